"""Plain decoding and the result every run returns. The loop itself is
vkspec.spec.decode's, with no draft source: one forward per emitted token."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .sampling import Sampler


@dataclass
class Result:
    tokens: list[int]
    last_logits: np.ndarray
    forwards: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    counters: object = None            # vkspec.spec.counters.Counters for speculative runs

    @property
    def digest(self) -> str:
        h = hashlib.sha256(np.asarray(self.tokens, dtype="<i4").tobytes())
        h.update(np.asarray(self.last_logits, dtype="<f4").tobytes())
        return h.hexdigest()

    @property
    def decode_tok_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0


def generate(model, prompt: list[int], n: int, sampler: Sampler | None = None,
             stop: set[int] | None = None, block: int | None = None) -> Result:
    """Plain decoding: n tokens after the prompt (fewer if a stop token comes).
    It is the speculative loop with no draft source."""
    from .spec.decode import generate_spec
    if not prompt:
        raise ValueError("empty prompt")
    return generate_spec(model, list(prompt), n, sampler or Sampler(), stop=stop, block=block)
