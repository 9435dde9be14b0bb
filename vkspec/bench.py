"""`vkspec bench MODEL --verify-cost`: what a verify block costs against a
decode step, and how much of a decode step is Python on the host.

Terms:
* T(n): the wall time of one forward of n rows with copy slots (a verify
  block of n-1 drafts), at a fixed context length, median of ``reps``;
  ``t_ratio[n] = T(n) / T(1)``. Sizes are interleaved (1..8, 1..8, ...) so
  drift on a noisy machine hits them alike.
* host share: the part of a decode step's forward spent in Python on the
  host, i.e. outside the one replay of the recorded sequence (the NumPy
  backend runs everything on the host, so its share is 1).
* weight bytes per token: the bytes of weights one decode step reads, in the
  formats they are held in: every matrix of the trunk once, the lm_head, one
  embedding row, and of a MoE layer the router, the shared expert and the
  routed experts a token takes (num_experts_per_tok of them, on average).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .speculative import generate


def verify_cost(model, prompt_len: int = 140, reps: int = 9, max_rows: int = 8) -> dict:
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(1, model.cfg.vocab_size, prompt_len)]
    st = model.new_state()
    for i in range(0, prompt_len, model.max_rows):
        model.forward(prompt[i:i + model.max_rows], st)
    sizes = range(1, min(max_rows, model.max_rows) + 1)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(reps + 1):                  # the first round records the sequences
        for n in sizes:
            block = [int(t) for t in rng.integers(1, model.cfg.vocab_size, n)]
            t0 = time.perf_counter()
            model.forward(block, st, copies=True)
            dt = time.perf_counter() - t0
            model.rewind(st, 1)                  # one row stands: the context grows slowly
            if rep:
                times[n].append(dt)
    t = {n: statistics.median(v) for n, v in times.items()}
    return {"t_ms": {str(n): t[n] * 1e3 for n in sizes},
            "t_ratio": {str(n): t[n] / t[1] for n in sizes},
            "context": prompt_len, "reps": reps}


def host_share(model, steps: int = 32) -> float:
    """A decode step is the forward of one row and the pick of the next token."""
    if model.backend == "cpu":
        return 1.0
    from .sampling import Sampler
    sampler = Sampler()
    st = model.new_state()
    model.forward([1, 2, 3], st)
    _, logits = model.forward([4], st)            # records the decode sequence
    model.timing = {"eval": 0.0}
    t0 = time.perf_counter()
    for _ in range(steps):
        _, logits = model.forward([sampler.pick(logits[-1])], st)
    total = time.perf_counter() - t0
    dev = model.timing.pop("eval")
    model.timing = None
    return (total - dev) / total


def decode_tok_s(model, n: int = 48) -> float:
    prompt = list(range(1, 17))
    generate(model, prompt, 4)                     # records the shapes
    return generate(model, prompt, n).decode_tok_s


def weight_bytes_per_token(w, cfg) -> int:
    """See the module docstring; ``w`` is the model's Weights."""
    from .weights import MoeW

    def mats(obj):
        vals = [x for v in vars(obj).values() for x in (v if isinstance(v, list) else [v])]
        return [m for m in vals if hasattr(m, "nbytes") and hasattr(m, "fmt")]

    total = w.lm_head.nbytes() + (w.embed.nbytes() // max(w.embed.rows, 1))
    for lw in w.layers:
        total += sum(m.nbytes() for m in mats(lw.mixer))
        f = lw.ffn
        if isinstance(f, MoeW):
            total += f.router.nbytes() + (f.shared_gate.nbytes() if f.shared_gate is not None else 0)
            total += sum(m.nbytes() for m in mats(f.shared)) if f.shared is not None else 0
            per_expert = sum(m.nbytes() for e in f.experts for m in mats(e)) / max(len(f.experts), 1)
            total += int(per_expert * cfg.num_experts_per_tok)
        else:
            total += sum(m.nbytes() for m in mats(f))
    return int(total)


def run(model, reps: int = 9) -> dict:
    out = verify_cost(model, reps=reps)
    out["host_share"] = host_share(model)
    out["decode_tok_s"] = decode_tok_s(model)
    out["backend"] = model.backend
    return out
