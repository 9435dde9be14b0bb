"""A request's sampling controls become one Sampler per choice.

Choice 0 draws with the request's seed (so n = 1 and the first of n choices
agree); choice i > 0 with a seed derived from (seed, i), so a seeded request
with n > 1 repeats exactly."""

from __future__ import annotations

import secrets

import numpy as np

from ..sampling import Sampler
from .schema import SEED_MAX, ApiError


def choice_seed(seed: int, i: int) -> int:
    if i == 0:
        return seed
    return int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0]) & SEED_MAX


def logit_bias(req, vocab: int) -> dict[int, float] | None:
    if not req.logit_bias:
        return None
    bias = {int(k): float(v) for k, v in req.logit_bias.items()}
    bad = [t for t in bias if not 0 <= t < vocab]
    if bad:
        raise ApiError(f"logit_bias: token id {bad[0]} is out of range (the vocabulary has {vocab})",
                       "logit_bias")
    return bias


def samplers(req, prompt: list[int], vocab: int, constraint=None) -> list[Sampler]:
    """One sampler per choice; `constraint()` makes each choice's own grammar
    state (None: unconstrained)."""
    seed = req.seed if req.seed is not None else secrets.randbits(63)
    bias = logit_bias(req, vocab)
    out = []
    for i in range(req.n):
        try:
            out.append(Sampler(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                               repetition_penalty=req.repetition_penalty,
                               presence_penalty=req.presence_penalty,
                               frequency_penalty=req.frequency_penalty, logit_bias=bias,
                               prompt=tuple(prompt), seed=choice_seed(seed, i),
                               constraint=constraint() if constraint else None))
        except ValueError as e:
            raise ApiError(str(e)) from None
    return out
