"""Tiny random Qwen3NextForCausalLM checkpoints built by transformers itself."""

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

SHAPES = {
    # key heads 2 -> value heads 4 (two value heads per key head), 6 experts top-2 renormalised
    "grouped": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=8, num_experts=6, num_experts_per_tok=2,
                    norm_topk_prob=True, num_hidden_layers=4),
    # one value head per key head, 4 experts top-1 without renormalisation, MQA
    "flat": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                 linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=8,
                 linear_value_head_dim=16, num_experts=4, num_experts_per_tok=1,
                 norm_topk_prob=False, num_hidden_layers=5),
    # dense MLP layers (no experts), 8 layers: two attention layers
    "dense": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                  linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                  linear_value_head_dim=16, num_experts=0, num_experts_per_tok=0,
                  num_hidden_layers=8),
}


def build(name: str, out_dir, seed: int = 0):
    torch.manual_seed(seed)
    kw = dict(SHAPES[name])
    cfg = Qwen3NextConfig(vocab_size=101, intermediate_size=80, moe_intermediate_size=32,
                          shared_expert_intermediate_size=40, rms_norm_eps=1e-6,
                          max_position_embeddings=512, linear_conv_kernel_dim=4,
                          partial_rotary_factor=0.25,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          tie_word_embeddings=False, **kw)
    model = Qwen3NextForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.uniform_(-1, 1)
            elif n.endswith("dt_bias"):
                p.normal_(0, 0.5)
            elif p.dim() == 1:
                p.normal_(0, 0.1)
            else:
                p.normal_(0, 0.12)
    model.save_pretrained(out_dir)
    return model
