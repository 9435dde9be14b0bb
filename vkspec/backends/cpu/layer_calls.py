"""A layer's compiled calls, their arguments made once: the CPU's
counterpart of the device's recorded sequence. CpuModel.layer walks the
layer's graph (vkspec.layer_graph) and calls these for the sublayers that
have them, and ops' general path for the others.

A sublayer is prepared when it is attention (attention_mode; the hybrids'
output gate too) or one MLP (mlp_mode), and its matrices all take q8 or are
all in blocks: every layer of SmolLM2, Llama, Qwen2, Qwen3 (biases, q/k
norms) and Gemma 3 (sandwich norms), Qwen3-MoE's attention, the hybrids'
dense MLPs; or a Gated DeltaNet whose projections take q8
(deltanet_calls).

With q8 activations a prepared attention or MLP is one compiled call
(jit_sublayer: the kernels of ops' q8 path, with no Python between them).
With f32 ones, an attention is one GEMV call for q, k and v, one of
jit_attend._attend and one for o, and an MLP one call for gate and up and
one for down (jit_blocks._gemv), with exactly the arguments
model.CpuModel's general path builds through ops (gemvs with the input
norm, rope_attend, gemv, gemvs with the post norm, act_gemv), between them
the same NumPy adds for biases and the same jit_math.rmsnorm calls for the
q/k norms. Either way: the same kernels on the same values, so the same
bits.

Why: the general path builds those arguments again on every call (ops
wrappers, reshapes, checks, _call_args lookups), a large part of a small
model's decoding step. tests/test_gguf.py (SmolLM2),
test_families_qwen.py (Qwen2, Qwen3, Qwen3-MoE, Qwen3.5) and test_gemma3.py
hold these here to the general path and to the NumPy definition
(conftest.layer_calls_three_ways).
"""

from __future__ import annotations

import numpy as np

from ...formats.matrix import QWeight
from ...layer_graph import SEQUENTIAL, Norm
from ...weights import AttnW, LayerW, MlpW, MoeW
from . import heap, jit, jit_attend, jit_blocks, jit_math, jit_qdot, jit_sublayer, qdot
from .deltanet_calls import DeltaNetCalls, deltanet_mode
from .expert_table import MoeRow

F = np.float32
_NONE1, _NONE2 = jit_blocks._NONE1, jit_blocks._NONE2


def _mode(mats) -> str | None:
    """"q8" (qdot's calls), "f32" (jit_blocks' kernels on blocks they read in
    place) or None: how a sublayer's matrices can be called prepared."""
    if all(isinstance(w, QWeight) and w.acts == "q8" for w in mats):
        return "q8"
    if not all(isinstance(w, QWeight) and w.fmt != "f32" and w.acts == "f32" for w in mats):
        return None
    return "f32" if all(jit_blocks._own(w, *jit_blocks.kernel_args(w)[:2]) for w in mats) else None  # no copies


def attention_mode(lw: LayerW) -> str | None:
    a = lw.mixer
    if lw.kind != "full_attention" or not isinstance(a, AttnW):
        return None
    return _mode((a.q, a.k, a.v, a.o))


def mlp_mode(lw: LayerW) -> str | None:
    f = lw.ffn
    return _mode((f.gate, f.up, f.down)) if isinstance(f, MlpW) else None


class LayerCalls:
    """A layer's prepared sublayers and adds for CpuModel.layer's steps: the
    attention mixer where attention_mode() allows, the MLP where mlp_mode()
    does (``attn``, ``mlp``: their modes, None where the general path runs
    it); h comes as (x, norm name)."""

    def __init__(self, lw: LayerW, cfg):
        a, f, H = lw.mixer, lw.ffn, lw.in_norm.shape[0]
        self.eps = F(cfg.rms_norm_eps)
        self.norms = {name: jit_math._weight(w, H) for name, w in lw.norms.items()}
        self.attn, self.mlp = attention_mode(lw), mlp_mode(lw)
        f32 = (([a.q, a.k, a.v, a.o] if self.attn == "f32" else [])
               + ([f.gate, f.up, f.down] if self.mlp == "f32" else []))
        self.floats = any(w.fmt in jit_blocks.FLOATS for w in f32)     # f16, bf16: bind_float before the calls
        self.inv_h = F(1.0 / H)                     # jit_math.rmsnorm's 1/K
        if self.attn == "q8":                       # words: jit_sublayer's Mats; keep: what they point into
            (self.qkv_words, k1), (self.o_words, k2) = qdot.mat_words([a.q, a.k, a.v]), qdot.mat_words([a.o])
            self.keep = (k1, k2)
        elif self.attn:
            self.qkv, self.qkv_rows = jit_blocks._call_args([a.q, a.k, a.v], True)
            self.o, (self.o_rows,) = jit_blocks._call_args([a.o], True)
        if self.attn:
            self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            self.scale, self.window, self.gated = F(cfg.scores_scale), int(a.window), a.gated
            self.biases = [None if b is None else np.asarray(b, F) for b in (a.q_bias, a.k_bias, a.v_bias, a.o_bias)]
            self.q_norm, self.k_norm = (None if w is None else jit_math._weight(w, self.hd)
                                        for w in (a.q_norm, a.k_norm))
            # jit_sublayer.attention_q8's arguments from the biases to the head count (empty: none)
            self.q8_args = (*(np.zeros(0, F) if b is None else np.ascontiguousarray(b, F) for b in self.biases),
                            *(np.zeros(0, F) if w is None else w for w in (self.q_norm, self.k_norm)),
                            F(1.0 / self.hd), self.nh, self.nkv, self.hd, bool(self.gated))
        if self.mlp == "q8":
            (self.gu_words, k1), (self.down_words, k2) = qdot.mat_words([f.gate, f.up]), qdot.mat_words([f.down])
            self.keep_mlp, self.inter = (k1, k2), f.gate.rows
        elif self.mlp:
            self.gu, self.gu_rows = jit_blocks._call_args([f.gate, f.up], True)
            self.down, (self.down_rows,) = jit_blocks._call_args([f.down], True)
        self.act_name = "gelu_tanh" if cfg.hidden_act == "gelu_tanh" else "silu"
        self.act = jit_math.ELEMENTWISE_OPS[self.act_name]
        self.delta = DeltaNetCalls(lw, cfg, self.norms, self.eps) if deltanet_mode(lw) else None
        self.moe_row = MoeRow(f, cfg) if isinstance(f, MoeW) and MoeRow.qualifies(f, cfg) else None
        # what CpuModel.layer calls for each sublayer (None: the general path)
        self.run_mixer = self.mixer if self.attn else (None if self.delta is None else self.delta.mixer)
        self.run_ffn = self.ffn if self.mlp else None
        # the whole layer in one call (jit_sublayer.layer_q8) where both sublayers are q8 and in sequence
        self.whole = self.attn == "q8" and self.mlp == "q8" and lw.graph == SEQUENTIAL
        if self.whole:
            self.layer_norms = tuple(self.norms[s.weight] for s in lw.graph.steps if isinstance(s, Norm))

    def add(self, lw, x, y, norm):
        """x + y, or x + rmsnorm(y) under a sandwich norm (ops.rmsnorm's residual variant)."""
        return x + (y if norm is None else jit_math.rmsnorm(y, self.norms[norm], self.eps))

    def mixer(self, lw, h, pos, rope, kc, vc, *_):
        x, norm = np.ascontiguousarray(h[0], dtype=F), self.norms[h[1]]
        n = x.shape[0]
        kc, vc = heap.heads_first(kc, True), heap.heads_first(vc, True)
        pos = np.ascontiguousarray(pos, dtype=np.int64)
        cos, sin = (np.ascontiguousarray(t, dtype=F) for t in rope)
        if self.attn == "q8":
            jit_qdot.bind()
            return jit_sublayer.attention_q8(x, norm, self.eps, self.inv_h, self.qkv_words, self.o_words, *self.q8_args,
                                             kc, vc, pos, self.window, self.scale, cos, sin, qdot.THREADS)
        if self.floats:
            jit_qdot.bind_float()
        qkv = [np.empty((n, r), F) for r in self.qkv_rows]
        jit_blocks._gemv(*self.qkv, x, norm, self.eps, _NONE2, 0, *qkv)
        q, k, v = (y if b is None else y + b for y, b in zip(qkv, self.biases))
        if self.gated:                              # q_proj's rows: [q | gate] per head
            q = q.reshape(n, self.nh, 2 * self.hd)
            q, gate = q[:, :, :self.hd], q[:, :, self.hd:].reshape(n, self.nh * self.hd)
        if self.q_norm is not None:                 # per head: rows of hd
            q = jit_math.rmsnorm(q.reshape(n, self.nh, self.hd), self.q_norm, self.eps)
        if self.k_norm is not None:
            k = jit_math.rmsnorm(k.reshape(n, self.nkv, self.hd), self.k_norm, self.eps)
        att = np.empty((n, self.nh, self.hd), F)
        jit_attend._attend(q.reshape(n * self.nh, self.hd), self.nh, kc, vc, pos + 1, self.window, self.scale, att,
                           k.reshape(n, self.nkv, self.hd), v.reshape(n, self.nkv, self.hd), cos, sin, pos)
        att = att.reshape(n, self.nh * self.hd)
        if self.gated:
            att = att * jit_math.sigmoid(gate)
        o = np.empty((n, self.o_rows), F)
        jit_blocks._gemv(*self.o, att, _NONE1, F(0), _NONE2, 0, o, o, o)
        return o if self.biases[3] is None else o + self.biases[3]

    def layer(self, x, pos, rope, kc, vc):
        """The layer's output for rows x (where ``whole``): CpuModel.layer's steps in one call."""
        kc, vc = heap.heads_first(kc, True), heap.heads_first(vc, True)
        jit_qdot.bind()
        return jit_sublayer.layer_q8(np.ascontiguousarray(x, dtype=F), *self.layer_norms, self.eps, self.inv_h,
                                     self.qkv_words, self.o_words, *self.q8_args, kc, vc,
                                     np.ascontiguousarray(pos, dtype=np.int64), self.window, self.scale,
                                     *(np.ascontiguousarray(t, dtype=F) for t in rope), self.gu_words,
                                     self.down_words, self.inter, self.act, qdot.THREADS)

    def ffn(self, lw, h):
        x, norm = h[0], self.norms[h[1]]
        n = x.shape[0]
        if self.mlp == "q8":
            jit_qdot.bind()
            return jit_sublayer.mlp_q8(np.ascontiguousarray(x, dtype=F), norm, self.eps, self.inv_h, self.gu_words,
                                       self.down_words, self.inter, self.act, qdot.THREADS)
        if self.floats:
            jit_qdot.bind_float()
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
        got = (LayerCalls(lw, cfg) if attention_mode(lw) or mlp_mode(lw) or deltanet_mode(lw)
               or (isinstance(lw.ffn, MoeW) and MoeRow.qualifies(lw.ffn, cfg)) else None)
        lw.__dict__["_layer_calls"] = got
    return got
