"""The fixed array sizes of the shaders, declared once: the build passes them
to glslang as defines (-DMAX_K=8u ...), and the Vulkan backend refuses, with
one clear line, a model whose shapes are past them (a shader would otherwise
index past its private array and compute garbage silently).

Standard library only (the build hook loads this file). Qwen3-Next's and
Qwen3.5's real shapes fit: conv kernel 4, key head 128, 512 experts, top 10.
"""

from __future__ import annotations

# rows a device block may have: the Step block's per-row arrays (step.glsl), a
# GEMV's input rows, the Vulkan backend's max_rows (backends/vulkan/layout.py)
MAX_ROWS = 8

# shader stem -> {define: limit}
LIMITS = {
    "conv_step": {"MAX_K": 8},          # DeltaNet conv taps (linear_conv_kernel_dim)
    "deltanet": {"MAX_DK": 256},        # DeltaNet key head size (linear_key_head_dim)
    "route": {"MAX_E": 512, "MAX_K": 16},   # routed experts, experts per token
}


def defines(stem: str) -> list[str]:
    return [f"MAX_ROWS={MAX_ROWS}u"] + [f"{name}={value}u" for name, value in LIMITS.get(stem, {}).items()]


def check(cfg) -> list[str]:
    """(what, value, limit, where) problems of a ModelConfig against LIMITS."""
    out = []
    if "linear_attention" in cfg.layer_types:
        out += [("linear_conv_kernel_dim", cfg.linear_conv_kernel_dim, LIMITS["conv_step"]["MAX_K"],
                 "conv_step.comp MAX_K"),
                ("linear_key_head_dim", cfg.linear_key_head_dim, LIMITS["deltanet"]["MAX_DK"],
                 "deltanet.comp MAX_DK")]
    if cfg.num_experts:
        out += [("num_experts", cfg.num_experts, LIMITS["route"]["MAX_E"], "route.comp MAX_E"),
                ("num_experts_per_tok", cfg.num_experts_per_tok, LIMITS["route"]["MAX_K"], "route.comp MAX_K")]
    return [f"{what} = {value} is over the device's limit of {limit} ({where})"
            for what, value, limit, where in out if value > limit]
