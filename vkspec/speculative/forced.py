"""Forced draft modes (tests): drafts built from a reference run's tokens.

Modes: ``accept`` (every draft right), ``reject`` (every draft wrong),
``mixed`` (every other verify's first draft wrong, the rest right), ``cycle``
(verify v has draft 1 + v mod k wrong: the wrong draft moves across the rows
verify by verify), ``rowN`` (draft N wrong). The wrapped source still runs
(its state and costs are exercised); only the draft ids are replaced. A wrong
draft is the reference token + 1 (mod the vocabulary).
"""

from __future__ import annotations

from .source import Proposal

MODES = ("accept", "reject", "mixed", "cycle")


def wrong_rows(mode: str, verify: int, k: int) -> set[int]:
    """0-based indices of the wrong drafts of verify number ``verify``."""
    if mode == "accept":
        return set()
    if mode == "reject":
        return set(range(k))
    if mode == "mixed":
        return {0} if verify % 2 == 0 else set()
    if mode == "cycle":
        return {verify % k}
    if mode.startswith("row") and mode[3:].isdigit():
        return {int(mode[3:]) - 1}
    raise ValueError(f"unknown forced draft mode {mode!r}")


class ForcedDrafts:
    def __init__(self, inner, mode: str, reference: list[int], vocab_size: int):
        wrong_rows(mode, 0, 1)                      # validates the mode
        self.inner, self.mode, self.ref, self.vocab = inner, mode, reference, vocab_size
        self.name, self.free = inner.name, inner.free
        self.verifies = 0

    def begin(self, model, state, prompt, fed=0):
        self.prompt_len = len(prompt)
        self.inner.begin(model, state, prompt, fed)

    def observe(self, tokens, hidden, start_pos):
        self.inner.observe(tokens, hidden, start_pos)

    def prefilled(self):
        self.inner.prefilled()

    def picked(self, tok):
        self.inner.picked(tok)

    def moved(self, model, state, tokens=None, hidden=None):
        self.inner.moved(model, state, tokens, hidden)

    def lead_passes(self) -> int:
        return self.inner.lead_passes()

    def checkpoint(self):
        return self.verifies, self.inner.checkpoint()

    def restore(self, ck):
        self.verifies, inner = ck
        self.inner.restore(inner)

    def propose(self, history, pick, pos, k, gate=None):
        inner = self.inner.propose(history, pick, pos, k, None)
        o = len(history) + 1 - self.prompt_len       # output index of the next token
        want = self.ref[o:o + k]
        if not want:
            return None
        bad = wrong_rows(self.mode, self.verifies, len(want))
        self.verifies += 1
        toks = [(t + 1) % self.vocab if j in bad else t for j, t in enumerate(want)]
        return Proposal(self.name, toks, None, inner.seconds if inner else 0.0)
