"""Tiny random Gemma3ForCausalLM checkpoints built by transformers itself, and
the same model written as a GGUF the way llama.cpp's converter writes it."""

import numpy as np
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from vkspec.family_gemma3 import GGUF_LAYER_NAMES

BASE = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, max_position_embeddings=512, rms_norm_eps=1e-6)
S, F = "sliding_attention", "full_attention"


def build(out_dir, seed=0, head_dim=16, scalar=16, window=4, layer_types=(S, S, F, S, S, F)):
    """Save a tiny Gemma 3 to out_dir (config.json + model.safetensors, f32)
    and return it (eager attention: the documented formula)."""
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(**BASE, num_hidden_layers=len(layer_types), head_dim=head_dim,
                           query_pre_attn_scalar=scalar, sliding_window=window, layer_types=list(layer_types),
                           attn_implementation="eager")
    model = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for _, p in model.named_parameters():       # the (1 + w) norms start at 0: give them values
            p.normal_(0, 0.1 if p.dim() == 1 else 0.12)
    model.save_pretrained(out_dir)
    return model


def gguf_build(out_dir, seed=0):
    """A tiny Gemma 3 that transformers' GGUF loader reads as it was built:
    its class defaults (query_pre_attn_scalar 256, local base 1e4, layer
    pattern 6) hold, and head_dim 256 makes llama.cpp's scale, key_length**-0.5,
    the same."""
    return build(out_dir, seed, head_dim=256, scalar=256, window=4, layer_types=(S,) * 5 + (F,))


def write_gguf(model, path, extra_tokens=()):
    """The model as llama.cpp's converter writes a gemma3 GGUF: f32 tensors,
    every norm stored as 1 + w, no output.weight (tied)."""
    import gguf
    c = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_sliding_window(c.sliding_window)
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        a = t.detach().numpy().astype(np.float32)
        if name.endswith("norm.weight"):
            a = (np.float32(1.0) + a).astype(np.float32)
        if name in top:
            g = top[name]
        else:
            parts = name.split(".")
            g = f"blk.{parts[2]}.{GGUF_LAYER_NAMES['.'.join(parts[3:])]}"
        w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
