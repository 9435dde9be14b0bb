"""What every run returns: the tokens, the last logits row and what it cost."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .counters import Counters


@dataclass
class Result:
    tokens: list[int]
    last_logits: np.ndarray
    forwards: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    counters: Counters | None = None

    @property
    def digest(self) -> str:
        h = hashlib.sha256(np.asarray(self.tokens, dtype="<i4").tobytes())
        h.update(np.asarray(self.last_logits, dtype="<f4").tobytes())
        return h.hexdigest()

    @property
    def decode_tok_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0
