"""A decode row's experts in one compiled call: ops.expert_mlps of one row
whose experts take q8, with the layer's shared expert in the same GEMV calls
where it has the routed experts' shape; and, where the router and the
shared expert's gate are float32 too, the row's whole MoE block (moe_row:
the norm, the router, the top-k, the experts and the weighted sum into the
residual).

The gates, then the ups, of the row's experts (and the shared expert's) in
one vk_q8_gemvs_each call, every activation in one silu, their downs in one
call; the calls pick the matrices by index from the layer's tables of Mats
(qdot.mat_words), made at the layer's first such row. Each output is what
the general path computes for it (the same quantisation of the row, the same
kernels, an activation element by element): only the grouping by rows,
which one row does not need, and a call per matrix set are left out. The
rest of moe_row is the general path's kernels in its order: jit_math's norm,
jit._gemv for the router and the shared gate, jit_route's top-k and
combine, the sigmoid of the shared gate's logit. tests/test_q8.py and the
families' three-way tests hold both to the general path and to the NumPy
definition.
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit

from . import jit, jit_math, jit_qdot, jit_route, qdot
from .jit_qdot import Y, q8_gemvs, q8_gemvs_each, set_output
from .jit_sublayer import normed

F = np.float32
_SILU, _SIGMOID = jit_math.ELEMENTWISE_OPS["silu"], jit_math.ELEMENTWISE_OPS["sigmoid"]


def all_q8(w) -> bool:
    """Every expert of the layer takes q8 (looked at once: a step runs cold,
    and its Python with it)."""
    got = w.__dict__.get("_q8_all")
    if got is None:
        got = w.__dict__["_q8_all"] = all(m.gate.acts == m.up.acts == m.down.acts == "q8" for m in w.experts)
    return got


def applies(w, experts) -> bool:
    """Every one of the row's experts takes q8."""
    return all_q8(w) or all(m.gate.acts == m.up.acts == m.down.acts == "q8" for m in map(w.experts.__getitem__, experts))


class Tables:
    """A MoE layer's Mats for one-row calls: ``gu`` row 2e the gate and 2e + 1
    the up of expert e, ``down`` row e its down; the shared expert last
    (index len(experts)) where ``joined``: it takes q8, has the routed
    experts' width and their silu."""

    def __init__(self, w, act: str | None):
        sh, m0 = w.shared, w.experts[0]
        self.joined = (sh is not None and act == "silu" and sh.gate.rows == m0.gate.rows
                       and sh.down.cols == m0.down.cols and sh.gate.acts == sh.up.acts == sh.down.acts == "q8")
        extra = [sh] if self.joined else []
        self.gu, k1 = qdot.mat_words([q for m in w.experts + extra for q in (m.gate, m.up)])
        self.down, k2 = qdot.mat_words([m.down for m in w.experts + extra])
        self.keep, self.inter, self.count = (k1, k2), m0.gate.rows, len(w.experts)


def tables(w, act: str | None) -> Tables:
    key = f"_q8_tables_{act}"
    got = w.__dict__.get(key)
    if got is None:
        got = w.__dict__[key] = Tables(w, act)
    return got


@njit(boundscheck=False, error_model="numpy", cache=True)
def _experts(gu_words, down_words, downs, h, inter, threads):
    """(len(downs), H): down(silu(gate h) * up h) of each expert downs[j]
    (table indices) for the one row h (1, H)."""
    m, H = downs.shape[0], h.shape[1]
    mats = np.empty((2 * m, gu_words.shape[1]), np.int64)
    for j in range(m):
        mats[j] = gu_words[2 * downs[j]]
        mats[m + j] = gu_words[2 * downs[j] + 1]
    g, u = np.empty((m, inter), F), np.empty((m, inter), F)
    xs, ns = np.empty(2 * m, np.int64), np.ones(2 * m, np.int64)
    for j in range(m):
        mats[j, Y] = g.ctypes.data + 4 * inter * j
        mats[m + j, Y] = u.ctypes.data + 4 * inter * j
    xs[:] = h.ctypes.data
    q8_gemvs_each(mats, 2 * m, xs, ns, threads)
    a = np.empty((m, inter), F)
    jit_math._elementwise_kernel(g.reshape(m * inter), a.reshape(m * inter), _SILU, u.reshape(m * inter))
    dm = np.empty((m, down_words.shape[1]), np.int64)
    ys = np.empty((m, H), F)
    for j in range(m):
        dm[j] = down_words[downs[j]]
        dm[j, Y] = ys.ctypes.data + 4 * H * j
        xs[j] = a.ctypes.data + 4 * inter * j
    q8_gemvs_each(dm, m, xs, ns, threads)
    return ys


def one_row(w, experts: np.ndarray, h: np.ndarray, shared_act: str | None = None):
    """(ys (1, k, H), the shared expert's output (1, H) or None): the row's
    k experts in routing order; the shared expert's only where it joins the
    calls (shared_act: the shared expert's activation; None: not asked)."""
    t = tables(w, shared_act)
    joined = t.joined and shared_act is not None
    k = len(experts)
    downs = np.append(experts, t.count) if joined else np.ascontiguousarray(experts, np.int64)
    jit_qdot.bind()
    ys = _experts(t.gu, t.down, downs, np.ascontiguousarray(h, F), t.inter, qdot.THREADS)
    return ys[None, :k], (ys[k:] if joined else None)


@njit(inline="always", boundscheck=False)
def _small_gemv(f32, words, h, rows, threads):
    """ops.gemv of the one row h by a float32 weight (jit._gemv) or, where
    ``words`` has its Mat, a q8 one (vk_q8_gemvs)."""
    y = np.empty((1, rows), F)
    if words.shape[0]:
        set_output(words, 0, y)
        q8_gemvs(words, 1, h, threads)
    else:
        jit._gemv(f32, h, y)
    return y


@njit(boundscheck=False, error_model="numpy", cache=True)
def _moe_row(x, res, norm, eps, inv_h, router, router_q8, k, normalize, gu_words, down_words, count, joined,
             shared_gate, shared_gate_q8, inter, threads):
    """res + the MoE block of the one row x (1, H) (CpuModel.moe after its
    norm): the router's top-k, their experts and, where joined, the shared
    expert (last in the tables, at ``count``) gated by sigmoid(shared_gate h);
    router and shared gate float32 arrays or (router_q8, shared_gate_q8)
    their Mats."""
    h = normed(x, norm, eps, inv_h)
    logits = _small_gemv(router, router_q8, h, count, threads)       # a row of the router an expert
    idx, wt = np.empty((1, k), np.int64), np.empty((1, k), F)
    jit_route._route_rows(logits, k, normalize, idx, wt)
    downs = np.empty(k + 1 if joined else k, np.int64)
    downs[:k] = idx[0]
    if joined:
        downs[k] = count
    ys = _experts(gu_words, down_words, downs, h, inter, threads)
    gate = np.empty(1 if joined else 0, F)
    shared = np.empty((1 if joined else 0, x.shape[1]), F)
    if joined:
        logit = _small_gemv(shared_gate, shared_gate_q8, h, 1, threads)
        jit_math._elementwise_kernel(logit.reshape(1), gate, _SIGMOID, np.empty(0, F))
        shared[0] = ys[k]
    out = np.empty_like(res)
    routed = np.empty((1, k, x.shape[1]), F)
    routed[0] = ys[:k]
    jit_route._combine_rows(res, routed, wt, gate, shared, out)
    return out


def _small(w):
    """(float32 array, Mats) of a router or shared gate for _moe_row: the
    array where it is float32 in storage order, else its Mats (q8); both
    empty where there is none."""
    if w is None:
        return np.zeros((0, 0), F), (np.zeros((0, qdot._WORDS), np.int64), None)
    if w.acts == "q8":
        return np.zeros((0, 0), F), qdot.mat_words([w])
    return np.ascontiguousarray(w.data.view(F)), (np.zeros((0, qdot._WORDS), np.int64), None)


class MoeRow:
    """A MoE layer's decode row in one call (_moe_row), where its experts
    take q8, its router (and shared gate) take q8 or are float32 in storage
    order, and its shared expert, if any, joins the tables."""

    def __init__(self, w, cfg):
        self.t = tables(w, cfg.hidden_act)
        self.router, (self.router_q8, k1) = _small(w.router)
        self.gate, (self.gate_q8, k2) = _small(w.shared_gate if w.shared is not None else None)
        self.keep = (k1, k2)
        self.k, self.normalize = int(cfg.num_experts_per_tok), bool(cfg.norm_topk_prob)

    @staticmethod
    def qualifies(w, cfg) -> bool:
        small = [w.router] + ([w.shared_gate] if w.shared is not None else [])
        return (all(q.acts == "q8" or (q.fmt == "f32" and q.order is None) for q in small) and all_q8(w)
                and (w.shared is None or tables(w, cfg.hidden_act).joined))

    def __call__(self, x, res, norm, eps, inv_h):
        jit_qdot.bind()
        t = self.t
        return _moe_row(x, res, norm, eps, inv_h, self.router, self.router_q8, self.k, self.normalize, t.gu, t.down,
                        t.count, t.joined, self.gate, self.gate_q8, t.inter, qdot.THREADS)
