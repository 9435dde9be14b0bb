"""Device memory for the dense chain: the plan, the budget, named allocations.

Every tensor the chain makes goes through an :class:`Uploader` under a name.
The memory plan is the same allocation code run against an uploader that
only counts (:meth:`Uploader.dry`), so the plan cannot drift from what is
allocated, and a model that does not fit the budget or a device limit fails
with one line before the first tensor is made.

Tensors of the same kind from every layer share **arenas** (one buffer per
kind up to the largest storage buffer, :class:`Span` a piece of one): the
weights' bytes, their scales, the norm vectors, the KV cache, the recurrent
state. A shader then binds the same buffers at every layer and takes the
layer's offset in its push constants, so one pipeline serves all layers
(Lavapipe compiles every pipeline with LLVM, which costs memory and time
for each).

The pieces (Plan, DevWeight, Span, the limits) are in buffers.py.
"""

from __future__ import annotations

import numpy as np

from ... import pages
from ...errors import DeviceError, VkspecError
from ...formats.matrix import QWeight
from .buffers import (ALIGN_WORDS, ARENA_KINDS, Arena, DevPart, DevWeight, Plan, Span, aligned,
                      max_buffer_bytes, pack, size_text)


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

    def __init__(self, dev, arenas: dict[str, list[int]] | None = None, planned: int | None = None):
        self.dev = dev
        self.planned = planned
        self.progress = None
        self.hit = None                       # the model's fault hook (faults.py: "alloc")
        self.fail_after: int | None = None
        self.made: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._staging = None
        self._planned = {k: list(v) for k, v in (arenas or {}).items()}   # (kind, generation) -> words
        self._arenas: dict[tuple[str, int], list[Arena]] = {}
        self._span_arena: dict[int, Arena] = {}

    @classmethod
    def dry(cls) -> "Uploader":
        return cls(None)

    @property
    def allocated(self) -> int:
        return sum(self.made.values())

    def plan(self) -> Plan:
        return Plan(list(self.made.items()))

    def arena_sizes(self) -> dict[tuple[str, int], list[int]]:
        """(kind, generation) -> words of each arena, as a dry run packed them: the real
        uploader given these makes each arena once at its final size."""
        return {k: [a.used for a in v] for k, v in self._arenas.items()}

    def plan_arenas(self, kind: str, generation: int, sizes: list[int]):
        """Spans of these sizes will come next in arenas of their own generation."""
        self._planned[kind, generation] = pack(sizes, max_buffer_bytes() // 4 // ALIGN_WORDS * ALIGN_WORDS)

    def span(self, name: str, words: int, kind: str, report: bool = True, generation: int = 0) -> Span:
        """`words` words for `name` in an arena of its kind (ARENA_KINDS) and
        generation (spans made together that outlive the arenas before them)."""
        dtype, zeroed = ARENA_KINDS[kind]
        need, limit = aligned(words), max_buffer_bytes() // 4 // ALIGN_WORDS * ALIGN_WORDS
        if need > limit and self.dev is not None:     # a dry run's Plan.check names it
            raise VkspecError(f"{name} needs one {need * 4 / 2**20:.2f} MiB device buffer, over the "
                              f"device's largest storage buffer ({limit * 4 / 2**20:.2f} MiB; "
                              "VKSPEC_MAX_BUFFER_MB)")
        if name in self.made:
            raise ValueError(f"device tensor {name} made twice")
        arenas = self._arenas.setdefault((kind, generation), [])
        a = arenas[-1] if arenas else None
        make = None
        if a is None or a.used + need > a.cap:
            planned = self._planned.get((kind, generation), [])
            cap = max(limit, need) if self.dev is None else (planned[len(arenas)] if len(arenas) < len(planned)
                                                             else need)
            a = Arena(None, cap)
            make = (lambda: self.dev.zeros(cap, dtype)) if zeroed else (lambda: self.dev.storage(cap, dtype))
        if self.dev is not None:
            t = self._allocate(name, need * 4, make or (lambda: None))
            if make is not None:
                a.t = t
        if make is not None:
            arenas.append(a)
        sp = Span(a.t, a.used, int(words))
        a.used += need
        a.live += 1
        self.made[name] = need * 4
        self._names[id(sp)] = name
        self._span_arena[id(sp)] = a
        if report:
            self._report(need * 4)
        return sp

    def vector(self, name: str, a: np.ndarray) -> Span:
        """A small float32 array (a norm, a conv kernel) in the vectors arena."""
        a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        sp = self.span(name, a.size, "vectors")
        self.write(sp.t, sp.off, a)
        return sp

    def _tick(self):
        if self.fail_after is not None:
            if self.fail_after <= 0:
                self.fail_after = None
                raise RuntimeError("vk::Device::allocateMemory: ErrorOutOfDeviceMemory (injected)")
            self.fail_after -= 1

    def _allocate(self, name: str, size: int, make):
        """make() for `name` (size bytes); a failure says what was asked and
        how much of the plan was in place."""
        from .device import device_calls
        try:
            with device_calls("to allocate device memory"):
                self._tick()
                if self.hit is not None:
                    self.hit("alloc", size)
                return make()
        except DeviceError as e:
            cause = e.__cause__ or e
            plan = f" of the plan's {size_text(self.planned)}" if self.planned else ""
            raise DeviceError(f"the Vulkan device could not allocate {name} ({size_text(size)}) with "
                              f"{size_text(self.allocated)}{plan} in place: {str(cause).splitlines()[0]}") from cause

    def _made(self, name: str, words: int, make, report: bool = True):
        if name in self.made:
            raise ValueError(f"device tensor {name} made twice")
        size = max(int(words), 1) * 4
        if self.dev is None:
            self.made[name] = size
            return None
        t = self._allocate(name, size, make)
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
        """A tensor or a span; an arena goes when its last span does."""
        name = self._names.pop(id(t))
        del self.made[name]
        if isinstance(t, Span):
            a = self._span_arena.pop(id(t))
            a.live -= 1
            if a.live == 0:
                for arenas in self._arenas.values():
                    if a in arenas:
                        arenas.remove(a)
                if a.t is not None:
                    self._destroy(a.t)
            return
        self._destroy(t)

    def _destroy(self, t):
        if self.dev is not None:
            self.dev.forget(t)
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
        from .device import device_calls
        with device_calls("in an upload"):
            seq = self.dev.sequence()
            seq.record(self.dev.kp.OpTensorSyncDevice([st]))
            self.dev.record_fill(seq, st, t, words, dst_off=dst_off)
            seq.eval()

    # --- weights -------------------------------------------------------------------------
    def weight(self, name: str, parts: list[QWeight], arena: bool = True) -> DevWeight:
        """Weights whose rows follow one another (q|k|v, every expert's
        gate|up ...) as one device matrix, each run of one format in one span
        of the weights arena (split where it would exceed the largest
        buffer); rows in logical order. ``arena`` False: buffers of its own
        (the embedding table and the lm_head, which one pipeline reads)."""
        cols = parts[0].cols
        assert all(p.cols == cols for p in parts)
        runs, row = [], 0
        for p in parts:
            if runs and (runs[-1][0].fmt, runs[-1][0].acts) == (p.fmt, p.acts):
                runs[-1].append(p)
            else:
                runs.append([p])
        out = []
        for run in runs:
            for first, pieces in _split(run, max_buffer_bytes()):
                out.append(self._part(f"{name}" + (f".{len(out)}" if len(runs) > 1 or out else ""),
                                      row + first, pieces, arena))
            row += sum(p.rows for p in run)
        return DevWeight(row, cols, out)

    def _part(self, name: str, first_row: int, pieces: list[QWeight], arena: bool) -> DevPart:
        f = pieces[0]
        rows = sum(p.rows for p in pieces)
        words = -(-rows * f.row_bytes // 4)
        if arena:
            span = self.span(name, words, "weights", report=False)
            data, w_off = span.t, span.off
        else:
            data, w_off = self._made(name, words, lambda: self.dev.storage(words, np.uint32), report=False), 0
        stream = Stream(self, data, w_off)
        if self.dev is not None:           # a dry run (the plan) reads no byte of the file
            for p in pieces:
                chunk = max(1, staging_bytes() // max(p.row_bytes, 1))
                for r0 in range(0, p.rows, chunk):
                    stream.add(p.rows_of(r0, min(p.rows, r0 + chunk)).data.reshape(-1))
            stream.close()
            for p in pieces:               # on the device now: the file's pages can go
                pages.drop(p.data)
        self._report(self.made[name])
        s_stride = f.scales_per_row
        sc = (np.concatenate([p.scales[p.stored(slice(0, p.rows))] for p in pieces]).astype(np.float32)
              if s_stride else np.zeros(1, np.float32))
        if arena:
            span = self.span(f"{name}.scales", sc.size, "scales")
            scales, s_off = span.t, span.off
            self.write(scales, s_off, sc)
        else:
            scales, s_off = self.array(f"{name}.scales", sc), 0
        return DevPart(first_row, rows, f.fmt, f.row_bytes, s_stride, data, scales, 4 * w_off, s_off, f.acts)


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
