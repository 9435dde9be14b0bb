"""Picking the next token from exact logits: greedy, or seeded temperature / top-k / top-p.

The random stream advances exactly once per sampled (emitted) token, never
otherwise, so a run's output depends only on the logits it picks from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import exact

f32 = np.float32


@dataclass
class Sampler:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    rng: np.random.Generator = field(init=False, repr=False)
    draws: int = field(default=0, init=False)

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature >= 0, 0 < top_p <= 1, top_k >= 0")
        self.rng = np.random.Generator(np.random.PCG64(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def pick(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, f32)
        if self.greedy:
            return int(exact.argmax(logits))
        probs = exact.softmax(logits * f32(1.0 / self.temperature))
        order = np.argsort(-probs, kind="stable")
        if self.top_k:
            order = order[:self.top_k]
        p = probs[order].astype(np.float64)
        if self.top_p < 1.0:
            cum = np.cumsum(p)
            keep = int(np.searchsorted(cum, self.top_p * cum[-1])) + 1
            order, p = order[:keep], p[:keep]
        cum = np.cumsum(p)
        u = self.rng.random() * cum[-1]
        self.draws += 1
        return int(order[min(int(np.searchsorted(cum, u, side="right")), len(order) - 1)])

    def state(self):
        return self.rng.bit_generator.state, self.draws

    def set_state(self, s):
        self.rng.bit_generator.state, self.draws = s


def logprobs(logits: np.ndarray, token: int, top: int = 0):
    """log p(token) and the `top` most likely (id, logprob) under temperature 1."""
    lp = exact.log(exact.softmax(np.asarray(logits, f32)))
    best = np.argsort(-lp, kind="stable")[:top]
    return float(lp[token]), [(int(i), float(lp[i])) for i in best]
