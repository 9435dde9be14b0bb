"""The decode loop: prefill, then speculative rounds (round.py) until done.

Plain decoding is the same loop with zero drafts. If anything fails or is
cancelled mid-round, the state of the last commit comes back: model rows,
sampler, draft sources, output. A device that fails (DeviceError) ends the
run there (the exception carries the committed tokens and their last logits
row), or, with a Fallback (fallback.py), the run continues from that commit
on the CPU.
"""

from __future__ import annotations

import time

from ..errors import DeviceError
from ..sampling import Sampler
from .prefill import prefill
from .result import Result
from .round import Run


def generate_spec(model, prompt, n, sampler, sources=(), gate=None, snapshots=7, stop=None,
                  cancel=None, block=None, state=None, fed=0, on_token=None, fallback=None) -> Result:
    """n tokens after the prompt (fewer if a stop token comes). The prompt is
    fed in blocks of ``block`` rows (the backend's largest by default: a row's
    bits do not depend on its block). ``cancel(tokens_so_far)`` returning true
    cancels mid-round (the state of the last commit comes back; the exception
    carries the committed tokens). ``state``: the model state to use, which
    already holds the first ``fed`` prompt tokens (a reused prefix; the draft
    sources' own state must match it). ``on_token(tok, logits_row)`` sees each
    emitted token and the row it was picked from; returning true ends the run
    after that token (a stop string); a token emitted again after a fallback
    (the same token: the bits are the same) is not shown to it twice.
    ``fallback``: a fallback.Fallback; on a DeviceError the run continues on its
    CPU model (the model and state it ends on are ``fallback.model/state``).
    An exception that ends the run carries ``tokens`` (the committed output)
    and ``last`` (the logits row of the last of them; None before the first)."""
    if not prompt:
        raise ValueError("empty prompt")
    st = state or model.new_state()
    if st.kv_len != fed or fed >= len(prompt):
        raise ValueError(f"the state holds {st.kv_len} rows, the reused prefix is {fed} of {len(prompt)}")
    t0 = time.perf_counter()
    if gate:
        gate.begin()
    for src in sources:
        src.begin(model, st, prompt, fed)
    logits = None                    # the last block's: a fallback after it keeps them (same bits)
    while True:
        try:
            got, _ = prefill(model, st, prompt, fed, sources=sources, block=block)
            logits = got if got is not None else logits
            break
        except DeviceError as e:
            if fallback is None or not fallback.applies(model, e):
                raise
            fed, logits = e.fed, e.logits if e.logits is not None else logits
            model, st = fallback.take_over(model, st, prompt[:fed], st.kv_len == fed, sources, e, 0)
    t1 = time.perf_counter()
    run = Run(model, st, sampler, tuple(sources), gate, n, list(prompt), snapshots, stop, cancel, on_token,
              cap=gate.k_max if gate else 0,
              hindsight={s.name for s in sources if s.free} if gate and gate.enabled else set())
    tok, last = sampler.pick(logits[-1]), logits[-1]
    run.emit(tok, last)
    while not run.done(tok):
        commit = run.checkpoint()
        try:
            tok, last = run.round(tok)
        except BaseException as e:
            state_ok = run.undo(commit)
            if fallback is not None and fallback.applies(run.model, e):
                run.model, run.st = fallback.take_over(run.model, run.st, list(run.history), state_ok,
                                                       sources, e, len(run.out))
                continue
            e.tokens, e.last = list(run.out), last
            e.state_lost = not state_ok
            raise
    c = run.counters
    return Result(run.out, last, c.forwards, t1 - t0, time.perf_counter() - t1, c.drafted, c.accepted, c)


def generate(model, prompt: list[int], n: int, sampler: Sampler | None = None,
             stop: set[int] | None = None, block: int | None = None) -> Result:
    """Plain decoding: n tokens after the prompt (fewer if a stop token comes),
    one forward per token. It is the speculative loop with no draft source."""
    return generate_spec(model, list(prompt), n, sampler or Sampler(), stop=stop, block=block)
