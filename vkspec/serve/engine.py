"""One model, many clients: turns run one at a time on the model's state.

Terms:
* **fed**: the tokens a state holds (a turn leaves prompt + reply minus its
  last token: the last pick is never fed, and drafts a turn ended with were
  undone).
* **prefix reuse**: a turn starts from the saved state whose fed tokens are
  the longest proper prefix of its prompt (the live state, a recent turn's
  saved snapshot, or a pin) and feeds only the rest. A state's bits do not
  depend on how its rows were fed, so reuse never changes output.
* **pin**: a named prompt whose state is kept until unpinned (or dropped
  when the state budget is full: see store.py).
A turn cancelled mid-round (a client that went away) leaves the state of its
last commit, which is what gets saved. A turn whose device fails ends with
the error (the app answers 5xx; the next turn starts afresh), or, with a
Fallback (--fallback cpu), continues on the CPU from its last commit, and so
does every later turn.

Only the thread that runs turns takes the engine lock for long; pins and
turn snapshots live in a StateStore with a lock of its own, so listing and
deleting pins never waits for a turn.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import DeviceError
from ..sampling import Sampler
from ..speculative.counters import Counters
from ..speculative.decode import generate_spec
from ..speculative.prefill import prefill
from ..speculative.round import Cancelled
from .store import Saved, StateStore, measure


@dataclass
class Turn:
    tokens: list[int] = field(default_factory=list)
    finish: str = "length"
    reused: int = 0
    counters: Counters | None = None
    cancelled: bool = False
    prefill_s: float = 0.0
    decode_s: float = 0.0


class Engine:
    def __init__(self, model, tokenizer, sources, gate, snapshots: int = 7, cache_size: int = 16,
                 eos: set[int] | None = None, name: str = "vkspec", budget_bytes: int = 1 << 30,
                 fallback=None):
        self.model, self.tokenizer, self.sources, self.gate = model, tokenizer, sources, gate
        self.fallback = fallback
        self.snapshots, self.eos, self.name = snapshots, eos or set(), name
        self.lock = threading.Lock()
        self.state = model.new_state()
        self.live: tuple | None = ()                 # fed tokens of the live state (None: unknown)
        self.store = StateStore(budget_bytes, cache_size)
        self.turns = 0
        self.cancelled = 0
        self.on_turn = None                          # on_turn(turn, prompt_len) after each turn (metrics)

    @property
    def ctx(self) -> int:
        return self.model.ctx

    # --- sessions -----------------------------------------------------------------
    def _save(self) -> Saved:
        snap, cks = self.model.snapshot(self.state), [s.checkpoint() for s in self.sources]
        return Saved(self.live, snap, cks, measure(snap, cks))

    def _load(self, saved: Saved):
        self.model.restore(self.state, saved.snap)
        for s, ck in zip(self.sources, saved.sources):
            s.restore(ck)
        self.live = saved.fed

    def _start(self, prompt: list[int], whole: bool = False) -> int:
        """Bring the live state to the longest saved prefix of the prompt (a
        proper one unless `whole`: a turn needs a row left to feed); its length."""
        p = tuple(prompt)
        best, best_len = None, -1
        cands = [(self.live, None)] if self.live is not None else []
        cands += self.store.candidates()
        for fed, saved in cands:
            if (len(fed) <= len(p) if whole else len(fed) < len(p)) and p[:len(fed)] == fed \
                    and len(fed) > best_len:
                best, best_len = (fed, saved), len(fed)
        if best is None or best_len == 0:
            self.state = self.model.new_state()
            self.live = ()
            return 0
        fed, saved = best
        if saved is not None:
            self.store.touch(saved)
            if fed != self.live:
                self._load(saved)
        return len(fed)

    def _fall_back(self, e: BaseException) -> bool:
        """The device failed outside a turn's rounds (bringing a saved state
        in, a pin's prefill): with a fallback, the engine moves to the CPU
        with a fresh state (saved states are host copies: they still serve)."""
        if self.fallback is None or not self.fallback.applies(self.model, e):
            return False
        cpu = self.fallback.model if self.fallback.model is not None else self.fallback.load()
        self.fallback.model = cpu
        self.model, self.state, self.live = cpu, cpu.new_state(), ()
        self.fallback.state = self.state
        for s in self.sources:
            s.moved(cpu, self.state)
        print(f"[vkspec serve] {e}; continuing on the CPU", file=sys.stderr, flush=True)
        return True

    def _adopt(self):
        """After a turn that moved to the CPU mid-round: the engine stays there."""
        fb = self.fallback
        if fb is not None and fb.model is not None and (fb.model is not self.model or fb.state is not self.state):
            self.model, self.state = fb.model, fb.state

    def pin(self, name: str, prompt: list[int]) -> Saved:
        """Feed a prompt and keep its state under a name (BudgetError: the
        state is larger than the whole budget)."""
        with self.lock:
            try:
                saved = self._pin(prompt)
            except DeviceError as e:
                self.live = None
                if not self._fall_back(e):
                    raise
                saved = self._pin(prompt)
        self.store.put_pin(name, saved)
        return saved

    def _pin(self, prompt: list[int]) -> Saved:
        fed = self._start(prompt, whole=True)
        if fed < len(prompt):
            # a turn's prefill (generate_spec): the sources begin on this state,
            # so a pin holds no draft-source rows of the turn before it
            for s in self.sources:
                s.begin(self.model, self.state, prompt, fed)
            prefill(self.model, self.state, prompt, fed, sources=self.sources)
            self.live = tuple(prompt)
        return self._save()

    def unpin(self, name: str) -> bool:
        return self.store.unpin(name)

    def pins(self) -> dict:
        return self.store.usage()

    # --- a turn ---------------------------------------------------------------------
    def run(self, prompt: list[int], max_tokens: int, sampler: Sampler, on_token=None,
            cancelled=None) -> Turn:
        """Generate up to max_tokens after prompt. on_token(tok, logits_row) -> True
        ends the turn (a stop string); cancelled() -> True cancels it."""
        if cancelled is not None and cancelled():        # its client left while it waited
            self.cancelled += 1
            print("[vkspec serve] a turn was cancelled before it started", file=sys.stderr, flush=True)
            return Turn(cancelled=True)
        with self.lock:
            turn = Turn()
            t0 = time.perf_counter()
            try:
                try:
                    turn.reused = self._start(prompt)
                except DeviceError as e:
                    self.live = None
                    if not self._fall_back(e):
                        raise
                    turn.reused = self._start(prompt)
                try:
                    res = generate_spec(self.model, prompt, max_tokens, sampler, self.sources, self.gate,
                                        snapshots=self.snapshots, stop=self.eos, state=self.state,
                                        fed=turn.reused, on_token=on_token, fallback=self.fallback,
                                        cancel=(lambda _: cancelled()) if cancelled else None)
                finally:
                    self._adopt()
                turn.tokens, turn.counters = res.tokens, res.counters
                turn.prefill_s, turn.decode_s = res.prefill_s, res.decode_s
                turn.finish = "stop" if (res.tokens and res.tokens[-1] in self.eos) else "length"
            except Cancelled as e:
                turn.tokens, turn.cancelled = list(e.tokens), True
                self.cancelled += 1
            except BaseException:
                self.live = None                 # unknown: the next turn starts afresh
                raise
            self.live = tuple(prompt) + tuple(turn.tokens[:-1])
            try:
                self.store.put_turn(self._save())
            except DeviceError as e:         # the turn is done; only its reuse is lost
                self.live = None
                self._fall_back(e)
            self.turns += 1
            c = turn.counters
            line = c.line(len(turn.tokens)) if c is not None else "cancelled"
            print(f"[vkspec serve] turn {self.turns}: prompt {len(prompt)} (reused {turn.reused}), "
                  f"{len(turn.tokens)} tokens, {line}, {time.perf_counter() - t0:.3f} s",
                  file=sys.stderr, flush=True)
            if self.on_turn is not None:
                self.on_turn(turn, len(prompt))
            return turn
