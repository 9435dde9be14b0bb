"""Compile qdot.c once per instruction set into shared libraries.

The install's build hook (hatch_build.py) runs :func:`compile_all` into this
folder; a checkout whose qdot.c changed since (or a wheel built without a C
compiler) compiles the one variant it needs into the user's cache on first
use (backends/cpu/qdot.py). The file name carries a hash of the source and
the flags, so a stale library is never loaded.

-ffp-contract=off: GCC fuses a * b + c into an FMA by default wherever -mfma
allows it, and the float part must round every product on its own.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "qdot.c"
HEADERS = (HERE / "qdot_decode.h", HERE / "qdot_rows_b32.h", HERE / "qdot_rows_k.h", HERE / "qdot_gemm.h", HERE / "qdot_gemm_tile.h",
           HERE / "attend_scores.h", HERE / "float_dot.h", HERE / "float_gemm.h")
BASE = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
X86 = platform.machine() in ("x86_64", "AMD64", "i686")
VARIANTS: dict[str, list[str]] = {
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
    "avxvnni": ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "plain": [],
} if X86 else {"plain": []}


class BuildError(RuntimeError):
    pass


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def lib_name(variant: str) -> str:
    text = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    h = hashlib.sha256(text + " ".join(BASE + VARIANTS[variant]).encode()).hexdigest()[:12]
    return f"qdot_{variant}_{h}.so"


def compile_one(variant: str, dest: Path) -> Path:
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, gcc or clang) to build the q8 kernels: install one, "
                         "or run with --activations f32")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / lib_name(variant)
    if out.exists():
        return out
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, *BASE, *VARIANTS[variant], str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
    if r.returncode:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{cc} failed on {SOURCE.name} ({variant}): {r.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)
    for old in dest.glob(f"qdot_{variant}_*.so"):      # an older source's library of this variant
        if old != out:
            old.unlink(missing_ok=True)
    return out


def compile_all(dest: Path = HERE / "lib") -> list[Path]:
    """Every variant (compile_one removes an older source's libraries)."""
    return [compile_one(v, dest) for v in VARIANTS]


if __name__ == "__main__":
    for p in compile_all():
        print(p)
