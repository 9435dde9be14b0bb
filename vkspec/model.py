"""The hybrid model (Qwen3-Next style, and dense Llama) on the exact CPU path.

Weights use Hugging Face's names and parametrisation; the forward pass is
built only from the exact core (vkspec.exact, vkspec.backends.cpu), so every
row of a block of n rows gets the bits it would get fed alone.

Conventions that are easy to get wrong (checked against transformers):
* in_proj_qkvz rows come grouped per key head as [q, k, v(r heads), z(r heads)]
  and in_proj_ba as [b(r), a(r)]; they are permuted once at load into
  [q all | k all | v all | z all] and [b all | a all] (a row permutation
  changes no bits);
* the conv input is cat(q, k, v); g = -exp(A_log) * softplus(a + dt_bias),
  beta = sigmoid(b); q and k are L2-normalised (eps 1e-6), q scaled by dk^-0.5;
* every RMSNorm is (1 + w) except linear_attn.norm (gated, plain w);
* q_proj yields [q, gate] per head; the attention output is multiplied by
  sigmoid(gate) before o_proj.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import exact
from .backends import cpu as ops
from .checkpoint import Checkpoint
from .config import ModelConfig
from .errors import VkspecError
from .quant import QWeight, quantize, take_rows

f32 = np.float32


@dataclass
class AttnW:
    q: QWeight
    k: QWeight
    v: QWeight
    o: QWeight
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    gated: bool


@dataclass
class DeltaW:
    qkvz: QWeight
    ba: QWeight
    conv: np.ndarray          # (conv_dim, K)
    dt_bias: np.ndarray
    neg_exp_a: np.ndarray     # -exp(A_log), exact, computed once
    norm: np.ndarray
    out: QWeight


@dataclass
class MlpW:
    gate: QWeight
    up: QWeight
    down: QWeight


@dataclass
class MoeW:
    router: QWeight
    experts: list[MlpW]
    shared: MlpW | None
    shared_gate: QWeight | None
    stacked: tuple | None = None  # f32: every expert's (gate, up, down) in one array each


@dataclass
class LayerW:
    kind: str                 # "linear_attention" | "full_attention"
    in_norm: np.ndarray
    post_norm: np.ndarray
    mixer: AttnW | DeltaW
    ffn: MlpW | MoeW


@dataclass
class MtpW:
    fc: QWeight
    norm_emb: np.ndarray
    norm_hidden: np.ndarray
    layer: LayerW
    norm: np.ndarray


@dataclass
class Weights:
    embed: np.ndarray         # (V, H) float32
    layers: list[LayerW]
    norm: np.ndarray
    lm_head: QWeight
    mtp: MtpW | None = None


class Loader:
    def __init__(self, cfg: ModelConfig, ckpt: Checkpoint, fmt: str):
        self.cfg, self.ckpt, self.fmt = cfg, ckpt, fmt

    def t(self, name, shape):
        return self.ckpt.get(name, shape)

    def norm(self, name, n):
        w = self.t(name, (n,))
        return (f32(1.0) + w).astype(f32) if self.cfg.norm_plus_one else np.array(w, dtype=f32)

    def lin(self, name, rows, cols):
        return quantize(self.t(name, (rows, cols)), self.fmt)

    def attn(self, p) -> AttnW:
        c = self.cfg
        nh, nkv, hd, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
        gated = c.model_type == "qwen3_next"
        return AttnW(
            q=self.lin(f"{p}.q_proj.weight", nh * hd * (2 if gated else 1), h),
            k=self.lin(f"{p}.k_proj.weight", nkv * hd, h),
            v=self.lin(f"{p}.v_proj.weight", nkv * hd, h),
            o=self.lin(f"{p}.o_proj.weight", h, nh * hd),
            q_norm=self.norm(f"{p}.q_norm.weight", hd) if gated else None,
            k_norm=self.norm(f"{p}.k_norm.weight", hd) if gated else None,
            gated=gated)

    def delta(self, p) -> DeltaW:
        c = self.cfg
        nk, nv, dk, dv, h = (c.linear_num_key_heads, c.linear_num_value_heads,
                             c.linear_key_head_dim, c.linear_value_head_dim, c.hidden_size)
        r = nv // nk
        per = 2 * dk + 2 * r * dv
        w = self.t(f"{p}.in_proj_qkvz.weight", (nk * per, h)).reshape(nk, per, h)
        q, k = w[:, :dk], w[:, dk:2 * dk]
        v, z = w[:, 2 * dk:2 * dk + r * dv], w[:, 2 * dk + r * dv:]
        qkvz = np.concatenate([x.reshape(-1, h) for x in (q, k, v, z)])
        ba = self.t(f"{p}.in_proj_ba.weight", (nk * 2 * r, h)).reshape(nk, 2 * r, h)
        ba = np.concatenate([ba[:, :r].reshape(-1, h), ba[:, r:].reshape(-1, h)])
        conv_dim = 2 * nk * dk + nv * dv
        kk = c.linear_conv_kernel_dim
        return DeltaW(
            qkvz=quantize(qkvz, self.fmt), ba=quantize(ba, self.fmt),
            conv=np.ascontiguousarray(self.t(f"{p}.conv1d.weight", (conv_dim, 1, kk))[:, 0]),
            dt_bias=np.array(self.t(f"{p}.dt_bias", (nv,)), dtype=f32),
            neg_exp_a=-exact.exp(self.t(f"{p}.A_log", (nv,))),
            norm=np.array(self.t(f"{p}.norm.weight", (dv,)), dtype=f32),
            out=self.lin(f"{p}.out_proj.weight", h, nv * dv))

    def mlp(self, p, inter) -> MlpW:
        h = self.cfg.hidden_size
        return MlpW(self.lin(f"{p}.gate_proj.weight", inter, h),
                    self.lin(f"{p}.up_proj.weight", inter, h),
                    self.lin(f"{p}.down_proj.weight", h, inter))

    def moe(self, p) -> MoeW:
        c = self.cfg
        h, e, mi = c.hidden_size, c.num_experts, c.moe_intermediate_size
        if f"{p}.experts.gate_up_proj" in self.ckpt:     # transformers' fused layout
            gu = self.t(f"{p}.experts.gate_up_proj", (e, 2 * mi, h))
            dn = self.t(f"{p}.experts.down_proj", (e, h, mi))
            experts = [MlpW(quantize(gu[i, :mi], self.fmt), quantize(gu[i, mi:], self.fmt),
                            quantize(dn[i], self.fmt)) for i in range(e)]
        else:
            experts = [self.mlp(f"{p}.experts.{i}", mi) for i in range(e)]
        si = c.shared_expert_intermediate_size
        return MoeW(router=self.lin(f"{p}.gate.weight", e, h), experts=experts,
                    shared=self.mlp(f"{p}.shared_expert", si) if si else None,
                    shared_gate=self.lin(f"{p}.shared_expert_gate.weight", 1, h) if si else None,
                    stacked=stack_experts(experts) if self.fmt == "f32" else None)

    def layer(self, p, i, kind) -> LayerW:
        c = self.cfg
        mixer = self.delta(f"{p}.linear_attn") if kind == "linear_attention" else self.attn(f"{p}.self_attn")
        ffn = self.moe(f"{p}.mlp") if c.is_moe_layer(i) else self.mlp(f"{p}.mlp", c.intermediate_size)
        return LayerW(kind, self.norm(f"{p}.input_layernorm.weight", c.hidden_size),
                      self.norm(f"{p}.post_attention_layernorm.weight", c.hidden_size), mixer, ffn)

    def load(self, mtp: bool) -> Weights:
        c = self.cfg
        h, v = c.hidden_size, c.vocab_size
        embed = np.array(self.t("model.embed_tokens.weight", (v, h)), dtype=f32)
        layers = [self.layer(f"model.layers.{i}", i, kind) for i, kind in enumerate(c.layer_types)]
        head_name = "model.embed_tokens.weight" if c.tie_word_embeddings or "lm_head.weight" not in self.ckpt \
            else "lm_head.weight"
        if head_name == "model.embed_tokens.weight" and not c.tie_word_embeddings:
            raise VkspecError(f"{self.ckpt.dir}: missing tensor lm_head.weight")
        w = Weights(embed=embed, layers=layers, norm=self.norm("model.norm.weight", h),
                    lm_head=self.lin(head_name, v, h))
        if mtp:
            moe_mtp = c.num_experts > 0
            lw = LayerW("full_attention", self.norm("mtp.layers.0.input_layernorm.weight", h),
                        self.norm("mtp.layers.0.post_attention_layernorm.weight", h),
                        self.attn("mtp.layers.0.self_attn"),
                        self.moe("mtp.layers.0.mlp") if moe_mtp else self.mlp("mtp.layers.0.mlp", c.intermediate_size))
            w.mtp = MtpW(fc=self.lin("mtp.fc.weight", h, 2 * h),
                         norm_emb=self.norm("mtp.pre_fc_norm_embedding.weight", h),
                         norm_hidden=self.norm("mtp.pre_fc_norm_hidden.weight", h),
                         layer=lw, norm=self.norm("mtp.norm.weight", h))
        return w


def stack_experts(experts: list[MlpW]) -> tuple:
    """One (E, rows, cols_p) array per projection, each expert's weight a view
    of it (no second copy): the compiled CPU path runs every routed pair of a
    block in one call."""
    out = []
    for name in ("gate", "up", "down"):
        stack = np.stack([getattr(e, name).data for e in experts])
        for e, view in zip(experts, stack):
            getattr(e, name).data = view
        out.append(stack)
    return tuple(out)


def has_mtp(ckpt: Checkpoint) -> bool:
    return "mtp.fc.weight" in ckpt


# --- state -------------------------------------------------------------------

@dataclass
class State:
    """Everything a forward reads and writes besides the weights."""
    kv_k: list                      # per attention layer: (ctx, nkv, hd)
    kv_v: list
    conv: list                      # per DeltaNet layer: (K-1, conv_dim) ring, oldest first
    ssm: list                       # per DeltaNet layer: (nv, dk, dv)
    kv_len: int = 0
    mtp_k: np.ndarray | None = None
    mtp_v: np.ndarray | None = None
    mtp_len: int = 0
    extra: dict = field(default_factory=dict)

    def recurrent_copy(self):
        return [c.copy() for c in self.conv], [s.copy() for s in self.ssm]

    def set_recurrent(self, copy):
        conv, ssm = copy
        for dst, src in zip(self.conv, conv):
            dst[...] = src
        for dst, src in zip(self.ssm, ssm):
            dst[...] = src


# --- the forward pass ----------------------------------------------------------

class Model:
    """The reference: the hybrid on the exact NumPy path."""
    max_rows = 32
    backend = "cpu"

    def __init__(self, cfg: ModelConfig, weights: Weights, ctx: int | None = None):
        self.cfg, self.w = cfg, weights
        self.ctx = ctx or min(cfg.max_position_embeddings, 4096)
        self.cos, self.sin = rope_tables(cfg, self.ctx)
        self._listed = (None, None)          # (draft vocabulary ids, their lm_head rows)

    # state
    def new_state(self) -> State:
        c = self.cfg
        kv_k, kv_v, conv, ssm = [], [], [], []
        for kind in c.layer_types:
            if kind == "full_attention":
                kv_k.append(np.zeros((self.ctx, c.num_key_value_heads, c.head_dim), f32))
                kv_v.append(np.zeros((self.ctx, c.num_key_value_heads, c.head_dim), f32))
            else:
                cd = 2 * c.linear_num_key_heads * c.linear_key_head_dim + \
                    c.linear_num_value_heads * c.linear_value_head_dim
                conv.append(np.zeros((c.linear_conv_kernel_dim - 1, cd), f32))
                ssm.append(np.zeros((c.linear_num_value_heads, c.linear_key_head_dim,
                                     c.linear_value_head_dim), f32))
        st = State(kv_k, kv_v, conv, ssm)
        if self.w.mtp is not None:
            st.mtp_k = np.zeros((self.ctx, c.num_key_value_heads, c.head_dim), f32)
            st.mtp_v = np.zeros_like(st.mtp_k)
        return st

    def forward(self, tokens, st: State, logits_rows: str = "all", copies: int | bool = 0):
        """Feed n tokens at positions kv_len..kv_len+n-1.

        Returns (hidden, logits): hidden (n, H) is the last layer's output
        before the final norm (what the MTP head reads); logits (n, V) for
        every row, or (1, V) for the last row with logits_rows="last".
        ``copies`` rows (True: all but the last) keep the recurrent state after
        them for :meth:`rewind`; the state before the block is always kept.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        n = tokens.shape[0]
        if st.kv_len + n > self.ctx:
            raise VkspecError(f"context full: {st.kv_len} + {n} tokens > {self.ctx}")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise VkspecError(f"token id out of range 0..{self.cfg.vocab_size - 1}")
        pos = st.kv_len + np.arange(n)
        x = ops.embed(self.w.embed, tokens)
        copies = min(n - 1, n - 1 if copies is True else int(copies))
        kept = [([], []) for _ in range(copies)]
        st.extra["block"] = (st.kv_len, n, st.recurrent_copy(), kept)
        ai = di = 0
        for lw in self.w.layers:
            if lw.kind == "full_attention":
                x = self.layer(lw, x, pos, st.kv_k[ai], st.kv_v[ai])
                ai += 1
            else:
                x = self.layer(lw, x, pos, st.conv[di], st.ssm[di], kept)
                di += 1
        st.kv_len += n
        rows = x if logits_rows == "all" else x[-1:]
        logits = ops.gemv(self.w.lm_head, ops.rmsnorm(rows, self.w.norm, self.cfg.rms_norm_eps))
        return x, logits

    def layer(self, lw: LayerW, x, pos, s1, s2, kept=None):
        eps = self.cfg.rms_norm_eps
        h = ops.rmsnorm(x, lw.in_norm, eps)
        if lw.kind == "full_attention":
            a = self.attention(lw.mixer, h, pos, s1, s2)
        else:
            a = self.deltanet(lw.mixer, h, s1, s2, kept)
        x = x + a
        h = ops.rmsnorm(x, lw.post_norm, eps)
        m = self.moe(lw.ffn, h) if isinstance(lw.ffn, MoeW) else self.mlp(lw.ffn, h)
        return x + m

    def attention(self, w: AttnW, h, pos, kcache, vcache):
        c = self.cfg
        n, nh, nkv, hd = h.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = ops.gemv(w.q, h)
        if w.gated:
            q = q.reshape(n, nh, 2 * hd)
            q, gate = q[:, :, :hd], q[:, :, hd:].reshape(n, nh * hd)
        q = q.reshape(n, nh, hd)
        if w.q_norm is not None:
            q = ops.rmsnorm(q, w.q_norm, c.rms_norm_eps)
        q = ops.rope(q, self.cos[pos], self.sin[pos])
        self.write_kv(w, h, pos, kcache, vcache)
        out = ops.attend(q, kcache, vcache, np.asarray(pos) + 1, f32(hd ** -0.5)).reshape(n, nh * hd)
        if w.gated:
            out = out * ops.sigmoid(gate)
        return ops.gemv(w.o, out)

    def write_kv(self, w: AttnW, h, pos, kcache, vcache):
        """The rows' keys (normed, rotated) and values into the cache at pos."""
        c = self.cfg
        n, nkv, hd = h.shape[0], c.num_key_value_heads, c.head_dim
        k = ops.gemv(w.k, h).reshape(n, nkv, hd)
        if w.k_norm is not None:
            k = ops.rmsnorm(k, w.k_norm, c.rms_norm_eps)
        kcache[pos] = ops.rope(k, self.cos[pos], self.sin[pos])
        vcache[pos] = ops.gemv(w.v, h).reshape(n, nkv, hd)

    def deltanet(self, w: DeltaW, h, ring, ssm, kept=None):
        c = self.cfg
        n = h.shape[0]
        nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                          c.linear_key_head_dim, c.linear_value_head_dim)
        qkvz = ops.gemv(w.qkvz, h)
        ba = ops.gemv(w.ba, h)
        cd = 2 * nk * dk + nv * dv
        K = w.conv.shape[1]
        mixed, window = ops.conv_step(ring, qkvz[:, :cd], w.conv)
        q, k, beta, decay = ops.deltanet_prep(
            mixed[:, :nk * dk].reshape(n, nk, dk), mixed[:, nk * dk:2 * nk * dk].reshape(n, nk, dk),
            ba[:, :nv], ba[:, nv:], w.dt_bias, w.neg_exp_a, f32(dk ** -0.5))
        rep = np.arange(nv) // (nv // nk)
        v = mixed[:, 2 * nk * dk:].reshape(n, nv, dv)
        out, snaps = ops.deltanet_scan(ssm, q[:, rep], k[:, rep], v, beta, decay, len(kept))
        for i in range(len(kept)):
            kept[i][0].append(window[i + 1:i + K].copy())
            kept[i][1].append(snaps[i])
        ring[:] = window[n:]
        z = qkvz[:, cd:].reshape(n, nv, dv)
        o = ops.rmsnorm_gated(out, w.norm, z, c.rms_norm_eps).reshape(n, nv * dv)
        return ops.gemv(w.out, o)

    def mlp(self, w: MlpW, h):
        return ops.gemv(w.down, ops.silu_mul(ops.gemv(w.gate, h), ops.gemv(w.up, h)))

    def moe(self, w: MoeW, h):
        c = self.cfg
        probs = ops.softmax(ops.gemv(w.router, h))
        idx, wt = ops.route(probs, c.num_experts_per_tok, c.norm_topk_prob)     # (n, k) each
        ys = ops.expert_mlps(w, h, idx)                                          # (n, k, H)
        if w.shared is None:
            return ops.moe_combine(ys, wt)
        return ops.moe_combine(ys, wt, self.mlp(w.shared, h), ops.gemv(w.shared_gate, h)[:, 0])

    def rewind(self, st: State, keep: int):
        """Keep rows 0..keep-1 of the last block (0: none, the state before it):
        kv_len comes down and the recurrent state after row keep-1 comes back."""
        if "block" not in st.extra:
            raise VkspecError("rewind needs a block forwarded just before")
        kv0, n, before, kept = st.extra["block"]
        if not 0 <= keep <= n:
            raise VkspecError(f"rewind keeps 0..{n} rows, got {keep}")
        if keep < n:
            if keep and keep > len(kept):
                raise VkspecError(f"row {keep - 1} of the last block has no copy slot")
            st.set_recurrent(kept[keep - 1] if keep else before)
        st.kv_len = kv0 + keep

    def snapshot(self, st: State) -> State:
        """A copy of the state (KV rows up to kv_len, the MTP head's rows just
        past it, the recurrent state), for :meth:`restore`."""
        rows = min(self.ctx, st.kv_len + 8)
        conv, ssm = st.recurrent_copy()
        snap = State([k[:st.kv_len].copy() for k in st.kv_k], [v[:st.kv_len].copy() for v in st.kv_v],
                     conv, ssm, kv_len=st.kv_len)
        if st.mtp_k is not None:
            snap.mtp_k, snap.mtp_v = st.mtp_k[:rows].copy(), st.mtp_v[:rows].copy()
        return snap

    def restore(self, st: State, snap: State):
        for dst, src in zip(st.kv_k + st.kv_v, snap.kv_k + snap.kv_v):
            dst[:len(src)] = src
        st.set_recurrent((snap.conv, snap.ssm))
        if snap.mtp_k is not None:
            st.mtp_k[:len(snap.mtp_k)] = snap.mtp_k
            st.mtp_v[:len(snap.mtp_v)] = snap.mtp_v
        st.kv_len = snap.kv_len
        st.extra.pop("block", None)

    # --- the MTP head -------------------------------------------------------
    def mtp_forward(self, hidden, next_tokens, st: State, positions, logits_rows: str = "all", ids=None):
        """One row per (h_t, token t+1): fc(cat[norm_emb(embed(t+1)), norm_hidden(h_t)]),
        the head's decoder layer (its own KV cache), its norm and the lm_head
        (only its rows ``ids``, ascending, when given: logits[:, j] is the
        score of token ids[j], the same bits as in the whole row).

        Rows are written at the given positions of the head's cache (the
        token t+1's position); returns (head hidden, logits). With
        logits_rows="last" the rows before the last only write their KV row
        (the head is one layer: nothing else of theirs is ever read) and the
        last row's (hidden, logits) come back, (1, H) and (1, V)."""
        m, eps = self.w.mtp, self.cfg.rms_norm_eps
        e = ops.rmsnorm(ops.embed(self.w.embed, next_tokens), m.norm_emb, eps)
        hh = ops.rmsnorm(np.asarray(hidden, f32), m.norm_hidden, eps)
        x = ops.gemv(m.fc, np.concatenate([e, hh], axis=-1))
        pos = np.asarray(positions)
        if logits_rows == "last" and len(x) > 1:
            self.write_kv(m.layer.mixer, ops.rmsnorm(x[:-1], m.layer.in_norm, eps), pos[:-1],
                          st.mtp_k, st.mtp_v)
            x, pos = x[-1:], pos[-1:]
        x = self.layer(m.layer, x, pos, st.mtp_k, st.mtp_v)
        head = self.w.lm_head if ids is None else self._listed_head(ids)
        logits = ops.gemv(head, ops.rmsnorm(x, m.norm, eps))
        return x, logits

    def _listed_head(self, ids):
        """The lm_head's rows of a draft vocabulary, kept while the list (an
        array DraftVocab replaces, never edits) stays the same object."""
        if self._listed[0] is not ids:
            self._listed = (ids, take_rows(self.w.lm_head, ids))
        return self._listed[1]


def rope_tables(cfg: ModelConfig, ctx: int):
    """cos/sin (ctx, rotary_dim) computed once on the host, as transformers does:
    float32 inverse frequencies and angles, cos/sin rounded to float32."""
    dim = cfg.rotary_dim
    inv = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / f32(dim)))).astype(f32)
    ang = (np.arange(ctx, dtype=f32)[:, None] * inv[None, :]).astype(f32)
    ang = np.concatenate([ang, ang], axis=1).astype(np.float64)
    return np.cos(ang).astype(f32), np.sin(ang).astype(f32)


def load_model(model_dir, fmt: str = "f32", mtp: bool | None = None, ctx: int | None = None,
               backend: str = "cpu", device_gb: float | None = None, tier=None):
    """The model on a backend: "cpu" (the NumPy reference) or "vulkan" (the
    dense chain; ``tier``, a vkspec.tier.resident.TierConfig, keeps only some
    routed experts on the device). Both have the same interface and give the
    same bits."""
    from .config import from_dict, load_config
    from .gguf_file import GgufFile, is_gguf
    if backend not in ("cpu", "vulkan"):
        raise VkspecError(f"unknown backend {backend!r} (cpu, vulkan)")
    if is_gguf(model_dir):
        if fmt != "f32":
            raise VkspecError(f"{model_dir}: a GGUF runs at f32 (its own weights, dequantised "
                              f"exactly); --dtype {fmt} would re-quantise it")
        ckpt = GgufFile(model_dir)
        cfg = from_dict(ckpt.config_dict(), str(model_dir))
    else:
        cfg = load_config(model_dir)
        ckpt = Checkpoint(model_dir)
    want_mtp = has_mtp(ckpt) if mtp is None else mtp
    if want_mtp and not has_mtp(ckpt):
        raise VkspecError(f"{model_dir}: the checkpoint has no MTP head (mtp.fc.weight)")
    weights = Loader(cfg, ckpt, fmt).load(want_mtp)
    if backend == "vulkan":
        from .chain import VulkanModel
        return VulkanModel(cfg, weights, ctx, budget_gb=device_gb, tier=tier)
    if tier is not None:
        raise VkspecError("the expert tier needs --backend vulkan")
    return Model(cfg, weights, ctx)
