# Two commands do all set-up on a fresh machine:
#   make demo   runs the main job on the device (Lavapipe or a real GPU)
#   make test   runs the tests under Lavapipe with synchronization validation
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.vkspec-setup

.PHONY: setup demo test bench shaders
setup: $(STAMP)

$(STAMP): pyproject.toml ci/kompute/kp-0.9.0-vkspec.patch ci/kompute/build-kp.sh ci/lavapipe/setup.sh
	bash ci/lavapipe/setup.sh
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check "$$(PYTHON=$(PY) bash ci/kompute/build-kp.sh)"
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# the main job: speculative decoding (MTP head + prompt lookup under the gate)
# with the bundled trained hybrid on the Vulkan device, then the same run on
# the CPU path and without drafts: the three digests are equal
DEMO_PROMPT := $$'import os\nimport sys\n\n\ndef main(argv):\n    parser = '
SHELL := /bin/bash
demo: setup
	$(VENV)/bin/vkspec selftest
	$(VENV)/bin/vkspec run models/tiny-hybrid --prompt $(DEMO_PROMPT) -n 64 --spec auto --backend vulkan --json
	$(VENV)/bin/vkspec run models/tiny-hybrid --prompt $(DEMO_PROMPT) -n 64 --spec auto --backend cpu --json
	$(VENV)/bin/vkspec run models/tiny-hybrid --prompt $(DEMO_PROMPT) -n 64 --spec off --backend vulkan --json

test: setup
	bash ci/lavapipe/test.sh -q

bench: setup
	$(VENV)/bin/python tests/bench/bench_core.py
	$(VENV)/bin/python tests/bench/bench_decode.py
	$(VENV)/bin/python tests/bench/bench_chain.py
	$(VENV)/bin/python tests/bench/bench_spec.py
	$(VENV)/bin/python tests/bench/bench_tier.py

shaders: setup
	$(VENV)/bin/python vkspec/shaders/build.py
