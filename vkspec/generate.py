"""The decode loop: prefill in blocks, then one forward per emitted token.

(Speculative decoding wraps the same loop: see vkspec.spec.)"""

from __future__ import annotations

import hashlib
import time
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
    counters: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        h = hashlib.sha256(np.asarray(self.tokens, dtype="<i4").tobytes())
        h.update(np.asarray(self.last_logits, dtype="<f4").tobytes())
        return h.hexdigest()

    @property
    def decode_tok_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0


def prefill(model, state, prompt: list[int], block: int | None = None):
    """Feed the prompt in blocks of the backend's largest block (a row's bits
    do not depend on its block)."""
    block = block or model.max_rows
    hidden = logits = None
    for i in range(0, len(prompt), block):
        hidden, logits = model.forward(prompt[i:i + block], state, logits_rows="last")
    return hidden, logits


def generate(model, prompt: list[int], n: int, sampler: Sampler | None = None,
             stop: set[int] | None = None, block: int | None = None) -> Result:
    """Plain decoding: n tokens after the prompt (fewer if a stop token comes)."""
    if not prompt:
        raise ValueError("empty prompt")
    sampler = sampler or Sampler()
    st = model.new_state()
    t0 = time.perf_counter()
    _, logits = prefill(model, st, prompt, block)
    t1 = time.perf_counter()
    out, forwards = [], 0
    last = logits[-1]
    while len(out) < n:
        tok = sampler.pick(last)
        out.append(tok)
        if stop and tok in stop or len(out) == n:
            break
        _, logits = model.forward([tok], st)
        forwards += 1
        last = logits[-1]
    return Result(out, last, forwards, t1 - t0, time.perf_counter() - t1)
