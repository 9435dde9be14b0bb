"""Tiny qwen3_5 / qwen3_5_moe checkpoints with an MTP head, and their GGUF
files (``qwen35`` / ``qwen35moe``) written with the gguf package exactly as
llama.cpp's converter writes them (conversion/qwen.py: Qwen3NextModel,
_LinearAttentionVReorderBase, _QwenMtpMixin, _Qwen35MRopeMixin).

scripts/check_qwen35_converter.py runs the converter itself on the same
checkpoints and checks that its files equal these, tensor for tensor and key
for key (CI has no llama.cpp source tree, so the tests use these).
"""

import json

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from family_models import add_mtp, build

ARCH = {"qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe"}


def checkpoint(name, out_dir, seed=0, vocab=320, **over):
    """The transformers model's weights and a random MTP head, saved; each
    A_log redrawn until torch's float32 exp (the converter's -exp(A_log)) and
    vkspec's exact exp agree on it, so that the file's decays are the ones
    vkspec computes from the safetensors (otherwise they may differ by an ulp,
    and the runs with them). A vocabulary of 320: room for the tokenizer
    (256 bytes and a special token) that the converter needs."""
    from vkspec import exact
    from vkspec.tiny import make_tokenizer
    build(name, out_dir, seed, vocab_size=vocab, **over)
    add_mtp(out_dir)
    make_tokenizer(vocab).save(str(out_dir / "tokenizer.json"))
    path = out_dir / "model.safetensors"
    t = load_file(str(path))
    rng = np.random.default_rng(seed + 11)
    for k in [k for k in t if k.endswith("A_log")]:
        a = t[k].copy()
        for i in range(a.size):
            while exact.exp(a[i:i + 1]).tobytes() != torch.exp(torch.from_numpy(a[i:i + 1])).numpy().tobytes():
                a[i] = np.float32(rng.uniform(-1, 1))
        t[k] = a
    save_file(t, str(path), metadata={"format": "pt"})
    return out_dir


def _tiled(a, axis, nk, nv, d):
    """The converter's _reorder_v_heads: value heads grouped by key head -> tiled."""
    a = np.moveaxis(a, axis, 0)
    shape = a.shape
    a = a.reshape(nk, nv // nk, d, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def tensors(src_dir, mtp="with"):
    """{GGUF name: float32 array} of the converter's output; mtp: "with"
    (the default), "none" (--no-mtp) or "only" (--mtp)."""
    c = json.loads((src_dir / "config.json").read_text())
    t = load_file(str(src_dir / "model.safetensors"))
    L, nk, nv = c["num_hidden_layers"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    out, experts = {}, {}
    for k, v in t.items():
        parts = k.split(".")
        if k.startswith("mtp."):
            if mtp == "none":
                continue
            if parts[1] == "layers":
                k, parts = f"model.layers.{L + int(parts[2])}." + ".".join(parts[3:]), None
            else:
                k = f"model.layers.{L}.nextn." + {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm",
                                                  "pre_fc_norm_hidden": "hnorm", "norm": "shared_head_norm"}[parts[1]]
                k += ".weight"
        elif mtp == "only" and k not in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            continue
        v = v.astype(np.float32)
        if "linear_attn." in k and nk != nv:
            if ".in_proj_qkv." in k:
                v = np.concatenate([v[:2 * nk * dk], _tiled(v[2 * nk * dk:], 0, nk, nv, dv)])
            elif ".in_proj_z." in k:
                v = _tiled(v, 0, nk, nv, dv)
            elif ".in_proj_a." in k or ".in_proj_b." in k or k.endswith((".A_log", ".dt_bias")):
                v = _tiled(v, 0, nk, nv, 1)
            elif ".conv1d." in k:
                v = np.concatenate([v[:2 * nk * dk], _tiled(v[2 * nk * dk:], 0, nk, nv, dv)])
            elif ".out_proj." in k:
                v = _tiled(v, 1, nk, nv, dv)
        if k.endswith(".A_log"):
            v = (-torch.exp(torch.from_numpy(v))).numpy()
        elif ".conv1d." in k:
            v = v[:, 0]
        elif k.endswith("norm.weight") and not k.endswith("linear_attn.norm.weight"):
            v = v + np.float32(1)
        p = k.split(".")
        if p[3:5] == ["mlp", "experts"] and p[5].isdigit():    # one tensor per expert: stacked
            experts.setdefault(f"blk.{p[2]}.ffn_{p[6][:-len('_proj')]}_exps.weight", {})[int(p[5])] = v
            continue
        out.update(_names(k, v))
    for name, per in experts.items():
        out[name] = np.stack([per[e] for e in range(len(per))])
    return out


_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          **{f"self_attn.{p}_proj.weight": f"attn_{g}.weight" for p, g in (("q", "q"), ("k", "k"), ("v", "v"),
                                                                           ("o", "output"))},
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
          "linear_attn.in_proj_a.weight": "ssm_alpha.weight", "linear_attn.in_proj_b.weight": "ssm_beta.weight",
          "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias",
          "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.norm.weight": "ssm_norm.weight",
          "linear_attn.out_proj.weight": "ssm_out.weight",
          **{f"mlp.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")},
          "mlp.gate.weight": "ffn_gate_inp.weight",
          **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")},
          "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
          **{f"nextn.{n}.weight": f"nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm")}}


def _names(k, v):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if k in top:
        return {top[k]: v}
    _, _, blk, rest = k.split(".", 3)
    if rest == "mlp.experts.gate_up_proj":         # (E, 2 mi, H): gate rows, then up rows
        mi = v.shape[1] // 2
        return {f"blk.{blk}.ffn_gate_exps.weight": v[:, :mi], f"blk.{blk}.ffn_up_exps.weight": v[:, mi:]}
    if rest == "mlp.experts.down_proj":
        return {f"blk.{blk}.ffn_down_exps.weight": v}
    return {f"blk.{blk}.{_LAYER[rest]}": v}


def _tokenizer(w, src_dir, vocab_size):
    """The converter's gpt2 vocabulary (_set_vocab_gpt2): ids without a token
    are [PADi] (unused), added tokens control, the merges of tokenizer.json."""
    import gguf
    tj = json.loads((src_dir / "tokenizer.json").read_text())
    rev = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"] for a in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([rev.get(i, f"[PAD{i}]") for i in range(vocab_size)])
    w.add_token_types([gguf.TokenType.UNUSED if i not in rev else gguf.TokenType.CONTROL if i in added
                       else gguf.TokenType.NORMAL for i in range(vocab_size)])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])


# kept F32 by the converter's --outtype q8_0 (ModelBase.prepare_tensors): besides
# vectors, norms and names not ending .weight
_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")


def _typed(name, a, outtype):
    """(data, GGML type) as the converter stores a tensor: Q8_0 where it can,
    F16 where the row does not fill whole blocks (its QuantError fallback)."""
    import gguf
    a = np.ascontiguousarray(a, dtype=np.float32)
    if outtype == "f32" or a.ndim <= 1 or name.endswith(("_norm.weight",) + _F32) or not name.endswith(".weight"):
        return a, gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    except gguf.QuantError:
        return a.astype(np.float16), gguf.GGMLQuantizationType.F16


def write(src_dir, path, mtp="with", drop=(), extra_keys=None, extra_tensors=None, outtype="f32"):
    """The converter's GGUF (--outtype f32 or q8_0) of a checkpoint; ``drop``
    leaves tensors out, ``extra_*`` add keys / tensors (the bad-input tests)."""
    import gguf
    c = json.loads((src_dir / "config.json").read_text())
    arch = ARCH[c["model_type"].removesuffix("_text")]
    L, n_mtp = c["num_hidden_layers"], 0 if mtp == "none" else c["mtp_num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L + n_mtp)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if c.get("intermediate_size"):
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if c.get("num_experts"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    if c.get("num_experts"):
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    if n_mtp:
        w.add_nextn_predict_layers(n_mtp)
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_array(f"{arch}.attention.recurrent_layers",        # the installed gguf has no add_recurrent_layers
                [t == "linear_attention" for t in c["layer_types"]] + [False] * n_mtp)
    w.add_full_attention_interval(c.get("full_attention_interval", 4))
    w.add_rope_dimension_count(int(c["head_dim"] * c["rope_parameters"]["partial_rotary_factor"]))
    w.add_rope_dimension_sections([11, 11, 10, 0])
    _tokenizer(w, src_dir, c["vocab_size"])
    for k, v in (extra_keys or {}).items():
        w.add_uint32(k, v)
    for name, a in {**tensors(src_dir, mtp), **(extra_tensors or {})}.items():
        if name not in drop:
            data, qtype = _typed(name, a, outtype)
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
