"""What the chain's device memory is made of: sizes and limits, the memory
plan, device weights (parts in their formats), and spans of the arenas that
the layers share (memory.py makes them).

Limits kp cannot query: the largest storage buffer (Vulkan guarantees 128 MiB,
Lavapipe reports exactly that; VKSPEC_MAX_BUFFER_MB overrides it) and the
memory to use (``budget_gb``, from ``--device-gb`` or VKSPEC_DEVICE_GB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import VkspecError
from ...formats.matrix import FORMATS

if TYPE_CHECKING:
    import kp


def size_text(b: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b / (1 << shift):.2f} {unit}"
    return f"{b} bytes"


def max_buffer_bytes() -> int:
    return int(float(os.environ.get("VKSPEC_MAX_BUFFER_MB", "128")) * (1 << 20))


def budget_bytes(budget_gb: float | None) -> int | None:
    if budget_gb is None and os.environ.get("VKSPEC_DEVICE_GB"):
        budget_gb = float(os.environ["VKSPEC_DEVICE_GB"])
    return None if budget_gb is None else int(budget_gb * (1 << 30))


@dataclass
class Plan:
    """The tensors of a chain, by name, in bytes."""
    items: list[tuple[str, int]]

    @property
    def total(self) -> int:
        return sum(b for _, b in self.items)

    def check(self, budget: int | None, what: str = "the dense chain"):
        limit = max_buffer_bytes()
        for name, b in self.items:
            if b > limit:
                raise VkspecError(
                    f"{name} needs one {b / 2**20:.2f} MiB device buffer, over the device's "
                    f"largest storage buffer ({limit / 2**20:.2f} MiB; VKSPEC_MAX_BUFFER_MB)")
        if budget is not None and self.total > budget:
            raise VkspecError(f"{what} needs {self.total / 2**30:.3f} GiB of device memory, over "
                              f"the budget of {budget / 2**30:.3f} GiB (--device-gb / VKSPEC_DEVICE_GB)")


def q8_words(cols: int, block: int) -> int:
    """Words of one row of quantize_q8.comp's output (its int8 values, a d
    per block, a sum per 16 columns), rounded up to whole vec4s."""
    return aligned(cols // 4 + cols // block + cols // 16)


@dataclass
class DevPart:
    """Rows first_row.. of a weight, in one format, in one device buffer."""
    first_row: int
    rows: int
    fmt: str
    row_bytes: int
    s_stride: int         # scales per row (0: none outside the data)
    data: kp.Tensor       # kp tensor holding the rows' bytes from byte w_off
    scales: kp.Tensor     # kp tensor holding the scales from float s_off
    w_off: int = 0
    s_off: int = 0
    acts: str = "f32"     # the QWeight's arithmetic: "q8" runs gemv_q8.comp

    @property
    def variant(self) -> str:
        return FORMATS[self.fmt].variant


@dataclass
class DevWeight:
    """A weight matrix on the device, uploaded once in its formats: one part,
    or several where the rows change format (q|k|v of a K-quant file) or
    exceed one storage buffer."""
    rows: int
    cols: int
    parts: list[DevPart]

    @property
    def single(self) -> DevPart:
        assert len(self.parts) == 1, "this use needs the weight in one part"
        return self.parts[0]


@dataclass(eq=False)
class Span:
    """Words off..off+n of the arena tensor t: one layer's piece of a buffer
    the layers share."""
    t: kp.Tensor
    off: int
    n: int


ALIGN_WORDS = 4               # spans start on 16 bytes (vec4 and block reads)
# arena kinds: word type, made zero (the rest is written whole before use)
ARENA_KINDS = {"weights": (np.uint32, False), "scales": (np.float32, False),
               "vectors": (np.float32, False), "kv": (np.float32, True),
               "ring": (np.float32, True), "ssm": (np.float32, True)}


def aligned(words: int) -> int:
    return -(-max(int(words), 1) // ALIGN_WORDS) * ALIGN_WORDS


def pack(sizes: list[int], limit_words: int) -> list[int]:
    """The arenas (their words) that spans of these sizes fill, in order,
    each arena closed when the next span does not fit."""
    arenas: list[int] = []
    for w in sizes:
        w = aligned(w)
        if not arenas or arenas[-1] + w > limit_words:
            arenas.append(0)
        arenas[-1] += w
    return arenas


class Arena:
    """One buffer of an arena kind: cap words, used so far, live spans."""

    def __init__(self, t, cap: int):
        self.t, self.cap, self.used, self.live = t, cap, 0, 0
