"""The Step block (shaders/step.glsl): what changes from one replay of a
recorded sequence to the next (tokens, positions, the KV watermark, the live
recurrent-state region, where each row's copy goes), written by the host
before each replay. Its layout is read from the compiled shaders, never
mirrored by hand."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ...shaders.limits import MAX_ROWS
from .device import DeviceError, load_shader

NO_SLOT = 0xFFFFFFFF


@dataclass(frozen=True)
class StepBlock:
    offsets: dict          # member -> first uint32 word
    rows: int              # length of the per-row arrays (MAX_ROWS)
    words: int

    def write(self, t, kv_len: int, live: int, tokens, pos, slots=()):
        """Fill a step tensor's host copy (the caller syncs it to the device)."""
        a, o, n = t.data(), self.offsets, len(tokens)
        a[:] = 0
        a[o["kv_len"]], a[o["live"]], a[o["nrows"]] = kv_len, live, n
        a[o["slot"]:o["slot"] + self.rows] = NO_SLOT
        a[o["slot"]:o["slot"] + len(slots)] = slots
        a[o["tok"]:o["tok"] + n] = tokens
        a[o["pos"]:o["pos"] + n] = pos


@functools.cache
def step_block() -> StepBlock:
    block = load_shader("conv_step").reflection.buffer("Step")
    if block is None:
        raise DeviceError("conv_step.spv has no Step block: shaders and host disagree (rebuild vkspec)")
    offsets, rows, end = {}, None, 0
    for m in block.members:
        offsets[m.name] = m.offset // 4
        n = int(m.type.split("[")[1][:-1]) if "[" in m.type else 1
        if n > 1:
            if rows not in (None, n):
                raise DeviceError(f"Step block arrays of {rows} and {n} rows")
            rows = n
        end = max(end, m.offset // 4 + n)
    if rows != MAX_ROWS:
        raise DeviceError(f"the shaders' Step block has {rows} rows, shaders/limits.py says {MAX_ROWS}: "
                          "the SPIR-V is stale (rebuild vkspec)")
    return StepBlock(offsets, rows, end)
