"""One speculative round as named steps over the run's state (terms: the
package docstring).

    checkpoint -> propose -> verify -> settle -> commit
                                     (or, on any exception: undo)

A round starts from a committed state and the last pick (emitted, not yet
fed) and emits the accepted drafts and exactly one more pick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DeviceError
from ..interface import Model, State
from ..sampling import Sampler
from .counters import Counters
from .gate import Gate
from .source import DraftSource, Proposal


class Cancelled(Exception):
    pass


def first_run(model, rows: int) -> bool:
    """Whether this is the model's first forward of ``rows`` rows. Its time is
    no verify-cost sample: a first dispatch builds pipelines, compiles kernels
    or faults pages in, and the gate would then decline every draft."""
    seen = model.__dict__.setdefault("timed_rows", set())
    if rows in seen:
        return False
    seen.add(rows)
    return True


@dataclass
class Commit:
    """What undo() brings back: the host's half of a committed state."""
    out: int
    history: int
    sampler: tuple                   # Sampler.state()
    sources: list                    # each source's checkpoint()
    cap: int
    ended: bool
    counters: Counters


@dataclass
class Run:
    """The state of one run between rounds."""
    model: Model
    st: State                        # the model's state (rows fed so far)
    sampler: Sampler
    sources: tuple[DraftSource, ...]
    gate: Gate | None
    n: int                           # tokens to emit at most
    history: list[int]               # every row that stood: the prompt, then the picks fed
    snapshots: int = 7               # copy slots: drafts past them are undone by replay
    stop: set[int] | None = None
    cancel: Callable[[int], bool] | None = None                 # cancel(tokens so far): True cancels mid-round
    on_token: Callable[[int, np.ndarray], bool] | None = None   # True ends the run after that token
    out: list[int] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    cap: int = 0                     # drafts a round may carry at most
    fed: bool = False                # this round has fed the model
    ended: bool = False              # on_token asked to end
    told: list = field(default_factory=list)    # (token, ended) on_token saw, per output index
    hindsight: set = field(default_factory=set)  # free sources: the gate judges them after the fact

    def emit(self, tok: int, row) -> None:
        self.out.append(tok)
        for src in self.sources:
            src.picked(tok)
        at = len(self.out) - 1
        if at < len(self.told):              # emitted again after a fallback: the caller has it
            if self.told[at][0] != tok:
                raise DeviceError(f"the CPU gave token {tok} where the device gave {self.told[at][0]} "
                                  f"(output {at}): the backends disagree")
            self.ended = self.told[at][1]
            return
        self.ended = bool(self.on_token and self.on_token(tok, row))
        self.told.append((tok, self.ended))

    def done(self, tok: int) -> bool:
        return len(self.out) >= self.n or (self.stop is not None and tok in self.stop) or self.ended

    # --- the round -------------------------------------------------------------------
    def round(self, pick: int):
        """Feed ``pick`` and its drafts; emit the accepted drafts and one more
        pick. Returns that pick and its logits row."""
        pos = self.st.kv_len
        prop = self.propose(pick, pos, min(self.cap, self.n - len(self.out) - 1))
        drafts = prop.tokens if prop else []
        rows = [pick] + drafts
        slots = min(len(drafts), self.snapshots)
        hidden, logits = self.verify(rows, slots)
        self.counters.forward(len(drafts), prop.source if prop else None)
        accepted, tok = self.settle(logits, drafts)
        self.commit(rows, accepted + 1, slots, hidden, pos)
        if prop:
            self.counters.settled(prop.source, len(drafts), accepted)
            if self.gate and prop.source not in self.hindsight:
                self.gate.record_verify(prop.key, len(drafts), accepted, prop.probs)
        if self.gate:
            self.gate.see_output(self.out)
        return tok, logits[accepted]

    def checkpoint(self) -> Commit:
        self.fed = False
        return Commit(len(self.out), len(self.history), self.sampler.state(),
                      [s.checkpoint() for s in self.sources], self.cap, self.ended, self.counters.copy())

    def propose(self, pick: int, pos: int, k_max: int) -> Proposal | None:
        """Every source's drafts, cut to what the gate says pays; the best of them."""
        gate, props = self.gate, []
        for src in self.sources:
            if src.name in self.hindsight:
                prop = src.propose(self.history, pick, pos, k_max) if k_max > 0 else None
                if prop and prop.tokens:                 # judged in full, carried up to the plan
                    gate.judge_later(prop.key, prop.tokens, len(self.out))
                    prop.tokens = prop.tokens[:gate.plan(prop.key, len(prop.tokens), src.lead_passes())]
            elif (k := gate.plan(src.name, k_max, src.lead_passes()) if gate else k_max) > 0:
                pstep = gate is not None and gate.enabled and gate.pstep
                prop = src.propose(self.history, pick, pos, k, gate if pstep else None)
                if prop and prop.tokens and gate:
                    gate.record_draft_time(prop.key, len(prop.tokens) - 1, prop.seconds, prop.lead, prop.passes)
                    if prop.probs is not None and pstep:
                        prop.tokens = prop.tokens[:gate.pick_p(src.name, prop.probs)]
                        prop.probs = prop.probs[:len(prop.tokens)]
            else:
                prop = None
            if prop and prop.tokens:
                props.append(prop)
        return choose(props, gate)

    def verify(self, rows: list[int], slots: int):
        """One forward over the pick and its drafts, keeping ``slots`` copies of
        the recurrent state; its time is a T(n) sample for the gate."""
        t, recorded = time.perf_counter(), self.model.recordings
        first = first_run(self.model, len(rows))
        self.fed = True
        hidden, logits = self.model.forward(rows, self.st, copies=slots)
        if self.gate and self.model.recordings == recorded and not first:    # recording or first dispatch: no T(n)
            self.gate.record_forward(len(rows), time.perf_counter() - t)
        return hidden, logits

    def settle(self, logits, drafts: list[int]) -> tuple[int, int]:
        """Pick from the verify's rows one at a time while the picks equal the
        drafts. Returns (drafts accepted, the last pick)."""
        i = 0
        while True:
            if self.cancel is not None and self.cancel(len(self.out)):
                raise Cancelled(f"cancelled after {len(self.out)} tokens")
            tok = self.sampler.pick(logits[i])
            self.emit(tok, logits[i])
            if i < len(drafts) and tok == drafts[i] and not self.done(tok):
                i += 1
                continue
            return i, tok

    def commit(self, rows: list[int], keep: int, slots: int, hidden, pos: int) -> None:
        """The first ``keep`` rows stand; the rest are undone, from a copy slot
        or, past the slots, by replaying the standing rows."""
        if keep < len(rows) and keep - 1 >= slots:
            self.model.rewind(self.st, 0)
            self.model.forward(rows[:keep], self.st)
            self.counters.replay()
            self.cap = min(self.cap, self.snapshots)     # the guard: one replay, then clamp to S
        else:
            self.model.rewind(self.st, keep)
        for src in self.sources:
            src.observe(rows[:keep], hidden, pos)
        self.history.extend(rows[:keep])

    def undo(self, c: Commit) -> bool:
        """Back to the commit. The host's half first, so that a model that
        fails to rewind (a failed device) still leaves the output, sampler
        and sources of the commit. True when the model's state is the
        commit's as far as the host can tell."""
        del self.out[c.out:]
        del self.history[c.history:]
        self.sampler.set_state(c.sampler)
        for src, ck in zip(self.sources, c.sources):
            src.restore(ck)
        self.cap, self.ended, self.counters = c.cap, c.ended, c.counters
        if self.fed:
            self.fed = False
            try:
                self.model.rewind(self.st, 0)          # the state before this round's first forward
            except Exception:                          # noqa: BLE001 - the caller raises the first error
                return False
        return self.st.kv_len == len(self.history)


def choose(proposals, gate):
    """The proposal with the higher expected tokens per unit of time (the
    gate's E(k)/cost(k) with its acceptance for that source), the longer one on
    a tie."""
    best, best_v = None, float("-inf")
    for prop in proposals:
        v = gate.value(prop.key, len(prop.tokens), written=True) if gate else float(len(prop.tokens))
        if best is None or v > best_v or (v == best_v and len(prop.tokens) > len(best.tokens)):
            best, best_v = prop, v
    return best
