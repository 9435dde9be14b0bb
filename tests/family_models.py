"""Tiny random models of the Qwen families, built by transformers 5.18 itself,
and GGUF files written from them with the gguf package's GGUFWriter (the
names and transforms of llama.cpp's converter)."""

import json

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, max_position_embeddings=512, rms_norm_eps=1e-6)
HYBRID = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=8, linear_conv_kernel_dim=4,
              rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25})
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def _model(name, **over):
    import transformers as T
    base = {**BASE, **{k: v for k, v in over.items() if k not in HYBRID}}
    hybrid = {**HYBRID, **{k: v for k, v in over.items() if k in HYBRID}}
    no_inter = {k: v for k, v in base.items() if k != "intermediate_size"}
    theta = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    return {
        # q, k, v biases; rope base 1e6
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**base, **theta)),
        # q/k norms, attention_bias: q, k, v and o biases
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**base, head_dim=16, attention_bias=True)),
        # head_dim 128: transformers' qwen3 GGUF loader reads no key_length (families.md §3)
        "qwen3_hd128": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**base, head_dim=128)),
        # no shared expert; layer 1 dense
        "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**base, head_dim=16, **MOE, norm_topk_prob=True,
                                                                   mlp_only_layers=[1])),
        # what a GGUF can say: every layer MoE, renormalised
        "qwen3_moe_all": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**base, head_dim=16, **MOE,
                                                                       norm_topk_prob=True)),
        "qwen3_5": lambda: T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(**base, **hybrid)),
        "qwen3_5_moe": lambda: T.Qwen3_5MoeForCausalLM(T.Qwen3_5MoeTextConfig(
            **no_inter, **hybrid, **MOE, shared_expert_intermediate_size=48)),
        # the Hub's layout: model.language_model.*, model.visual.*, text_config
        "qwen3_5_composite": lambda: T.Qwen3_5ForConditionalGeneration(T.Qwen3_5Config(
            text_config={**base, **hybrid},
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               patch_size=4, num_position_embeddings=16))),
    }[name]()


def build(name: str, out_dir, seed: int = 0, **over):
    """The model (float32, eval) with every parameter drawn again, saved to
    out_dir; ``over``: config fields other than BASE's."""
    torch.manual_seed(seed)
    model = _model(name, **over).float().eval()
    plus_one = name.startswith("qwen3_5")          # (1 + w) norms: w near 0; plain norms: w near 1
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.uniform_(-1, 1)
            elif n.endswith("dt_bias"):
                p.normal_(0, 0.5)
            elif p.dim() == 1:
                p.normal_(0, 0.1)
                if n.endswith("norm.weight") and not plus_one and "linear_attn" not in n:
                    p.add_(1.0)
            else:
                p.normal_(0, 0.12)
    model.save_pretrained(out_dir)
    return model


def add_mtp(out_dir, seed: int = 1):
    """Random mtp.* tensors (the Qwen3.5 MTP head: no transformers module) in
    the saved safetensors, shaped like the trunk's last full-attention layer."""
    path = out_dir / "model.safetensors"
    t = load_file(str(path))
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    last = max(i for i, k in enumerate(cfg["layer_types"]) if k == "full_attention")
    prefix = next(p for p in ("model.language_model.layers.", "model.layers.") if any(k.startswith(p) for k in t))
    rng = np.random.default_rng(seed)
    h = cfg["hidden_size"]

    def rnd(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    for k, v in list(t.items()):
        if k.startswith(f"{prefix}{last}."):
            t["mtp.layers.0." + k[len(f"{prefix}{last}."):]] = rnd(v.shape, 0.1 if v.ndim == 1 else 0.12)
    t["mtp.fc.weight"] = rnd((h, 2 * h), 0.12)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        t[f"mtp.{n}.weight"] = rnd((h,), 0.1)
    save_file(t, str(path), metadata={"format": "pt"})
    cfg_path = out_dir / "config.json"
    c = json.loads(cfg_path.read_text())
    (c.get("text_config", c))["mtp_num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(c))


# --- GGUF ---------------------------------------------------------------------------------

def _writer(path, arch, c, layers, head_dim):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c.get("intermediate_size") or 0)
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    return w


def _close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(model, path, arch: str):
    """A qwen2 / qwen3 / qwen3moe GGUF of a transformers model, F32, as
    llama.cpp's converter names it (no row permutation: NEOX RoPE)."""
    import gguf
    c = model.config.to_dict()
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    w = _writer(path, arch, c, c["num_hidden_layers"], hd)
    w.add_rope_freq_base(float(model.config.rope_parameters["rope_theta"]))
    if arch == "qwen3moe":
        w.add_expert_count(model.config.num_experts)
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     c["num_hidden_layers"])
    for k, v in model.state_dict().items():
        v = v.detach().numpy().astype(np.float32)
        if "experts.gate_up_proj" in k:               # (E, 2 mi, H): gate rows, then up rows
            blk, mi = k.split(".")[2], v.shape[1] // 2
            w.add_tensor(f"blk.{blk}.ffn_gate_exps.weight", np.ascontiguousarray(v[:, :mi]))
            w.add_tensor(f"blk.{blk}.ffn_up_exps.weight", np.ascontiguousarray(v[:, mi:]))
            continue
        if "experts.down_proj" in k:                  # (E, H, mi)
            w.add_tensor(f"blk.{k.split('.')[2]}.ffn_down_exps.weight", np.ascontiguousarray(v))
            continue
        base, suffix = k.rsplit(".", 1) if k.endswith((".weight", ".bias")) else (k, "")
        g = names.get_name(base)
        assert g, k
        w.add_tensor(g + ("." + suffix if suffix else ""), np.ascontiguousarray(v))
    _close(w)
    return path


def write_qwen3next_gguf(src_dir, path, mtp: bool, only: bool = False):
    """A qwen3next GGUF of a vkspec tiny hybrid (vkspec.tiny: Qwen3-Next's
    names, MoE with a shared expert, optional MTP head), with llama.cpp's
    names and transforms (families.md §7): attn_qkv + attn_gate from the
    grouped in_proj_qkvz, ssm_ba as stored, ssm_a = -exp(A_log) (vkspec's exact
    exp: bit-identical decays), every norm but ssm_norm stored as 1 + w,
    block_count counting the MTP block, its tensors under blk.L.nextn.*.
    ``only``: the MTP block alone, as convert_hf_to_gguf.py --mtp writes it
    (with token_embd, output_norm and output)."""
    from vkspec import exact
    c = json.loads((src_dir / "config.json").read_text())
    t = load_file(str(src_dir / "model.safetensors"))
    L, h = c["num_hidden_layers"], c["hidden_size"]
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    r, hd = nv // nk, c["head_dim"]
    w = _writer(path, "qwen3next", c, L + (1 if mtp else 0), hd)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(int(hd * c["partial_rotary_factor"]))
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(nv * dv)
    w.add_full_attention_interval(c["full_attention_interval"])
    if mtp:
        w.add_nextn_predict_layers(1)
    one = np.float32(1)
    out = {"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": one + t["model.norm.weight"],
           "output.weight": t["lm_head.weight"]}

    def layer(src, blk):
        g = lambda n: f"blk.{blk}.{n}"  # noqa: E731
        out[g("attn_norm.weight")] = one + t[f"{src}.input_layernorm.weight"]
        out[g("post_attention_norm.weight")] = one + t[f"{src}.post_attention_layernorm.weight"]
        if f"{src}.linear_attn.in_proj_qkvz.weight" in t:
            la = f"{src}.linear_attn"
            qkvz = t[f"{la}.in_proj_qkvz.weight"].reshape(nk, 2 * dk + 2 * r * dv, h)
            q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
            v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
            out[g("attn_qkv.weight")] = np.concatenate([a.reshape(-1, h) for a in (q, k, v)])
            out[g("attn_gate.weight")] = z.reshape(-1, h)
            out[g("ssm_ba.weight")] = t[f"{la}.in_proj_ba.weight"]
            out[g("ssm_conv1d.weight")] = t[f"{la}.conv1d.weight"][:, 0]
            out[g("ssm_dt.bias")] = t[f"{la}.dt_bias"]
            out[g("ssm_a")] = -exact.exp(t[f"{la}.A_log"])
            out[g("ssm_norm.weight")] = t[f"{la}.norm.weight"]
            out[g("ssm_out.weight")] = t[f"{la}.out_proj.weight"]
        else:
            sa = f"{src}.self_attn"
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                           ("o_proj", "attn_output")):
                out[g(f"{gg}.weight")] = t[f"{sa}.{hf}.weight"]
            out[g("attn_q_norm.weight")] = one + t[f"{sa}.q_norm.weight"]
            out[g("attn_k_norm.weight")] = one + t[f"{sa}.k_norm.weight"]
        m = f"{src}.mlp"
        out[g("ffn_gate_inp.weight")] = t[f"{m}.gate.weight"]
        for p in ("gate", "up", "down"):
            out[g(f"ffn_{p}_exps.weight")] = np.stack([t[f"{m}.experts.{e}.{p}_proj.weight"]
                                                       for e in range(c["num_experts"])])
            out[g(f"ffn_{p}_shexp.weight")] = t[f"{m}.shared_expert.{p}_proj.weight"]
        out[g("ffn_gate_inp_shexp.weight")] = t[f"{m}.shared_expert_gate.weight"][0]     # stored (H)

    for i in range(L):
        layer(f"model.layers.{i}", i)
    if mtp:
        layer("mtp.layers.0", L)
        out[f"blk.{L}.nextn.eh_proj.weight"] = t["mtp.fc.weight"]
        for hf, gg in (("pre_fc_norm_embedding", "enorm"), ("pre_fc_norm_hidden", "hnorm"),
                       ("norm", "shared_head_norm")):
            out[f"blk.{L}.nextn.{gg}.weight"] = one + t[f"mtp.{hf}.weight"]
    for name, a in out.items():
        if not only or not name.startswith("blk.") or name.startswith(f"blk.{L}."):
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    _close(w)
    return path
