"""The shape of the house: imports run one way, every shader has its NumPy
twin, both backends offer the same interface, and the op table binds what the
compiled shaders declare."""

import ast
import importlib
import inspect
import pkgutil
import re
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
    """Every compiled variant has exactly one op-table entry whose bindings,
    in binding order, are its storage blocks by name: a binding is named as
    its block is (lowercased) or as the block's first member."""
    from vkspec.backends.vulkan.device import load_shader
    for src in sorted((ROOT / "shaders").glob("*.comp")):
        if src.stem in NO_TWIN - {"fill"}:
            continue
        for name in build.variants(src):
            variant = name[len(src.stem) + 1:-4] or None
            blocks = load_shader(src.stem, variant).reflection.buffers
            declared = [(b.name.lower(), b.members[0].name) for b in blocks]
            entries = [op for op in graph.OPS if op.stem == src.stem and len(op.bindings) == len(blocks)
                       and all(n in pair for n, pair in zip(op.bindings, declared))]
            assert len(entries) == 1, (name, declared, [op.bindings for op in graph.OPS if op.stem == src.stem])


def test_a_push_struct_that_disagrees_with_its_shader_fails_the_build(tmp_path):
    """build.check_push on a shader whose block gained a field."""
    src = (ROOT / "shaders" / "argmax.comp").read_text().replace("uint rows;", "uint rows;\n    uint extra_;", 1)
    (tmp_path / "argmax.comp").write_text(src)
    for inc in (ROOT / "shaders").glob("*.glsl"):
        (tmp_path / inc.name).write_text(inc.read_text())
    with pytest.raises(build.ShaderError, match="extra_"):
        build.compile_all(tmp_path, tmp_path / "out", force=True)


def _marks(decorators) -> set:
    """The pytest.mark.NAME names among decorators (or a pytestmark value)."""
    out = set()
    for d in decorators:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            out.add(node.attr)
    return out


def _requires_oracle(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "require"
               and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value in ("torch", "transformers")
               for n in ast.walk(node))


def test_tests_that_use_transformers_are_marked_oracle():
    """`-m "not oracle"` leaves out every test that needs torch or
    transformers: a module that requires them at import is marked as a
    whole, a test that requires them itself (or through a fixture named
    oracle, which conftest marks) is marked on its own."""
    unmarked = []
    for path in sorted((Path(__file__).parent).glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marks = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                module_marks |= _marks([node.value])
        module_requires = any(_requires_oracle(n) for n in tree.body
                              if not isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        if module_requires and "oracle" not in module_marks:
            unmarked.append(path.name)
        fixtures = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _requires_oracle(n)
                    and any("fixture" in ast.unparse(d) for d in n.decorator_list)}
        for n in tree.body:
            if not (isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
                continue
            uses = _requires_oracle(n) or any(a.arg in fixtures for a in n.args.args)
            if uses and "oracle" not in module_marks | _marks(n.decorator_list) and \
                    "oracle" not in {a.arg for a in n.args.args}:
                unmarked.append(f"{path.name}::{n.name}")
    assert not unmarked, f"not marked oracle: {unmarked}"


# A path that names no file here on purpose: what it is.
NOT_IN_THE_REPOSITORY = {
    "out/": "the benchmarks' output folder (gitignored), made by the scripts that write there",
    "vkspec/shaders/broken.comp": "written by test_shader_build into a temporary copy of the tree",
}


def test_every_repository_path_named_in_code_and_docs_exists():
    """Every path into the repository that a module, script, shader, test or
    doc names (from a top-level folder, or from one of vkspec's packages)
    exists: as named, as a module (.py added), or as a file followed by one of
    its attributes (`ops.py.rmsnorm`). docs/history.md may name what is gone;
    nothing may name a path outside the repository as if it were one."""
    root = Path(__file__).resolve().parents[1]
    tops = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] + [".ci"]
    packages = [p.name for p in (root / "vkspec").iterdir() if p.is_dir() and not p.name.startswith("_")]
    named = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w)" % "|".join(map(re.escape, tops + packages)))
    sources = [p for pattern in ("vkspec/**/*.py", "vkspec/**/*.glsl", "vkspec/**/*.comp", "vkspec/**/*.c",
                                 "vkspec/**/*.h", "tests/**/*.py", "scripts/**/*.py", "ci/**/*.sh", "docs/*.md")
               for p in root.glob(pattern)] + [root / "README.md", root / "Makefile", root / ".ci" / "run"]

    def exists(path: str) -> bool:
        for base in (root, root / "vkspec"):
            parts = path.split(".")
            for cut in range(len(parts), 0, -1):        # strip trailing .attribute segments
                p = base / ".".join(parts[:cut])
                if p.exists() or p.with_name(p.name + ".py").exists():
                    return True
        return False

    missing = []
    for src in sources:
        if src.name == "history.md" or ".venv" in src.parts:
            continue
        text = src.read_text(errors="replace")
        assert "/" + "work/" not in text, f"{src.relative_to(root)} names a path of the machine it was written on"
        for m in named.finditer(text):
            path = m.group(1).rstrip(".")
            if any(c in path for c in "*{}<>$") or any(path.startswith(k) for k in NOT_IN_THE_REPOSITORY):
                continue
            if not exists(path):
                missing.append(f"{src.relative_to(root)}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_timings_stay_out_of_the_code():
    """Comments and docstrings say why; the numbers that showed it live in
    docs/ (performance.md states the present, history.md the rest): a
    timing or a rate in the package's sources is a claim nobody re-measures."""
    timing = re.compile(r"\d[\d.]* ?(ms|us|µs|ns|GB/s|MB/s|tok/s)\b|\d[\d.]*x (faster|slower)")
    found = []
    for src in sorted(ROOT.rglob("*")):
        if src.suffix not in (".py", ".c", ".h", ".comp", ".glsl") or "__pycache__" in src.parts:
            continue
        for i, line in enumerate(src.read_text(errors="replace").splitlines(), 1):
            if timing.search(line) and "print(" not in line and 'f"' not in line:
                found.append(f"{src.relative_to(ROOT.parent)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_modules_and_functions_stay_readable():
    """No module of the package over 500 lines and no function over 80 (the
    outer function counts the ones nested in it): a file or a function past
    that is two things, and should be split where they part."""
    long = []
    for src in sorted(ROOT.rglob("*.py")):
        text = src.read_text()
        if len(text.splitlines()) > 500:
            long.append(f"{src.relative_to(ROOT.parent)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{src.relative_to(ROOT.parent)}:{node.lineno} {node.name}: "
                            f"{node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


def test_the_design_map_names_every_module():
    """docs/design.md's map names every module of the package, so whoever
    opens it finds where a thing lives."""
    design = (ROOT.parent / "docs" / "design.md").read_text()
    missing = [str(p.relative_to(ROOT.parent)) for p in sorted(ROOT.rglob("*.py"))
               if p.name != "__init__.py" and "__pycache__" not in p.parts
               and not re.search(r"(?<![\w.])%s\b" % re.escape(p.name), design)]
    assert not missing, "modules docs/design.md does not name:\n" + "\n".join(missing)
