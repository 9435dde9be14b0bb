"""The CPU's floating-point environment: vkspec's CPU path is IEEE 754
binary32 as NumPy computes it by default (round to nearest even, denormals
kept), and the device is held to the same bits.

A process can lose that without asking: a library that turns on
flush-to-zero and denormals-are-zero (MXCSR's FTZ and DAZ bits on x86-64,
FPCR.FZ on AArch64; a shared library linked with -ffast-math sets them from
a constructor when it is loaded) makes NumPy and numba compute other bits
for every denormal, silently.

:func:`check` runs vkspec/ieee.py's cases (ties, denormals in and out, -0,
inf, NaN, min/max, comparisons) with NumPy in this thread and with a compiled
numba kernel, parallel like vkspec's own: numba code runs with the control
register of the thread that runs it, this one or one of numba's workers (a
thread starts with a copy of its creator's).

:func:`ensure_ieee` (every model load) fixes what it can and refuses the
rest: when the control register shows FTZ, DAZ or a rounding mode other
than nearest, it restores the IEEE defaults in this thread and says so on
stderr, then checks. Why fix and not refuse: the
flags only change results that IEEE 754 defines, which is what vkspec (and
most numerical code) expects; the library that set them stays correct, a
little slower on denormals. Threads started later inherit the fix. What is
still wrong after that (numba's worker threads, started earlier under the
old flags; a platform whose register this module cannot read) refuses with
one line naming the failing case.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from dataclasses import dataclass, field

import numpy as np

from ... import ieee
from ...errors import VkspecError

REPEAT = 64            # copies of every case in the parallel kernel: work for every worker thread

# x86-64 glibc fenv_t: the 28-byte x87 environment, then MXCSR
_X86_SIZE, _X86_MXCSR = 32, 28
_MXCSR_FTZ, _MXCSR_DAZ, _MXCSR_RC = 1 << 15, 1 << 6, 3 << 13
# AArch64 glibc fenv_t: FPCR, FPSR
_ARM_SIZE, _ARM_FZ, _ARM_RMODE = 8, 1 << 24, 3 << 22
ROUNDING = {0: "nearest", 1: "down", 2: "up", 3: "toward zero"}


@dataclass
class Control:
    """What the thread's control register says."""
    register: str
    ftz: bool
    daz: bool
    rounding: str

    @property
    def ieee(self) -> bool:
        return not self.ftz and not self.daz and self.rounding == "nearest"

    def line(self) -> str:
        flags = [n for n, v in (("FTZ", self.ftz), ("DAZ", self.daz)) if v]
        return f"{self.register}: {'+'.join(flags) or 'no FTZ/DAZ'}, rounding {self.rounding}"


def _libm():
    return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")


def _arch() -> str | None:
    m = platform.machine().lower()
    if m in ("x86_64", "amd64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return None


def control() -> Control | None:
    """This thread's FTZ/DAZ/rounding state; None where this module cannot read it."""
    arch = _arch()
    if arch is None or not sys.platform.startswith("linux"):
        return None
    try:
        env = ctypes.create_string_buffer(_X86_SIZE if arch == "x86_64" else _ARM_SIZE)
        if _libm().fegetenv(env) != 0:
            return None
    except (OSError, AttributeError):
        return None
    if arch == "x86_64":
        m = int.from_bytes(env.raw[_X86_MXCSR:_X86_MXCSR + 4], "little")
        return Control("MXCSR", bool(m & _MXCSR_FTZ), bool(m & _MXCSR_DAZ), ROUNDING[(m & _MXCSR_RC) >> 13])
    c = int.from_bytes(env.raw[0:4], "little")
    # FPCR.RMode: 0 nearest, 1 toward +inf, 2 toward -inf, 3 toward zero
    return Control("FPCR", bool(c & _ARM_FZ), False, {0: "nearest", 1: "up", 2: "down", 3: "toward zero"}
                   [(c & _ARM_RMODE) >> 22])


def set_flush(on: bool) -> bool:
    """Turn FTZ and DAZ (FPCR.FZ) on or off in this thread, rounding to
    nearest; False where this module cannot. ``on`` is for the tests: it is
    what a -ffast-math library does."""
    arch = _arch()
    if arch is None or not sys.platform.startswith("linux"):
        return False
    try:
        libm = _libm()
        env = ctypes.create_string_buffer(_X86_SIZE if arch == "x86_64" else _ARM_SIZE)
        if libm.fegetenv(env) != 0:
            return False
        raw = bytearray(env.raw)
        if arch == "x86_64":
            m = int.from_bytes(raw[_X86_MXCSR:_X86_MXCSR + 4], "little") & ~(_MXCSR_FTZ | _MXCSR_DAZ | _MXCSR_RC)
            raw[_X86_MXCSR:_X86_MXCSR + 4] = (m | (_MXCSR_FTZ | _MXCSR_DAZ if on else 0)).to_bytes(4, "little")
        else:
            c = int.from_bytes(raw[0:4], "little") & ~(_ARM_FZ | _ARM_RMODE)
            raw[0:4] = (c | (_ARM_FZ if on else 0)).to_bytes(4, "little")
        env = ctypes.create_string_buffer(bytes(raw), len(raw))
        return libm.fesetenv(env) == 0
    except (OSError, AttributeError):
        return False


# --- the check ----------------------------------------------------------------------


def _operands(cases):
    bits = lambda k: np.array([getattr(c, k) for c in cases], np.uint32).view(np.float32)  # noqa: E731
    return bits("a"), bits("b"), bits("c"), np.array([ieee.OPS.index(c.op) for c in cases], np.int64)


def _gt_bits(v: np.ndarray, ops: np.ndarray) -> list[int]:
    """Result bits per case, a comparison's as 0 or 1 (the kernels write 1.0 / 0.0)."""
    b = v.view(np.uint32)
    gt = ieee.OPS.index("gt")
    return [int(x == 0x3F800000) if o == gt else int(x) for x, o in zip(b, ops)]


def numpy_results(cases=ieee.CASES) -> list[int]:
    a, b, c, ops = _operands(cases)
    out = np.zeros(len(cases), np.float32)
    with np.errstate(all="ignore"):
        for k, op in enumerate(ieee.OPS):
            m = ops == k
            x, y, z = a[m], b[m], c[m]
            out[m] = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                      "min": lambda: np.minimum(x, y), "max": lambda: np.maximum(x, y),
                      "gt": lambda: (x > y).astype(np.float32), "muladd": lambda: (x * y) + z}[op]()
    return _gt_bits(out, ops)


_kernel = None


def _compiled():
    global _kernel
    if _kernel is None:
        from . import numba_cache  # noqa: F401
        from numba import njit, prange

        @njit(parallel=True, cache=True, error_model="numpy")
        def cases_kernel(ops, a, b, c, out):
            n = ops.size
            for j in prange(out.size):
                i = j % n
                x, y, op = a[i], b[i], ops[i]
                if op == 0:
                    r = x + y
                elif op == 1:
                    r = x - y
                elif op == 2:
                    r = x * y
                elif op == 3:
                    r = np.minimum(x, y)
                elif op == 4:
                    r = np.maximum(x, y)
                elif op == 5:
                    r = np.float32(1.0) if x > y else np.float32(0.0)
                else:
                    p = x * y
                    r = p + c[i]
                out[j] = r
        _kernel = cases_kernel
    return _kernel


def numba_results(cases=ieee.CASES, repeat: int = REPEAT) -> list[list[int]]:
    """Each copy's result bits (the copies ran on whichever threads numba chose)."""
    a, b, c, ops = _operands(cases)
    out = np.zeros(len(cases) * repeat, np.float32)
    _compiled()(ops, a, b, c, out)
    return [_gt_bits(out[r * len(cases):(r + 1) * len(cases)], ops) for r in range(repeat)]


@dataclass
class CpuCheck:
    control: Control | None
    numpy: list[str] = field(default_factory=list)         # failing cases
    numba: list[str] = field(default_factory=list)
    numba_checked: bool = True
    fixed: bool = False                                     # ensure_ieee cleared the flags

    @property
    def ok(self) -> bool:
        return not self.numpy and not self.numba

    def line(self) -> str:
        where = self.control.line() if self.control else "control register not readable here"
        if self.ok:
            tools = "NumPy and numba" if self.numba_checked else "NumPy (numba off)"
            return f"{len(ieee.CASES)} cases as IEEE 754 in {tools} ({where})" + \
                   ("; FTZ/DAZ were on and were turned off" if self.fixed else "")
        side, fails = ("NumPy", self.numpy) if self.numpy else ("numba", self.numba)
        return f"{side}: {fails[0]} ({where})"


def check(use_numba: bool | None = None) -> CpuCheck:
    if use_numba is None:
        from . import jit
        use_numba = jit.enabled()
    res = CpuCheck(control(), numba_checked=use_numba)
    res.numpy, _ = ieee.check(numpy_results())
    if use_numba:
        fails: dict[str, None] = {}            # every copy's failures, first seen first
        for got in numba_results():
            fails.update(dict.fromkeys(ieee.check(got)[0]))
        res.numba = list(fails)
    return res


_checked: CpuCheck | None = None
_numba_asked = False            # _checked was asked to cover numba (it may be off)


def ensure_ieee(numba: bool = True) -> CpuCheck:
    """Restore IEEE defaults in this thread if FTZ/DAZ or another rounding
    is on (before any numba code runs here, so that numba's worker threads
    start with them too), then check(); refuse (VkspecError, one line) what
    is still wrong. Done once per process while it passes.

    numba=False: this process will run no numba code (a device model with
    every weight on the device), so numba is neither loaded nor checked: it
    costs ~70 MB of RSS and a compile. A later ensure_ieee() checks it."""
    global _checked, _numba_asked
    if _checked is not None and _checked.ok and (_numba_asked or not numba):
        return _checked
    ctl, fixed = control(), False
    if ctl is not None and not ctl.ieee and set_flush(False):
        print(f"vkspec: this process computed float32 with {ctl.line()} (a library turned it on): "
              "turned off for vkspec's IEEE 754 arithmetic", file=sys.stderr, flush=True)
        fixed = True
    res = check(None if numba else False)
    res.fixed = fixed
    if not res.ok:
        raise VkspecError(f"the CPU does not compute float32 as vkspec's exact path needs: {res.line()}")
    _checked, _numba_asked = res, numba
    return res
