"""The state on the device: the KV watermark, the recurrent state's regions
and copy slots, rewinding, and host copies of it all.

Terms:
* **watermark**: ``kv_len``, the rows of the device KV cache that are valid.
  Rewinding lowers it; the next forward overwrites the stale tail.
* **region**: the recurrent state (conv ring, DeltaNet state) of every layer
  is a buffer of R >= 2 regions. A block reads the live region and never
  writes it: the state after its last row goes to another region, which
  becomes live, so the state before the block stays restorable until the next
  forward. With copies, the state after row r is also written to a region of
  its own, the **copy slot** of row r. Rewinding makes a slot (or the region
  that was live before the block) live again: a swap of roles, nothing moves.
  Regions beyond two are allocated on first use (:meth:`DeviceStates.grow`).
"""

from __future__ import annotations

import numpy as np

from ...errors import DeviceError, VkspecError
from ...interface import HostState
from .device import device_calls
from .layout import MAX_ROWS, Buffers, DeltaMixer, Layout
from .memory import Uploader


class DeviceState:
    """Where a sequence of forwards stands on the device (the host's half)."""

    def __init__(self, owner):
        self.owner = owner
        self.kv_len = 0
        self.live = 0
        # the last block: (kv_len before, rows, region live before, region per row or None)
        self.block: tuple[int, int, int, list] | None = None


class DeviceStates:
    """The one device state of a model (a new one replaces the last)."""

    def __init__(self, dev, up: Uploader, layout: Layout, buffers: Buffers):
        self.dev, self.up, self.lay, self.b = dev, up, layout, buffers
        self.regions = 2
        self.current: DeviceState | None = None
        trunk = layout.n_trunk
        self.trunk = buffers.layers[:trunk]
        self.recurrent = [L.mixer for L in buffers.layers if isinstance(L.mixer, DeltaMixer)]

    def new(self) -> DeviceState:
        if self.current is not None:
            self.current.owner = None
        if self.recurrent:                       # a pure-attention model has no recurrent state
            seq = self.dev.sequence()
            for m in self.recurrent:
                for sp in (m.ring, m.ssm):
                    self.dev.record_fill(seq, None, sp.t, sp.n, dst_off=sp.off)
            with device_calls("while clearing the state"):
                seq.eval()
        self.current = DeviceState(self)
        return self.current

    def check(self, st: DeviceState):
        if st is not self.current or st.owner is not self:
            raise VkspecError("this device state was replaced by a newer one (one state per model)")

    def place(self, st: DeviceState, n: int, copies: int) -> list:
        """The regions a block of n rows writes: copy slots for its first
        `copies` rows, None for the other rows before the last, then the region
        that becomes live. Grows the regions first when needed."""
        if self.regions < copies + 2:
            self.grow(copies + 2)
        free = [r for r in range(self.regions) if r != st.live]
        return free[:copies] + [None] * (n - 1 - copies) + [free[copies]]

    def grow(self, regions: int) -> set[int]:
        """Give every recurrent state span `regions` regions (in arenas of
        their own generation), the live one moved to region 0 (the last block
        can no longer be rewound). A failed allocation releases what it made
        and leaves the live state as it was. Returns the ids of the replaced
        tensors (their recorded uses are void)."""
        st = self.current
        made = []
        try:
            for part in ("ring", "ssm"):
                spans = [getattr(m, part) for m in self.recurrent]
                self.up.plan_arenas(part, regions, [sp.n // self.regions * regions for sp in spans])
                for m, sp in zip(self.recurrent, spans):
                    name = self.up.name_of(sp)
                    made.append((m, part, name, self.up.span(name + ".grown", sp.n // self.regions * regions,
                                                             part, generation=regions)))
        except Exception as e:
            for _, _, _, sp in made:
                self.up.release(sp)
            raise DeviceError(f"could not allocate {regions - 2} recurrent copy slots: {e}") from None
        seq = self.dev.sequence()
        for m, part, _, sp in made:
            old = getattr(m, part)
            words = old.n // self.regions
            self.dev.record_fill(seq, old.t, sp.t, words, src_off=old.off + st.live * words, dst_off=sp.off)
        if made:
            with device_calls("while copying the recurrent state"):
                seq.eval()
        replaced = set()
        for m, part, name, sp in made:
            old = getattr(m, part)
            replaced.add(id(old.t))
            self.up.release(old)
            self.up.rename(sp, name)
            setattr(m, part, sp)
        self.regions, st.live, st.block = regions, 0, None
        return replaced

    def rewind(self, st: DeviceState, keep: int):
        self.check(st)
        if st.block is None:
            raise VkspecError("rewind needs a block forwarded just before")
        kv0, n, before, regions = st.block
        if not 0 <= keep <= n:
            raise VkspecError(f"rewind keeps 0..{n} rows, got {keep}")
        live = before if keep == 0 else regions[keep - 1]
        if live is None:
            raise VkspecError(f"row {keep - 1} of the last block has no copy slot")
        st.live, st.kv_len = live, kv0 + keep

    # --- host copies ------------------------------------------------------------------
    def read(self, st: DeviceState) -> HostState:
        """The live state as host arrays (KV rows up to the watermark)."""
        self.check(st)
        d, dev = self.lay.dims, self.dev
        kv_k, kv_v, conv, ssm = [], [], [], []
        row = d.nkv * d.hd
        for L in self.trunk:
            m = L.mixer
            if isinstance(m, DeltaMixer):
                w = m.ring.n // self.regions
                conv.append(dev.read(m.ring.t, m.ring.off + st.live * w, w).reshape(d.K - 1, d.cd))
                w = m.ssm.n // self.regions
                ssm.append(dev.read(m.ssm.t, m.ssm.off + st.live * w, w).reshape(d.nv, d.dk, d.dv))
            else:
                kv_k.append(dev.read(m.kc.t, m.kc.off, st.kv_len * row).reshape(st.kv_len, d.nkv, d.hd))
                kv_v.append(dev.read(m.vc.t, m.vc.off, st.kv_len * row).reshape(st.kv_len, d.nkv, d.hd))
        return HostState(kv_k, kv_v, conv, ssm, kv_len=st.kv_len)

    def snapshot(self, st: DeviceState) -> HostState:
        """read(), and the MTP head's rows just past the watermark (its drafts'
        rows a restored state may still attend)."""
        snap = self.read(st)
        if self.lay.mtp:
            m, d = self.b.layers[-1].mixer, self.lay.dims
            rows = min(self.lay.ctx, st.kv_len + MAX_ROWS)
            n = rows * d.nkv * d.hd
            snap.mtp_k = self.dev.read(m.kc.t, m.kc.off, n).reshape(rows, d.nkv, d.hd)
            snap.mtp_v = self.dev.read(m.vc.t, m.vc.off, n).reshape(rows, d.nkv, d.hd)
        return snap

    def restore(self, st: DeviceState, snap: HostState):
        self.check(st)
        attn = [L.mixer for L in self.trunk if not isinstance(L.mixer, DeltaMixer)]
        delta = [L.mixer for L in self.trunk if isinstance(L.mixer, DeltaMixer)]
        for m, k, v in zip(attn, snap.kv_k, snap.kv_v):
            self.up.write(m.kc.t, m.kc.off, np.asarray(k)[:snap.kv_len])
            self.up.write(m.vc.t, m.vc.off, np.asarray(v)[:snap.kv_len])
        for m, conv, ssm in zip(delta, snap.conv, snap.ssm):
            self.up.write(m.ring.t, m.ring.off + st.live * (m.ring.n // self.regions), conv)
            self.up.write(m.ssm.t, m.ssm.off + st.live * (m.ssm.n // self.regions), ssm)
        if self.lay.mtp and snap.mtp_k is not None:
            m = self.b.layers[-1].mixer
            self.up.write(m.kc.t, m.kc.off, snap.mtp_k)
            self.up.write(m.vc.t, m.vc.off, snap.mtp_v)
        st.kv_len, st.block = snap.kv_len, None
