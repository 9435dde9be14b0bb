"""A Gated DeltaNet mixer's compiled calls, their arguments made once: what
CpuModel.deltanet does through ops, without ops' wrappers, for a layer whose
projections all take q8 (the hybrids' three layers in four).

Why: a hybrid decoding step at real widths spent, between its kernels, about
as long in Python as it trailed llama.cpp by; ops rebuilds every argument on
every call (the conv taps transposed, the head map, the wrappers' checks).

The same kernels on the same arrays in the same order as the general path
(qdot's calls after jit_math.rmsnorm, jit_math's conv taps, silu, l2norm,
sigmoid, softplus and exp, the compiled scan, the gated norm), so the same
bits: tests/test_families_qwen.py (qwen3_5, conftest.layer_calls_three_ways)
holds it to the general path and to the NumPy definition.
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit

from ...weights import DeltaW, LayerW
from . import jit_math, jit_qdot, qdot
from .jit_qdot import Y, q8_gemvs, set_output
from .jit_sublayer import normed

F = np.float32
_OP = jit_math.ELEMENTWISE_OPS
_SILU, _SIGMOID, _SOFTPLUS, _EXP = _OP["silu"], _OP["sigmoid"], _OP["softplus"], _OP["exp"]
_EPS = F(1e-6)                      # ops.l2norm's


@njit(boundscheck=False, error_model="numpy", cache=True)
def _prep(window, taps, ba, dt_bias, neg_exp_a, scale, nk, dk, rep, mixed, q, k, beta, decay):
    """The block's conv and the delta rule's inputs in one call, each value
    through the kernel ops' path takes (jit_math's conv taps, elementwise
    ops and row norms, on the same contiguous copies): mixed = silu(conv);
    q, k (n, nv, dk) = l2norm(q) * scale and l2norm(k), repeated to the
    value heads by rep; beta = sigmoid(b); decay = exp(neg_exp_a *
    softplus(a + dt_bias))."""
    n, cd = mixed.shape
    nv = rep.shape[0]
    none = np.empty(0, np.float32)
    conv = np.empty((n, cd), np.float32)
    jit_math._conv_taps(window, taps, conv)
    jit_math._elementwise_kernel(conv.reshape(n * cd), mixed.reshape(n * cd), _SILU, none)
    qk = np.empty((2, n * nk, dk), np.float32)
    for r in range(n):
        for j in range(nk * dk):
            qk[0, r * nk + j // dk, j % dk] = mixed[r, j]
            qk[1, r * nk + j // dk, j % dk] = mixed[r, nk * dk + j]
    unit = np.empty((2, n * nk, dk), np.float32)
    ones = np.ones(dk, np.float32)
    for i in range(2):
        jit_math._rms_rows(qk[i], ones, qk[i], _EPS, jit_math._ONE, False, unit[i])
    for r in range(n):
        for h in range(nv):
            g = r * nk + rep[h]
            for j in range(dk):
                q[r, h, j] = unit[0, g, j] * scale
                k[r, h, j] = unit[1, g, j]
    b = np.empty(n * nv, np.float32)
    a = np.empty(n * nv, np.float32)
    for r in range(n):
        for h in range(nv):
            b[r * nv + h] = ba[r, h]
            a[r * nv + h] = ba[r, nv + h] + dt_bias[h]
    jit_math._elementwise_kernel(b, beta.reshape(n * nv), _SIGMOID, none)
    sp = np.empty(n * nv, np.float32)
    jit_math._elementwise_kernel(a, sp, _SOFTPLUS, none)
    for r in range(n):
        for h in range(nv):
            sp[r * nv + h] = neg_exp_a[h] * sp[r * nv + h]
    jit_math._elementwise_kernel(sp, decay.reshape(n * nv), _EXP, none)


@njit(boundscheck=False, error_model="numpy", cache=True)
def _head(x, norm, eps, inv_h, proj, widths, ring0, taps, dt_bias, neg_exp_a, scale, nk, dk, nv, dv, rep, threads):
    """Everything before the scan, in one call: the projections of
    rmsnorm(x) (each matrix's rows written beside the last's: the
    concatenated [q | k | v | z | b | a] rows), the conv window (ring0, then
    the block's q, k, v columns) and _prep's inputs of the delta rule.
    Returns (window, mixed, q, k, beta, decay, z)."""
    n = x.shape[0]
    h = normed(x, norm, eps, inv_h)
    total = 0
    for i in range(widths.shape[0]):
        total += widths[i]
    rows = np.empty((n, total), F)
    at = 0
    for i in range(widths.shape[0]):
        proj[i, Y] = rows.ctypes.data + 4 * at
        proj[i, Y + 1] = total
        at += widths[i]
    q8_gemvs(proj, widths.shape[0], h, threads)
    cd = 2 * nk * dk + nv * dv
    r0 = ring0.shape[0]
    window = np.empty((r0 + n, cd), F)
    window[:r0] = ring0
    window[r0:] = rows[:, :cd]
    ba = np.ascontiguousarray(rows[:, cd + nv * dv:])
    z = np.ascontiguousarray(rows[:, cd:cd + nv * dv])
    mixed, q, k = np.empty((n, cd), F), np.empty((n, nv, dk), F), np.empty((n, nv, dk), F)
    beta, decay = np.empty((n, nv), F), np.empty((n, nv), F)
    _prep(window, taps, ba, dt_bias, neg_exp_a, scale, nk, dk, rep, mixed, q, k, beta, decay)
    return window, mixed, q, k, beta, decay, z


@njit(boundscheck=False, error_model="numpy", cache=True)
def _tail(out, norm, eps, inv_dv, z, o_words, hidden, threads):
    """After the scan, in one call: the gated norm of the heads' outputs
    (jit_math.rmsnorm with z) and the out projection. Returns (n, hidden)."""
    n, nv, dv = out.shape
    o = np.empty((n * nv, dv), F)
    jit_math._rms_rows(out.reshape(n * nv, dv), norm, z.reshape(n * nv, dv), eps, inv_dv, True, o)
    y = np.empty((n, hidden), F)
    set_output(o_words, 0, y)
    q8_gemvs(o_words, 1, o.reshape(n, nv * dv), threads)
    return y


def deltanet_mode(lw: LayerW) -> str | None:
    w = lw.mixer
    if not isinstance(w, DeltaW) or not all(p.acts == "q8" for p in w.proj + [w.out]):
        return None
    return "q8"


def head_map(cfg) -> np.ndarray:
    """The key head each value head reads: j % nk in llama.cpp's tiled order
    (ModelConfig.linear_v_tiled), else j // (nv / nk)."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    return np.arange(nv) % nk if cfg.linear_v_tiled else np.arange(nv) // (nv // nk)


def keep_states(kept, window, snaps, ring) -> None:
    """After a block: the conv window and the state after each kept row into
    ``kept`` (HostState's copy slots), the ring moved on to the block's end."""
    r = ring.shape[0]
    for i in range(len(kept)):
        kept[i][0].append(window[i + 1:i + 1 + r].copy())
        kept[i][1].append(snaps[i])
    ring[:] = window[window.shape[0] - r:]


class DeltaNetCalls:
    def __init__(self, lw: LayerW, cfg, norms: dict, eps):
        """norms, eps: the layer's norm weights and epsilon as LayerCalls holds them."""
        w, c = lw.mixer, cfg
        self.eps, self.norms = eps, norms
        (self.proj, k1), (self.out, k2) = qdot.mat_words(w.proj), qdot.mat_words([w.out])
        self.keep, self.widths, self.hidden = (k1, k2), np.array([p.rows for p in w.proj], np.int64), w.out.rows
        self.norm, self.inv_h, self.inv_dv = jit_math._weight(w.norm, c.linear_value_head_dim), F(1.0 / w.out.rows), \
            F(1.0 / c.linear_value_head_dim)
        self.nk, self.nv, self.dk, self.dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                                              c.linear_key_head_dim, c.linear_value_head_dim)
        self.taps = np.ascontiguousarray(np.asarray(w.conv, F).T)      # (K, cd): jit_math.conv_taps' rows
        self.scale = F(self.dk ** -0.5)
        self.rep = head_map(c)
        self.dt_bias, self.neg_exp_a = (np.ascontiguousarray(a, F) for a in (w.dt_bias, w.neg_exp_a))

    def mixer(self, lw, h, pos, rope, ring, ssm, kept=None, room=None, src=None):
        """CpuModel.deltanet of h = (x, norm name)."""
        ring0, ssm0 = (ring, ssm) if src is None else src
        x = np.ascontiguousarray(h[0], dtype=F)
        n, nv, dv = x.shape[0], self.nv, self.dv
        jit_qdot.bind()
        window, mixed, q, k, beta, decay, z = _head(
            x, self.norms[h[1]], self.eps, self.inv_h, self.proj, self.widths, np.ascontiguousarray(ring0, dtype=F),
            self.taps, self.dt_bias, self.neg_exp_a, self.scale, self.nk, self.dk, nv, dv, self.rep, qdot.THREADS)
        v = mixed[:, 2 * self.nk * self.dk:].reshape(n, nv, dv)
        out, snaps = jit_math.deltanet_scan(ssm, q, k, v, beta, decay, len(kept), room, ssm0)
        keep_states(kept, window, snaps, ring)
        return _tail(np.ascontiguousarray(out, dtype=F), self.norm, self.eps, self.inv_dv, z, self.out, self.hidden,
                     qdot.THREADS)


def machine_code() -> str:
    """_prep's assembly (numba_cache.machine_code)."""
    n, nk, dk, nv = 1, 1, 4, 2
    cd = 2 * nk * dk + nv * dk
    args = (np.ones((4, cd), F), np.ones((4, cd), F), np.ones((n, 2 * nv), F), np.ones(nv, F), np.ones(nv, F),
            F(0.5), nk, dk, np.zeros(nv, np.int64), np.empty((n, cd), F), np.empty((n, nv, dk), F),
            np.empty((n, nv, dk), F), np.empty((n, nv), F), np.empty((n, nv), F))
    return "\n".join(numba_cache.machine_code(_prep, *args))
