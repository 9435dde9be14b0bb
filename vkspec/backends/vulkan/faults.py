"""Injected device failures, for the tests of what a failed device loses
(nothing: tests/test_device_faults.py).

A VulkanModel calls ``faults.hit(stage)`` where a real device could fail:

* ``forward``: the trunk's recorded sequence is submitted (a block: prefill,
  a plain step, a verify, a replay);
* ``mtp``: the MTP head's sequence is submitted (drafting, before a verify);
* ``readback``: a forward's rows are read back (after the device computed
  them: the watermark has moved, the host has nothing yet);
* ``rewind``: the decoder undoes rows of the last block;
* ``upload``: the expert tier copies an expert into a slot (--tier-gb);
* ``snapshot`` / ``restore``: a state is copied to or from the host;
* ``new_state``: a state is cleared;
* ``alloc``: a device tensor is made (loading, copy slots).

A fault raises what kp raises for a failed Vulkan call (a RuntimeError), at
the ``at``-th time its stage is reached, so it goes through the same
conversion to DeviceError as a real one. ``lost``: the device is lost for
good: every later stage except ``rewind`` (host bookkeeping on this backend)
fails too, as after VK_ERROR_DEVICE_LOST.

VKSPEC_FAULT=stage@n[+m...][!] arms faults in a process (``!``: lost), so
the command line and the server can be tested as users run them.
"""

from __future__ import annotations

import os
from collections import Counter

STAGES = ("forward", "mtp", "readback", "rewind", "upload", "snapshot", "restore", "new_state", "alloc")


class Faults:
    """``at``: one occurrence (1-based) or several."""

    def __init__(self, stage: str | None = None, at: int | tuple = 1, lost: bool = False):
        if stage is not None and stage not in STAGES:
            raise ValueError(f"unknown fault stage {stage!r} ({', '.join(STAGES)})")
        self.stage, self.lost = stage, lost
        self.at = {at} if isinstance(at, int) else set(at)
        self.seen: Counter = Counter()
        self.fired = False
        self.log: list[tuple[str, int]] = []   # (stage, rows) reached, in order (tests choose `at` from it)

    @classmethod
    def parse(cls, spec: str) -> "Faults":
        """stage@n, stage@n+m (several), a trailing ! for a lost device."""
        lost = spec.endswith("!")
        stage, _, at = spec.rstrip("!").partition("@")
        return cls(stage, tuple(int(a) for a in (at or "1").split("+")), lost)

    @classmethod
    def from_env(cls) -> "Faults | None":
        spec = os.environ.get("VKSPEC_FAULT")
        return cls.parse(spec) if spec else None

    def hit(self, stage: str, rows: int = 0):
        self.seen[stage] += 1
        self.log.append((stage, rows))
        call = "vk::Device::allocateMemory" if stage == "alloc" else "vk::Queue::submit"
        if self.fired and self.lost and stage != "rewind":
            raise RuntimeError(f"{call}: ErrorDeviceLost (injected: lost since {self.stage})")
        if stage == self.stage and self.seen[stage] in self.at:
            self.fired = True
            kind = "ErrorDeviceLost" if self.lost else "ErrorOutOfDeviceMemory"
            raise RuntimeError(f"{call}: {kind} (injected at {stage} #{self.seen[stage]})")

    def occurrences(self, stage: str, rows=None) -> list[int]:
        """The `at` values (1-based) at which this stage was reached, with
        these rows (a row count, or a predicate on it)."""
        out, n = [], 0
        for s, r in self.log:
            if s == stage:
                n += 1
                if rows is None or (rows(r) if callable(rows) else r == rows):
                    out.append(n)
        return out
