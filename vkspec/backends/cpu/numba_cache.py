"""Where numba caches the compiled kernels: imported by every module here
before it imports numba.

numba caches the compiled kernels on disk so that no run compiles inside its
clock. The cache lives in the user's cache folder (an installed package may
be read-only), in a folder named after the dot product's IR digest, which
depends on the ISA chosen (jit_ir.py): kernels linked against another IR are
never loaded. And after the digest of the compiled Python itself (every
module of this package and exact.py, whose formulas the kernels inline):
numba checks a cached function against its own file only, while a caller
holds a copy of every kernel it calls, so a kernel changed in one file would
run its old code inside a cached caller from another (jit_sublayer's
attention inside, say, jit_attend's). This must happen before numba is
imported; a process that imported numba first, or set NUMBA_CACHE_DIR,
keeps its own choice.

Not in the package's __init__: a device run imports this package for the
float checks (fpenv) and must not pay llvmlite's ~40 MB of RSS for it.
"""

import hashlib
import os
import sys
from pathlib import Path

from ...cachedir import cache_root
from .jit_ir import ISA
from .jit_ir_blocks import ir_digest

HERE = Path(__file__).resolve().parent


def compiled_sources() -> list[Path]:
    """The Python the kernels are compiled from: this package's modules and
    exact.py."""
    return sorted(HERE.glob("*.py")) + [HERE.parents[1] / "exact.py"]


def source_digest() -> str:
    h = hashlib.sha1()
    for p in compiled_sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def folder(isa: str = ISA) -> str:
    """The cache folder's name: the ISA, the dot IR's digest, the sources'."""
    return f"{isa}-{ir_digest(isa)}-{source_digest()}"


if "numba" not in sys.modules and not os.environ.get("NUMBA_CACHE_DIR"):
    os.environ["NUMBA_CACHE_DIR"] = str(cache_root() / "numba" / folder())


def machine_code(kernel, *example) -> list[str]:
    """A kernel's assembly: of its overloads compiled in this process if it
    has any, else of a fresh copy compiled for the example arguments. numba
    cannot show code it loaded from this cache, and a fresh copy of a block
    kernel is slow to compile (tests on an empty cache reuse theirs)."""
    from numba import njit
    compiled = [sig for sig in kernel.signatures if kernel.stats.cache_misses[sig]]
    if compiled:
        return [kernel.inspect_asm(signature=sig) for sig in compiled]
    fresh = njit(**kernel.targetoptions)(kernel.py_func)
    fresh(*example)
    return list(fresh.inspect_asm().values())
