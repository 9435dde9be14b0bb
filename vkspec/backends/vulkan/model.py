"""The Vulkan dense chain: the whole model on the device, byte for byte with
the NumPy path (vkspec.backends.cpu.model), behind vkspec.interface.Model.

The rooms: layout.py (what the chain holds, by name, and the memory plan),
graph.py (the op table), recorder.py (one sequence per step shape),
state.py (the watermark, regions and copy slots), step.py (the per-step
block the sequences read), device.py (kp), memory.py (allocations).

A failed device call in any method here is a DeviceError of one line
(device.on_device); the state it leaves is the one before the call, as far
as the host can tell (a forward that failed is undone by rewind(st, 0), the
decoder's restore). ``faults`` (faults.py) injects failures for the tests.
"""

from __future__ import annotations

import time

import numpy as np

from ...config import ModelConfig
from ...errors import DeviceError, VkspecError
from ...weights import Weights
from .device import get_device, on_device
from .faults import Faults
from .graph import Pass
from .layout import MAX_ROWS, Layout
from .buffers import Plan, budget_bytes
from .memory import Uploader
from .recorder import Recorder
from .state import DeviceState, DeviceStates
from .step import NO_SLOT, step_block

LISTED_STEP = 256          # a draft vocabulary's device list grows in steps of this many ids


class VulkanModel:
    max_rows = MAX_ROWS
    backend = "vulkan"
    listed_step = LISTED_STEP

    @on_device("while loading the model")
    def __init__(self, cfg: ModelConfig, w: Weights, ctx: int | None = None,
                 budget_gb: float | None = None, tier=None):
        from ...progress import bar
        from ...shaders.limits import check
        self.cfg = cfg
        self.ctx = cfg.context(ctx)
        problems = check(cfg)
        if problems:
            raise VkspecError(f"{cfg.source}: {problems[0]}; run it with --backend cpu")
        self.faults: Faults | None = Faults.from_env()
        self.layout = Layout(cfg, w, self.ctx)
        self.tier = None
        if tier is not None:                 # the tier computes on the CPU: numba only then
            from ...tier.resident import ExpertTier
            self.tier = ExpertTier(self.layout, tier)
            self.tier.hit = self._hit
        dry = Uploader.dry()
        self.layout.allocate(dry, tier=self.tier)
        self.plan = dry.plan()
        self.plan.check(budget_bytes(budget_gb))
        self.dev = get_device()
        self.up = Uploader(self.dev, arenas=dry.arena_sizes(), planned=self.plan.total)
        self.up.hit = self._hit
        with bar(self.plan.total, "uploading weights", unit="B") as progress:
            self.up.progress = progress.update
            self.b = self.layout.allocate(self.up, tier=self.tier)
        self.up.progress = None
        self.states = DeviceStates(self.dev, self.up, self.layout, self.b)
        self.recorder = Recorder(self.layout, self.b, self.dev, self.up, self.tier)
        self._seqs: dict = {}
        self.recordings = 0        # sequences recorded so far (a forward that records is slow)
        self.timing: dict | None = None
        self._ids, self._ids_width = None, 0
        if self.tier is not None:
            self.tier.start(self.dev, self.up, self.b)
        self.layout.release_host()

    @staticmethod
    def planned_from(layout: Layout, tier=None, slots: int = 0) -> Plan:
        up = Uploader.dry()
        layout.allocate(up, regions=2 + slots, tier=tier)
        return up.plan()

    @classmethod
    def planned(cls, cfg, w, ctx=None, tier=None, slots: int = 0) -> Plan:
        """The memory plan of a chain with `slots` recurrent copy slots, without a device."""
        from ...tier.resident import ExpertTier
        layout = Layout(cfg, w, cfg.context(ctx))
        return cls.planned_from(layout, ExpertTier(layout, tier) if tier is not None else None, slots)

    @property
    def has_mtp(self) -> bool:
        return self.layout.mtp

    @property
    def regions(self) -> int:
        return self.states.regions

    # --- sequences ----------------------------------------------------------------
    def _sequence(self, kind, n, bucket, last, listed=0):
        key = (kind, n, bucket, last, listed)
        if key not in self._seqs:
            self._seqs[key] = self.recorder.record(kind, n, bucket, last, listed)
            self.recordings += 1
        return self._seqs[key]

    def _bucket(self, length: int) -> int:
        b = 64
        while b < length:
            b *= 2
        return min(b, self.ctx)

    def _hit(self, stage: str, rows: int = 0):
        if self.faults is not None:
            self.faults.hit(stage, rows)

    @on_device("while recording the decoding shapes")
    def warm(self, length: int = 0, copies: int = 0, listed: int = 0, prompt: int = 0):
        """Record now the step shapes a run will meet, so that no forward pays
        for a pipeline build (Lavapipe compiles one at creation, for each row
        count): a prompt of ``prompt`` tokens fed in blocks, then decoding
        up to ``length`` tokens in every context bucket on the way: one row a
        step for plain decoding, 1..MAX_ROWS rows (trunk and MTP head) when
        drafts may come (``copies`` copy slots or a ``listed`` draft
        vocabulary). The recurrent state first gets the regions for ``copies``
        copy slots: growing them later records every shape again. ``listed``:
        the head will score a draft vocabulary of about that many ids (its
        device length and the next are recorded too)."""
        if self.regions < copies + 2:
            if self.states.current is None:
                self.new_state()
            self._grow(copies + 2)
        buckets = [self._bucket(max(prompt, 1))]
        while buckets[-1] < min(length, self.ctx):
            buckets.append(self._bucket(buckets[-1] + 1))
        widths = [0]                             # 0: the whole vocabulary
        if listed:
            step, V = self.listed_step, self.cfg.vocab_size
            first = -(-listed // step) * step
            widths += sorted({min(V, first), min(V, first + step)})
        from ...progress import bar
        drafts = copies > 0 or listed > 0
        shapes = [(Pass.MAIN, min(MAX_ROWS, prompt - i), self._bucket(min(prompt, i + MAX_ROWS)),
                   min(MAX_ROWS, prompt - i) > 1, 0) for i in range(0, prompt, MAX_ROWS)]
        rows = range(1, (MAX_ROWS if drafts else 1) + 1)
        shapes += [(Pass.MAIN, n, bucket, False, 0) for bucket in buckets for n in rows]
        if self.has_mtp and drafts:
            shapes += [(Pass.MTP, n, bucket, n > 1, w) for bucket in buckets for n in rows for w in widths]
        todo = list(dict.fromkeys(s for s in shapes if s not in self._seqs))
        with bar(len(todo), "recording pipelines", unit="shape") as progress:
            for shape in todo:
                self._sequence(*shape)
                progress.update(1)

    def _grow(self, regions: int):
        replaced = self.states.grow(regions)
        self._seqs.clear()
        self.recorder.forget(replaced)

    def _run(self, segments, stage: str, rows: int):
        self._hit(stage, rows)
        for seq, host in segments:
            if self.timing is None:
                seq.eval()
            else:                                # vkspec.bench: device time vs host time
                t0 = time.perf_counter()
                seq.eval()
                self.timing["eval"] += time.perf_counter() - t0
            if host is not None:
                host()

    # --- the interface -----------------------------------------------------------
    @on_device("while clearing the state")
    def new_state(self) -> DeviceState:
        """A fresh state. The device holds one: a new one replaces the last."""
        self._hit("new_state")
        return self.states.new()

    def _validate(self, tokens, start):
        n = len(tokens)
        if not 1 <= n <= MAX_ROWS:
            raise VkspecError(f"a device block has 1 to {MAX_ROWS} rows, got {n}")
        if start + n > self.ctx:
            raise VkspecError(f"context full: {start} + {n} tokens > {self.ctx}")
        if min(tokens) < 0 or max(tokens) >= self.cfg.vocab_size:
            raise VkspecError(f"token id out of range 0..{self.cfg.vocab_size - 1}")

    def _rows(self, kind, n, last, logits_t, picks_t, ids=None, width=0):
        H, V = self.cfg.hidden_size, width or self.cfg.vocab_size
        x = (self.b.scratch.x if kind is Pass.MAIN else self.b.scratch.mx).data()
        rows = 1 if last else n
        hidden = x[:n * self.layout.dims.Hp].reshape(n, -1)[:, :H].copy()
        logits = logits_t.data()[:rows * V].reshape(rows, V)
        picks = picks_t.data()[:rows].astype(np.int64)
        if ids is not None:                  # the listed ids, then padding that repeats the last
            logits, picks = logits[:, :len(ids)], ids[np.minimum(picks, len(ids) - 1)]
        logits = logits.copy()
        if kind is Pass.MAIN:
            self.last_picks = picks      # the device's argmax of each logits row
        else:
            self.last_mtp_picks = picks
        return hidden, logits

    @on_device("in a forward")
    def forward(self, tokens, st: DeviceState, logits_rows: str = "all", copies: int | bool = 0):
        """Feed n <= MAX_ROWS tokens at positions kv_len..; see interface.Model."""
        self.states.check(st)
        if self.tier is not None and self.tier.broken:
            raise DeviceError(self.tier.broken)
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        self._validate(tokens, st.kv_len)
        copies = min(n - 1, n - 1 if copies is True else int(copies))
        if self.regions < copies + 2:
            self._grow(copies + 2)
        regions = self.states.place(st, n, copies)
        step_block().write(self.b.step, st.kv_len, st.live, tokens, range(st.kv_len, st.kv_len + n),
                           [NO_SLOT if r is None else r for r in regions])
        last = logits_rows != "all" and n > 1
        segments, logits_t, picks_t = self._sequence(Pass.MAIN, n, self._bucket(st.kv_len + n), last)
        st.block = (st.kv_len, n, st.live, regions)
        self._run(segments, "forward", n)
        if self.tier is not None:
            self.tier.after_forward(n)
        st.kv_len += n
        st.live = regions[-1]
        self._hit("readback", n)
        return self._rows(Pass.MAIN, n, last, logits_t, picks_t)

    @on_device("in a rewind")
    def rewind(self, st: DeviceState, keep: int):
        """Keep rows 0..keep-1 of the last block (0: none, the state before
        it): the watermark comes down and the region of row keep-1 becomes live."""
        self._hit("rewind", keep)
        self.states.rewind(st, keep)

    @on_device("in the MTP head")
    def mtp_forward(self, hidden, next_tokens, st: DeviceState, positions, logits_rows: str = "all", ids=None):
        """The MTP head on the device; see interface.Model. With
        logits_rows="last" the rows before the last only write their KV row
        (one recorded pass) and the last alone goes on to the lm_head. With
        ``ids`` the lm_head reads only those rows, through a device list
        padded to a multiple of listed_step (one recorded sequence per padded
        length)."""
        self.states.check(st)
        if not self.has_mtp:
            raise VkspecError("the model was loaded without its MTP head")
        tokens = [int(t) for t in next_tokens]
        pos = [int(p) for p in positions]
        self._validate(tokens, max(pos) + 1 - len(tokens))
        n, d = len(tokens), self.layout.dims
        buf = self.b.scratch.mtp_in.data()
        buf[:n * d.Hp].reshape(n, d.Hp)[:, :d.H] = np.asarray(hidden, np.float32).reshape(n, d.H)
        step_block().write(self.b.mtp_step, 0, 0, tokens, pos)
        step_block().write(self.b.mtp_last, 0, 0, tokens[-1:], pos[-1:])
        last = logits_rows != "all" and n > 1
        if ids is not None and not isinstance(ids, np.ndarray):
            ids = np.asarray(ids, np.int64)
        listed = 0 if ids is None else self._list_ids(ids)
        segments, logits_t, picks_t = self._sequence(Pass.MTP, n, self._bucket(max(pos) + 1), last, listed)
        self._run(segments, "mtp", n)
        hidden, logits = self._rows(Pass.MTP, n, last, logits_t, picks_t, ids, listed)
        return (hidden[-1:], logits) if last else (hidden, logits)

    def _list_ids(self, ids) -> int:
        """Put a draft vocabulary (an array DraftVocab replaces, never edits) on
        the device if it is not the one there; its padded length."""
        k, V = len(ids), self.cfg.vocab_size
        if not 1 <= k <= V:
            raise VkspecError(f"a draft vocabulary has 1 to {V} ids, got {k}")
        width = min(V, -(-k // self.listed_step) * self.listed_step)
        if self._ids is not ids or self._ids_width != width:
            if int(np.min(ids)) < 0 or int(np.max(ids)) >= V:
                raise VkspecError(f"a draft vocabulary id is out of range 0..{V - 1}")
            a = self.b.ids.data()
            a[:k] = ids
            a[k:width] = ids[-1]         # argmax keeps the first of equal scores: index k-1
            self.dev.upload(self.b.ids)
            self._ids, self._ids_width = ids, width
        return width

    @on_device("while copying the state to the host")
    def snapshot(self, st: DeviceState):
        self._hit("snapshot")
        return self.states.snapshot(st)

    @on_device("while copying a state to the device")
    def restore(self, st: DeviceState, snap):
        self._hit("restore")
        self.states.restore(st, snap)

    @on_device("while reading the state")
    def read_state(self, st: DeviceState):
        """The live state as host arrays (KV rows up to the watermark): for tests."""
        return self.states.read(st)
