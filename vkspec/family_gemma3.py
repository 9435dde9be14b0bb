"""Gemma 3 (Hugging Face ``gemma3_text`` / Gemma3ForCausalLM, GGUF arch
``gemma3``): its config translated into ModelConfig's generic fields, its GGUF
tensor names and metadata, and its SentencePiece tokenizer rebuilt from a GGUF.

What makes Gemma 3 (transformers 5.18 transformers/models/gemma3; llama.cpp src/models/
gemma3.cpp):

* every RMSNorm is (1 + w) in a Hugging Face checkpoint; llama.cpp writes the
  norms with the 1 already added, so a GGUF runs them as plain multipliers
  (never add it twice);
* four norms per layer (layer_graph.SANDWICH, the family's layer): post_attention
  and post_feedforward norm a sublayer's output *before* the residual add;
  pre_feedforward is the norm before the MLP;
* per-head q/k norms before RoPE; scores scaled by query_pre_attn_scalar**-0.5;
* the input embedding times f32(sqrt(hidden)) (the tied lm_head is unscaled);
* sliding-window layers (a key at distance d attended iff 0 <= d < window)
  with RoPE base rope_local_base_freq (1e4), full layers with rope_theta (1e6);
  layer i is sliding iff (i + 1) % pattern != 0 (pattern 6) unless the config
  lists layer_types;
* MLP down(gelu_tanh(gate x) * up x).

A GGUF follows llama.cpp where transformers' GGUF loader only takes its class
defaults: the attention scale is key_length**-0.5 (hidden/heads for the 27B,
62 layers), the local base is rope.freq_base_swa (default 1e4) and the
pattern attention.sliding_window_pattern (default 6). On the real files both
agree. Softcapping (Gemma 2 style) is refused.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .cachedir import cache_root
from .errors import VkspecError
from .gguf_keys import attention_shape, needer

MODEL_TYPES = ("gemma3_text",)
GGUF_ARCH = "gemma3"
END_OF_TURN = "<end_of_turn>"

GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _refuse(d: dict, src: str) -> None:
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if d.get(key):
            raise VkspecError(f"{src}: {key} = {d[key]} is not supported (Gemma 3 has none)")
    if d.get("use_bidirectional_attention"):
        raise VkspecError(f"{src}: use_bidirectional_attention is not supported")
    if d.get("attention_bias"):
        raise VkspecError(f"{src}: attention_bias is not supported for gemma3")
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise VkspecError(f"{src}: hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")


def _rope(d: dict, src: str) -> tuple[float, float]:
    """(full, local) RoPE bases from either config style: transformers 5's
    rope_parameters per layer type, or rope_theta / rope_local_base_freq."""
    rp = d.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        parts = [rp.get("full_attention") or {}, rp.get("sliding_attention") or {}]
    else:
        parts = [d.get("rope_scaling") or rp, {}]
    for p in parts:
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", None):
            raise VkspecError(f"{src}: rope_type {kind!r} is not supported (default RoPE only)")
    full = parts[0].get("rope_theta", d.get("rope_theta", 1e6))
    local = parts[1].get("rope_theta", d.get("rope_local_base_freq", 1e4))
    return float(full), float(local)


def layer_types(d: dict, layers: int) -> list[str]:
    types = d.get("layer_types")
    if types is None:
        pattern = int(d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6)) or 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    return list(types)


def translate(d: dict, src: str) -> tuple[dict, dict]:
    """A gemma3_text config (from config.json, or gguf_config below) -> (the
    config vkspec.config.from_dict reads, the ModelConfig fields it sets).
    Every layer is an attention layer ("full_attention" to the rest of vkspec);
    which ones slide, and their RoPE base, are per-layer fields."""
    try:
        return _translate(d, src)
    except (TypeError, ValueError, AttributeError) as e:
        raise VkspecError(f"{src}: not a readable gemma3_text config ({e})") from None


def _translate(d: dict, src: str) -> tuple[dict, dict]:
    _refuse(d, src)
    layers = int(d.get("num_hidden_layers") or 0)
    hidden = int(d.get("hidden_size") or 0)
    types = layer_types(d, layers)
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise VkspecError(f"{src}: layer_types must list {layers} entries of "
                          "'sliding_attention' or 'full_attention'")
    window = int(d.get("sliding_window") or 0)
    if "sliding_attention" in types and window < 1:
        raise VkspecError(f"{src}: sliding_window = {d.get('sliding_window')} (must be >= 1)")
    full, local = _rope(d, src)
    head_dim = int(d.get("head_dim") or 256)
    scalar = float(256 if d.get("query_pre_attn_scalar") is None else d["query_pre_attn_scalar"])
    if scalar <= 0:
        raise VkspecError(f"{src}: query_pre_attn_scalar = {scalar} (must be > 0)")
    sliding = [t == "sliding_attention" for t in types]
    # what families.refuse_unsupported would refuse is now in the fields below
    out = {k: v for k, v in d.items() if k not in ("rope_parameters", "rope_scaling", "layer_types",
                                                  "hidden_act", "hidden_activation", "use_sliding_window")}
    out.update(layer_types=["full_attention"] * layers, rope_theta=full, head_dim=head_dim,
               tie_word_embeddings=d.get("tie_word_embeddings", True))
    fields = dict(
        norm_plus_one=not d.get("_norms_stored_plus_one", False), qk_norm=True,
        hidden_act="gelu_tanh", embedding_scale=float(np.float32(hidden ** 0.5)),
        attn_scale=scalar ** -0.5, sliding_window=window,
        layer_windows=[window if s else 0 for s in sliding],
        layer_rope_theta=[local if s else full for s in sliding])
    return out, fields


# --- GGUF ------------------------------------------------------------------------------

def gguf_config(meta, tensors, path) -> dict:
    """A gemma3_text config dict (translate's input) from a GGUF's metadata,
    with llama.cpp's reading of what the file leaves out."""
    a = GGUF_ARCH

    need = needer(meta, a, path)
    heads, hidden, head_dim = attention_shape(meta, a, path)
    layers = int(need("block_count"))
    cap = meta(f"{a}.final_logit_softcapping")
    pattern = meta(f"{a}.attention.sliding_window_pattern")
    if pattern is None or np.ndim(pattern) == 0:
        p = int(pattern or 6)
        types = ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(layers)]
    else:                                   # newer files: one flag per layer, true = sliding
        types = ["sliding_attention" if bool(s) else "full_attention" for s in list(pattern)[:layers]]
    tokens = meta("tokenizer.ggml.tokens")
    emb = tensors.get("token_embd.weight")
    vocab = meta(f"{a}.vocab_size") or (len(tokens) if tokens is not None else 0) or \
        (emb.numpy_shape[0] if emb is not None else 0)
    eos = meta("tokenizer.ggml.eos_token_id")
    stops = [int(eos)] if eos is not None else []
    if tokens is not None and END_OF_TURN in tokens:          # chat turns end there (id 106)
        stops.append(list(tokens).index(END_OF_TURN))
    # llama.cpp: 1/sqrt(key_length), except the 27B (62 layers): 1/sqrt(hidden / heads)
    scalar = hidden / heads if layers == 62 else head_dim
    return {
        "model_type": "gemma3_text", "vocab_size": int(vocab), "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(meta(f"{a}.attention.head_count_kv", heads)), "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta(f"{a}.rope.freq_base", 1e6)),
        "rope_local_base_freq": float(meta(f"{a}.rope.freq_base_swa", 1e4)),
        "sliding_window": int(meta(f"{a}.attention.sliding_window", 4096)), "layer_types": types,
        "query_pre_attn_scalar": scalar, "final_logit_softcapping": cap,
        "max_position_embeddings": int(meta(f"{a}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "eos_token_id": stops, "_norms_stored_plus_one": True,
    }


def tokenizer(meta, path):
    """The SentencePiece vocabulary of a Gemma GGUF as a `tokenizers` BPE, the
    way transformers 5.18 rebuilds it (integrations/gguf/gguf_tokenizer_mapping
    gemma_tokenizer + GemmaTokenizer): tokens of only spaces respelled with
    U+2581, merges recovered from the vocabulary in file order, byte fallback,
    spaces as U+2581; control tokens are special.

    Recovering 515k merges takes seconds, so the result is kept in the user's
    cache under a hash of everything it is made from (a changed vocabulary is
    a new file; an unwritable cache only costs the time)."""
    from tokenizers import Tokenizer
    tokens = meta("tokenizer.ggml.tokens")
    if tokens is None:
        raise VkspecError(f"{path}: no tokenizer.ggml.tokens")
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    types = meta("tokenizer.ggml.token_type")
    types = [] if types is None else np.asarray(types).tolist()
    unk = tokens[int(meta("tokenizer.ggml.unknown_token_id", 3))]
    key = hashlib.sha256("\0".join([_TOKENIZER_RECIPE, unk, ",".join(map(str, types))] + tokens)
                         .encode("utf-8", "surrogatepass")).hexdigest()[:24]
    cached = cache_root() / "tokenizers" / f"gemma-{key}.json"
    try:
        return Tokenizer.from_file(str(cached))
    except Exception:                        # noqa: BLE001 - absent or unreadable: build it
        pass
    tk = _build_tokenizer(tokens, types, unk)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(tk.to_str())
        os.replace(tmp, cached)
    except OSError:
        pass
    return tk


_TOKENIZER_RECIPE = "gemma-spm-bpe-1"        # change when _build_tokenizer changes


def _build_tokenizer(tokens, types, unk):
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(BPE(vocab=vocab, merges=_merges(tokens, vocab), fuse_unk=True, unk_token=unk,
                       byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


def _merges(tokens, vocab) -> list[tuple[str, str]]:
    """transformers' generate_merges with file positions as scores: every
    split of a token into two tokens, best (earliest) token first, ties by the
    halves' lengths (longer first, its reverse sort), then by their ids. A
    respelled duplicate counts once, at its first place with its last score,
    as the dicts there make it."""
    positions = {t: -i for i, t in enumerate(tokens)}
    found = []
    for t, score in positions.items():
        local = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend((score, left, right) for left, right in local)
    found.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    return [(left, right) for _, left, right in found]
