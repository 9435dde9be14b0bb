"""gemv compiled by numba: the float32 operations of exact.gemv, in its order.

Why a compiled twin at all: NumPy's elementwise loops move every product
through memory, so an extra row of a verify block cost ~0.55 of a whole step
on the CPU path and speculation could never pay there. Here each weight row is
read once from memory and reused from L1 by every row of the block, and the
dot itself is jit_dot's register-resident kernel, up to eight rows at a time.

Why it is still exact: numba compiles without fast-math, so LLVM neither
reassociates the lane sums nor fuses a multiply with an add (no contraction
flags), and it leaves the FPU's denormal mode alone. ``test_exact_core`` holds
it to exact.gemv bit for bit (NaN, infinities, denormals, ragged shapes) and
checks the machine code for fused multiply-adds. ``VKSPEC_CPU_JIT=0`` runs the
NumPy definition instead.
"""

from __future__ import annotations

import os

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit, prange

from ... import exact
from . import jit_dot
from .jit_dot import DOT_ROWS, MAX_ROWS, chunk_rows, dot_rows

BLOCK = 32                  # weight rows per parallel work item

assert exact.REDUCE_LANES == 32 and exact.REDUCE_VEC == 4


# read once: enabled() is asked several times per op, and an environment
# lookup cost ~15% of a trained-hybrid step (tests set ENABLED directly)
ENABLED = os.environ.get("VKSPEC_CPU_JIT", "1") != "0"


def enabled() -> bool:
    return ENABLED


@njit(inline="always", boundscheck=False, error_model="numpy")
def _finish(acc, s, used):
    """exact._finish for one row: (x+y)+(z+w) per lane, then the lane tree.

    Lanes from `used` on hold only padding (+0); adding them is the identity
    (no lane is -0), so they are left out."""
    for lane in range(used):
        s[lane] = (acc[4 * lane] + acc[4 * lane + 1]) + (acc[4 * lane + 2] + acc[4 * lane + 3])
    stride = 16
    while stride > 0:
        for i in range(used - stride):
            s[i] = s[i] + s[i + stride]
        used = min(used, stride)
        stride //= 2
    return s[0]


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _gemv(w, x, out):
    """out[r, m] = dot(x[r], w[m]) over x's width; up to DOT_ROWS rows share
    each weight load (jit_dot.dot_rows)."""
    rows, n = w.shape[0], x.shape[0]
    for b in prange((rows + BLOCK - 1) // BLOCK):
        got = np.empty(MAX_ROWS, np.float32)
        for m in range(b * BLOCK, min(rows, b * BLOCK + BLOCK)):
            r = 0
            while r < n:
                c = chunk_rows(n - r, DOT_ROWS)
                dot_rows(w[m], x, r, c, got)
                for j in range(c):
                    out[r + j, m] = got[j]
                r += c


@njit(inline="always", boundscheck=False, error_model="numpy")
def _columns(x, m, acc, s, out):
    """out[d] = dot(x, m[:, d]) over x's length for every column d of m, in
    the canonical order (acc (128, D) and s (32, D) are scratch)."""
    dv = m.shape[1]
    acc[:, :] = np.float32(0.0)
    for t in range(x.shape[0]):
        xt = x[t]
        a = acc[t % 128]
        for d in range(dv):
            a[d] = a[d] + xt * m[t, d]
    fold_columns(acc, s, out)


@njit(inline="always", boundscheck=False, error_model="numpy")
def fold_columns(acc, s, out):
    """out[d] = exact._finish of column d of the lanes acc (128, D): (x+y)+(z+w)
    per lane, then the lane tree (s (32, D) is scratch)."""
    dv = acc.shape[1]
    for lane in range(32):
        for d in range(dv):
            s[lane, d] = (acc[4 * lane, d] + acc[4 * lane + 1, d]) + (acc[4 * lane + 2, d] + acc[4 * lane + 3, d])
    stride = 16
    while stride > 0:
        for j in range(stride):
            for d in range(dv):
                s[j, d] = s[j, d] + s[j + stride, d]
        stride //= 2
    for d in range(dv):
        out[d] = s[0, d]


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def gemv(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """exact.gemv(w, x): w (M, >= K) zero-padded past K, x (n, K) -> (n, M)."""
    assert w.shape[-1] >= x.shape[-1]
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    _gemv(_f32(w), _f32(x), out)
    return out


def machine_code() -> str:
    """The kernel's assembly and the dot IR's (numba_cache.machine_code)."""
    example = np.zeros((BLOCK, 256), np.float32), np.zeros((2, 200), np.float32), np.empty((2, BLOCK), np.float32)
    return "\n".join(numba_cache.machine_code(_gemv, *example) + [jit_dot.machine_code()])
