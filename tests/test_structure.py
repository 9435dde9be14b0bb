"""The shape of the house: imports run one way, every shader has its NumPy
twin, both backends offer the same interface, and the op table binds what the
compiled shaders declare."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import vkspec
from vkspec.backends.cpu import ops
from vkspec.backends.vulkan import graph
from vkspec.interface import Model
from vkspec.shaders import build

ROOT = Path(vkspec.__file__).parent
# device utilities with no arithmetic of the model: copies, the op-by-op test
# harness (exact.ELEMENTWISE) and the start-up probe
NO_TWIN = {"fill", "core_eval", "float_probe"}


def modules():
    return sorted(m.name for m in pkgutil.walk_packages([str(ROOT)], "vkspec."))


def imports_of(name: str) -> set[str]:
    """The vkspec modules `name` imports anywhere (top level or in a function)."""
    path = Path(importlib.util.find_spec(name).origin)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = set(modules()) | {"vkspec"}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("vkspec")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("vkspec"):
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out - {name}


def test_every_module_imports():
    for name in modules():
        importlib.import_module(name)


def test_the_import_graph_has_no_cycles():
    graph_ = {name: imports_of(name) for name in modules()}
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in graph_.get(n, ()):
            if state.get(m) == "open":
                cycle = stack[stack.index(m):] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in graph_:
        if n not in state:
            visit(n)


def test_every_shader_has_its_numpy_twin():
    """shader S with variants V: backends/cpu/ops.py has S (one function for
    every variant) or S_V for each (separate steps)."""
    for src in sorted((ROOT / "shaders").glob("*.comp")):
        stem = src.stem
        if stem in NO_TWIN:
            continue
        names = [n[len(stem) + 1:-4] for n in build.variants(src)]
        if hasattr(ops, stem):
            continue
        missing = [v for v in names if not hasattr(ops, f"{stem}_{v}")]
        assert not missing, f"{src.name}: no ops.{stem} nor ops.{stem}_<variant> for {missing}"


@pytest.fixture(scope="module")
def models(vk, tmp_path_factory):
    from vkspec.loader import load_model
    from vkspec.tiny import make_tiny
    d = make_tiny(tmp_path_factory.mktemp("tiny"), seed=3, mtp=True, experts=4)
    return load_model(d), load_model(d, backend="vulkan")


def test_both_backends_offer_the_model_interface(models):
    members = [n for n, v in vars(Model).items() if not n.startswith("_") and callable(v)]
    for m in models:
        assert isinstance(m, Model), type(m)
        for name in members:
            want = list(inspect.signature(getattr(Model, name)).parameters)
            got = list(inspect.signature(getattr(type(m), name)).parameters)
            assert got == want, (type(m).__name__, name, got, want)
        assert m.has_mtp and m.max_rows >= 1 and m.ctx >= 1


def test_the_interface_gives_the_same_bits_on_both_backends(models):
    """Every method of the protocol, once, on both backends: the same values."""
    cpu, vk = models
    runs = []
    for m in models:
        st = m.new_state()
        m.warm(16, copies=2)
        h, lg = m.forward([1, 2, 3, 4], st, copies=2)
        m.rewind(st, 2)
        snap = m.snapshot(st)
        h2, lg2 = m.forward([5], st)
        m.restore(st, snap)
        h3, lg3 = m.forward([5], st)
        mh, ml = m.mtp_forward(h3, [6], st, [st.kv_len], ids=np.arange(0, 100, 3))
        runs.append([lg, lg2, lg3, mh, ml, snap.kv_k[0], snap.ssm[0]])
    for a, b in zip(*runs):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert runs[0][1].tobytes() == runs[0][2].tobytes()      # restore undid the step


def test_the_op_table_binds_what_each_shader_declares(vk):
    from vkspec.backends.vulkan.device import load_shader
    for src in sorted((ROOT / "shaders").glob("*.comp")):
        if src.stem in NO_TWIN - {"fill"}:
            continue
        for name in build.variants(src):
            variant = name[len(src.stem) + 1:-4] or None
            bound = len(load_shader(src.stem, variant).reflection.buffers)
            entries = [op for op in graph.OPS if op.stem == src.stem and len(op.bindings) == bound]
            assert len(entries) == 1, (name, bound, [op.bindings for op in graph.OPS if op.stem == src.stem])


def test_a_push_struct_that_disagrees_with_its_shader_fails_the_build(tmp_path):
    """build.check_push on a shader whose block gained a field."""
    src = (ROOT / "shaders" / "argmax.comp").read_text().replace("uint rows;", "uint rows;\n    uint extra_;", 1)
    (tmp_path / "argmax.comp").write_text(src)
    for inc in (ROOT / "shaders").glob("*.glsl"):
        (tmp_path / inc.name).write_text(inc.read_text())
    with pytest.raises(build.ShaderError, match="extra_"):
        build.compile_all(tmp_path, tmp_path / "out", force=True)
