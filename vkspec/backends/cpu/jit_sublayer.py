"""A q8 sublayer in one compiled call: attention (attention_q8) and the gated
MLP (mlp_q8), for layer_calls.LayerCalls where every matrix of the sublayer
takes q8 activations.

Why: the same steps as separate calls from Python (a norm, the GEMVs, the
head split and norms, the attention, the gate) cost a dispatch each, and a
decoding step at real widths runs that Python with cold caches; here one
call a sublayer runs them with nothing between.

Why it is exact: each step is the kernel LayerCalls' separate calls run, on
arrays holding the same values: jit_math._rms_rows for the input norm and
the q/k norms (1/K as float32(1.0 / K)), qdot's vk_q8_gemvs for the
projections (jit_qdot: the library qdot.gemvs runs), float32 adds of the
biases and a float32 product with the gate (NumPy's ``y + b`` and ``att *
sigmoid(gate)``: one rounding each), jit_math._elementwise_kernel for
sigmoid and the MLP's activation times up, and jit_attend._attend for RoPE,
the cache writes and the attention. tests/test_gguf.py and the families'
tests hold LayerCalls to the general path and to the NumPy definition
(conftest.layer_calls_three_ways).
"""

from __future__ import annotations

import numpy as np

from . import numba_cache  # noqa: I001  (first: where numba caches)
from numba import njit

from . import jit_math
from .jit_attend import _attend
from .jit_qdot import q8_gemvs, set_output

F = np.float32
_SIGMOID = jit_math.ELEMENTWISE_OPS["sigmoid"]


@njit(inline="always", boundscheck=False)
def _add_bias(y, b):
    if b.size:
        for r in range(y.shape[0]):
            for j in range(y.shape[1]):
                y[r, j] = y[r, j] + b[j]


@njit(inline="always", boundscheck=False)
def normed(x, w, eps, inv):
    """jit_math.rmsnorm of x's rows (a copy of x where w is empty: no norm)."""
    out = np.empty_like(x)
    if w.size:
        jit_math._rms_rows(x, w, x, eps, inv, False, out)
    else:
        out[:] = x
    return out


@njit(boundscheck=False, error_model="numpy", cache=True)
def attention_q8(x, norm, eps, inv_h, qkv, o, qb, kb, vb, ob, q_norm, k_norm, inv_hd, nh, nkv, hd, gated,
                 kc, vc, pos, window, scale, cos, sin, threads):
    """The attention mixer of rows x (n, H) (LayerCalls.mixer): q, k, v =
    the rows of qkv's three matrices against rmsnorm(x, norm), plus their
    biases (empty: none); q_proj's rows [q | gate] per head when gated; the
    q and k norms per head (empty: none); RoPE, the cache writes at pos and
    the attention (jit_attend._attend over the caches kc, vc (nkv, L, hd),
    keys up to pos + 1, the last ``window`` of them where nonzero); times sigmoid(gate) when gated; then
    o's rows and o's bias. Returns (n, H)."""
    n = x.shape[0]
    h = normed(x, norm, eps, inv_h)
    yq = np.empty((n, nh * hd * (2 if gated else 1)), F)
    yk, yv = np.empty((n, nkv * hd), F), np.empty((n, nkv * hd), F)
    set_output(qkv, 0, yq)
    set_output(qkv, 1, yk)
    set_output(qkv, 2, yv)
    q8_gemvs(qkv, 3, h, threads)
    _add_bias(yq, qb)
    _add_bias(yk, kb)
    _add_bias(yv, vb)
    q = np.empty((n * nh, hd), F)
    gate = np.empty((n, nh * hd if gated else 0), F)
    for r in range(n):
        for i in range(nh):
            at = i * hd * (2 if gated else 1)
            for j in range(hd):
                q[r * nh + i, j] = yq[r, at + j]
                if gated:
                    gate[r, i * hd + j] = yq[r, at + hd + j]
    q = normed(q, q_norm, eps, inv_hd)
    k = normed(yk.reshape((n * nkv, hd)), k_norm, eps, inv_hd).reshape((n, nkv, hd))
    att = np.empty((n, nh, hd), F)
    _attend(q, nh, kc, vc, pos + 1, window, scale, att, k, yv.reshape((n, nkv, hd)), cos, sin, pos)
    a = att.reshape((n, nh * hd))
    if gated:
        s = np.empty((n, nh * hd), F)
        jit_math._elementwise_kernel(gate.reshape(n * nh * hd), s.reshape(n * nh * hd), _SIGMOID,
                                     np.empty(0, F))
        for r in range(n):
            for j in range(nh * hd):
                a[r, j] = a[r, j] * s[r, j]
    y = np.empty((n, x.shape[1]), F)
    set_output(o, 0, y)
    q8_gemvs(o, 1, a, threads)
    _add_bias(y, ob)
    return y


@njit(boundscheck=False, error_model="numpy", cache=True)
def mlp_q8(x, norm, eps, inv_h, gate_up, down, inter, act, threads):
    """The gated MLP of rows x (n, H) (LayerCalls.ffn): down(act(g) * u)
    with g, u the rows of gate_up's two matrices (inter each) against
    rmsnorm(x, norm); act an _elementwise_kernel op. Returns (n, H)."""
    n = x.shape[0]
    h = normed(x, norm, eps, inv_h)
    g, u = np.empty((n, inter), F), np.empty((n, inter), F)
    set_output(gate_up, 0, g)
    set_output(gate_up, 1, u)
    q8_gemvs(gate_up, 2, h, threads)
    a = np.empty((n, inter), F)
    jit_math._elementwise_kernel(g.reshape(n * inter), a.reshape(n * inter), act, u.reshape(n * inter))
    y = np.empty((n, x.shape[1]), F)
    set_output(down, 0, y)
    q8_gemvs(down, 1, a, threads)
    return y


@njit(boundscheck=False, error_model="numpy", cache=True)
def layer_q8(x, norm, post_norm, eps, inv_h, qkv, o, qb, kb, vb, ob, q_norm, k_norm, inv_hd, nh, nkv, hd, gated,
             kc, vc, pos, window, scale, cos, sin, gate_up, down, inter, act, threads):
    """A sequential layer (layer_graph.SEQUENTIAL) whose attention and MLP
    both take q8, in one call: h = x + attention_q8 of x under norm, then h +
    mlp_q8 of h under post_norm; each add one float32 rounding, as NumPy's.
    Why: one dispatch a layer, without the Python of CpuModel.layer's graph
    walk between the two sublayers' calls."""
    h = x + attention_q8(x, norm, eps, inv_h, qkv, o, qb, kb, vb, ob, q_norm, k_norm, inv_hd, nh, nkv, hd, gated,
                         kc, vc, pos, window, scale, cos, sin, threads)
    return h + mlp_q8(h, post_norm, eps, inv_h, gate_up, down, inter, act, threads)


def machine_code() -> str:
    """The kernels' assembly (numba_cache.machine_code), on a tiny int8 layer."""
    from ...formats.matrix import f32
    from ...formats.quant import quantize
    from .qdot import mat_words
    rng = np.random.default_rng(0)
    mats = [quantize(f32(rng.standard_normal((r, c))), "int8") for r, c in ((64, 32), (32, 64))]
    w1, _ = mat_words([mats[0]] * 3)
    w2, _ = mat_words([mats[1]])
    gu, _ = mat_words([mats[0]] * 2)
    x, none, ones = np.ones((1, 32), F), np.zeros(0, F), np.ones(32, F)
    kc = np.zeros((2, 4, 32), F)                # (nkv, L, hd)
    rope = np.ones((1, 16), F)
    attn = (x, ones, F(1e-6), F(1 / 32), w1, w2, none, none, none, none, ones, ones, F(1 / 32), 2, 2, 32, False,
            kc, kc.copy(), np.zeros(1, np.int64), 0, F(0.2), rope, rope, 1)
    mlp = (x, ones, F(1e-6), F(1 / 32), gu, w2, 64, jit_math.ELEMENTWISE_OPS["silu"], 1)
    return "\n".join(numba_cache.machine_code(attention_q8, *attn) + numba_cache.machine_code(mlp_q8, *mlp))
