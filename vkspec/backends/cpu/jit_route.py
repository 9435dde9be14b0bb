"""ops.route and ops.moe_combine compiled: the router's softmax, top-k and
renormalisation, and the experts' weighted sum into the residual, every row
in one call each.

Why: as NumPy they are a dozen calls on a row of a few hundred numbers, in
every MoE layer of every decoding step; their fixed costs were a
noticeable part of a hybrid MoE token at real widths.

Exact: the same float32 operations in the same order as ops' (softmax_row
is exact.softmax's; the renormalising sum is exact.reduce_sum's lanes and
tree; the top-k is np.argsort(-p, kind="stable"): the largest first, ties
to the lower index, NaN last). No fast-math, so no fused multiply-adds.
tests/test_jit_route.py holds both to the NumPy definitions.
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit

from . import jit, jit_math

F = np.float32
_ZERO = jit_math._ZERO


@njit(boundscheck=False, error_model="numpy", cache=True)
def _route_rows(logits, k, normalize, idx, wt):
    n, E = logits.shape
    acc = np.empty(128, F)
    s = np.empty(32, F)
    probs = np.empty(E, F)
    taken = np.empty(E, np.bool_)
    for r in range(n):
        jit_math.softmax_row(logits[r], 0, E, acc, s, probs)
        taken[:] = False
        for j in range(k):
            best = -1
            for e in range(E):
                if taken[e]:
                    continue
                if best < 0:
                    best = e
                elif probs[e] > probs[best] or (probs[best] != probs[best] and probs[e] == probs[e]):
                    best = e
            taken[best] = True
            idx[r, j] = best
            wt[r, j] = probs[best]
        if normalize:
            for j in range(128):
                acc[j] = _ZERO
            for j in range(k):
                acc[j % 128] = acc[j % 128] + wt[r, j]
            q = jit_math.recip1(jit._finish(acc, s, max(1, min(32, (k + 3) // 4))))
            for j in range(k):
                wt[r, j] = wt[r, j] * q


def route(logits, k: int, normalize: bool):
    """ops.route: (idx (n, k) int64, weights (n, k) float32)."""
    x = np.ascontiguousarray(logits, dtype=F)
    x2 = x.reshape(-1, x.shape[-1])
    idx = np.empty((x2.shape[0], k), np.int64)
    wt = np.empty((x2.shape[0], k), F)
    _route_rows(x2, k, normalize, idx, wt)
    return idx.reshape(x.shape[:-1] + (k,)), wt.reshape(x.shape[:-1] + (k,))


@njit(boundscheck=False, error_model="numpy", cache=True)
def _combine_rows(x, ys, wts, gate, shared, out):
    n, k, H = ys.shape
    acc = np.empty(H, F)
    for r in range(n):
        acc[:] = _ZERO
        for j in range(k):
            w = wts[r, j]
            for h in range(H):
                acc[h] = acc[h] + ys[r, j, h] * w
        if shared.shape[0]:
            g = gate[r]
            for h in range(H):
                acc[h] = acc[h] + g * shared[r, h]
        for h in range(H):
            out[r, h] = x[r, h] + acc[h]


_NONE1, _NONE2 = np.zeros(0, F), np.zeros((0, 0), F)


def moe_combine(x, ys, wts, shared=None, shared_logit=None) -> np.ndarray:
    """ops.moe_combine, rows (n, H)."""
    x = np.ascontiguousarray(x, dtype=F)
    out = np.empty_like(x)
    if shared is None:
        gate, sh = _NONE1, _NONE2
    else:
        gate, sh = jit_math.sigmoid(shared_logit), np.ascontiguousarray(shared, dtype=F)
    _combine_rows(x, np.ascontiguousarray(ys, dtype=F), np.ascontiguousarray(wts, dtype=F), gate, sh, out)
    return out


def machine_code() -> str:
    """The assembly of both kernels (numba_cache.machine_code)."""
    x = np.ones((2, 9), F)
    calls = ((_route_rows, (x, 3, True, np.empty((2, 3), np.int64), np.empty((2, 3), F))),
             (_combine_rows, (x, np.ones((2, 3, 9), F), np.ones((2, 3), F), np.ones(2, F), x, np.empty_like(x))))
    return "\n".join(code for d, args in calls for code in numba_cache.machine_code(d, *args))
