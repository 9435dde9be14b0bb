"""The expert tier on the device: slots, the expert -> slot map, uploads, and
the host's share of a forward.

Terms:
* hit: a routed pair (row, expert) whose expert holds a slot: the device
  computes it in the chain.
* miss: the others. The host computes them on the CPU path between two
  segments of the recorded forward (after the layer's routing, before its
  experts run) and uploads the rows; with ``stream`` it uploads the expert
  into a stream slot instead and the device computes it.
Either way each pair's result has the same bits, and moe_combine sums the
pairs in routing order, so placement never changes output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backends.cpu import ops as cpu
from ..backends.vulkan.buffers import DevPart, DevWeight
from ..errors import VkspecError
from .history import History
from .policy import Placement, split_slots

NO_SLOT = 0xFFFFFFFF
PARTS = ("gate_up", "down")


@dataclass
class TierConfig:
    budget_gb: float = 0.0          # device memory for routed experts
    rate: int = 2                   # uploads per forward at most
    balance: bool = True            # slots to layers by their usage
    stream: bool = False            # misses stream through the device instead of the CPU
    history: str | None = None      # a usage history to start from (JSON)


@dataclass
class TierStats:
    pairs: int = 0
    hits: int = 0
    cpu: int = 0
    streamed: int = 0
    uploads: int = 0
    upload_s: float = 0.0
    host_s: float = 0.0
    forwards: int = 0
    per_layer: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(pairs=self.pairs, hits=self.hits, hit_rate=self.hits / self.pairs if self.pairs else 0.0,
                    cpu=self.cpu, streamed=self.streamed, uploads=self.uploads,
                    upload_ms_per_forward=1e3 * self.upload_s / max(self.forwards, 1),
                    host_ms_per_forward=1e3 * self.host_s / max(self.forwards, 1))


class ExpertTier:
    def __init__(self, layout, cfg: TierConfig):
        from ..backends.vulkan.layout import MAX_ROWS
        self.lay, self.cfg = layout, cfg
        c = layout.cfg
        self.E, self.k = c.num_experts, max(c.num_experts_per_tok, 1)
        # trunk MoE layers: (index in layout.host, ordinal)
        self.layer_ids = [i for i, lw in enumerate(layout.w.layers) if c.is_moe_layer(i)]
        # what the tier reads on the host after the layout lets go of the
        # weights: each layer's expert weights (views of the mapped file)
        self.host_ffn = {i: layout.host[i].ffn for i in self.layer_ids}
        self.experts = {i: layout.w.layers[i].ffn.experts for i in self.layer_ids}
        self.n_layers = len(self.layer_ids)
        if not self.n_layers:
            raise VkspecError("--tier-gb needs a model with routed experts")
        self.history = History(self.n_layers, self.E)
        if cfg.history and Path(cfg.history).exists():
            self.history = History.load(Path(cfg.history), self.n_layers, self.E)
        f0 = layout.host[self.layer_ids[0]].ffn
        self.expert_bytes = sum(q.nbytes() for part in PARTS for q in getattr(f0, part)) // self.E
        total = int(cfg.budget_gb * (1 << 30)) // self.expert_bytes if self.expert_bytes else 0
        self.caps = split_slots(total, self.history.counts, self.E, cfg.balance)
        self.placement = Placement(self.caps, self.E, cfg.rate)
        self.extra = self.k * MAX_ROWS if cfg.stream else 0    # stream slots per layer
        self.max_rows = MAX_ROWS
        self.reset_stats()
        self.layers: dict[int, object] = {}      # ordinal -> the layer's Ffn on the device
        self._streamed: set[int] = set()
        self.hit = None                          # the model's fault hook (backends/vulkan/faults.py)
        self.broken: str | None = None           # why the slot maps cannot be trusted

    def reset_stats(self):
        self.stats = TierStats(per_layer=[[0, 0] for _ in range(self.n_layers)])

    # --- the plan -------------------------------------------------------------------
    def holds(self, i: int, part: str) -> bool:
        return i in self.layer_ids and part in PARTS

    def holds_layer(self, ffn) -> bool:
        """Does this layer need the host between its routing and its experts?"""
        o = ffn.tier_ord
        return o is not None and (self.caps[o] < self.E or self.cfg.stream)

    def slots(self, i: int) -> int:
        return max(1, self.caps[self.layer_ids.index(i)] + self.extra)

    # --- building ---------------------------------------------------------------------
    def _pieces(self, i: int, part: str) -> tuple[list, int]:
        """Layer i's host weights of one part (gate_up or down) and how many
        follow one another per expert."""
        qs = getattr(self.host_ffn[i], part)
        if len({q.fmt for q in qs}) != 1:
            raise VkspecError(f"layer {i}: the expert tier needs every expert's {part} in one format")
        return qs, len(qs) // self.E

    def build_layer(self, up, i: int, ffn):
        """The slots of layer i's experts, in place of its whole expert weights."""
        ffn.tier_ord = self.layer_ids.index(i)
        n = self.slots(i)
        for part in PARTS:
            qs, per = self._pieces(i, part)
            q0, rows = qs[0], sum(q.rows for q in qs[:per])
            words = rows * q0.row_bytes
            assert words % 4 == 0, "an expert's bytes must end on a word"
            data = up.zeros(f"experts:layer{i}.{part}", rows * n * q0.row_bytes // 4, np.uint32)
            scales = up.zeros(f"experts:layer{i}.{part}.scales", max(rows * n * q0.scales_per_row, 1), np.float32)
            setattr(ffn, part, DevWeight(rows * n, q0.cols,
                                         [DevPart(0, rows * n, q0.fmt, q0.row_bytes, q0.scales_per_row, data, scales,
                                                  acts=q0.acts)]))
        if ffn.smap is not None:
            ffn.smap.data()[:] = NO_SLOT

    def start(self, dev, up, buffers):
        self.dev, self.up, self.b = dev, up, buffers
        self.layers = {L.ffn.tier_ord: L.ffn for L in buffers.layers if L.ffn.tier_ord is not None}
        self._upload(self.placement.initial(self.history.counts))
        for o in self.layers:
            self._set_map(o)
        self.reset_stats()                       # the stats count forwards, not the initial fill

    # --- uploads ----------------------------------------------------------------------
    def _upload(self, moves):
        """Copy experts into slots, (layer, slot, expert) each, through the
        uploader's staging buffer: the expert's rows as its file stores them.
        If that fails, no slot it touched is used again (see _void)."""
        if not moves:
            return
        try:
            self._copy(moves)
        except BaseException:
            self._void(moves)
            raise

    def _void(self, moves):
        """After a failed upload: the slots it was filling may hold part of an
        expert, so they hold none (the placement forgets them and the maps
        the shaders read lose them; their experts run on the CPU until a later
        upload). If even the maps cannot be written, the tier is broken and
        refuses every forward (a device that reads a half-copied expert would
        give other bits)."""
        touched = set()
        for o, slot, _ in moves:
            if slot < len(self.placement.slots[o]):          # stream slots are never in the placement
                self.placement.slots[o][slot] = None
            touched.add(o)
        try:
            for o in touched:
                self._set_map(o)
        except Exception as e:                               # noqa: BLE001 - recorded, and the caller raises
            self.broken = f"the expert tier's slot maps could not be restored after a failed upload ({e})"

    def _copy(self, moves):
        if self.hit is not None:
            self.hit("upload", len(moves))
        t0 = time.perf_counter()
        for o, slot, e in moves:
            i = self.layer_ids[o]
            for part in PARTS:
                qs, per = self._pieces(i, part)
                mine = qs[e * per:(e + 1) * per]
                rows = sum(q.rows for q in mine)
                dev_part = getattr(self.layers[o], part).single
                data = np.concatenate([q.data[q.stored(slice(0, q.rows))].reshape(-1) for q in mine])
                self.up.write(dev_part.data, slot * rows * dev_part.row_bytes // 4, data)
                if dev_part.s_stride:
                    sc = np.concatenate([q.scales[q.stored(slice(0, q.rows))] for q in mine]).astype(np.float32)
                    self.up.write(dev_part.scales, slot * rows * dev_part.s_stride, sc)
        self.stats.uploads += len(moves)
        self.stats.upload_s += time.perf_counter() - t0

    def _set_map(self, o: int, extra: dict | None = None):
        """The expert -> slot map the shaders read: the resident experts (and
        this forward's streamed ones)."""
        smap = self.layers[o].smap.data()
        smap[:] = NO_SLOT
        for e, sl in {**self.placement.resident(o), **(extra or {})}.items():
            smap[e] = sl
        self.dev.upload(self.layers[o].smap)

    # --- a forward --------------------------------------------------------------------
    def host_step(self, ffn, n: int):
        o, k = ffn.tier_ord, self.k

        def run():
            t0 = time.perf_counter()
            s = self.b.scratch
            off = ffn.moe_i * self.max_rows * k
            idx = s.ridx.data()[off:off + n * k].astype(np.int64)
            smap = ffn.smap.data()
            missing = [p for p in range(n * k) if smap[idx[p]] == NO_SLOT]
            if missing and self.cfg.stream:
                self._stream(o, sorted({int(idx[p]) for p in missing}))
            elif missing:
                H, Hp = self.lay.dims.H, self.lay.dims.Hp
                h = s.h.data()[:n * Hp].reshape(n, Hp)[:, :H]
                ed = s.ed.data()
                experts = self.experts[self.layer_ids[o]]
                for p in missing:
                    w = experts[int(idx[p])]
                    x = h[p // k]
                    ed[p * H:(p + 1) * H] = cpu.gemv(w.down, cpu.silu_mul(cpu.gemv(w.gate, x), cpu.gemv(w.up, x)))
                self.stats.cpu += len(missing)
            self.stats.host_s += time.perf_counter() - t0
        return run

    def _stream(self, o: int, experts: list[int]):
        """This forward's missing experts into the stream slots past the layer's cap."""
        base = self.caps[o]
        moves = [(o, base + j, e) for j, e in enumerate(experts)]
        self._upload(moves)
        self._set_map(o, {e: sl for _, sl, e in moves})
        self._streamed.add(o)
        self.stats.streamed += len(experts)

    def after_forward(self, n: int):
        """Count the routing of every row, restore stream maps, take this forward's uploads."""
        k = self.k
        ridx = self.b.scratch.ridx.data()
        for o, ffn in self.layers.items():
            off = ffn.moe_i * self.max_rows * k
            idx = ridx[off:off + n * k].astype(np.int64)
            res = self.placement.resident(o)
            hits = sum(int(e) in res for e in idx)
            self.stats.pairs += idx.size
            self.stats.hits += hits
            self.stats.per_layer[o][0] += idx.size
            self.stats.per_layer[o][1] += hits
            for r in range(n):
                self.history.add(o, idx[r * k:(r + 1) * k])
        moves = self.placement.step(self.history.counts)
        self._upload(moves)
        for o in self._streamed | {m[0] for m in moves}:
            self._set_map(o)
        self._streamed = set()
        self.stats.forwards += 1

    def save_history(self, path):
        self.history.save(Path(path))
