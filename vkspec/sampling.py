"""Picking the next token from exact logits: greedy, or seeded temperature /
top-k / top-p / min-p, after the history-dependent controls (logit bias,
repetition / presence / frequency penalties, a grammar's token mask).

The sampler sees every emitted token, in order, through its own picks, and
keeps the history they make: every control is a function of the prompt and
the picks before the row it is applied to. A verify's rows are picked one at
a time in that order and a rejected round restores the sampler (set_state),
so drafts never change what is picked. The random stream advances exactly
once per sampled (emitted) token, never otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import exact

f32 = np.float32


class Constraint(Protocol):
    """A grammar that a sampler's picks must follow (serve/constraint.py)."""
    finished: bool

    def allowed(self) -> np.ndarray:
        """The token ids the grammar accepts next."""

    def consume(self, tok: int) -> None:
        ...

    def rollback(self, k: int) -> None:
        """Forget the last k tokens consumed."""


@dataclass
class Sampler:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    min_p: float = 0.0
    # the penalties follow vLLM: repetition (CTRL's divide / multiply) over
    # the prompt and the output, presence and frequency over the output only
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    prompt: tuple[int, ...] = ()
    constraint: Constraint | None = None
    rng: np.random.Generator = field(init=False, repr=False)
    draws: int = field(default=0, init=False)
    out: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or not 0 <= self.min_p <= 1 \
                or self.repetition_penalty <= 0:
            raise ValueError("temperature >= 0, 0 < top_p <= 1, top_k >= 0, 0 <= min_p <= 1, "
                             "repetition_penalty > 0")
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self.counts: Counter = Counter()
        self.prompt = tuple(self.prompt)
        self.seen = np.unique(np.asarray(self.prompt, np.int64))   # sorted ids of the prompt

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def controlled(self) -> bool:
        return bool(self.logit_bias) or self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 \
            or self.frequency_penalty != 0.0

    def adjusted(self, logits: np.ndarray) -> np.ndarray:
        """The logits after bias and penalties, from this row's history."""
        x = np.array(logits, f32)
        if self.logit_bias:
            ids = np.fromiter(self.logit_bias, np.int64)
            x[ids] += np.fromiter(self.logit_bias.values(), f32, len(ids))
        if self.repetition_penalty != 1.0:
            ids = np.union1d(self.seen, np.fromiter(self.counts, np.int64, len(self.counts)))
            v, p = x[ids], f32(self.repetition_penalty)
            x[ids] = np.where(v > 0, v / p, v * p)
        if self.counts and (self.presence_penalty or self.frequency_penalty):
            ids = np.fromiter(self.counts, np.int64, len(self.counts))
            n = np.fromiter(self.counts.values(), f32, len(ids))
            x[ids] -= f32(self.presence_penalty) + f32(self.frequency_penalty) * n
        return x

    def pick(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, f32)
        if self.controlled:
            logits = self.adjusted(logits)
        valid = self.constraint.allowed() if self.constraint is not None else None
        tok = self._choose(logits, valid)
        self.out.append(tok)
        self.counts[tok] += 1
        if self.constraint is not None:
            self.constraint.consume(tok)
        return tok

    def _choose(self, logits, valid) -> int:
        if self.greedy:
            if valid is not None:
                logits = np.where(valid, logits, f32(-np.inf))
            return int(exact.argmax(logits))
        probs = exact.softmax(logits * f32(1.0 / self.temperature), valid)
        order = np.argsort(-probs, kind="stable")
        if valid is not None:
            order = order[:max(1, int(np.count_nonzero(valid)))]
        if self.top_k:
            order = order[:self.top_k]
        p = probs[order].astype(np.float64)
        if self.top_p < 1.0:
            cum = np.cumsum(p)
            keep = int(np.searchsorted(cum, self.top_p * cum[-1])) + 1
            order, p = order[:keep], p[:keep]
        if self.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(p >= self.min_p * p[0])))   # p is sorted: a prefix
            order, p = order[:keep], p[:keep]
        cum = np.cumsum(p)
        u = self.rng.random() * cum[-1]
        self.draws += 1
        return int(order[min(int(np.searchsorted(cum, u, side="right")), len(order) - 1)])

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing more may follow."""
        return self.constraint is not None and self.constraint.finished

    def state(self):
        return self.rng.bit_generator.state, self.draws, len(self.out)

    def set_state(self, s):
        self.rng.bit_generator.state, self.draws, n = s
        if n < len(self.out):
            if self.constraint is not None:
                self.constraint.rollback(len(self.out) - n)
            for t in self.out[n:]:
                self.counts[t] -= 1
                if not self.counts[t]:
                    del self.counts[t]
            del self.out[n:]


def logprobs(logits: np.ndarray, token: int, top: int = 0):
    """log p(token) and the `top` most likely (id, logprob) under temperature 1."""
    lp = exact.log(exact.softmax(np.asarray(logits, f32)))
    best = np.argsort(-lp, kind="stable")[:top]
    return float(lp[token]), [(int(i), float(lp[i])) for i in best]
