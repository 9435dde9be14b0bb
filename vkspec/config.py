"""Model configuration from a Hugging Face config.json (or a GGUF's metadata,
translated by vkspec.families): the families' shapes and feature flags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import families
from .layer_graph import SEQUENTIAL, LayerGraph
from .errors import VkspecError

SUPPORTED = tuple(families.FAMILIES)


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int
    layer_types: list[str]
    # Gated DeltaNet
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    # value head j reads key head j % nk: llama.cpp's tiled order, kept where a
    # GGUF's ssm_out blocks span value heads (family_qwen35); else j // (nv / nk)
    linear_v_tiled: bool = False
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    # MTP head
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    # feature flags (vkspec.families says which family has which)
    norm_plus_one: bool = True      # (1 + w) RMSNorms (HF Qwen3-Next / Qwen3.5, Gemma 3); else plain w
    qk_norm: bool = False           # per-head RMSNorm of q and k before RoPE
    attn_gate: bool = False         # q_proj yields [q | gate] per head; output * sigmoid(gate)
    qkv_bias: bool = False          # q, k, v projections have biases
    o_bias: bool = False            # o_proj has a bias
    layer_graph: LayerGraph = SEQUENTIAL   # the decoder layer's steps (vkspec.layer_graph; the family's)
    hidden_act: str = "silu"        # the dense MLP's: "silu" | "gelu_tanh"
    embedding_scale: float = 1.0    # the input embedding's rows times this float32 (not the lm_head)
    attn_scale: float | None = None # scores times f32(this); None: head_dim ** -0.5
    sliding_window: int = 0
    layer_windows: list[int] = field(default_factory=list)      # per layer: keys at distance < w; 0 all
    layer_rope_theta: list[float] = field(default_factory=list) # per layer RoPE base; empty: rope_theta
    dtype: str = "float32"
    eos_token_id: list[int] = field(default_factory=list)
    source: str = "config.json"

    def is_moe_layer(self, i: int) -> bool:
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)

    def window_of(self, i: int) -> int:
        """Layer i attends keys at distance 0..w-1 (0: every earlier key)."""
        return self.layer_windows[i] if i < len(self.layer_windows) else 0

    def rope_theta_of(self, i: int) -> float:
        return self.layer_rope_theta[i] if i < len(self.layer_rope_theta) else self.rope_theta

    @property
    def sandwich_norms(self) -> bool:
        """A norm on a sublayer's output before its residual add (Gemma 3)."""
        return self.layer_graph.out_norms

    @property
    def scores_scale(self) -> float:
        return self.head_dim ** -0.5 if self.attn_scale is None else self.attn_scale

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def context(self, ctx: int | None = None) -> int:
        """The positions a state holds: ``ctx`` up to the model's own length,
        or without one the model's, at most 4096 (the one rule: both backends
        allocate it and ``vkspec plan`` reports it)."""
        return min(ctx, self.max_position_embeddings) if ctx else min(self.max_position_embeddings, 4096)


def _need(d: dict, key: str, src: str, typ=int, lo=None):
    if key not in d:
        raise VkspecError(f"{src}: missing key {key!r}")
    v = d[key]
    try:
        v = typ(v)
    except (TypeError, ValueError):
        raise VkspecError(f"{src}: {key} = {d[key]!r} is not a {typ.__name__}") from None
    if lo is not None and v < lo:
        raise VkspecError(f"{src}: {key} = {v} is out of range (must be >= {lo})")
    return v


def from_dict(d: dict, src: str = "config.json") -> ModelConfig:
    d = families.text_config(d)
    fam = families.family(d, src)
    extra = {}
    if fam.translate is not None:          # Gemma 3: sliding layers, GELU as per-layer fields
        d, extra = fam.translate(d, src)
    mt = d["model_type"]
    families.refuse_unsupported(d, src)
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
    prf = d.get("partial_rotary_factor", rope.get("partial_rotary_factor", fam.partial_rotary_factor))
    hidden = _need(d, "hidden_size", src, lo=1)
    heads = _need(d, "num_attention_heads", src, lo=1)
    layers = _need(d, "num_hidden_layers", src, lo=1)
    head_dim = int(d.get("head_dim") or hidden // heads)
    kv = heads if d.get("num_key_value_heads") is None else _need(d, "num_key_value_heads", src)
    if kv < 1 or heads % kv:
        raise VkspecError(f"{src}: num_key_value_heads = {kv} must divide num_attention_heads = {heads}")
    interval = int(d.get("full_attention_interval", 4))
    types = d.get("layer_types") or (
        ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
        if fam.hybrid else ["full_attention"] * layers)
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise VkspecError(f"{src}: layer_types must list {layers} entries of "
                          "'linear_attention' or 'full_attention'")
    eos = d.get("eos_token_id")
    kw = dict(
        model_type=mt, vocab_size=_need(d, "vocab_size", src, lo=1), hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, intermediate_size=int(d.get("intermediate_size") or 0),
        rms_norm_eps=_need(d, "rms_norm_eps", src, float, lo=0.0), rope_theta=float(theta),
        partial_rotary_factor=float(prf),
        max_position_embeddings=int(d.get("max_position_embeddings", 4096)), layer_types=types,
        linear_num_key_heads=int(d.get("linear_num_key_heads", 0)),
        linear_num_value_heads=int(d.get("linear_num_value_heads", 0)),
        linear_key_head_dim=int(d.get("linear_key_head_dim", 0)),
        linear_value_head_dim=int(d.get("linear_value_head_dim", 0)),
        linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", 4)),
        num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(d.get("moe_intermediate_size") or 0),
        shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0),
        decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
        mlp_only_layers=list(d.get("mlp_only_layers") or []),
        num_nextn_predict_layers=int(d.get("num_nextn_predict_layers", d.get("mtp_num_hidden_layers", 0)) or 0),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        dtype=str(d.get("dtype") or d.get("torch_dtype") or "float32"),
        eos_token_id=[eos] if isinstance(eos, int) else list(eos or []),
        source=src,
    )
    cfg = ModelConfig(**{**kw, **families.flags(d, fam), **extra})
    _check_ranges(cfg, src)
    return cfg


def _check_ranges(c: ModelConfig, src: str) -> None:
    def bad(key, why):
        raise VkspecError(f"{src}: {key} = {getattr(c, key)} is out of range ({why})")
    if not 0.0 < c.partial_rotary_factor <= 1.0:
        bad("partial_rotary_factor", "must be in (0, 1]")
    if c.rotary_dim % 2:
        bad("partial_rotary_factor", "head_dim * factor must be even")
    if c.rope_theta <= 0 or any(t <= 0 for t in c.layer_rope_theta):
        bad("rope_theta", "must be > 0")
    if any(w < 0 for w in c.layer_windows):
        bad("layer_windows", "a window is >= 0")
    if "linear_attention" in c.layer_types:
        for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim"):
            if getattr(c, k) < 1:
                bad(k, "must be >= 1 for Gated DeltaNet layers")
        if c.linear_num_value_heads % c.linear_num_key_heads:
            bad("linear_num_value_heads", "must be a multiple of linear_num_key_heads")
    if c.num_experts:
        if not 1 <= c.num_experts_per_tok <= c.num_experts:
            bad("num_experts_per_tok", f"must be in 1..num_experts={c.num_experts}")
        if c.moe_intermediate_size < 1:
            bad("moe_intermediate_size", "must be >= 1")
    if c.num_experts == 0 or c.mlp_only_layers:
        if c.intermediate_size < 1:
            bad("intermediate_size", "must be >= 1 for dense MLP layers")
    if c.num_nextn_predict_layers not in (0, 1):
        bad("num_nextn_predict_layers", "0 or 1 supported")


def load_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise VkspecError(f"{model_dir}: no config.json (not a checkpoint directory)")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VkspecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise VkspecError(f"{path}: not a JSON object")
    return from_dict(d, str(path))
