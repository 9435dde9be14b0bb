"""Device memory for the dense chain: the plan, the budget, named allocations.

Every tensor the chain makes goes through an :class:`Uploader` under a name.
The memory plan is the same allocation code run against an uploader that
only counts (:meth:`Uploader.dry`), so the plan cannot drift from what is
allocated, and a model that does not fit the budget or a device limit fails
with one line before the first tensor is made.

Limits kp cannot query: the largest storage buffer (Vulkan guarantees 128 MiB,
Lavapipe reports exactly that; VKSPEC_MAX_BUFFER_MB overrides it) and the
memory to use (``budget_gb``, from ``--device-gb`` or VKSPEC_DEVICE_GB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...errors import VkspecError
from ...formats.quant import QWeight


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


def qcat(ws: list[QWeight]) -> QWeight:
    """Row-concatenate weights of one format and width: one GEMV for several
    projections of the same input (each output row keeps its bits)."""
    w0 = ws[0]
    assert all(w.fmt == w0.fmt and w.cols == w0.cols for w in ws)
    scales = np.concatenate([w.scales for w in ws]) if w0.scales.size else w0.scales
    return QWeight(w0.fmt, sum(w.rows for w in ws), w0.cols,
                   np.concatenate([w.data for w in ws]), scales)


@dataclass
class DevWeight:
    """A weight resident on the device (data and scales), uploaded once."""
    fmt: str
    rows: int
    cols_p: int
    variant: str
    data: object          # kp tensor
    scales: object        # kp tensor
    words_per_row: int    # data elements per row (floats or uint32 words)
    scales_per_row: int


class Uploader:
    """Makes the chain's device tensors, each under a name; ``made`` maps the
    live ones to their bytes. A dry uploader (``dev`` None) makes nothing and
    only counts: the memory plan. ``fail_after`` injects an allocation failure
    (tests), after that many more tensors."""

    def __init__(self, dev):
        self.dev = dev
        self.fail_after: int | None = None
        self.made: dict[str, int] = {}
        self._names: dict[int, str] = {}

    @classmethod
    def dry(cls) -> "Uploader":
        return cls(None)

    @property
    def allocated(self) -> int:
        return sum(self.made.values())

    def plan(self) -> Plan:
        return Plan(list(self.made.items()))

    def _tick(self):
        if self.fail_after is not None:
            if self.fail_after <= 0:
                self.fail_after = None
                raise VkspecError("device allocation failed (injected)")
            self.fail_after -= 1

    def _made(self, name: str, words: int, make):
        if name in self.made:
            raise ValueError(f"device tensor {name} made twice")
        self._tick()
        self.made[name] = max(int(words), 1) * 4
        if self.dev is None:
            return None
        t = make()
        self._names[id(t)] = name
        return t

    def array(self, name: str, a: np.ndarray, kind: str = "storage"):
        a = np.ascontiguousarray(a)
        return self._made(name, a.size, lambda: self.dev.tensor(a, kind))

    def zeros(self, name: str, n: int, dtype=np.float32, kind: str = "storage"):
        return self._made(name, n, lambda: self.dev.zeros(n, dtype, kind))

    def release(self, t):
        name = self._names.pop(id(t))
        del self.made[name]
        t.destroy()

    def name_of(self, t) -> str:
        return self._names[id(t)]

    def rename(self, t, name: str):
        """A tensor made to replace another takes over its name."""
        old = self._names[id(t)]
        if name in self.made:
            raise ValueError(f"device tensor {name} exists")
        self.made[name] = self.made.pop(old)
        self._names[id(t)] = name

    def weight(self, name: str, w: QWeight) -> DevWeight:
        data = self.array(name, w.data)
        scales = self.array(f"{name}.scales", w.scales if w.scales.size else np.zeros(1, np.float32))
        spr = {"f32": 0, "bf16": 0, "int8": 1}.get(w.fmt, w.cols_p // 64)
        return DevWeight(w.fmt, w.rows, w.cols_p, w.variant, data, scales, int(w.data.shape[1]), spr)
