"""Device memory for the dense chain: the plan, the budget, resident weights.

Every tensor the chain will create is listed (name, bytes) before the first
one is made, so a model that does not fit the budget or a device limit fails
with one line and nothing half-built.

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

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, b in self.items:
            k = name.split(":")[0]
            out[k] = out.get(k, 0) + b
        return out


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


def weight_bytes(w: QWeight) -> tuple[int, int]:
    return int(w.data.nbytes), int(max(w.scales.nbytes, 4))


class Uploader:
    """Makes the chain's device tensors; ``fail_after`` injects an allocation
    failure (tests), after that many more tensors."""

    def __init__(self, dev):
        self.dev = dev
        self.fail_after: int | None = None
        self.allocated = 0                    # bytes of the live tensors made here

    def _tick(self):
        if self.fail_after is not None:
            if self.fail_after <= 0:
                self.fail_after = None
                raise VkspecError("device allocation failed (injected)")
            self.fail_after -= 1

    def array(self, a: np.ndarray, kind: str = "storage"):
        self._tick()
        t = self.dev.tensor(np.ascontiguousarray(a), kind)
        self.allocated += t.size() * 4
        return t

    def zeros(self, n: int, dtype=np.float32, kind: str = "storage"):
        self._tick()
        t = self.dev.zeros(n, dtype, kind)
        self.allocated += t.size() * 4
        return t

    def release(self, t):
        self.allocated -= t.size() * 4
        t.destroy()

    def weight(self, w: QWeight) -> DevWeight:
        data = self.array(w.data)
        scales = self.array(w.scales if w.scales.size else np.zeros(1, np.float32))
        spr = {"f32": 0, "bf16": 0, "int8": 1}.get(w.fmt, w.cols_p // 64)
        return DevWeight(w.fmt, w.rows, w.cols_p, w.variant, data, scales,
                         int(w.data.shape[1]), spr)
