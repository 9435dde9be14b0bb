"""The op table: every shader the chain dispatches, declared once with its
bindings (in binding order) and its push struct; and the recording a
sequence is built from.

A dispatch names its buffers (``x=..., y=...``): a missing or unknown one is
an error, and tests/test_structure.py holds each entry's bindings to the
compiled shader's. The push structs (vkspec/shaders/push.py) are checked
against the SPIR-V when the shaders are built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from ...shaders import push as P
from .device import load_shader

if TYPE_CHECKING:
    import kp
    import numpy as np


class Pass(StrEnum):
    """What a recorded sequence runs: the model's layers, or its MTP head."""
    MAIN = "main"
    MTP = "mtp"


@dataclass(frozen=True)
class Op:
    stem: str                  # the .comp file
    bindings: tuple[str, ...]
    push: type

    def bound(self, buffers: dict) -> list:
        """The buffers named by binding, in binding order (a missing or unknown one: TypeError)."""
        if set(buffers) != set(self.bindings):
            raise TypeError(f"{self.stem}: bindings {sorted(buffers)} != {list(self.bindings)}")
        return [buffers[b] for b in self.bindings]


STEP = "step"
GEMV = Op("gemv", ("w", "scales", "x", "y"), P.Gemv)
GEMV_ROUTED = Op("gemv", ("w", "scales", "x", "y", "idx", "slot_of"), P.Gemv)
GEMV_ROWMAP = Op("gemv", ("w", "scales", "x", "y", "row_of"), P.Gemv)
GEMV_Q8 = Op("gemv_q8", ("w", "scales", "q", "y"), P.Gemv)
GEMV_Q8_ROUTED = Op("gemv_q8", ("w", "scales", "q", "y", "idx", "slot_of"), P.Gemv)
GEMV_Q8_ROWMAP = Op("gemv_q8", ("w", "scales", "q", "y", "row_of"), P.Gemv)
QUANTIZE_Q8 = Op("quantize_q8", ("x", "q"), P.QuantizeQ8)
RMSNORM = Op("rmsnorm", ("x", "w", "y"), P.Rmsnorm)
RMSNORM_GATED = Op("rmsnorm", ("x", "w", "y", "z"), P.Rmsnorm)
EMBED = Op("embed", ("w", "scales", "y", STEP), P.Embed)
ROPE = Op("rope", ("x", "cos", "sin", "y", STEP), P.Rope)
ATTEND = Op("attend", ("q", "kv", "s", "o", STEP), P.Attend)
CONV_STEP = Op("conv_step", ("x", "w", "ring", "y", STEP), P.ConvStep)
DELTANET = Op("deltanet", ("mixed", "ba", "par", "prep", "state", "o", STEP), P.Deltanet)
BIAS_ADD = Op("bias_add", ("y", "b"), P.BiasAdd)
BIAS_ADD_ACC = Op("bias_add", ("x", "b", "y"), P.BiasAdd)
SILU_MUL = Op("silu_mul", ("x", "y"), P.SiluMul)
GELU_MUL = Op("gelu_mul", ("x", "y"), P.GeluMul)
ROUTE = Op("route", ("logits", "idx", "wt"), P.Route)
MOE_COMBINE = Op("moe_combine", ("x", "y", "wt", "sh", "gate"), P.MoeCombine)
ARGMAX = Op("argmax", ("x", "y"), P.Argmax)
SOFTMAX = Op("softmax", ("x", "y"), P.Softmax)          # the op tests (immediate.py)
FILL = Op("fill", ("x", "y"), P.Fill)

OPS = (GEMV, GEMV_ROUTED, GEMV_ROWMAP, GEMV_Q8, GEMV_Q8_ROUTED, GEMV_Q8_ROWMAP, QUANTIZE_Q8, RMSNORM,
       RMSNORM_GATED, EMBED, ROPE, ATTEND, CONV_STEP, DELTANET, BIAS_ADD, BIAS_ADD_ACC, SILU_MUL, GELU_MUL, ROUTE, MOE_COMBINE, ARGMAX, SOFTMAX, FILL)


@dataclass(frozen=True)
class Dispatch:
    algo: kp.Algorithm
    push: np.ndarray             # the packed push constants


@dataclass(frozen=True)
class SyncLocal:
    """Device -> host copies of these tensors."""
    tensors: list


@dataclass(frozen=True)
class SyncDevice:
    """Host -> device copies of these tensors."""
    tensors: list


@dataclass(frozen=True)
class Host:
    """The sequence ends; the host runs fn; the next one begins."""
    fn: Callable[[], None]


def grid3(grid) -> tuple[int, int, int]:
    """A dispatch's workgroups along x, y, z from an int or a shorter tuple."""
    return (grid, 1, 1) if isinstance(grid, int) else tuple(grid) + (1,) * (3 - len(grid))


def groups(n: int, local: int = 64) -> int:
    """Workgroups of `local` invocations that cover n."""
    return max(1, -(-n // local))


class Recording:
    """The steps of one sequence in order: dispatches, syncs between the device
    and the host copies, and host work that splits it into segments."""

    def __init__(self, dev, algos: dict):
        self.dev, self.algos = dev, algos
        self.items: list[Dispatch | SyncLocal | SyncDevice | Host] = []

    def op(self, op: Op, variant: str | None, grid, push, /, spec=(), **buffers):
        tensors = op.bound(buffers)
        shader = load_shader(op.stem, variant)
        g = grid3(grid)
        key = (shader.name, tuple(id(t) for t in tensors), g, tuple(spec))
        algo = self.algos.get(key)
        if algo is None:
            algo = self.algos[key] = self.dev.algorithm(shader, tensors, g, push, spec)
        self.items.append(Dispatch(algo, shader.pack(push)))

    def sync_local(self, tensors):
        self.items.append(SyncLocal(tensors))

    def sync_device(self, tensors):
        self.items.append(SyncDevice(tensors))

    def host(self, fn):
        """The sequence ends here; the host runs fn; the next one begins."""
        self.items.append(Host(fn))

    def sequences(self, first_sync: list, last_sync: list) -> list[tuple]:
        """kp sequences [(sequence, host fn or None)]: each replays with one
        eval(); ``first_sync`` goes to the device first, ``last_sync`` comes
        back to the host at the end."""
        kp = self.dev.kp
        segments, seq = [], self.dev.sequence()
        seq.record(kp.OpTensorSyncDevice(first_sync))
        for item in self.items:
            if isinstance(item, Dispatch):
                seq.record(kp.OpAlgoDispatch(item.algo, item.push))
            elif isinstance(item, SyncLocal):
                seq.record(kp.OpTensorSyncLocal(item.tensors))
            elif isinstance(item, SyncDevice):
                seq.record(kp.OpTensorSyncDevice(item.tensors))
            else:
                segments.append((seq, item.fn))
                seq = self.dev.sequence()
        seq.record(kp.OpTensorSyncLocal(last_sync))
        segments.append((seq, None))
        return segments
