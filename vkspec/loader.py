"""A checkpoint (HF safetensors directory or GGUF file) becomes Weights, and
Weights become a model on a backend.

Conventions that are easy to get wrong (checked against transformers):
* Qwen3-Next's in_proj_qkvz rows come grouped per key head as
  [q, k, v(r heads), z(r heads)] and in_proj_ba as [b(r), a(r)]; they are read
  in the order [q all | k all | v all | z all] and [b all | a all] (a row
  permutation changes no bits). Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b,
  in_proj_a (and llama.cpp's attn_qkv, attn_gate) already are that order:
  separate matrices, consecutive parts of one weight on the device;
* with norm_plus_one every RMSNorm is (1 + w) except linear_attn.norm (gated,
  plain w): the effective weight 1 + w is computed once here, in float32;
* the names are Hugging Face's; a GGUF file (gguf_file) and a composite
  checkpoint (``model.language_model.*``, TextModelNames) answer to them.
"""

from __future__ import annotations

import numpy as np

from . import exact
from .checkpoint import Checkpoint
from .config import ModelConfig
from .errors import VkspecError
from .formats.quant import quantize
from .weights import ACTIVATIONS, AttnW, DeltaW, LayerW, MlpW, MoeW, MtpW, Weights, set_activations

f32 = np.float32


class Loader:
    """Reads one tensor at a time. Matrices stay in the checkpoint's format
    (views of the mapped file) unless ``fmt`` asks for int8 / int4-g64, which
    quantises each one alone; vectors (norms, biases) are read as float32."""

    def __init__(self, cfg: ModelConfig, ckpt: Checkpoint, fmt: str):
        self.cfg, self.ckpt, self.fmt = cfg, ckpt, fmt

    def t(self, name, shape):
        return self.ckpt.get(name, shape)

    def norm(self, name, n):
        w = self.t(name, (n,))
        return (f32(1.0) + w).astype(f32) if self.cfg.norm_plus_one else np.array(w, dtype=f32)

    def vec(self, name, n):
        return np.array(self.t(name, (n,)), dtype=f32)

    def lin(self, name, rows, cols, order=None):
        w = self.ckpt.matrix(name, (rows, cols))
        return quantize(w if order is None else w.reordered(order), self.fmt)

    def attn(self, p, i=None) -> AttnW:
        """Layer i's attention (None: the MTP head's, full and at rope_theta)."""
        c = self.cfg
        nh, nkv, hd, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
        qr = nh * hd * (2 if c.attn_gate else 1)

        def bias(proj, rows, present):
            return self.vec(f"{p}.{proj}_proj.bias", rows) if present else None
        return AttnW(
            q=self.lin(f"{p}.q_proj.weight", qr, h),
            k=self.lin(f"{p}.k_proj.weight", nkv * hd, h),
            v=self.lin(f"{p}.v_proj.weight", nkv * hd, h),
            o=self.lin(f"{p}.o_proj.weight", h, nh * hd),
            q_norm=self.norm(f"{p}.q_norm.weight", hd) if c.qk_norm else None,
            k_norm=self.norm(f"{p}.k_norm.weight", hd) if c.qk_norm else None,
            gated=c.attn_gate, q_bias=bias("q", qr, c.qkv_bias), k_bias=bias("k", nkv * hd, c.qkv_bias),
            v_bias=bias("v", nkv * hd, c.qkv_bias), o_bias=bias("o", h, c.o_bias),
            window=0 if i is None else c.window_of(i),
            rope_theta=None if i is None or c.rope_theta_of(i) == c.rope_theta else c.rope_theta_of(i))

    def delta(self, p) -> DeltaW:
        c = self.cfg
        nk, nv, dk, dv, h = (c.linear_num_key_heads, c.linear_num_value_heads,
                             c.linear_key_head_dim, c.linear_value_head_dim, c.hidden_size)
        r = nv // nk
        per = 2 * dk + 2 * r * dv
        heads = np.arange(nk)[:, None]
        # rows grouped per key head [q, k, v(r heads), z(r heads)] -> [q all | k all | v all | z all]
        qkvz = np.concatenate([(heads * per + lo + np.arange(n)).reshape(-1)
                               for lo, n in ((0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv))])
        ba = np.concatenate([(heads * 2 * r + lo + np.arange(r)).reshape(-1) for lo in (0, r)])
        conv_dim = 2 * nk * dk + nv * dv
        kk = c.linear_conv_kernel_dim
        has = self.ckpt.__contains__
        if has(f"{p}.in_proj_qkvz.weight") or not has(f"{p}.in_proj_qkv.weight"):
            proj = [self.lin(f"{p}.in_proj_qkvz.weight", nk * per, h, qkvz)]
        else:
            proj = [self.lin(f"{p}.in_proj_qkv.weight", conv_dim, h), self.lin(f"{p}.in_proj_z.weight", nv * dv, h)]
        if has(f"{p}.in_proj_ba.weight") or not has(f"{p}.in_proj_b.weight"):
            proj.append(self.lin(f"{p}.in_proj_ba.weight", nk * 2 * r, h, ba))
        else:
            proj += [self.lin(f"{p}.in_proj_b.weight", nv, h), self.lin(f"{p}.in_proj_a.weight", nv, h)]
        # llama.cpp stores -exp(A_log) itself (ssm_a); from A_log it is vkspec's exact exp
        neg_exp_a = (self.vec(f"{p}.ssm_a", nv) if has(f"{p}.ssm_a")
                     else -exact.exp(self.t(f"{p}.A_log", (nv,))))
        return DeltaW(
            proj=proj,
            conv=np.ascontiguousarray(self.t(f"{p}.conv1d.weight", (conv_dim, 1, kk))[:, 0]),
            dt_bias=np.array(self.t(f"{p}.dt_bias", (nv,)), dtype=f32),
            neg_exp_a=neg_exp_a,
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
        if f"{p}.experts.gate_up_proj" in self.ckpt:     # transformers' fused layout: views of one tensor
            gu = self.ckpt.matrix(f"{p}.experts.gate_up_proj", (e, 2 * mi, h))
            dn = self.ckpt.matrix(f"{p}.experts.down_proj", (e, h, mi))
            experts = [MlpW(quantize(gu.rows_of(2 * mi * i, 2 * mi * i + mi), self.fmt),
                            quantize(gu.rows_of(2 * mi * i + mi, 2 * mi * (i + 1)), self.fmt),
                            quantize(dn.rows_of(h * i, h * (i + 1)), self.fmt)) for i in range(e)]
        else:
            experts = [self.mlp(f"{p}.experts.{i}", mi) for i in range(e)]
        si = c.shared_expert_intermediate_size
        return MoeW(router=self.lin(f"{p}.gate.weight", e, h), experts=experts,
                    shared=self.mlp(f"{p}.shared_expert", si) if si else None,
                    shared_gate=self.lin(f"{p}.shared_expert_gate.weight", 1, h) if si else None)

    def layer(self, p, i, kind) -> LayerW:
        c = self.cfg
        mixer = self.delta(f"{p}.linear_attn") if kind == "linear_attention" else self.attn(f"{p}.self_attn", i)
        ffn = self.moe(f"{p}.mlp") if c.is_moe_layer(i) else self.mlp(f"{p}.mlp", c.intermediate_size)
        return self.layer_w(p, kind, mixer, ffn)

    def layer_w(self, p, kind, mixer, ffn) -> LayerW:
        """A layer's weights, with the norms its family's graph names."""
        g = self.cfg.layer_graph
        return LayerW(kind, g, {n: self.norm(f"{p}.{n}.weight", self.cfg.hidden_size) for n in g.norm_names},
                      mixer, ffn)

    def load(self, mtp: bool) -> Weights:
        c = self.cfg
        h, v = c.hidden_size, c.vocab_size
        embed = self.ckpt.matrix("model.embed_tokens.weight", (v, h))     # looked up, never quantised here
        layers = [self.layer(f"model.layers.{i}", i, kind) for i, kind in enumerate(c.layer_types)]
        head_name = "model.embed_tokens.weight" if c.tie_word_embeddings or "lm_head.weight" not in self.ckpt \
            else "lm_head.weight"
        if head_name == "model.embed_tokens.weight" and not c.tie_word_embeddings:
            raise VkspecError(f"{self.ckpt.dir}: missing tensor lm_head.weight")
        head = quantize(embed, self.fmt) if head_name == "model.embed_tokens.weight" else self.lin(head_name, v, h)
        w = Weights(embed=embed, layers=layers, norm=self.norm("model.norm.weight", h), lm_head=head)
        if mtp:
            moe_mtp = c.num_experts > 0
            lw = self.layer_w("mtp.layers.0", "full_attention", self.attn("mtp.layers.0.self_attn"),
                              self.moe("mtp.layers.0.mlp") if moe_mtp else self.mlp("mtp.layers.0.mlp",
                                                                                    c.intermediate_size))
            w.mtp = MtpW(fc=self.lin("mtp.fc.weight", h, 2 * h),
                         norm_emb=self.norm("mtp.pre_fc_norm_embedding.weight", h),
                         norm_hidden=self.norm("mtp.pre_fc_norm_hidden.weight", h),
                         layer=lw, norm=self.norm("mtp.norm.weight", h))
        return w


def has_mtp(ckpt) -> bool:
    return "mtp.fc.weight" in ckpt


def open_checkpoint(model_dir, fmt: str = "f32"):
    """(config, checkpoint) of a checkpoint directory or a .gguf file; the
    metadata is read once."""
    from .config import from_dict, load_config
    from .gguf_file import is_gguf, open_gguf
    if is_gguf(model_dir):
        if fmt != "f32":
            raise VkspecError(f"{model_dir}: a GGUF runs in its own blocks; --dtype {fmt} would "
                              "re-quantise it")
        ckpt = open_gguf(model_dir)
        return from_dict(ckpt.config_dict(), str(model_dir)), ckpt
    ckpt = Checkpoint(model_dir)
    if any(n.startswith(TextModelNames.PREFIX) for n in ckpt.names()):
        ckpt = TextModelNames(ckpt)
    return load_config(model_dir), ckpt


class TextModelNames:
    """A composite checkpoint (Qwen3.5 on the Hub: model.language_model.*,
    model.visual.*, top-level lm_head and mtp.*) read as its text model:
    model.X is model.language_model.X; the vision tower is never read."""
    PREFIX = "model.language_model."

    def __init__(self, ckpt: Checkpoint):
        self.inner = ckpt

    def _name(self, name: str) -> str:
        return self.PREFIX + name[len("model."):] if name.startswith("model.") else name

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.inner

    def get(self, name, shape=None):
        return self.inner.get(self._name(name), shape)

    def matrix(self, name, shape):
        return self.inner.matrix(self._name(name), shape)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def with_mtp_file(model_dir, ckpt, mtp: bool | None, mtp_file=None):
    """The checkpoint, with the MTP head of an MTP-only GGUF (vkspec.mtp_file)
    when one is named, or when a GGUF without a head of its own has one beside
    it and the head may be used."""
    from .gguf_file import is_gguf, open_gguf
    from .mtp_file import WithMtpFile, beside
    if mtp_file is None:
        # only the hybrids' releases carry a head; a file beside another model is not its head
        if mtp is False or not is_gguf(model_dir) or has_mtp(ckpt) or not ckpt.family.hybrid:
            return ckpt
        mtp_file = beside(model_dir)
        if mtp_file is None or open_gguf(mtp_file).arch != ckpt.arch:
            return ckpt
    elif not is_gguf(model_dir):
        raise VkspecError(f"{model_dir}: --mtp-file goes with a .gguf model (a checkpoint folder has its mtp.* "
                          "tensors)")
    if not is_gguf(mtp_file):
        raise VkspecError(f"{mtp_file}: not a .gguf file")
    return WithMtpFile(ckpt, open_gguf(mtp_file))


def load_model(model_dir, fmt: str = "f32", mtp: bool | None = None, ctx: int | None = None,
               backend: str = "cpu", device_gb: float | None = None, tier=None, activations: str = "q8",
               mtp_file=None):
    """The model on a backend: "cpu" (the NumPy reference) or "vulkan" (the
    dense chain; ``tier``, a vkspec.tier.resident.TierConfig, keeps only some
    routed experts on the device). Both have the same interface and give the
    same bits. ``activations``: "f32" or "q8" (weights.set_activations).
    ``mtp_file``: an MTP-only GGUF for a GGUF model (else one found beside it)."""
    if backend not in ("cpu", "vulkan"):
        raise VkspecError(f"unknown backend {backend!r} (cpu, vulkan)")
    if activations not in ACTIVATIONS:
        raise VkspecError(f"unknown activations {activations!r} ({', '.join(ACTIVATIONS)})")
    from .backends.cpu.fpenv import ensure_ieee
    from .gguf_file import is_gguf
    # the sampler computes on the CPU with NumPy on both backends; numba
    # runs only the CPU model's ops and the tier's CPU experts
    ensure_ieee(numba=backend == "cpu" or tier is not None)
    cfg, ckpt = open_checkpoint(model_dir, fmt)
    ckpt = with_mtp_file(model_dir, ckpt, mtp, mtp_file)
    if backend == "vulkan":
        from .shaders.limits import check
        problems = check(cfg)
        if problems:                     # before a weight is read
            raise VkspecError(f"{model_dir}: {problems[0]}; run it with --backend cpu")
    want_mtp = has_mtp(ckpt) if mtp is None else mtp
    if want_mtp and not has_mtp(ckpt):
        where = "no nextn tensors, no mtp-*.gguf beside it" if is_gguf(model_dir) else "mtp.fc.weight"
        raise VkspecError(f"{model_dir}: the checkpoint has no MTP head ({where})")
    weights = Loader(cfg, ckpt, fmt).load(want_mtp)
    set_activations(weights, activations)
    if backend == "vulkan":
        from .backends.vulkan.model import VulkanModel
        model = VulkanModel(cfg, weights, ctx, budget_gb=device_gb, tier=tier)
        ckpt.drop_pages()               # the device holds the weights now
        return model
    if tier is not None:
        raise VkspecError("the expert tier needs --backend vulkan")
    from .backends.cpu.model import CpuModel
    if hasattr(ckpt, "map_pages"):      # a GGUF: the weights are the file's pages
        ckpt.map_pages()
    return CpuModel(cfg, weights, ctx)
