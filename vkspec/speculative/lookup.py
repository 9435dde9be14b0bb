"""Prompt lookup: drafts copied from the context itself.

The longest n-gram (4 down to 2 tokens) that ends the token history (prompt,
output so far and the last pick) and also occurs earlier in it, at its most
recent earlier occurrence, proposes the tokens that followed it there (up to
``max_drafts``, 7 at most: with the CPU's verify cost at T(8)/T(1) ~3.1, a
copy's 7 drafts yield more tokens per plain step's time than 5; the seed's cap
of 5 was set for dearer verifies, and the gate still drafts shallower where
rows cost more). Code edits, quotes and repeated structure give long accepted
runs; free text gives few proposals.

* offset: how far back the copied text lies (history length minus where the
  proposal starts in it).
* kind "copy": the proposal has the offset of this source's previous one, so
  it goes on with a copy the output has been following; a fresh match (the
  first, or after the output left the text it copied) has kind "". The gate
  keeps their acceptance apart: a copy in progress tends to go on for many
  tokens, a fresh match of two tokens often does not, and one average rate
  would draft too deep on the one and too shallow on the other.
"""

from __future__ import annotations

from .config import MAX_DRAFTS
from .source import Proposal


class PromptLookup:
    name = "lookup"
    free = True               # proposing costs nothing: the gate may judge every proposal in hindsight

    def __init__(self, max_drafts: int = MAX_DRAFTS, max_ngram: int = 4, min_ngram: int = 2):
        self.max_drafts = min(max_drafts, MAX_DRAFTS)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.offset = None            # the previous proposal's offset

    def begin(self, model, state, prompt, fed=0):
        self.offset = None

    def observe(self, tokens, hidden, start_pos):
        pass

    def prefilled(self):
        pass

    def picked(self, tok: int):
        pass

    def moved(self, model, state, tokens=None, hidden=None):
        pass

    def lead_passes(self) -> int:
        return 0

    def checkpoint(self):
        return self.offset

    def restore(self, ck):
        self.offset = ck

    def propose(self, history: list[int], pick: int, pos: int, k: int, gate=None) -> Proposal | None:
        seq = history + [pick]
        k = min(k, self.max_drafts)
        if k <= 0:
            return None
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):      # most recent earlier occurrence
                if seq[start:start + n] == tail:
                    follow = seq[start + n:start + n + k]
                    if follow:
                        offset = len(seq) - start - n
                        kind = "copy" if offset == self.offset else ""
                        self.offset = offset
                        return Proposal(self.name, follow, kind=kind)
                    break
        return None
