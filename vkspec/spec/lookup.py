"""Prompt lookup: drafts copied from the context itself.

The longest n-gram (4 down to 2 tokens) that ends the token history (prompt,
output so far and the last pick) and also occurs earlier in it, at its most
recent earlier occurrence, proposes the tokens that followed it there (up to
``max_drafts``, 5 at most). Code edits, quotes and repeated structure give long
accepted runs; free text gives few proposals.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Proposal:
    """Drafts after the last pick, and (optionally) the source's own
    probability of each (the per-step confidence)."""
    source: str
    tokens: list[int]
    probs: list[float] | None = None
    seconds: float = 0.0          # time spent writing drafts past the first
    extra: dict = field(default_factory=dict)


class PromptLookup:
    name = "lookup"
    free = True               # proposing costs nothing: the gate may judge every proposal in hindsight

    def __init__(self, max_drafts: int = 5, max_ngram: int = 4, min_ngram: int = 2):
        self.max_drafts = min(max_drafts, 5)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def begin(self, model, state, prompt, fed=0):
        pass

    def observe(self, tokens, hidden, start_pos):
        pass

    def checkpoint(self):
        return None

    def restore(self, ck):
        pass

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
                        return Proposal(self.name, follow)
                    break
        return None
