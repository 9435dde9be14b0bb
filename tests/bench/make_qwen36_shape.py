"""A random-weight Qwen3.6-35B-A3B-width checkpoint with fewer layers, as
safetensors (bf16, one shard a layer), for side-by-side runs of vkspec and
llama.cpp on the same file after llama.cpp's own converter and llama-quantize.

    python tests/bench/make_qwen36_shape.py OUT_DIR [--layers 8]

The widths are the release's (hidden 2048; 3 Gated DeltaNet layers to 1
gated attention layer; 16 QK and 32 V heads of 128; 16 Q and 2 KV heads of
256 with 64 rotary dims; 256 experts of 512, 8 routed and 1 shared; a
248,320-row vocabulary; one MTP layer). The names and shapes are those of
transformers' Qwen3_5MoeForCausalLM at these widths (built on the meta
device, so nothing is allocated), plus the release's mtp.* tensors. The
tokenizer is the bundled tiny hybrid's BPE; ids past it are the converter's
unused [PAD] rows, as in the release's padded vocabulary.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "models" / "tiny-hybrid"

WIDTHS = dict(vocab_size=248320, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
              linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8,
              moe_intermediate_size=512, shared_expert_intermediate_size=512, max_position_embeddings=262144,
              rms_norm_eps=1e-6, full_attention_interval=4, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})


def shapes(layers: int) -> tuple[dict, dict[str, tuple]]:
    """(config dict, {name: shape}) of the text model with its MTP layer."""
    import transformers as T
    cfg = T.Qwen3_5MoeTextConfig(num_hidden_layers=layers, **WIDTHS)
    with torch.device("meta"):
        model = T.Qwen3_5MoeForCausalLM(cfg)
    out = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    last = max(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    for k, s in list(out.items()):
        if k.startswith(f"model.layers.{last}."):
            out["mtp.layers.0." + k[len(f"model.layers.{last}."):]] = s
    h = cfg.hidden_size
    out["mtp.fc.weight"] = (h, 2 * h)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = (h,)
    c = cfg.to_dict()
    c.update(architectures=["Qwen3_5MoeForCausalLM"], mtp_num_hidden_layers=1, torch_dtype="bfloat16",
             bos_token_id=0, eos_token_id=0)
    return c, out


def draw(name: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """Small weights, so the random model's activations stay finite."""
    if name.endswith("A_log"):
        return torch.rand(shape, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
    if name.endswith("dt_bias"):
        return (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16)
    scale = 0.1 if len(shape) == 1 or name.endswith("conv1d.weight") else 0.02
    return (torch.randn(shape, generator=g, dtype=torch.bfloat16) * scale).to(torch.bfloat16)


def shard_of(name: str) -> str:
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return f"layer-{int(parts[2]):03d}"
    return "mtp" if parts[0] == "mtp" else "top"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config, named = shapes(a.layers)
    groups: dict[str, list[str]] = {}
    for k in named:
        groups.setdefault(shard_of(k), []).append(k)
    g = torch.Generator().manual_seed(a.seed)
    index, total = {}, 0
    for i, (shard, names) in enumerate(sorted(groups.items())):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {k: draw(k, named[k], g) for k in names}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        index.update({k: fname for k in names})
        print(f"{fname}: {shard}, {sum(t.numel() for t in tensors.values()) / 1e6:.0f} M weights", flush=True)
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / f, out / f)
    print(f"wrote {out}: {total / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
