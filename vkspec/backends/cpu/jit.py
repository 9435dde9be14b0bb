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

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
from numba import njit, prange

from ... import exact
from . import jit_dot
from .jit_dot import MAX_ROWS, dot_rows

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
    """out[i, r, m] = dot(x[i, r], w[i, m]) over x's width, for a batch of
    matrices; up to MAX_ROWS rows share each weight load (jit_dot.dot_rows)."""
    batch, rows, n = w.shape[0], w.shape[1], x.shape[1]
    blocks = (rows + BLOCK - 1) // BLOCK
    for ib in prange(batch * blocks):
        i, b = ib // blocks, ib % blocks
        xi = x[i]
        got = np.empty(MAX_ROWS, np.float32)
        for m in range(b * BLOCK, min(rows, b * BLOCK + BLOCK)):
            r = 0
            while r < n:
                c = min(MAX_ROWS, n - r)
                dot_rows(w[i, m], xi, r, c, got)
                for j in range(c):
                    out[i, r + j, m] = got[j]
                r += c


@njit(inline="always", boundscheck=False, error_model="numpy")
def _columns(x, m, acc, s, out):
    """out[d] = dot(x, m[:, d]) over x's length for every column d of m, in
    the canonical order (acc (128, D) and s (32, D) are scratch)."""
    _columns_from(x, m, 0, acc, s, out)


@njit(inline="always", boundscheck=False, error_model="numpy")
def _columns_from(x, m, lo, acc, s, out):
    """_columns with terms t < lo left out (they would add +0: the lanes stay
    where the whole row puts them, and m's rows before lo are never read)."""
    dv = m.shape[1]
    acc[:, :] = np.float32(0.0)
    for t in range(lo, x.shape[0]):
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


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _weighted_rows(p, v, lens, starts, out):
    """out[i, r, d] = dot(p[i, r, :lens[r]], v[i, :lens[r], d]): every column d
    of v reduced in the canonical order, all columns at once; the terms
    before starts[r] are left out (+0, v unread)."""
    batch, n = p.shape[0], p.shape[1]
    width = v.shape[2]
    for ir in prange(batch * n):
        i, r = ir // n, ir % n
        acc = np.empty((128, width), np.float32)
        s = np.empty((32, width), np.float32)
        _columns_from(p[i, r, :lens[r]], v[i], starts[r], acc, s, out[i, r])


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _rows_f32(a: np.ndarray) -> np.ndarray:
    """a itself when it is float32 with contiguous rows (a strided view of the
    KV cache seen per head), else a contiguous copy."""
    if a.dtype == np.float32 and a.strides[-1] == 4 and all(st % 4 == 0 for st in a.strides):
        return a
    return _f32(a)


def gemv(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """exact.gemv(w, x): w (M, >= K) zero-padded past K, x (n, K) -> (n, M)."""
    assert w.shape[-1] >= x.shape[-1]
    out = np.empty((1, x.shape[0], w.shape[0]), dtype=np.float32)
    _gemv(_f32(w)[None], _f32(x)[None], out)
    return out[0]


def gemv_batched(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(B, M, >= K), (B, n, K) -> (B, n, M): exact.gemv(w[i], x[i]) for each i.
    w may be a strided view whose rows are contiguous (the KV cache seen per
    head): the kernel reads it in place instead of copying it every step."""
    assert w.shape[-1] >= x.shape[-1]
    out = np.empty((w.shape[0], x.shape[1], w.shape[1]), dtype=np.float32)
    _gemv(_rows_f32(w), _f32(x), out)
    return out


def weighted_rows(p: np.ndarray, v: np.ndarray, lens, starts=None) -> np.ndarray:
    """(B, n, L), (B, L, D), lens (n,) -> (B, n, D): row r is
    exact.dot(p[i, r, :lens[r]], v[i, :lens[r]].T), the attention's output
    (terms before starts[r] left out); v read in place as gemv_batched's w."""
    out = np.empty((p.shape[0], p.shape[1], v.shape[2]), dtype=np.float32)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    starts = np.zeros_like(lens) if starts is None else np.ascontiguousarray(starts, dtype=np.int64)
    _weighted_rows(_f32(p), _rows_f32(v), lens, starts, out)
    return out


def machine_code() -> str:
    """The kernels' assembly, compiled afresh (numba cannot show cached code)."""
    opts = dict(parallel=True, boundscheck=False, error_model="numpy")
    gemv_ = njit(**opts)(_gemv.py_func)
    gemv_(np.zeros((1, BLOCK, 256), np.float32), np.zeros((1, 2, 200), np.float32),
          np.empty((1, 2, BLOCK), np.float32))
    rows_ = njit(**opts)(_weighted_rows.py_func)
    rows_(np.zeros((1, 2, 9), np.float32), np.zeros((1, 9, 64), np.float32),
          np.array([9, 5], np.int64), np.array([0, 2], np.int64), np.empty((1, 2, 64), np.float32))
    return "\n".join(list(gemv_.inspect_asm().values()) + list(rows_.inspect_asm().values())
                     + [jit_dot.machine_code()])
