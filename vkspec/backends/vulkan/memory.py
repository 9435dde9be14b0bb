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

from ...errors import DeviceError, VkspecError
from ...formats.matrix import FORMATS, QWeight


def _size(b: int) -> str:
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


@dataclass
class DevPart:
    """Rows first_row.. of a weight, in one format, in one device buffer."""
    first_row: int
    rows: int
    fmt: str
    row_bytes: int
    s_stride: int         # scales per row (0: none outside the data)
    data: object          # kp tensor: the rows' bytes
    scales: object        # kp tensor (one float when there are none)

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


STAGING_MAX = 4 << 20         # host-visible bytes every upload goes through


def staging_bytes() -> int:
    return min(STAGING_MAX, max_buffer_bytes() // 4 * 4)


class Uploader:
    """Makes the chain's device tensors, each under a name; ``made`` maps the
    live ones to their bytes. Everything reaches the device through one
    bounded staging buffer (staging_bytes()), so nothing is ever staged whole in
    host memory. A dry uploader (``dev`` None) makes nothing and only counts:
    the memory plan. ``fail_after`` injects an allocation failure (tests),
    after that many more tensors. A failed allocation says what it asked for
    and how much of the plan (``planned`` bytes) was in place.
    ``progress(bytes)`` is told of every tensor made."""

    def __init__(self, dev, planned: int | None = None):
        self.dev = dev
        self.planned = planned
        self.progress = None
        self.hit = None                       # the model's fault hook (faults.py: "alloc")
        self.fail_after: int | None = None
        self.made: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._staging = None
        self._copies: dict = {}

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
                raise RuntimeError("vk::Device::allocateMemory: ErrorOutOfDeviceMemory (injected)")
            self.fail_after -= 1

    def _made(self, name: str, words: int, make, report: bool = True):
        if name in self.made:
            raise ValueError(f"device tensor {name} made twice")
        size = max(int(words), 1) * 4
        if self.dev is None:
            self.made[name] = size
            return None
        from .device import device_calls
        try:
            with device_calls("to allocate device memory"):
                self._tick()
                if self.hit is not None:
                    self.hit("alloc", size)
                t = make()
        except DeviceError as e:
            cause = e.__cause__ or e
            plan = f" of the plan's {_size(self.planned)}" if self.planned else ""
            raise DeviceError(f"the Vulkan device could not allocate {name} ({_size(size)}) with "
                              f"{_size(self.allocated)}{plan} in place: {str(cause).splitlines()[0]}") from cause
        self.made[name] = size
        self._names[id(t)] = name
        if report:
            self._report(size)
        return t

    def _report(self, size: int):
        if self.progress is not None:
            self.progress(size)

    def zeros(self, name: str, n: int, dtype=np.float32, kind: str = "storage"):
        return self._made(name, n, lambda: self.dev.zeros(n, dtype, kind))

    def array(self, name: str, a: np.ndarray, kind: str = "storage"):
        a = np.ascontiguousarray(a)
        if kind != "storage":
            return self._made(name, a.size, lambda: self.dev.tensor(a, kind))
        t = self._made(name, a.size, lambda: self.dev.storage(a.size, a.dtype))
        self.write(t, 0, a)
        return t

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

    # --- the staging buffer ------------------------------------------------------------
    def _stage(self):
        if "staging:upload" not in self.made:
            words = staging_bytes() // 4
            self._staging = self._made("staging:upload", words,
                                       lambda: self.dev.zeros(words, np.uint32, "device"))
        return self._staging

    def write(self, t, word_off: int, data: np.ndarray):
        """data's bytes into tensor t from word ``word_off`` on."""
        s = Stream(self, t, word_off)
        s.add(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        s.close()

    def copy_words(self, t, dst_off: int, words: int):
        """The staging buffer's first `words` words to the device, into t at dst_off."""
        st = self._stage()
        if self.dev is None:
            return
        from ...shaders.push import Fill
        from .device import load_shader
        kp = self.dev.kp
        key = id(t)
        if key not in self._copies:
            self._copies[key] = self.dev.record_fill(self.dev.sequence(), st, t, words)
        push = load_shader("fill", "copy").pack(Fill(n=words, x_off=0, y_off=dst_off))
        from .device import device_calls
        with device_calls("in an upload"):
            seq = self.dev.sequence()
            seq.record(kp.OpTensorSyncDevice([st]))
            seq.record(kp.OpAlgoDispatch(self._copies[key], push))
            seq.eval()

    # --- weights -------------------------------------------------------------------------
    def weight(self, name: str, parts: list[QWeight]) -> DevWeight:
        """Weights whose rows follow one another (q|k|v, every expert's
        gate|up ...) as one device matrix, each run of one format in one buffer
        (split where it would exceed the largest buffer); rows in logical order."""
        cols = parts[0].cols
        assert all(p.cols == cols for p in parts)
        runs, row = [], 0
        for p in parts:
            if runs and runs[-1][0].fmt == p.fmt:
                runs[-1].append(p)
            else:
                runs.append([p])
        out = []
        for run in runs:
            for first, pieces in _split(run, max_buffer_bytes()):
                out.append(self._part(f"{name}" + (f".{len(out)}" if len(runs) > 1 or out else ""),
                                      row + first, pieces))
            row += sum(p.rows for p in run)
        return DevWeight(row, cols, out)

    def _part(self, name: str, first_row: int, pieces: list[QWeight]) -> DevPart:
        f = pieces[0]
        rows = sum(p.rows for p in pieces)
        words = -(-rows * f.row_bytes // 4)
        data = self._made(name, words, lambda: self.dev.storage(words, np.uint32), report=False)
        stream = Stream(self, data, 0)
        for p in pieces:
            chunk = max(1, staging_bytes() // max(p.row_bytes, 1))
            for r0 in range(0, p.rows, chunk):
                r1 = min(p.rows, r0 + chunk)
                stream.add(p.data[p.stored(slice(r0, r1))].reshape(-1))
        stream.close()
        self._report(max(words, 1) * 4)           # the weight is on the device now
        s_stride = f.scales_per_row
        if s_stride:
            sc = np.concatenate([p.scales[p.stored(slice(0, p.rows))] for p in pieces]).astype(np.float32)
            scales = self.array(f"{name}.scales", sc)
        else:
            scales = self.zeros(f"{name}.scales", 1)
        return DevPart(first_row, rows, f.fmt, f.row_bytes, s_stride, data, scales)


class Stream:
    """Bytes appended in order, sent to a device tensor through the staging
    buffer one full buffer at a time."""

    def __init__(self, up: Uploader, t, word_off: int):
        self.up, self.t, self.word = up, t, word_off
        self.fill, self.size = 0, staging_bytes()
        self.buf = None if up.dev is None else up._stage().data().view(np.uint8)
        if up.dev is None:
            up._stage()

    def add(self, data: np.ndarray):
        if self.buf is None:
            return
        at = 0
        while at < data.size:
            n = min(data.size - at, self.size - self.fill)
            self.buf[self.fill:self.fill + n] = data[at:at + n]
            self.fill, at = self.fill + n, at + n
            if self.fill == self.size:
                self._send()

    def _send(self):
        words = -(-self.fill // 4)
        self.buf[self.fill:words * 4] = 0
        self.up.copy_words(self.t, self.word, words)
        self.word += words
        self.fill = 0

    def close(self):
        if self.buf is not None and self.fill:
            self._send()


def _split(run: list[QWeight], limit: int):
    """(first row, pieces) of a run of weights, each piece at most `limit` bytes."""
    out, cur, cur_bytes, first, row = [], [], 0, 0, 0
    for p in run:
        per = max(1, limit // max(p.row_bytes, 1))
        r0 = 0
        while r0 < p.rows:
            room = max(1, (limit - cur_bytes) // p.row_bytes) if cur else per
            r1 = min(p.rows, r0 + room)
            cur.append(p.rows_of(r0, r1) if (r0, r1) != (0, p.rows) else p)
            cur_bytes += (r1 - r0) * p.row_bytes
            if cur_bytes + p.row_bytes > limit:
                out.append((first, cur))
                first, cur, cur_bytes = row + r1, [], 0
            r0 = r1
        row += p.rows
    if cur:
        out.append((first, cur))
    return out
