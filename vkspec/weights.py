"""The weights of a model, as the forward pass reads them (both backends).

Names and parametrisation follow Hugging Face's; see vkspec.loader for how a
checkpoint becomes these, and vkspec.backends.cpu.model for the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, is_dataclass

import numpy as np

from .formats.matrix import QWeight
from .layer_graph import LayerGraph


@dataclass
class AttnW:
    q: QWeight                # (nh * hd, H), or (2 * nh * hd, H) as [q | gate] per head when gated
    k: QWeight
    v: QWeight
    o: QWeight
    q_norm: np.ndarray | None # per-head RMSNorm weights (qk_norm)
    k_norm: np.ndarray | None
    gated: bool               # the output is multiplied by sigmoid(gate)
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    o_bias: np.ndarray | None = None
    window: int = 0                    # keys at distance 0..window-1 from the query (0: all)
    rope_theta: float | None = None    # this layer's RoPE base (None: the model's)

    @property
    def qkv_bias(self) -> np.ndarray | None:
        """The biases of the fused q|k|v rows (the device adds them in one op)."""
        if self.q_bias is None:
            return None
        return np.concatenate([self.q_bias, self.k_bias, self.v_bias]).astype(np.float32)


@dataclass
class DeltaW:
    proj: list[QWeight]       # parts whose rows, one after another, are [q | k | v | z | b | a]
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
    graph: LayerGraph         # the steps in order (vkspec.layer_graph): which norms, where
    norms: dict[str, np.ndarray]   # the graph's norms by name ("input_layernorm": weights)
    mixer: AttnW | DeltaW
    ffn: MlpW | MoeW

    @property
    def in_norm(self) -> np.ndarray:
        """The norm of the mixer's input."""
        return self.norms[self.graph.mixer_norm]


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


def qweights(obj, seen=None) -> list[QWeight]:
    """Every QWeight reachable from obj (the weights' dataclasses and lists), once."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, QWeight):
        return [obj]
    items = obj if isinstance(obj, list) else getattr(obj, "__dict__", {}).values()
    out = []
    for v in items:
        if isinstance(v, (list, QWeight)) or is_dataclass(v):
            out += qweights(v, seen)
    return out


ACTIVATIONS = ("f32", "q8")


def set_activations(weights: Weights, acts: str) -> int:
    """Give every matrix that q8 applies to (formats.intform.supports) the
    arithmetic ``acts``; float weights always keep f32. Returns how many
    matrices take q8."""
    from .formats.intform import supports
    count = 0
    for w in qweights(weights):
        if supports(w):
            w.acts = acts
            count += acts == "q8"
    return count
