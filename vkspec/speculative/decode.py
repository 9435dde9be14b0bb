"""The speculative transaction and the decode loop around it.

A round starts from a committed state and the last pick (emitted, not yet
fed). It asks the gate how many drafts pay and a draft source for at most
that many, runs one verify over the pick and its drafts, settles the drafts
one at a time from the exact logits, commits the rows that stood, undoes the
rest, and returns the round's one correction or bonus pick. Plain decoding is
the same loop with zero drafts. If anything fails or is cancelled mid-round,
the state of the last commit comes back: model rows, sampler, draft sources,
output. A device that fails (DeviceError) ends the run there (the exception
carries the committed tokens and their last logits row), or, with a
Fallback (fallback.py), the run continues from that commit on the CPU.
"""

from __future__ import annotations

import time

from ..errors import DeviceError
from ..sampling import Sampler
from .counters import Counters
from .result import Result


class Cancelled(Exception):
    pass


def first_run(model, rows: int) -> bool:
    """Whether this is the model's first forward of ``rows`` rows. Its time is
    no verify-cost sample: a first dispatch builds pipelines, compiles kernels
    or faults pages in (on Lavapipe one first 2-row forward measured 25 times
    a decoding step, and the gate then declined every draft)."""
    seen = model.__dict__.setdefault("timed_rows", set())
    if rows in seen:
        return False
    seen.add(rows)
    return True


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
    block = block or model.max_rows
    st, out, counters = state or model.new_state(), [], Counters()
    if st.kv_len != fed or fed >= len(prompt):
        raise ValueError(f"the state holds {st.kv_len} rows, the reused prefix is {fed} of {len(prompt)}")
    history = list(prompt)
    t0 = time.perf_counter()
    if gate:
        gate.begin()
    for src in sources:
        src.begin(model, st, prompt, fed)
    i = fed
    while True:
        try:
            while i < len(prompt):
                rows = prompt[i:i + block]
                hidden, logits = model.forward(rows, st, logits_rows="last")
                for src in sources:
                    src.observe(rows, hidden, i)
                i += len(rows)
            for src in sources:
                src.prefilled()              # the MTP head reads the prompt's rows
            break
        except DeviceError as e:
            if fallback is None or not fallback.applies(model, e):
                raise
            # the rows before i stood; a forward that failed after moving the
            # watermark (its rows computed, never read) is not the commit
            model, st = fallback.take_over(model, st, prompt[:i], st.kv_len == i, sources, e, 0)
    t1 = time.perf_counter()
    state = dict(cap=gate.k_max if gate else 0, fed=False, ended=False)
    # sources whose proposals cost nothing: the gate judges them in hindsight
    hindsight = {s.name for s in sources if s.free} if gate and gate.enabled else set()
    told: list[tuple[int, bool]] = []        # what on_token saw, and said, per output index

    def emit(tok, row):
        out.append(tok)
        for src in sources:
            src.picked(tok)
        at = len(out) - 1
        if at < len(told):                   # emitted again after a fallback: the caller has it
            if told[at][0] != tok:
                raise DeviceError(f"the CPU gave token {tok} where the device gave {told[at][0]} "
                                  f"(output {at}): the backends disagree")
            state["ended"] = told[at][1]
            return
        state["ended"] = bool(on_token and on_token(tok, row))
        told.append((tok, state["ended"]))

    def done(tok):
        return len(out) >= n or (stop is not None and tok in stop) or state["ended"]

    def round_(pick):
        """Feed `pick` and its drafts; emit the accepted drafts and one more pick."""
        pos = st.kv_len
        prop = propose(pick, pos, min(state["cap"], n - len(out) - 1))
        drafts = prop.tokens if prop else []
        rows = [pick] + drafts
        slots = min(len(drafts), snapshots)
        t, recorded = time.perf_counter(), model.recordings
        first = first_run(model, len(rows))
        state["fed"] = True
        hidden, logits = model.forward(rows, st, copies=slots)
        if gate and model.recordings == recorded and not first:    # recording or first dispatch: no T(n)
            gate.record_forward(len(rows), time.perf_counter() - t)
        counters.forward(len(drafts), prop.source if prop else None)
        i = 0
        while True:
            if cancel is not None and cancel(len(out)):
                raise Cancelled(f"cancelled after {len(out)} tokens")
            tok = sampler.pick(logits[i])
            emit(tok, logits[i])
            if i < len(drafts) and tok == drafts[i] and not done(tok):
                i += 1
                continue
            break
        keep = i + 1
        if keep < len(rows) and keep - 1 >= slots:       # no copy slot for that row: replay
            model.rewind(st, 0)
            model.forward(rows[:keep], st)
            counters.replay()
            state["cap"] = min(state["cap"], snapshots)     # the guard: one replay, then clamp to S
        else:
            model.rewind(st, keep)
        for src in sources:
            src.observe(rows[:keep], hidden, pos)
        history.extend(rows[:keep])
        if prop:
            counters.settled(prop.source, len(drafts), i)
            if gate and prop.source not in hindsight:
                gate.record_verify(prop.key, len(drafts), i, prop.probs)
        if gate:
            gate.see_output(out)
        return tok, logits[i]

    def propose(pick, pos, k_max):
        props = []
        for src in sources:
            if src.name in hindsight:
                prop = src.propose(history, pick, pos, k_max) if k_max > 0 else None
                if prop and prop.tokens:                 # judged in full, carried up to the plan
                    gate.judge_later(prop.key, prop.tokens, len(out))
                    prop.tokens = prop.tokens[:gate.plan(prop.key, len(prop.tokens), src.lead_passes())]
            elif (k := gate.plan(src.name, k_max, src.lead_passes()) if gate else k_max) > 0:
                pstep = gate is not None and gate.enabled and gate.pstep
                prop = src.propose(history, pick, pos, k, gate if pstep else None)
                if prop and prop.tokens and gate:
                    gate.record_draft_time(prop.key, len(prop.tokens) - 1, prop.seconds, prop.lead, prop.passes)
                    if prop.probs is not None and pstep:
                        prop.tokens = prop.tokens[:gate.pick_p(src.name, prop.probs)]
                        prop.probs = prop.probs[:len(prop.tokens)]
            else:
                prop = None
            if prop and prop.tokens:
                props.append(prop)
        return choose(props, gate)

    def restore(commit) -> bool:
        """Back to the commit. The host's half first, so that a model that
        fails to rewind (a failed device) still leaves the output, sampler
        and sources of the commit. True when the model's state is the
        commit's as far as the host can tell."""
        n_out, n_hist, sampler_state, source_states, saved_state, saved_counters = commit
        fed_this_round = state["fed"]
        del out[n_out:]
        del history[n_hist:]
        sampler.set_state(sampler_state)
        for src, ck in zip(sources, source_states):
            src.restore(ck)
        state.update(saved_state)
        counters.__dict__.update(saved_counters.__dict__)
        if fed_this_round:
            try:
                model.rewind(st, 0)          # the state before this round's first forward
            except Exception:                # noqa: BLE001 - the caller raises the first error
                return False
        return st.kv_len == len(history)

    tok, last = sampler.pick(logits[-1]), logits[-1]
    emit(tok, last)
    while not done(tok):
        state["fed"] = False
        commit = (len(out), len(history), sampler.state(), [s.checkpoint() for s in sources],
                  dict(state), counters.copy())
        try:
            tok, last = round_(tok)
        except BaseException as e:
            state_ok = restore(commit)
            if fallback is not None and fallback.applies(model, e):
                model, st = fallback.take_over(model, st, list(history), state_ok, sources, e, len(out))
                continue
            e.tokens, e.last = list(out), last
            e.state_lost = not state_ok
            raise
    return Result(out, last, counters.forwards, t1 - t0, time.perf_counter() - t1,
                  counters.drafted, counters.accepted, counters)


def choose(proposals, gate):
    """The proposal with the higher expected tokens per unit of time (the
    gate's E(k)/cost(k) with its acceptance for that source), the longer one on
    a tie."""
    best, best_v = None, float("-inf")
    for prop in proposals:
        v = gate.value(prop.key, len(prop.tokens), written=True) if gate else float(len(prop.tokens))
        if best is None or v > best_v or (v == best_v and len(prop.tokens) > len(best.tokens)):
            best, best_v = prop, v
    return best


def generate(model, prompt: list[int], n: int, sampler: Sampler | None = None,
             stop: set[int] | None = None, block: int | None = None) -> Result:
    """Plain decoding: n tokens after the prompt (fewer if a stop token comes),
    one forward per token. It is the speculative loop with no draft source."""
    return generate_spec(model, list(prompt), n, sampler or Sampler(), stop=stop, block=block)
