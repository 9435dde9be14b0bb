"""attend compiled by numba: a block's attention in one call per layer.

Why one kernel: scores, softmax and the weighted sum as three compiled calls
(each a parallel dispatch) with NumPy reshapes between them cost ~170 us a
layer at one row on SmolLM2, ten times their arithmetic, and a quarter of a
decoding step.

Why it is exact: each (row, query head) is one work item that computes what
the three kernels computed for it, with the same helpers: every score is
jit_dot.dot of its key and query times the scale (gemv_batched's bits, which
does not depend on how many rows share a load), jit_math.softmax_row over the
row's keys, and jit._columns_from's sums for the values (reading each
value row in place, contiguous), each key in the lane of its position. ``test_exact_core`` holds ops.attend to attend_row, the NumPy
definition, row by row, windows and infinite values included.
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: F401,I001  (first: where numba caches)
from numba import njit, prange

from ... import exact
from . import jit, jit_math
from .jit_dot import dot

F = np.float32


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _attend(q, kc, vc, lens, starts, base, scale, out):
    """out[r, h] = the attention of q[r, h] over keys starts[r]..lens[r]-1 of
    its KV head; keys are read from ``base`` (a multiple of 128, at or before
    every start), so key t takes lane (t - base) % 128 = t % 128."""
    n, nh, hd = q.shape
    rep = nh // kc.shape[1]
    span = 0
    for r in range(n):
        span = max(span, lens[r] - base)
    for item in prange(n * nh):
        r, h = item // nh, item % nh
        g = h // rep
        lo, hi = starts[r] - base, lens[r] - base
        sc = np.empty(span, F)
        p = np.empty(span, F)
        acc = np.empty(128, F)
        s = np.empty(32, F)
        for j in range(lo, hi):
            sc[j] = dot(kc[base + j, g], q[r, h]) * scale
        jit_math.softmax_row(sc, lo, hi, acc, s, p)
        acc_d = np.zeros((128, hd), F)
        for j in range(lo, hi):                 # jit._columns_from's terms, each value row contiguous
            pj, vj, a = p[j], vc[base + j, g], acc_d[j % 128]
            for d in range(hd):
                a[d] = a[d] + pj * vj[d]
        jit.fold_columns(acc_d, np.empty((32, hd), F), out[r, h])


def attend(q, kc, vc, lens, starts, scale) -> np.ndarray:
    """ops.attend's compiled path: q (n, nh, hd), kc and vc (L, nkv, hd)
    caches (read in place when C-contiguous float32), row r over keys
    starts[r]..lens[r]-1."""
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    base = int(starts.min()) // exact.REDUCE_STRIDE * exact.REDUCE_STRIDE
    out = np.empty(q.shape, F)
    _attend(np.ascontiguousarray(q, dtype=F), np.ascontiguousarray(kc, dtype=F), np.ascontiguousarray(vc, dtype=F), lens, starts, base, F(scale), out)
    return out


def machine_code() -> str:
    """The kernel's assembly, compiled afresh (numba cannot show cached code)."""
    fresh = njit(parallel=True, boundscheck=False, error_model="numpy")(_attend.py_func)
    kc = np.ones((9, 1, 8), F)
    fresh(np.ones((2, 2, 8), F), kc, kc, np.array([9, 5]), np.array([0, 2]), 0, F(0.5), np.empty((2, 2, 8), F))
    return "\n".join(fresh.inspect_asm().values())
