"""The weights of a model, as the forward pass reads them (both backends).

Names and parametrisation follow Hugging Face's; see vkspec.loader for how a
checkpoint becomes these, and vkspec.backends.cpu.model for the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats.quant import QWeight


@dataclass
class AttnW:
    q: QWeight
    k: QWeight
    v: QWeight
    o: QWeight
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    gated: bool


@dataclass
class DeltaW:
    qkvz: QWeight
    ba: QWeight
    conv: np.ndarray          # (conv_dim, K)
    dt_bias: np.ndarray
    neg_exp_a: np.ndarray     # -exp(A_log), exact, computed once
    norm: np.ndarray
    out: QWeight


@dataclass
class MlpW:
    gate: QWeight
    up: QWeight
    down: QWeight


@dataclass
class MoeW:
    router: QWeight
    experts: list[MlpW]
    shared: MlpW | None
    shared_gate: QWeight | None
    stacked: tuple | None = None  # f32: every expert's (gate, up, down) in one array each


@dataclass
class LayerW:
    kind: str                 # "linear_attention" | "full_attention"
    in_norm: np.ndarray
    post_norm: np.ndarray
    mixer: AttnW | DeltaW
    ffn: MlpW | MoeW


@dataclass
class MtpW:
    fc: QWeight
    norm_emb: np.ndarray
    norm_hidden: np.ndarray
    layer: LayerW
    norm: np.ndarray


@dataclass
class Weights:
    embed: np.ndarray         # (V, H) float32
    layers: list[LayerW]
    norm: np.ndarray
    lm_head: QWeight
    mtp: MtpW | None = None


def stack_experts(experts: list[MlpW]) -> tuple:
    """One (E, rows, cols_p) array per projection, each expert's weight a view
    of it (no second copy): the compiled CPU path runs every routed pair of a
    block in one call."""
    out = []
    for name in ("gate", "up", "down"):
        stack = np.stack([getattr(e, name).data for e in experts])
        for e, view in zip(experts, stack):
            getattr(e, name).data = view
        out.append(stack)
    return tuple(out)
