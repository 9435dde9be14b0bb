"""The shader build: compile errors name file and line; stale outputs are rebuilt."""

import os
import time

import pytest

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
