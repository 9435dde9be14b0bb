"""`vkspec make-tiny`: a deterministic tiny Qwen3-Next-style checkpoint in the
Hugging Face layout (config.json, model.safetensors, tokenizer.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CORPUS = """def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count

The quick brown fox jumps over the lazy dog. Speculative decoding checks drafts
in one forward pass; the output never changes, only the number of forwards.
"""


def make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return tok


def tiny_config(hidden=64, layers=4, vocab=512, experts=4, top_k=2, mtp=False, heads=4,
                kv_heads=2, head_dim=16, k_heads=2, v_heads=4, dk=16, dv=16, inter=96,
                moe_inter=48, shared=64, ctx=1024) -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": inter, "rms_norm_eps": 1e-6, "max_position_embeddings": ctx,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25},
        "partial_rotary_factor": 0.25, "full_attention_interval": 4,
        "linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads,
        "linear_key_head_dim": dk, "linear_value_head_dim": dv, "linear_conv_kernel_dim": 4,
        "num_experts": experts, "num_experts_per_tok": min(top_k, experts) if experts else 0,
        "moe_intermediate_size": moe_inter, "shared_expert_intermediate_size": shared,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "num_nextn_predict_layers": 1 if mtp else 0, "tie_word_embeddings": False,
        "dtype": "float32", "eos_token_id": 0, "bos_token_id": 0,
    }


def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Weights for every tensor the config implies, deterministic in the seed."""
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]

    def lin(rows, cols):
        return (rng.standard_normal((rows, cols)) * (1.0 / np.sqrt(cols))).astype(np.float32)

    def vec(n, scale=0.1):
        return (rng.standard_normal(n) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": (rng.standard_normal((v, h)) * 0.5).astype(np.float32)}

    def attn(p):
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        t[f"{p}.q_proj.weight"] = lin(nh * hd * 2, h)
        t[f"{p}.k_proj.weight"] = lin(nkv * hd, h)
        t[f"{p}.v_proj.weight"] = lin(nkv * hd, h)
        t[f"{p}.o_proj.weight"] = lin(h, nh * hd)
        t[f"{p}.q_norm.weight"] = vec(hd)
        t[f"{p}.k_norm.weight"] = vec(hd)

    def mlp(p, inter):
        t[f"{p}.gate_proj.weight"] = lin(inter, h)
        t[f"{p}.up_proj.weight"] = lin(inter, h)
        t[f"{p}.down_proj.weight"] = lin(h, inter)

    def ffn(p):
        if cfg["num_experts"]:
            t[f"{p}.gate.weight"] = lin(cfg["num_experts"], h)
            for e in range(cfg["num_experts"]):
                mlp(f"{p}.experts.{e}", cfg["moe_intermediate_size"])
            mlp(f"{p}.shared_expert", cfg["shared_expert_intermediate_size"])
            t[f"{p}.shared_expert_gate.weight"] = lin(1, h)
        else:
            mlp(p, cfg["intermediate_size"])

    def layer(p, kind):
        t[f"{p}.input_layernorm.weight"] = vec(h)
        t[f"{p}.post_attention_layernorm.weight"] = vec(h)
        if kind == "full_attention":
            attn(f"{p}.self_attn")
        else:
            nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
            dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
            la = f"{p}.linear_attn"
            t[f"{la}.in_proj_qkvz.weight"] = lin(2 * nk * dk + 2 * nv * dv, h)
            t[f"{la}.in_proj_ba.weight"] = lin(2 * nv, h)
            taps = cfg.get("linear_conv_kernel_dim", 4)
            t[f"{la}.conv1d.weight"] = (rng.standard_normal((2 * nk * dk + nv * dv, 1, taps)) * 0.5).astype(np.float32)
            t[f"{la}.dt_bias"] = vec(nv, 0.5)
            t[f"{la}.A_log"] = rng.uniform(-1, 1, nv).astype(np.float32)
            t[f"{la}.norm.weight"] = (1 + vec(dv)).astype(np.float32)
            t[f"{la}.out_proj.weight"] = lin(h, nv * dv)
        ffn(f"{p}.mlp")

    interval = cfg.get("full_attention_interval", 4)
    for i in range(cfg["num_hidden_layers"]):
        layer(f"model.layers.{i}", "linear_attention" if (i + 1) % interval else "full_attention")
    t["model.norm.weight"] = vec(h)
    t["lm_head.weight"] = lin(v, h)
    if cfg.get("num_nextn_predict_layers"):
        t["mtp.fc.weight"] = lin(h, 2 * h)
        t["mtp.pre_fc_norm_embedding.weight"] = vec(h)
        t["mtp.pre_fc_norm_hidden.weight"] = vec(h)
        t["mtp.norm.weight"] = vec(h)
        layer("mtp.layers.0", "full_attention")
    return t


CYCLE = 8
# a small ChatML-like template, so the tiny models serve /v1/chat/completions
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def cycle_next(t):
    """The echo model's walk: token ids in cycles of 8 (8c+0 -> 8c+1 -> .. -> 8c+7 -> 8c)."""
    return CYCLE * (t // CYCLE) + (t + 1) % CYCLE


def make_echo(t: dict, cfg: dict):
    """Make the weights predict cycle_next(token), so that greedy output walks
    short cycles (a stand-in for repetitive text, for speculative demos): every
    layer's writes to the residual stream are damped, the lm_head row of v is
    the embedding of the token before v, and the MTP head's fc passes the next
    token's embedding through (so it predicts the token after next)."""
    for name in t:
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            t[name] = (t[name] * 0.01).astype(np.float32)
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    before = np.empty(v, np.int64)
    before[cycle_next(np.arange(v))] = np.arange(v)
    t["lm_head.weight"] = t["model.embed_tokens.weight"][before].copy()
    if "mtp.fc.weight" in t:
        t["mtp.fc.weight"] = np.concatenate([np.eye(h, dtype=np.float32),
                                             np.zeros((h, h), np.float32)], axis=1)


def bf16_values(a: np.ndarray) -> np.ndarray:
    """float32 a rounded to the nearest bfloat16 values (ties to even), kept as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def save_bf16(tensors: dict[str, np.ndarray], path: Path):
    """A safetensors file whose tensors are BF16 (the high halves of the
    float32 values, which must be bfloat16 values). NumPy has no bfloat16, so
    the file is written as uint16 and its header then names the dtype."""
    import json as _json
    import struct
    halves = {k: (np.ascontiguousarray(v, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
              for k, v in tensors.items()}
    save_file(halves, str(path), metadata={"format": "pt"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = _json.loads(raw[8:8 + n])
    for k, info in header.items():
        if k != "__metadata__":
            info["dtype"] = "BF16"
    text = _json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def make_tiny(out_dir: Path, seed: int = 0, echo: bool = False, bf16: bool = False, **kw) -> Path:
    """A random model (``bf16``: a BF16 checkpoint, every weight rounded to
    its bfloat16 value)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(**kw)
    weights = random_weights(cfg, seed)
    if echo:
        make_echo(weights, cfg)
    if bf16:
        save_bf16({k: bf16_values(v) for k, v in weights.items()}, out / "model.safetensors")
    else:
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    make_tokenizer(cfg["vocab_size"]).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    return out
