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

from ...weights import DeltaW, LayerW
from . import jit_math, qdot

F = np.float32


def deltanet_mode(lw: LayerW) -> str | None:
    w = lw.mixer
    if not isinstance(w, DeltaW) or not all(p.acts == "q8" for p in w.proj + [w.out]):
        return None
    return "q8"


class DeltaNetCalls:
    def __init__(self, lw: LayerW, cfg):
        w, c = lw.mixer, cfg
        self.w, self.eps = w, F(c.rms_norm_eps)
        self.norms = {name: jit_math._weight(v, lw.in_norm.shape[0]) for name, v in lw.norms.items()}
        self.proj, self.out = qdot._call(w.proj), qdot._call([w.out])
        self.nk, self.nv, self.dk, self.dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                                              c.linear_key_head_dim, c.linear_value_head_dim)
        self.cd = 2 * self.nk * self.dk + self.nv * self.dv
        self.taps = np.ascontiguousarray(np.asarray(w.conv, F).T)      # (K, cd): jit_math.conv_taps' rows
        self.scale = F(self.dk ** -0.5)
        nk, nv = self.nk, self.nv
        self.rep = np.arange(nv) % nk if c.linear_v_tiled else np.arange(nv) // (nv // nk)

    def mixer(self, lw, h, pos, rope, ring, ssm, kept=None, room=None, src=None):
        """CpuModel.deltanet of h = (x, norm name)."""
        ring0, ssm0 = (ring, ssm) if src is None else src
        x, w = h[0], self.w
        n, nk, nv, dk, dv, cd = h[0].shape[0], self.nk, self.nv, self.dk, self.dv, self.cd
        proj = np.concatenate(self.proj(jit_math.rmsnorm(x, self.norms[h[1]], self.eps)), axis=-1)
        qkvz, ba = proj[:, :cd + nv * dv], proj[:, cd + nv * dv:]
        window = np.concatenate([ring0, qkvz[:, :cd]], axis=0)
        conv = np.empty((n, cd), F)
        jit_math._conv_taps(window, self.taps, conv)
        mixed = jit_math.silu(conv)
        q = jit_math.l2norm(mixed[:, :nk * dk].reshape(n, nk, dk), 1e-6) * self.scale
        k = jit_math.l2norm(mixed[:, nk * dk:2 * nk * dk].reshape(n, nk, dk), 1e-6)
        beta = jit_math.sigmoid(ba[:, :nv])
        decay = jit_math.exp(w.neg_exp_a * jit_math.softplus(ba[:, nv:] + w.dt_bias))
        v = mixed[:, 2 * nk * dk:].reshape(n, nv, dv)
        out, snaps = jit_math.deltanet_scan(ssm, q[:, self.rep], k[:, self.rep], v, beta, decay, len(kept), room,
                                            ssm0)
        K = self.taps.shape[0]
        for i in range(len(kept)):
            kept[i][0].append(window[i + 1:i + K].copy())
            kept[i][1].append(snaps[i])
        ring[:] = window[n:]
        o = jit_math.rmsnorm(out, w.norm, self.eps, qkvz[:, cd:].reshape(n, nv, dv))
        return self.out(o.reshape(n, nv * dv))[0]
