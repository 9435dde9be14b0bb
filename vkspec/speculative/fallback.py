"""Going on without the device: ``--fallback cpu``.

When the device fails mid-run, the decoder (decode.py) first comes back to
the last commit (model rows, sampler, draft sources, output). With a
Fallback it then moves that commit to a CPU model loaded from the same
checkpoint and goes on there. The CPU path gives the device's bits, so the
run's tokens and digest are those of a run the device never failed.

How the state comes over:
* **snapshot**: the device still answers (the failure was one submission or
  one allocation): its state is copied to the host (Model.snapshot) and
  restored into the CPU model's, the MTP head's rows included;
* **replay**: the device is lost, or its state is not the commit's: the CPU
  feeds the rows the commit holds (prompt and output but the last pick) in
  blocks; a state's bits do not depend on how its rows were fed. The draft
  sources are told (DraftSource.moved) so the MTP head re-reads its rows.
"""

from __future__ import annotations

import sys

from ..errors import DeviceError
from .prefill import prefill


class Fallback:
    """``load()`` gives the CPU model (called once, at the first failure)."""

    def __init__(self, load, quiet: bool = False):
        self.load = load
        self.quiet = quiet
        self.model = None            # the model runs went on with (None: no failure yet)
        self.state = None
        self.moves: list[str] = []   # how each move went ("snapshot" | "replay"), for tests

    def applies(self, model, e: BaseException) -> bool:
        return isinstance(e, DeviceError) and model.backend != "cpu"

    def take_over(self, model, st, rows: list[int], state_ok: bool, sources, error, emitted: int):
        """A CPU model and a state on it holding ``rows`` (what ``st`` holds
        at the commit); the sources follow."""
        cpu = self.model if self.model is not None else self.load()
        new = cpu.new_state()
        snap = None
        if state_ok:
            try:
                snap = model.snapshot(st)
            except DeviceError:
                snap = None
        if snap is not None and snap.kv_len == len(rows):
            cpu.restore(new, snap)
            for s in sources:
                s.moved(cpu, new)
            how = "snapshot"
        else:
            _, hidden = prefill(cpu, new, rows, keep_hidden=True)
            for s in sources:
                s.moved(cpu, new, list(rows), hidden)
            how = "replay"
        self.model, self.state = cpu, new
        self.moves.append(how)
        if not self.quiet:
            print(f"vkspec: {error}; continuing on the CPU after {emitted} tokens "
                  f"(the state came over by {how})", file=sys.stderr, flush=True)
        return cpu, new
