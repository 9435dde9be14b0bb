"""Model families: what a Hugging Face model_type or a GGUF architecture means
to vkspec, as table entries plus a few feature flags of ModelConfig.

A family is one row of FAMILIES (Hugging Face configs) and, for GGUF files,
one row of GGUF_ARCHS (llama.cpp's architecture names, tensor names and
metadata keys). The forward pass reads only the flags, never a family's name:

* ``norm_plus_one``: the (1 + w) RMSNorms of Qwen3-Next / Qwen3.5 (HF weights);
  plain w for Llama and Qwen2/3. llama.cpp stores the qwen3next norms with the
  1 already added, so a GGUF of it runs with the flag off (never add it twice);
* ``qk_norm``: a per-head RMSNorm of q and k before RoPE (Qwen3, Qwen3-MoE,
  and the gated attention of the hybrids);
* ``attn_gate``: q_proj yields [q | gate] per head, the output is multiplied
  by sigmoid(gate) (the hybrids' full-attention layers);
* ``qkv_bias`` / ``o_bias``: biases of the projections (Qwen2: q, k, v always;
  the others: all four when ``attention_bias``);
* MoE: per layer from the config (Qwen3-MoE, Qwen3-Next), none (Qwen3.5
  dense ignores any expert keys), or every layer renormalised (Qwen3.5-MoE).

Sources: transformers 5.18 (transformers/models/qwen2, qwen3, qwen3_moe, qwen3_next,
qwen3_5, qwen3_5_moe) and llama.cpp's converter (conversion/qwen.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from . import family_gemma3, family_qwen35
from .errors import VkspecError
from .gguf_keys import attention_shape, needer
from .layer_graph import SANDWICH, SEQUENTIAL, LayerGraph

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class Family:
    hybrid: bool = False              # Gated DeltaNet layers (layer_types from full_attention_interval)
    norm_plus_one: bool = False
    qk_norm: bool = False
    attn_gate: bool = False
    bias: str = "attention_bias"      # "qkv": q, k, v always (Qwen2); else all four iff attention_bias
    moe: str = "config"               # "config" | "none" | "all"
    norm_topk_default: bool = True    # when the config does not say
    partial_rotary_factor: float = 1.0
    layer: LayerGraph = SEQUENTIAL    # the decoder layer's steps and norms (vkspec.layer_graph)
    # (config dict, source) -> (the dict config.from_dict reads, ModelConfig
    # fields it sets): a family whose features are per-layer fields (Gemma 3)
    translate: Callable[[dict, str], tuple[dict, dict]] | None = None


_NEXT = Family(hybrid=True, norm_plus_one=True, qk_norm=True, attn_gate=True, partial_rotary_factor=0.25)
FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "qwen2": Family(bias="qkv"),
    "qwen3": Family(qk_norm=True),
    "qwen3_moe": Family(qk_norm=True, norm_topk_default=False),
    "qwen3_next": _NEXT,
    "qwen3_5": replace(_NEXT, moe="none"), "qwen3_5_text": replace(_NEXT, moe="none"),
    "qwen3_5_moe": replace(_NEXT, moe="all"), "qwen3_5_moe_text": replace(_NEXT, moe="all"),
    # the rest of Gemma 3 (sandwich norms, windows, GELU) is family_gemma3.translate's
    **{mt: Family(norm_plus_one=True, qk_norm=True, layer=SANDWICH, translate=family_gemma3.translate)
       for mt in family_gemma3.MODEL_TYPES},
}


def family(d: dict, src: str) -> Family:
    mt = d.get("model_type")
    if mt not in FAMILIES:
        raise VkspecError(f"{src}: unknown model_type {mt!r} (supported: {', '.join(FAMILIES)})")
    return FAMILIES[mt]


def text_config(d: dict) -> dict:
    """A composite checkpoint's text model (Qwen3.5 on the Hub: model_type
    qwen3_5 with the text config under text_config): the text config, with the
    composite's own tie flag (transformers ties by the model's config) and its
    ids where the text config has none."""
    t = d.get("text_config")
    if not isinstance(t, dict):
        return d
    out = dict(t)
    for k in ("tie_word_embeddings", "eos_token_id", "dtype", "torch_dtype"):
        if k in d and (k == "tie_word_embeddings" or out.get(k) is None):
            out[k] = d[k]
    return out


def refuse_unsupported(d: dict, src: str) -> None:
    """One line for what the forward does not implement."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise VkspecError(f"{src}: rope_type {rope.get('rope_type', rope.get('type'))!r} is not supported "
                          "(default RoPE only)")
    if d.get("use_sliding_window") or "sliding_attention" in (d.get("layer_types") or []):
        raise VkspecError(f"{src}: sliding-window attention (use_sliding_window / sliding_attention "
                          "layers) is not supported")
    if d.get("hidden_act", "silu") != "silu":
        raise VkspecError(f"{src}: hidden_act {d.get('hidden_act')!r} is not supported (silu)")
    if d.get("mlp_bias"):
        raise VkspecError(f"{src}: mlp_bias is not supported")
    if d.get("mtp_use_dedicated_embeddings"):
        raise VkspecError(f"{src}: mtp_use_dedicated_embeddings is not supported")


def flags(d: dict, fam: Family) -> dict:
    """The ModelConfig fields a family decides; a GGUF's translation may
    override them under the key "vkspec" (what its tensors say)."""
    ab = bool(d.get("attention_bias", False))
    out = dict(norm_plus_one=fam.norm_plus_one, qk_norm=fam.qk_norm, attn_gate=fam.attn_gate,
               qkv_bias=True if fam.bias == "qkv" else ab, o_bias=False if fam.bias == "qkv" else ab,
               layer_graph=fam.layer)
    experts = int(d.get("num_experts", d.get("num_local_experts", 0)) or 0)
    if fam.moe == "none":
        out.update(num_experts=0, num_experts_per_tok=0, mlp_only_layers=[])
    elif fam.moe == "all":
        out.update(num_experts=experts, mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True)
    else:
        out.update(num_experts=experts, norm_topk_prob=bool(d.get("norm_topk_prob", fam.norm_topk_default)))
    out.update(d.get("vkspec", {}))
    return out


# --- GGUF --------------------------------------------------------------------------------

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    **{f"self_attn.{p}_proj.{s}": f"attn_{g}.{s}" for p, g in (("q", "q"), ("k", "k"), ("v", "v"),
                                                                ("o", "output")) for s in ("weight", "bias")},
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    **{f"mlp.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")},
    "mlp.gate.weight": "ffn_gate_inp.weight",
    **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")},
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
# one 3-D tensor per projection, expert e = rows [e*rows, (e+1)*rows)
_EXPERTS = {f"{p}_proj.weight": f"ffn_{p}_exps.weight" for p in ("gate", "up", "down")}
_QWEN3NEXT = {
    **_LAYER, "post_attention_layernorm.weight": "post_attention_norm.weight",
    # attn_qkv | attn_gate are Qwen3.5's in_proj_qkv | in_proj_z: [q all | k all | v all], z
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_qkvz.weight": "ssm_in.weight",          # older files: HF's grouped rows
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",            # HF's grouped rows
    "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.ssm_a": "ssm_a",                                # -exp(A_log), as llama.cpp stores it
    "linear_attn.norm.weight": "ssm_norm.weight", "linear_attn.out_proj.weight": "ssm_out.weight",
}
_NEXTN = {"mtp.fc.weight": "nextn.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
          "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight", "mtp.norm.weight": "nextn.shared_head_norm.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


@dataclass(frozen=True)
class GgufArch:
    model_type: str
    layer: dict = field(default_factory=lambda: _LAYER)
    permute_qk: bool = False          # llama.cpp's interleaved-RoPE q/k rows (llama only)
    hybrid: bool = False              # ssm.* keys, nextn MTP blocks counted in block_count
    stored_plus_one: bool = False     # norms written as 1 + w (then norm_plus_one is off)
    config: Callable[..., dict] | None = None   # (meta, tensors, path) -> config dict, for a family of its own
    tokenizer: Callable[..., Tokenizer] | None = None   # (meta, path) -> a SentencePiece vocabulary as a BPE
    untile: bool = False              # value heads tiled, unknown keys and tensors refused (family_qwen35)


GGUF_ARCHS: dict[str, GgufArch] = {
    "llama": GgufArch("llama", permute_qk=True),
    "qwen2": GgufArch("qwen2"),
    "qwen3": GgufArch("qwen3"),
    "qwen3moe": GgufArch("qwen3_moe"),
    "qwen3next": GgufArch("qwen3_next", layer=_QWEN3NEXT, hybrid=True, stored_plus_one=True),
    **{a: GgufArch(mt, layer={**_QWEN3NEXT, **family_qwen35.GGUF_LAYER_NAMES}, hybrid=True, stored_plus_one=True,
                   untile=True) for a, mt in family_qwen35.ARCHS.items()},
    family_gemma3.GGUF_ARCH: GgufArch("gemma3_text", layer=family_gemma3.GGUF_LAYER_NAMES, stored_plus_one=True,
                                      config=family_gemma3.gguf_config, tokenizer=family_gemma3.tokenizer),
}


def gguf_arch(arch, path) -> GgufArch:
    if arch not in GGUF_ARCHS:
        raise VkspecError(f"{path}: architecture {arch!r} is not supported ({', '.join(GGUF_ARCHS)})")
    return GGUF_ARCHS[arch]


def gguf_name(ga: GgufArch, name: str, n_trunk: int) -> tuple[str, int | None]:
    """The GGUF tensor holding a Hugging Face name, and the expert whose rows
    it is (None: the whole tensor). An unknown name maps to itself."""
    if name in _TOP:
        return _TOP[name], None
    if name in _NEXTN:
        return f"blk.{n_trunk}.{_NEXTN[name]}", None
    parts = name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 3:
        blk, rest = parts[2], parts[3:]
    elif parts[:2] == ["mtp", "layers"] and len(parts) > 3:
        blk, rest = str(n_trunk + int(parts[2])), parts[3:]
    else:
        return name, None
    if rest[:2] == ["mlp", "experts"] and len(rest) == 5 and rest[2].isdigit():
        g = _EXPERTS.get(".".join(rest[3:]))
        if g:
            return f"blk.{blk}.{g}", int(rest[2])
    g = ga.layer.get(".".join(rest))
    return (f"blk.{blk}.{g}", None) if g else (name, None)


def gguf_config(ga: GgufArch, arch: str, meta, tensors, path) -> dict:
    """A config dict (from_dict's input) from a GGUF's metadata and tensor
    table; what the file says by its tensors goes under "vkspec"."""
    if ga.config is not None:
        return ga.config(meta, tensors, path)
    need = needer(meta, arch, path)
    rope_dims = meta(f"{arch}.rope.dimension_count")
    heads, hidden, head_dim = attention_shape(meta, arch, path, rope_dims if arch == "llama" else None)
    scaling = meta(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise VkspecError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (default RoPE only)")
    tokens = meta("tokenizer.ggml.tokens")
    eos = meta("tokenizer.ggml.eos_token_id")
    blocks = int(need("block_count"))
    n_mtp = int(meta(f"{arch}.nextn_predict_layers", 0) or 0)
    layers = blocks - n_mtp
    has = tensors.__contains__
    d = {
        "model_type": ga.model_type, "vocab_size": int(meta(f"{arch}.vocab_size") or len(tokens or ())),
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(meta(f"{arch}.attention.head_count_kv", heads)), "head_dim": head_dim,
        "intermediate_size": int(meta(f"{arch}.feed_forward_length", 0) or 0),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta(f"{arch}.context_length", 4096)),
        "tie_word_embeddings": not has("output.weight"),
        "eos_token_id": [int(eos)] if eos is not None else [],
        "num_nextn_predict_layers": n_mtp,
        "vkspec": {"qkv_bias": any(has(f"blk.{i}.attn_q.bias") for i in range(blocks)),
                   "o_bias": any(has(f"blk.{i}.attn_output.bias") for i in range(blocks))},
    }
    experts = int(meta(f"{arch}.expert_count", 0) or 0)
    if experts:
        # llama.cpp renormalises the top-k weights of every MoE arch here
        d["vkspec"].update(num_experts=experts, norm_topk_prob=True,
                           mlp_only_layers=[i for i in range(layers) if not has(f"blk.{i}.ffn_gate_inp.weight")])
        d.update(num_experts_per_tok=int(need("expert_used_count")),
                 moe_intermediate_size=int(need("expert_feed_forward_length")),
                 shared_expert_intermediate_size=int(meta(f"{arch}.expert_shared_feed_forward_length", 0) or 0),
                 decoder_sparse_step=1)
    if ga.stored_plus_one:
        d["vkspec"]["norm_plus_one"] = False
    if ga.hybrid:
        d.update(_hybrid(arch, meta, need, layers, head_dim, rope_dims))
    return d


def _hybrid(arch, meta, need, layers, head_dim, rope_dims) -> dict:
    nv = int(need("ssm.time_step_rank"))
    rec = meta(f"{arch}.attention.recurrent_layers")
    if rec is not None:
        types = ["linear_attention" if bool(r) else "full_attention" for r in list(rec)[:layers]]
    else:
        interval = int(meta(f"{arch}.full_attention_interval", 4) or 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    return {
        "layer_types": types, "partial_rotary_factor": int(rope_dims or head_dim) / head_dim,
        "linear_num_key_heads": int(need("ssm.group_count")), "linear_num_value_heads": nv,
        "linear_key_head_dim": int(need("ssm.state_size")),
        "linear_value_head_dim": int(need("ssm.inner_size")) // max(nv, 1),
        "linear_conv_kernel_dim": int(need("ssm.conv_kernel")),
    }
