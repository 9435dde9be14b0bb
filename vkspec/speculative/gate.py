"""The gate: how many drafts a verify carries, per draft source.

Terms:
* a_j: the running probability that draft j is accepted when the drafts
  before it were. It starts at the source's prior (MTP 0.8, 0.6, 0.5, then
  0.5; a fresh lookup match 0.5; a lookup copy in progress 0.9, since the
  output has followed that text since the last proposal: copies were accepted
  at 0.95-0.98 on a code edit, and from 0.5 the first five copy rounds of an
  output drafted 0 to 4 tokens while the rate climbed), worth PRIOR_WEIGHT
  pseudo-verifies, and remembers about MEMORY verifies (older evidence is
  scaled down).
* T(n): the measured seconds of an n-row forward: the lower quartile of its
  last SAMPLES forwards (the minimum of up to three). Timing noise on a
  shared machine is upward (preemption, the first step after a prefill), and
  with the median of a few samples one slow plain step made T(1) too high and
  every draft look cheap; Lavapipe's step time moves by up to 1.5x in a run. An unmeasured row count costs
  T(1) (1 + (n-1) rho), rho fitted from the multi-row forwards measured once
  T(1) is (0.5 until then).
* d: the measured seconds a source spends per draft past its first.
* d0: the measured seconds a source spends to its first draft, per pass
  (the MTP head reads the rows that stood since its last proposal, up to a
  block of rows per pass, and writes draft 1; lookup's is ~0). A declined
  round skips it, but the rows pile up: after a run of declines the next
  draft costs more passes, and the gate prices it so (``passes``).
* E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k, the tokens a verify of k drafts
  yields; cost(k) = (T(k+1) + passes d0 + (k-1) d) / T(1), in plain steps;
  value(k) = E(k) / cost(k). The gate drafts the best k only when value > 1.
  Choosing between proposals already written, their writing is not counted.
* probe: it tries one draft deeper than its best, so an estimate it stopped
  feeding can recover: at most every PROBE_EVERY picks of that source, and
  rarer when the probe is expected to lose time: the expected loss
  cost(k) - E(k), in plain steps, over PROBE_BUDGET per pick (a dear
  source's probes cost at most ~3% of the time).
* forced plain step: after FORCE_PLAIN_AFTER forwards without a plain step it
  takes one, so T(1) stays measured; and for a source with passes of its
  own (the MTP head) it takes plain steps first until T(1) has T1_SAMPLES
  samples, because every cost is in units of T(1)
  (without it, the priors alone would draft and a dear draft source, such as
  an MTP head pass on Lavapipe, would never be priced). One sample is not
  enough: the first step after a prefill ran ~1.3-1.9x a later one on the CPU
  path, and a T(1) that high made every draft look cheap until the next
  forced plain step, 64 forwards later.
* confidence bins: with per-draft probabilities p_j from the source (the MTP
  head's own), a_j becomes the acceptance measured for drafts in p_j's bin (ten
  bins, each starting at its own centre, worth PRIOR_WEIGHT verifies).
  ``pick_p`` prices only the verify (the drafts are written); ``deeper_p``
  lets the head write draft n+1 only when no shorter verify is worth more and
  n+1 drafts, the new one as likely as the best bin, beat a plain step and n.
* hindsight: a source whose proposals cost nothing (prompt lookup) shows the
  gate its whole proposal every round, carried or not; as the output settles
  each of those tokens, the gate records that draft as if verified (draft j
  once output j is known, up to the first miss). So a_j learns from every
  proposal (a declined one too), not only from the drafts it dared to
  carry; the deeper positions do not wait for probes, and draft 1 of a
  proposal made in a plain step is judged by the very next token.
* disabled: every proposal is drafted in full (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIORS = {"mtp": (0.8, 0.6, 0.5), "lookup": (0.5,), "lookup/copy": (0.9,)}
PRIOR_WEIGHT = 2.0
MEMORY = 16.0
PROBE_EVERY = 16
PROBE_BUDGET = 1 / 32
FORCE_PLAIN_AFTER = 64
T1_SAMPLES = 3
BINS = 10
SAMPLES = 8


@dataclass
class Rate:
    """A running acceptance: hits / trials, with the prior as pseudo-trials."""
    hits: float
    trials: float = PRIOR_WEIGHT

    @classmethod
    def prior(cls, p: float) -> "Rate":
        return cls(p * PRIOR_WEIGHT)

    @property
    def p(self) -> float:
        return self.hits / self.trials

    def add(self, accepted: bool):
        self.hits += float(accepted)
        self.trials += 1.0
        if self.trials > MEMORY:
            f = MEMORY / self.trials
            self.hits, self.trials = self.hits * f, self.trials * f


@dataclass
class SourceStats:
    name: str
    rates: list[Rate] = field(default_factory=list)
    bins: list[Rate] = field(default_factory=lambda: [Rate.prior((b + 0.5) / BINS) for b in range(BINS)])
    d: float | None = None                    # seconds per draft past the first
    d0: float | None = None                   # seconds to the first draft, per pass
    since_probe: int = 0

    def a(self, j: int) -> float:
        """P(draft j accepted | drafts 1..j-1 were), j from 1."""
        pri = PRIORS.get(self.name, (0.5,))
        while len(self.rates) < j:
            self.rates.append(Rate.prior(pri[min(len(self.rates), len(pri) - 1)]))
        return self.rates[j - 1].p


def _bin(p: float) -> int:
    if not p == p or p in (float("inf"), float("-inf")):      # a head that gave NaN/inf scores
        return 0
    return min(BINS - 1, max(0, int(p * BINS)))


class Gate:
    def __init__(self, k_max: int, enabled: bool = True, pstep: bool = False):
        self.k_max, self.enabled, self.pstep = k_max, enabled, pstep
        self.stats: dict[str, SourceStats] = {}
        self.samples: dict[int, list[float]] = {}
        self.t: dict[int, float] = {}          # n -> T(n), seconds
        self.picks = 0
        self.since_plain = 0
        self.declined = self.probes = self.forced_plain = 0
        self.pending: list[tuple[str, list[int], int, int]] = []   # hindsight: (source, tokens, at, judged)

    def source(self, name: str) -> SourceStats:
        if name not in self.stats:
            self.stats[name] = SourceStats(name)
        return self.stats[name]

    # --- measurements ------------------------------------------------------------
    def record_forward(self, rows: int, seconds: float):
        last = self.samples.setdefault(rows, [])
        last.append(seconds)
        del last[:-SAMPLES]
        self.t[rows] = sorted(last)[len(last) // 4]
        self.since_plain = 0 if rows == 1 else self.since_plain + 1

    def record_verify(self, name: str, drafted: int, accepted: int, probs=None):
        s = self.source(name)
        for j in range(1, min(drafted, accepted + 1) + 1):   # draft j was judged
            s.a(j)
            s.rates[j - 1].add(j <= accepted)
            if probs is not None:
                s.bins[_bin(probs[j - 1])].add(j <= accepted)

    def begin(self):
        """A new output starts (a server keeps its gate across turns): hindsight
        proposals about an earlier output are dropped unjudged."""
        self.pending = []

    def judge_later(self, name: str, tokens: list[int], at: int):
        """A free source proposed `tokens` as output[at], output[at+1], ..."""
        self.pending.append((name, list(tokens), at, 0))

    def see_output(self, out: list[int]):
        """Judge each hindsight proposal's drafts as far as the output now
        decides them: draft j as soon as output[at + j - 1] is known (not once
        the whole proposal is), so that in plain steps, one token at a time,
        a five-token copy teaches draft 1 at once instead of five steps on.
        A proposal is done at its first miss or its last draft."""
        still = []
        for name, toks, at, judged in self.pending:
            known, s, hit = out[at:at + len(toks)], self.source(name), True
            while hit and judged < len(known):
                hit = known[judged] == toks[judged]
                judged += 1
                s.a(judged)                          # draft `judged` has a rate (its prior at first)
                s.rates[judged - 1].add(hit)
            if hit and judged < len(toks):
                still.append((name, toks, at, judged))
        self.pending = still

    def record_draft_time(self, name: str, extra_drafts: int, seconds: float, lead: float | None = None,
                          passes: int = 1):
        s = self.source(name)
        if extra_drafts > 0:
            per = seconds / extra_drafts
            s.d = per if s.d is None else 0.8 * s.d + 0.2 * per
        if lead is not None:
            per = lead / max(1, passes)
            s.d0 = per if s.d0 is None else 0.8 * s.d0 + 0.2 * per

    # --- the model -----------------------------------------------------------------
    @property
    def rho(self) -> float:
        t1 = self.t.get(1)
        fits = [(self.t[n] / t1 - 1.0) / (n - 1) for n in self.t if n > 1] if t1 else []
        return max(0.0, sum(fits) / len(fits)) if fits else 0.5

    def cost_rows(self, n: int) -> float:
        """T(n) / T(1)."""
        t1 = self.t.get(1)
        if t1 and n in self.t:
            return self.t[n] / t1
        return 1.0 + (n - 1) * self.rho

    def expected(self, rates: list[float]) -> float:
        e, run = 1.0, 1.0
        for a in rates:
            run *= a
            e += run
        return e

    def _terms(self, name: str, k: int, written: bool, passes: int) -> tuple[float, float]:
        """(E(k), cost(k)); ``written``: the drafts exist, only the verify counts."""
        s = self.source(name)
        t1 = self.t.get(1)
        write = 0.0 if written or not t1 else (passes * (s.d0 or 0.0) + (k - 1) * (s.d or 0.0)) / t1
        return self.expected([s.a(j) for j in range(1, k + 1)]), self.cost_rows(k + 1) + write

    def value(self, name: str, k: int, written: bool = False, passes: int = 1) -> float:
        """E(k) / cost(k); the first draft takes ``passes`` passes of the source."""
        if k == 0:
            return 1.0
        e, cost = self._terms(name, k, written, passes)
        return e / cost

    def best(self, name: str, k_max: int, passes: int = 1) -> tuple[int, float]:
        best_k, best_v = 0, 1.0
        for k in range(1, k_max + 1):
            v = self.value(name, k, passes=passes)
            if v > best_v:
                best_k, best_v = k, v
        return best_k, best_v

    # --- decisions ----------------------------------------------------------------
    def plan(self, name: str, k_max: int | None = None, passes: int = 1) -> int:
        """Drafts to ask the source for (0: a plain step); its first draft
        would take ``passes`` passes (0: a free source, such as lookup, which
        may draft once T(1) has one sample)."""
        k_max = min(self.k_max, k_max if k_max is not None else self.k_max)
        if not self.enabled:
            return k_max
        if self.since_plain >= FORCE_PLAIN_AFTER or len(self.samples.get(1, ())) < (T1_SAMPLES if passes else 1):
            self.forced_plain += 1
            return 0
        self.picks += 1
        s = self.source(name)
        s.since_probe += 1
        k, _ = self.best(name, k_max, passes)
        if k < k_max and s.since_probe >= PROBE_EVERY:
            e, cost = self._terms(name, k + 1, False, passes)
            if s.since_probe >= (cost - e) / PROBE_BUDGET:
                s.since_probe = 0
                self.probes += 1
                return k + 1
        if k == 0:
            self.declined += 1
        return k

    def pick_p(self, name: str, probs: list[float]) -> int:
        """How many of these written drafts to verify, from their probabilities."""
        if not self.enabled or not probs:
            return len(probs)
        s = self.source(name)
        best_k, best_v, run, e = 0, 1.0, 1.0, 1.0
        for k, p in enumerate(probs, 1):
            run *= s.bins[_bin(p)].p
            e += run
            v = e / self.cost_rows(k + 1)
            if v > best_v:
                best_k, best_v = k, v
        return best_k

    def deeper_p(self, name: str, n: int, probs: list[float]) -> bool:
        """Write draft n+1? Only if no shorter verify beats n drafts and n+1
        drafts (the new one as likely as the best bin) beat a plain step and n."""
        if not self.enabled:
            return True
        if n >= self.k_max:
            return False
        s = self.source(name)
        rates = [s.bins[_bin(p)].p for p in probs]
        v = [1.0] + [self.expected(rates[:k]) / self.cost_rows(k + 1) for k in range(1, n + 1)]
        if max(v[:-1]) > v[n]:
            return False
        top = max(b.p for b in s.bins)
        v_next = self.expected(rates + [top]) / self.cost_rows(n + 2)
        return v_next > 1.0 and v_next > v[n]

    def summary(self) -> str:
        t1 = self.t.get(1)
        costs = " ".join(f"{n}:{self.cost_rows(n):.2f}" for n in sorted(self.t))
        acc = "; ".join(f"{n} " + " ".join(f"{r.p:.2f}" for r in s.rates) for n, s in self.stats.items())
        return (f"T(1) {t1 * 1e3:.2f} ms | cost/T(1) {costs} | rho {self.rho:.2f} | acceptance {acc}"
                if t1 else "T(1) not measured")
