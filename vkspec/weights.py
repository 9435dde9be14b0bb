"""The weights of a model, as the forward pass reads them (both backends).

Names and parametrisation follow Hugging Face's; see vkspec.loader for how a
checkpoint becomes these, and vkspec.backends.cpu.model for the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats.matrix import QWeight


@dataclass
class AttnW:
    q: QWeight
    k: QWeight
    v: QWeight
    o: QWeight
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    gated: bool
    window: int = 0                    # keys at distance 0..window-1 from the query (0: all)
    rope_theta: float | None = None    # this layer's RoPE base (None: the model's)


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


@dataclass
class LayerW:
    kind: str                 # "linear_attention" | "full_attention"
    in_norm: np.ndarray
    post_norm: np.ndarray
    mixer: AttnW | DeltaW
    ffn: MlpW | MoeW
    # sandwich norms (Gemma 3): the mixer's and the FFN's outputs normed before
    # their residual adds (post_norm is then the pre-FFN norm)
    mixer_out_norm: np.ndarray | None = None
    ffn_out_norm: np.ndarray | None = None


@dataclass
class MtpW:
    fc: QWeight
    norm_emb: np.ndarray
    norm_hidden: np.ndarray
    layer: LayerW
    norm: np.ndarray


@dataclass
class Weights:
    embed: QWeight            # (V, H), looked up row by row
    layers: list[LayerW]
    norm: np.ndarray
    lm_head: QWeight
    mtp: MtpW | None = None
