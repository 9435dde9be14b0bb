"""RoPE tables: computed once on the host and uploaded, never by a driver's sin/cos."""

from __future__ import annotations

import numpy as np

from .config import ModelConfig

f32 = np.float32


def rope_tables(cfg: ModelConfig, ctx: int, theta: float | None = None):
    """cos/sin (ctx, rotary_dim) computed once on the host, as transformers does:
    float32 inverse frequencies and angles, cos/sin rounded to float32.
    ``theta``: the base of a layer with its own (Gemma 3's local layers);
    default the model's rope_theta."""
    dim = cfg.rotary_dim
    base = np.float32(cfg.rope_theta if theta is None else theta)
    inv = (1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / f32(dim)))).astype(f32)
    ang = (np.arange(ctx, dtype=f32)[:, None] * inv[None, :]).astype(f32)
    ang = np.concatenate([ang, ang], axis=1).astype(np.float64)
    return np.cos(ang).astype(f32), np.sin(ang).astype(f32)
