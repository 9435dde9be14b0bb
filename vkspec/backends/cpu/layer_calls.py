"""An attention layer's compiled calls, their arguments made once: the
CPU's counterpart of the device's recorded sequence. CpuModel.layer walks
the layer's graph (vkspec.layer_graph) and calls these for its sublayers
and adds.

A layer qualifies when its mixer is attention without an output gate, its
FFN one MLP, and every matrix is in blocks: SmolLM2 and Llama, Qwen2 and
Qwen3 (biases, q/k norms), Gemma 3 (sandwich norms). A step is then four
GEMV calls (jit_blocks._gemv with f32 activations; with q8 ones, qdot's
calls after the same jit_math norm and activation calls as ops' q8 path)
and one of jit_attend._attend, with exactly the
arguments model.CpuModel.layer's general path builds through ops (gemvs
with the input norm, rope_attend, gemv, gemvs with the post norm,
act_gemv), between them the same NumPy adds for biases and residuals and
the same jit_math.rmsnorm calls for the q/k and sandwich norms: the same
kernels on the same arrays, so the same bits.

Why: the general path builds those arguments again on every call (ops
wrappers, reshapes, checks, _call_args lookups), a large part of a small
model's decoding step. tests/test_gguf.py (SmolLM2),
test_families_qwen.py (Qwen2, Qwen3) and test_gemma3.py hold these
families here to the general path and to the NumPy definition
(conftest.layer_calls_three_ways).
"""

from __future__ import annotations

import numpy as np

from ...formats.matrix import QWeight
from ...weights import AttnW, LayerW, MlpW
from . import jit, jit_attend, jit_blocks, jit_math, qdot

F = np.float32
_NONE1, _NONE2 = jit_blocks._NONE1, jit_blocks._NONE2


def qualifies(lw: LayerW) -> bool:
    a, f = lw.mixer, lw.ffn
    if lw.kind != "full_attention" or not isinstance(a, AttnW) or not isinstance(f, MlpW):
        return False
    if a.gated:
        return False
    mats = (a.q, a.k, a.v, a.o, f.gate, f.up, f.down)
    if all(isinstance(w, QWeight) and w.acts == "q8" for w in mats):
        return True
    if not all(isinstance(w, QWeight) and w.fmt != "f32" and w.acts == "f32" for w in mats):
        return False
    return all(jit_blocks._own(w, *jit_blocks.kernel_args(w)[:2]) for w in mats)   # kept: no copies


class Q8Gemvs:
    """The q8 GEMVs of a layer: ops.gemvs' q8 path (the input normed once,
    then qdot's call over the matrices it feeds), its calls made once."""

    def __init__(self, a: AttnW, f: MlpW):
        self.qkv, self.o = qdot._call([a.q, a.k, a.v]), qdot._call([a.o])
        self.gu, self.down = qdot._call([f.gate, f.up]), qdot._call([f.down])

    def attention_in(self, x, norm, eps):
        return self.qkv(jit_math.rmsnorm(x, norm, eps))

    def mlp(self, x, norm, eps, act):
        g, u = self.gu(jit_math.rmsnorm(x, norm, eps))
        a = jit_math.gelu_tanh(g, times=u) if act == "gelu_tanh" else jit_math.silu(g, times=u)
        return self.down(a)[0]


class LayerCalls:
    """An attention layer's sublayers and adds for CpuModel.layer's steps,
    for a layer that qualifies(): h comes as (x, norm name)."""

    def __init__(self, lw: LayerW, cfg):
        a, f, H = lw.mixer, lw.ffn, lw.in_norm.shape[0]
        self.eps = F(cfg.rms_norm_eps)
        self.q8 = Q8Gemvs(a, f) if a.q.acts == "q8" else None
        if self.q8 is None:
            self.qkv, self.qkv_rows = jit_blocks._call_args([a.q, a.k, a.v], True)
            self.o, (self.o_rows,) = jit_blocks._call_args([a.o], True)
            self.gu, self.gu_rows = jit_blocks._call_args([f.gate, f.up], True)
            self.down, (self.down_rows,) = jit_blocks._call_args([f.down], True)
        self.act_name = "gelu_tanh" if cfg.hidden_act == "gelu_tanh" else "silu"
        self.act = jit_math.ELEMENTWISE_OPS[self.act_name]
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale, self.window = F(cfg.scores_scale), int(a.window)
        self.biases = [None if b is None else np.asarray(b, F) for b in (a.q_bias, a.k_bias, a.v_bias, a.o_bias)]
        self.q_norm, self.k_norm = (None if w is None else jit_math._weight(w, self.hd) for w in (a.q_norm, a.k_norm))
        self.norms = {name: jit_math._weight(w, H) for name, w in lw.norms.items()}

    def add(self, lw, x, y, norm):
        """x + y, or x + rmsnorm(y) under a sandwich norm (ops.rmsnorm's residual variant)."""
        return x + (y if norm is None else jit_math.rmsnorm(y, self.norms[norm], self.eps))

    def mixer(self, lw, h, pos, rope, kc, vc, *_):
        x, norm = np.ascontiguousarray(h[0], dtype=F), self.norms[h[1]]
        n = x.shape[0]
        if self.q8 is not None:
            qkv = self.q8.attention_in(x, norm, self.eps)
        else:
            qkv = [np.empty((n, r), F) for r in self.qkv_rows]
            jit_blocks._gemv(*self.qkv, x, norm, self.eps, _NONE2, 0, *qkv)
        q, k, v = (y if b is None else y + b for y, b in zip(qkv, self.biases))
        if self.q_norm is not None:                 # per head: rows of hd
            q = jit_math.rmsnorm(q.reshape(n, self.nh, self.hd), self.q_norm, self.eps)
        if self.k_norm is not None:
            k = jit_math.rmsnorm(k.reshape(n, self.nkv, self.hd), self.k_norm, self.eps)
        att = np.empty((n, self.nh, self.hd), F)
        assert kc.dtype == F and vc.dtype == F and kc.flags.c_contiguous and vc.flags.c_contiguous
        pos = np.ascontiguousarray(pos, dtype=np.int64)
        cos, sin = rope
        jit_attend._attend(q.reshape(n * self.nh, self.hd), self.nh, kc, vc, pos + 1, self.window, self.scale, att,
                           k.reshape(n, self.nkv, self.hd), v.reshape(n, self.nkv, self.hd),
                           np.ascontiguousarray(cos, dtype=F), np.ascontiguousarray(sin, dtype=F), pos)
        att = att.reshape(n, self.nh * self.hd)
        if self.q8 is not None:
            o = self.q8.o(att)[0]
        else:
            o = np.empty((n, self.o_rows), F)
            jit_blocks._gemv(*self.o, att, _NONE1, F(0), _NONE2, 0, o, o, o)
        return o if self.biases[3] is None else o + self.biases[3]

    def ffn(self, lw, h):
        x, norm = h[0], self.norms[h[1]]
        n = x.shape[0]
        if self.q8 is not None:
            return self.q8.mlp(x, norm, self.eps, self.act_name)
        g, u = (np.empty((n, r), F) for r in self.gu_rows)
        jit_blocks._gemv(*self.gu, x, norm, self.eps, _NONE2, 0, g, u, g)
        d = np.empty((n, self.down_rows), F)
        jit_blocks._gemv(*self.down, g, _NONE1, F(0), u, self.act, d, d, d)
        return d


def layer_calls(lw: LayerW, cfg) -> LayerCalls | None:
    """The layer's prepared calls, made at its first use and kept on it;
    None where it does not qualify or the compiled path is off."""
    if not jit.enabled():
        return None
    got = lw.__dict__.get("_layer_calls", False)
    if got is False:
        got = LayerCalls(lw, cfg) if qualifies(lw) else None
        lw.__dict__["_layer_calls"] = got
    return got
