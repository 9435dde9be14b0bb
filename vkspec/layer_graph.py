"""A family's decoder layer, written once as data: the steps in order, the
norms they read (by their checkpoint names) and which adds fuse.

Terms:
* **x**: the residual stream, the layer's input and output rows;
* **h**: the normed rows a sublayer reads (one at a time: the device holds one);
* a **sublayer** is the layer's mixer (attention or Gated DeltaNet, by the
  layer's kind) or its FFN (an MLP or the experts, by its weights);
* a **norm name** is the RMSNorm's tensor name inside the layer, without
  ".weight" ("input_layernorm"): the loader reads it, both backends apply it.

Steps:
* ``Norm(w)``:       h = rmsnorm(x, w);
* ``Sub(kind)``:     the sublayer's output from h;
* ``Add(kind, w)``:  x = x + out, or x + rmsnorm(out, w) (a sandwich norm).

Every backend interprets the same steps: the NumPy definition
(backends/cpu/model.py), its compiled calls (backends/cpu/layer_calls.py) and
the device recorder (backends/vulkan/recorder.py). A backend may fuse: the
CPU norms h inside the first GEMV's call; the device adds a sublayer's output
into x inside its last op (the output projection's accumulate, the experts'
combine). An add fused that early is the same add only if nothing reads or
writes x between the sublayer and its Add, so :func:`check` refuses graphs
where something does, and where the adds come in another order than their
sublayers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .errors import VkspecError


class Sublayer(StrEnum):
    MIXER = "mixer"     # attention or Gated DeltaNet, by the layer's kind
    FFN = "ffn"         # an MLP or the experts, by the layer's weights


def _sublayer(step) -> None:
    try:
        object.__setattr__(step, "kind", Sublayer(step.kind))
    except ValueError:
        raise VkspecError(f"{type(step).__name__}({step.kind!r}): a sublayer is one of "
                          f"{', '.join(Sublayer)}") from None


@dataclass(frozen=True)
class Norm:
    weight: str


@dataclass(frozen=True)
class Sub:
    kind: Sublayer

    def __post_init__(self):
        _sublayer(self)


@dataclass(frozen=True)
class Add:
    kind: Sublayer
    norm: str | None = None

    def __post_init__(self):
        _sublayer(self)


Step = Norm | Sub | Add


@dataclass(frozen=True)
class LayerGraph:
    name: str
    steps: tuple[Step, ...]

    def __post_init__(self):
        check(self)

    @property
    def norm_names(self) -> tuple[str, ...]:
        """Every norm the layer has, in the order the steps read them."""
        names = [s.weight if isinstance(s, Norm) else s.norm for s in self.steps if not isinstance(s, Sub)]
        return tuple(dict.fromkeys(n for n in names if n is not None))

    @property
    def mixer_norm(self) -> str:
        """The norm of the mixer's input (what the MTP head's earlier rows write their KV from)."""
        at = self.steps.index(Sub(Sublayer.MIXER))
        return next(s.weight for s in reversed(self.steps[:at]) if isinstance(s, Norm))

    @property
    def out_norms(self) -> bool:
        """Whether a sublayer's output is normed before its add (the device then needs a scratch for it)."""
        return any(isinstance(s, Add) and s.norm is not None for s in self.steps)

    def add_of(self, kind: Sublayer) -> Add:
        return next(s for s in self.steps if isinstance(s, Add) and s.kind == kind)


def check(g: LayerGraph) -> None:
    """One line for a graph the backends cannot run as written."""
    def bad(why):
        raise VkspecError(f"layer graph {g.name!r}: {why}")
    subs = [s.kind for s in g.steps if isinstance(s, Sub)]
    adds = [s.kind for s in g.steps if isinstance(s, Add)]
    if sorted(subs) != sorted(Sublayer) or sorted(adds) != sorted(Sublayer):
        bad(f"needs one Sub and one Add of each of {', '.join(Sublayer)}")
    if subs != adds:
        bad("the adds must come in the order of their sublayers")
    normed, pending = False, set()
    for s in g.steps:
        if isinstance(s, Norm):
            if pending:
                bad(f"Norm({s.weight!r}) reads x while {', '.join(sorted(pending))} is not added yet")
            normed = True
        elif isinstance(s, Sub):
            if not normed:
                bad(f"Sub({s.kind!r}) before any Norm: h is undefined")
            pending.add(s.kind)
        else:
            if s.kind not in pending:
                bad(f"Add({s.kind!r}) before its sublayer")
            pending.discard(s.kind)


# x + mixer(norm(x)), then x + ffn(norm(x)): Llama, Qwen2/3, Qwen3-MoE, the hybrids
MIXER, FFN = Sublayer
SEQUENTIAL = LayerGraph("sequential", (
    Norm("input_layernorm"), Sub(MIXER), Add(MIXER),
    Norm("post_attention_layernorm"), Sub(FFN), Add(FFN)))

# each sublayer's output normed before its add; post_attention_layernorm is the mixer's output norm (Gemma 3)
SANDWICH = LayerGraph("sandwich", (
    Norm("input_layernorm"), Sub(MIXER), Add(MIXER, "post_attention_layernorm"),
    Norm("pre_feedforward_layernorm"), Sub(FFN), Add(FFN, "post_feedforward_layernorm")))
