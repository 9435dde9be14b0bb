"""attend compiled by numba: a block's attention in one call per layer.

Why one kernel: scores, softmax and the weighted sum as three compiled calls
(each a parallel dispatch) with NumPy reshapes between them cost ten times
their arithmetic at one row on SmolLM2.

Two parallel loops: the scores, and then softmax and values, one item per
(row, query head). Heads up to 64 wide (a multiple of 4) with more than
KEYS_PATH_QUERIES queries a KV head take their scores from _lane_scores:
every row's queries of a KV head side by side, one a vector lane
(jit_dot.query_scores), so each key is loaded once for all the verify rows
and no shuffles are needed. Other heads take one item per (row, KV head),
each key row loaded once for the query heads of its group (jit_dot.key_scores
up to 64 wide; wider, qdot's library's vk_scores four keys at a time where
jit_qdot is bound, else dot_rows one key at a time). The
values are jit_dot.row_values per (row, head), right after its softmax: the
lanes in registers, a lane's keys in turn (faster than lanes in memory for
one row and one query a vector lane for the verify rows).

Why it is exact: each item computes what the three kernels (a GEMV, softmax,
weighted sums) computed for it, with the same helpers: every score is
exact.dot of its key and query (query_scores, key_scores, vk_scores or
dot_rows, all in exact.dot's order; a row's dot does not depend on how many rows share a load)
times the scale, jit_math.softmax_row over the row's keys, and
exact.dot's lanes for the values (row_values), each key in the lane of its
position, the keys before the row's window left out (they would add +0).
``test_exact_core`` holds ops.attend to attend_row, the NumPy definition,
row by row, windows and infinite values included.
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit, prange

from ... import exact
from . import heap, jit_math
from .jit_dot import MAX_ROWS, QUERY_LANES, SCORES_DIMS, dot_rows, key_scores, query_scores, row_values
from .jit_qdot import wide_scores, wide_scores_bound

F = np.float32
KEY_CHUNK = 64                  # keys a _lane_scores item takes
KEYS_PATH_QUERIES = 4 * QUERY_LANES     # at most this many queries a KV head: key_scores (hd <= SCORES_DIMS)


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _attend(q, nh, kc, vc, lens, window, scale, out, k, v, cos, sin, pos):
    """out[r, h] = the attention of query row r * nh + h of q (n * nh, hd)
    over keys starts[r]..lens[r]-1 of its KV head (kc, vc (nkv, L, hd):
    heap.heads_first), starts[r] the row's
    window start (ops.window_start); keys are read from ``base`` (a multiple
    of 128, at or before every start), so key t takes lane (t - base) % 128
    = t % 128.

    With the block's own keys (k, v (n, nkv, hd); none: zero rows), q and k
    are first rotated by jit_math._rope_rows (ops.rope) and k, v written to
    the caches at rows pos (ops.rope's cache variant and the value store):
    one call a layer instead of three wrappers and two dispatches."""
    n, hd, nkv = q.shape[0] // nh, q.shape[1], kc.shape[0]
    rep = nh // nkv
    if k.shape[0]:
        qr = np.empty((n, nh, hd), F)
        jit_math._rope_rows(q.reshape((n, nh, hd)), cos, sin, qr)
        q = qr.reshape((n * nh, hd))
        kr = np.empty(k.shape, F)
        jit_math._rope_rows(k, cos, sin, kr)
        for r in range(n):
            for g in range(nkv):
                kc[g, pos[r]] = kr[r, g]
                vc[g, pos[r]] = v[r, g]
    starts = np.empty(n, np.int64)              # loops, not array expressions: those would be parallel loops
    first = lens[0]
    for r in range(n):
        starts[r] = max(lens[r] - window, 0) if window else 0
        first = min(first, starts[r])
    base = first // exact.REDUCE_STRIDE * exact.REDUCE_STRIDE
    span = 0
    for r in range(n):
        span = max(span, lens[r] - base)
    scores = np.empty((n, nh, span), F)
    # all rows' queries of a KV head, one a vector lane; where a head has few queries (decode and
    # verify rows of a small head) most lanes would idle, and sixteen keys' trees at once do better
    if hd <= SCORES_DIMS and hd % 4 == 0 and n * rep > KEYS_PATH_QUERIES:
        _lane_scores(q, nh, kc, base, first - base, span, scale, scores)
        return _weighted(scores, nh, vc, starts, lens, base, span, out)
    for item in prange(n * nkv):                # a key row is loaded once for its group's query heads
        r, g = item // nkv, item % nkv
        lo, hi = starts[r] - base, lens[r] - base
        if hd <= SCORES_DIMS:                   # sixteen keys' lane trees at once
            key_scores(kc, g, base + lo, hi - lo, q, r * nh + g * rep, rep, scores, r, g * rep, lo, scale)
            continue
        if wide_scores_bound():                 # four keys' lane trees at once (qdot's library, when bound)
            wide_scores(kc, g, base + lo, hi - lo, q, r * nh + g * rep, rep, scores, r, g * rep, lo, scale)
            continue
        got = np.empty(MAX_ROWS, F)
        for h0 in range(g * rep, g * rep + rep, MAX_ROWS):
            c = min(MAX_ROWS, g * rep + rep - h0)
            for j in range(lo, hi):
                dot_rows(kc[g, base + j], q, r * nh + h0, c, got)
                for i in range(c):
                    scores[r, h0 + i, j] = got[i] * scale
    _weighted(scores, nh, vc, starts, lens, base, span, out)


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _lane_scores(q, nh, kc, base, lo, hi, scale, scores):
    """scores[r, h, t] = dot(q[r * nh + h], kc[h's KV head, base + t]) *
    scale for every row r, head h and key lo <= t < hi (keys past a row's
    own are computed and never read): jit_dot.query_scores over each KV
    head's queries, QUERY_LANES to a vector, in items of KEY_CHUNK keys."""
    n, hd, nkv = q.shape[0] // nh, q.shape[1], kc.shape[0]
    rep = nh // nkv
    nq = n * rep                                # a KV head's queries: (row, head) in row order
    nvec = (nq + QUERY_LANES - 1) // QUERY_LANES
    qt = np.zeros((nkv, nvec, hd, QUERY_LANES), F)
    for g in range(nkv):
        for i in range(nq):
            for c in range(hd):
                qt[g, i // QUERY_LANES, c, i % QUERY_LANES] = q[(i // rep) * nh + g * rep + i % rep, c]
    chunks = (hi - lo + KEY_CHUNK - 1) // KEY_CHUNK
    for item in prange(nkv * nvec * chunks):
        g, v, ch = item // (nvec * chunks), item // chunks % nvec, item % chunks
        t0 = lo + ch * KEY_CHUNK
        nk = min(hi - t0, KEY_CHUNK)
        got = np.empty((KEY_CHUNK, QUERY_LANES), F)
        query_scores(kc, g, base + t0, nk, qt[g, v], got, scale)
        for i in range(min(QUERY_LANES, nq - v * QUERY_LANES)):
            qi = v * QUERY_LANES + i
            r, h = qi // rep, g * rep + qi % rep
            for t in range(nk):
                scores[r, h, t0 + t] = got[t, i]


@njit(parallel=True, boundscheck=False, error_model="numpy", cache=True)
def _weighted(scores, nh, vc, starts, lens, base, span, out):
    """out[r, h] = the values weighted by softmax_row of the row's scores
    over its keys starts[r]..lens[r]-1 (key t read at base + t): one item
    per (row, head), its lanes in registers (jit_dot.row_values)."""
    n, nkv = scores.shape[0], vc.shape[0]
    rep = nh // nkv
    for item in prange(n * nh):
        r, h = item // nh, item % nh
        g = h // rep
        lo, hi = starts[r] - base, lens[r] - base
        p = np.empty(span, F)
        jit_math.softmax_row(scores[r, h], lo, hi, np.empty(128, F), np.empty(32, F), p)
        row_values(p, vc, g, base, lo, hi, out[r, h])


_NONE3, _NONE2, _NO_POS = np.zeros((0, 1, 1), F), np.zeros((0, 1), F), np.zeros(0, np.int64)


def attend(q, kc, vc, lens, window, scale, new=None) -> np.ndarray:
    """ops.attend's compiled path: q (n, nh, hd), kc and vc (L, nkv, hd)
    caches (read in place where they come from heap.kv_cache, else as
    head-first copies), row r over its keys up to lens[r] (the last `window`
    of them, 0: all). new: (k, v, cos, sin, pos), the block's keys and
    values and its RoPE rows, for ops.rope_attend (q not yet rotated; the
    caches then heap.kv_cache's, written in place)."""
    n, nh, hd = q.shape
    out = np.empty(q.shape, F)
    kc, vc = (heap.heads_first(c, writable=new is not None) for c in (kc, vc))
    if new is None:
        k, v, cos, sin, pos = _NONE3, _NONE3, _NONE2, _NONE2, _NO_POS
    else:
        k, v, cos, sin = (np.ascontiguousarray(a, dtype=F) for a in new[:4])
        pos = np.ascontiguousarray(new[4], dtype=np.int64)
    _attend(np.ascontiguousarray(q, dtype=F).reshape(n * nh, hd), nh, kc, vc,
            np.ascontiguousarray(lens, dtype=np.int64), int(window), F(scale), out, k, v, cos, sin, pos)
    return out


def machine_code() -> str:
    """The kernel's assembly (numba_cache.machine_code)."""
    kc = np.ones((1, 9, 8), F)                  # (nkv, L, hd)
    example = (np.ones((4, 8), F), 2, kc, kc, np.array([9, 5]), 7, F(0.5), np.empty((2, 2, 8), F),
               np.ones((2, 1, 8), F), np.ones((2, 1, 8), F), np.ones((2, 8), F), np.ones((2, 8), F), np.array([7, 8]))
    lanes = (np.ones((4, 8), F), 2, kc, 0, 0, 9, F(0.5), np.empty((2, 2, 9), F))
    weighted = (np.ones((2, 2, 9), F), 2, kc, np.array([0, 2]), np.array([9, 5]), 0, 9, np.empty((2, 2, 8), F))
    return "\n".join(numba_cache.machine_code(_attend, *example) + numba_cache.machine_code(_lane_scores, *lanes)
                     + numba_cache.machine_code(_weighted, *weighted))
