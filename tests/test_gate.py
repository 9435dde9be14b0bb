"""The gate's formulas and decisions, the draft sources' rules, the settings."""

import types

import numpy as np
import pytest

from vkspec.errors import VkspecError
from vkspec.sampling import Sampler
from vkspec.speculative.config import SpecConfig
from vkspec.speculative import round as spec_round
from vkspec.speculative.decode import generate_spec
from vkspec.speculative.round import choose
from vkspec.speculative.gate import FORCE_PLAIN_AFTER, PROBE_EVERY, T1_SAMPLES, Gate, Rate
from vkspec.speculative.lookup import PromptLookup
from vkspec.speculative.source import Proposal


def plain_steps(g, seconds):
    """The plain steps the gate takes before it drafts, each `seconds` long."""
    for _ in range(T1_SAMPLES):
        g.record_forward(1, seconds)


def test_the_gate_drafts_only_after_timing_its_plain_steps():
    g = Gate(7)
    for i in range(T1_SAMPLES):
        assert g.plan("mtp") == 0 and g.forced_plain == i + 1
        g.record_forward(1, 0.010 * (3 if i == 0 else 1))   # the first step after a prefill: slow
    assert g.t[1] == pytest.approx(0.010)                  # the low quartile shrugs it off
    assert g.plan("mtp") > 0
    free = Gate(7)                                         # a free source risks less: one sample
    assert free.plan("lookup", passes=0) == 0
    free.record_forward(1, 0.010)
    free.source("lookup").rates = [Rate(0.9 * 16, 16)]
    assert free.plan("lookup", passes=0) > 0


def test_priors_expected_tokens_and_unmeasured_cost():
    g = Gate(7)
    s = g.source("mtp")
    assert [round(s.a(j), 6) for j in (1, 2, 3, 4)] == [0.8, 0.6, 0.5, 0.5]
    assert g.source("lookup").a(1) == 0.5
    assert g.source("lookup/copy").a(1) == 0.9                # a copy in progress
    assert g.expected([0.8, 0.6, 0.5]) == pytest.approx(1 + 0.8 + 0.48 + 0.24)
    assert g.rho == 0.5                                   # nothing measured
    assert g.cost_rows(4) == pytest.approx(1 + 3 * 0.5)
    assert g.value("mtp", 2) == pytest.approx((1 + 0.8 + 0.48) / 2.0)    # T(3)/T(1) = 1 + 2 rho
    assert g.value("mtp", 0) == 1.0


def test_rho_is_fitted_and_measured_rows_cost_what_they_cost():
    g = Gate(7)
    plain_steps(g, 0.010)
    g.record_forward(3, 0.014)                            # 1.4 = 1 + 2 rho -> rho 0.2
    g.record_forward(5, 0.018)                            # 1.8 = 1 + 4 rho -> rho 0.2
    assert g.rho == pytest.approx(0.2)
    assert g.cost_rows(3) == pytest.approx(1.4)
    assert g.cost_rows(7) == pytest.approx(1 + 6 * 0.2)   # unmeasured: T(1)(1 + (n-1) rho)
    g.record_draft_time("mtp", 2, 0.004)                  # d = 2 ms per extra draft
    e = 1 + 0.8 + 0.48
    assert g.value("mtp", 2) == pytest.approx(e / (1.4 + 1 * 0.2))    # (T(3) + d) / T(1)
    g.record_draft_time("mtp", 0, 0.0, lead=0.005)        # d0 = 5 ms to the first draft
    assert g.value("mtp", 2) == pytest.approx(e / (1.4 + 0.5 + 0.2))  # (T(3) + d0 + d) / T(1)
    assert g.value("mtp", 2, written=True) == pytest.approx(e / 1.4)  # written drafts: the verify only


def test_a_source_whose_first_draft_costs_a_step_is_declined():
    """An MTP head pass as dear as half a plain step (Lavapipe) makes one
    draft at 0.6 lose to a plain step, though the verify row alone pays."""
    g = Gate(7)
    plain_steps(g, 0.010)
    g.record_forward(2, 0.013)
    g.source("mtp").rates = [Rate(0.6 * 16, 16)]
    assert g.value("mtp", 1) > 1.0
    g.record_draft_time("mtp", 0, 0.0, lead=0.005)
    assert g.value("mtp", 1) < 1.0 and g.best("mtp", 1)[0] == 0


def test_rows_piled_up_by_declines_price_the_next_draft_by_its_passes():
    """d0 is measured per head pass; after a run of declines the head has
    more rows to read before draft 1, and the gate prices those passes."""
    g = Gate(7)
    plain_steps(g, 0.010)
    g.record_forward(2, 0.012)
    g.source("mtp").rates = [Rate(0.8 * 16, 16)]
    g.record_draft_time("mtp", 0, 0.0, lead=0.006, passes=2)      # 3 ms a pass
    assert g.source("mtp").d0 == pytest.approx(0.003)
    assert g.value("mtp", 1, passes=1) == pytest.approx(1.8 / (1.2 + 0.3))
    assert g.value("mtp", 1, passes=3) == pytest.approx(1.8 / (1.2 + 0.9))
    assert g.plan("mtp", 1, passes=1) == 1 and g.plan("mtp", 1, passes=3) == 0


def test_a_dear_probe_is_rarer():
    """A probe expected to lose 1.5 plain steps waits 1.5 / PROBE_BUDGET = 48
    picks of its source; a cheap one (test below) every PROBE_EVERY."""
    g = Gate(7)
    plain_steps(g, 0.010)
    g.record_forward(2, 0.020)
    g.source("mtp").rates = [Rate(0.5 * 16, 16)]
    g.record_draft_time("mtp", 0, 0.0, lead=0.010)                # cost(1) = 2 + 1, E(1) = 1.5
    picks = [g.plan("mtp", 1) for _ in range(100)]
    assert [i + 1 for i, k in enumerate(picks) if k] == [48, 96] and g.probes == 2


def test_acceptance_runs_with_a_memory_of_16_verifies():
    g = Gate(7)
    for _ in range(40):
        g.record_verify("lookup", 1, 0)
    assert g.source("lookup").a(1) < 0.02
    for _ in range(16):
        g.record_verify("lookup", 1, 1)
    assert 0.6 < g.source("lookup").a(1) < 0.7             # old evidence fades, ~1 - 1/e
    g.record_verify("mtp", 3, 1)                           # draft 1 taken, 2 judged and refused, 3 unjudged
    s = g.source("mtp")
    assert s.rates[0].trials == 3 and s.rates[1].trials == 3 and len(s.rates) == 2


def test_plan_declines_when_no_depth_beats_a_plain_step_and_probes_every_16():
    g = Gate(7)
    plain_steps(g, 0.01)
    for n in range(2, 9):
        g.record_forward(n, 0.01 * n)                      # every row costs a full step
    picks = [g.plan("lookup") for _ in range(2 * PROBE_EVERY)]
    assert picks.count(0) == 2 * PROBE_EVERY - 2 and g.declined == 2 * PROBE_EVERY - 2
    assert picks[PROBE_EVERY - 1] == 1 and picks[2 * PROBE_EVERY - 1] == 1 and g.probes == 2


def test_plan_picks_the_depth_maximising_value():
    g = Gate(7)
    plain_steps(g, 0.010)
    for n in range(2, 9):
        g.record_forward(n, 0.010 * (1 + 0.1 * (n - 1)))   # cheap rows
    for _ in range(30):
        g.record_verify("mtp", 7, 7)                        # everything accepted
    k, v = g.best("mtp", 7)
    assert k == 7 and v == pytest.approx(g.value("mtp", 7))
    assert g.plan("mtp", 3) == 3                            # the caller's cap


def test_a_plain_step_is_forced_after_64_forwards_without_one():
    g = Gate(3, enabled=True)
    plain_steps(g, 0.01)
    for _ in range(FORCE_PLAIN_AFTER):
        g.record_forward(3, 0.011)
    assert g.plan("mtp") == 0 and g.forced_plain == 1
    plain_steps(g, 0.01)
    assert g.plan("mtp") > 0


def test_gate_off_drafts_every_proposal_in_full():
    g = Gate(5, enabled=False)
    assert g.plan("lookup") == 5 and g.plan("lookup", 2) == 2
    assert g.pick_p("mtp", [0.01, 0.01]) == 2 and g.deeper_p("mtp", 1, [0.01])


def test_confidence_bins():
    g = Gate(7)
    plain_steps(g, 0.01)
    for n in range(2, 9):
        g.record_forward(n, 0.01 * (1 + 0.2 * (n - 1)))
    s = g.source("mtp")
    assert [round(b.p, 2) for b in s.bins] == [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
    assert g.pick_p("mtp", [0.97, 0.96, 0.05]) == 2        # sure drafts stay, the doubtful one goes
    assert g.pick_p("mtp", [0.02]) == 0                     # not worth its verify row
    assert g.deeper_p("mtp", 1, [0.97])                     # a sure step goes deeper
    assert not g.deeper_p("mtp", 2, [0.97, 0.03])           # a shorter verify is worth more
    for _ in range(20):
        g.record_verify("mtp", 1, 0, probs=[0.97])          # that bin learns it is wrong
    assert s.bins[9].p < 0.2 and g.pick_p("mtp", [0.97]) == 0


def test_choose_takes_the_higher_value_then_the_longer():
    g = Gate(7)
    a, b = Proposal("lookup", [1, 2]), Proposal("mtp", [3, 4])
    assert choose([a, b], g) is b                          # MTP's priors are higher
    for _ in range(30):
        g.record_verify("lookup", 2, 2)
    assert choose([a, b], g) is a
    assert choose([Proposal("x", [1]), Proposal("y", [1, 2])], None).source == "y"


def test_prompt_lookup_longest_suffix_at_its_most_recent_occurrence():
    lk = PromptLookup(5)
    prop = lk.propose([5, 6, 7, 1, 2, 3, 4, 0, 1, 2, 3, 4, 9, 9, 1, 2], 3, 0, 5)
    assert prop.tokens == [4, 9, 9, 1, 2]                  # most recent [1, 2, 3] (4-gram [x,1,2,3] absent)
    prop = lk.propose([7, 1, 2, 3, 8, 8, 7, 1, 2], 3, 0, 5)
    assert prop.tokens == [8, 8, 7, 1, 2]                  # the 4-gram [7, 1, 2, 3]
    assert lk.propose([1, 2, 3], 4, 0, 5) is None          # no earlier occurrence
    assert lk.propose([1, 2, 9, 1], 2, 0, 2).tokens == [9, 1]
    assert PromptLookup(9).max_drafts == 7


def test_a_copy_in_progress_drafts_deep_from_its_first_round():
    """On the CPU's verify cost (T(n)/T(1) of SmolLM2 on a Zen 3), a copy in
    progress drafts 3 or more on its prior alone, a fresh match 1: from the
    fresh match's 0.5 the first copy rounds of an output drafted 0 to 4."""
    g = Gate(7)
    for n, c in enumerate((1.00, 1.22, 1.68, 1.81, 2.16, 2.52, 2.82, 3.07), 1):
        g.record_forward(n, 0.01 * c)
    assert g.plan("lookup", passes=0) == 1
    assert g.plan("lookup/copy", passes=0) >= 3
    g.source("lookup/copy").rates = [Rate(0.97 * 16, 16) for _ in range(7)]   # as the code edit's copies go
    assert g.plan("lookup/copy", passes=0) == 7


def test_prompt_lookup_tells_a_copy_in_progress_from_a_fresh_match():
    lk = PromptLookup(5)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    first = lk.propose(text + [0, 1], 2, 0, 5)              # copies text[2:] at offset 9
    assert (first.tokens, first.kind, first.key) == ([3, 4, 5, 6, 7], "", "lookup")
    on = lk.propose(text + [0, 1, 2, 3, 4], 5, 0, 5)       # the output followed it: same offset
    assert (on.tokens, on.kind, on.key) == ([6, 7, 8, 9, 0], "copy", "lookup/copy")
    ck = lk.checkpoint()
    off = lk.propose(text + [0, 1, 2, 3, 4, 5, 9, 9, 1, 2], 3, 0, 5)   # left it, matched again later
    assert off.kind == "" and lk.offset != ck
    lk.restore(ck)                                          # a cancelled round puts it back
    assert lk.offset == ck
    lk.begin(None, None, [])
    assert lk.propose(text + [0, 1, 2, 3, 4], 5, 0, 5).kind == ""      # a new output starts fresh


def test_settings_from_toml_and_flags(tmp_path):
    f = tmp_path / "spec.toml"
    f.write_text('[spec]\nspec_mode = "mtp"\nspec_draft_max = 3\nspec_mtp_recurrent_snapshots = 2\n'
                 'spec_mtp_fr_vocab_size = 100\n')
    c = SpecConfig.load(f)
    assert (c.spec_mode, c.spec_draft_max, c.spec_mtp_recurrent_snapshots, c.spec_mtp_fr_vocab_size) == \
        ("mtp", 3, 2, 100)
    assert SpecConfig.load(f, spec_draft_max=5).spec_draft_max == 5      # flags win
    f.write_text("spec_mode = 'lookup'\nspec_drafts = 3\n")
    with pytest.raises(VkspecError, match="unknown key 'spec_drafts'"):
        SpecConfig.load(f)
    f.write_text("spec_draft_max = 9\n")
    with pytest.raises(VkspecError, match=r"spec_draft_max = 9 is out of range \(1..7\)"):
        SpecConfig.load(f)
    f.write_text("spec_mode = [\n")
    with pytest.raises(VkspecError, match="not valid TOML"):
        SpecConfig.load(f)
    for mode in ("draft-model", "dflash", "dspark"):
        with pytest.raises(VkspecError, match="never substitutes"):
            SpecConfig(spec_mode=mode).check()


def test_hindsight_judges_whole_lookup_proposals_once_the_output_decides():
    g = Gate(7)
    out = [1, 2, 3]
    g.judge_later("lookup", [4, 5, 6, 7], at=3)        # a declined or trimmed proposal
    g.judge_later("lookup", [9, 9], at=3)
    g.see_output(out)
    assert len(g.pending) == 2                          # nothing after 3 is known yet
    out += [4, 5]
    g.see_output(out)                                   # [9, 9] misses at once; [4..7] still open
    assert [p[1] for p in g.pending] == [[4, 5, 6, 7]]
    rates = g.source("lookup").rates                    # ...with its drafts 1 and 2 judged already
    assert [r.p for r in rates[:2]] == pytest.approx([2 / 4, 2 / 3])
    out += [6, 8]
    g.see_output(out)                                   # 4, 5, 6 stood, 7 did not
    assert g.pending == []
    rates = g.source("lookup").rates
    # draft 1 judged twice (hit, miss), 2 and 3 once (hits), 4 once (miss), from the prior 1/2
    assert [r.p for r in rates[:4]] == pytest.approx([0.5, 2 / 3, 2 / 3, 1 / 3])
    g.judge_later("lookup", [1, 2], at=len(out))        # the output ends before it is known
    g.begin()                                           # the next turn's output is another one
    assert g.pending == []


class Echo:
    """A stand-in model: the next token is (last + 1) % 4. Each forward of a
    row count it has not seen before counts as recording a device shape.
    Time is its own clock: a forward of n rows takes 10 ms (1 + 0.2 (n - 1)),
    so the gate's decisions do not hang on a loaded machine's wall clock."""
    max_rows, cfg = 8, None

    def __init__(self):
        self.recordings, self.seen, self.calls, self.now = 0, set(), [], 0.0

    def perf_counter(self):
        return self.now

    def new_state(self):
        return types.SimpleNamespace(kv_len=0)

    def forward(self, rows, st, logits_rows="all", copies=0):
        new = len(rows) not in self.seen
        self.seen.add(len(rows))
        self.recordings += new
        self.calls.append(new)
        self.now += 0.010 * (1 + 0.2 * (len(rows) - 1))
        st.kv_len += len(rows)
        logits = np.zeros((len(rows), 4), np.float32)
        logits[np.arange(len(rows)), (np.asarray(rows) + 1) % 4] = 1.0
        return None, logits if logits_rows == "all" else logits[-1:]

    def rewind(self, st, keep):
        pass


@pytest.fixture
def echo(monkeypatch):
    m = Echo()
    monkeypatch.setattr(spec_round, "time", types.SimpleNamespace(perf_counter=m.perf_counter))
    return m


def test_hindsight_lets_lookup_learn_while_it_does_not_draft(echo):
    """The first rounds are plain steps until T(1) has a sample (lookup, a
    free source, needs only one; Echo's first one-row forward records its
    shape, so two). Their proposals are judged draft by draft as the output
    comes, so the next round already drafts: with T(n) unmeasured (rho 0.5)
    and the 0.5 prior value(1) = 1 would decline, a hit makes it pay."""
    g = Gate(7)
    r = generate_spec(echo, [0, 1, 2, 3, 0, 1], 12, Sampler(), [PromptLookup(5)], g)
    assert r.tokens == [2, 3, 0, 1] * 3
    assert (g.forced_plain, g.declined) == (2, 0)
    assert r.counters.accepted == r.counters.drafted > 0 and r.forwards < 12
    assert g.source("lookup/copy").rates[0].p > 0.8       # a copy in progress: its own rates


def test_a_forward_that_records_a_shape_is_not_a_measurement(echo):
    """A device forward of a new row count records its sequence (on Lavapipe
    ~0.15 s, fifteen steps); that time must not become T(n)."""
    m, g = echo, Gate(7)
    shown = []
    record = g.record_forward
    g.record_forward = lambda rows, seconds: (shown.append(rows), record(rows, seconds))
    r = generate_spec(m, [0, 1, 2, 3, 0, 1], 24, Sampler(), [PromptLookup(5)], g)
    decoding = m.calls[1:]                              # after the prompt's one forward
    assert r.tokens == [2, 3, 0, 1] * 6 and len(decoding) == r.forwards and any(decoding)
    assert len(shown) == decoding.count(False)          # the recording forwards skipped


class FirstSlow(Echo):
    """Echo whose shapes are all recorded ahead (no recording counts), but the
    first dispatch of each row count takes 25 steps: Lavapipe's first 2-row
    forward after a fresh start, which taught the gate T(2)/T(1) = 25."""

    def forward(self, rows, st, logits_rows="all", copies=0):
        first = len(rows) not in self.seen
        out = super().forward(rows, st, logits_rows, copies)
        self.recordings = 0
        self.now += 0.25 * first
        return out


def test_a_first_dispatch_is_not_a_measurement(monkeypatch):
    m = FirstSlow()
    monkeypatch.setattr(spec_round, "time", types.SimpleNamespace(perf_counter=m.perf_counter))
    g = Gate(7)
    r = generate_spec(m, [0, 1, 2, 3, 0, 1], 24, Sampler(), [PromptLookup(5)], g)
    assert r.tokens == [2, 3, 0, 1] * 6
    assert g.t[1] == pytest.approx(0.010)                 # not 0.26: the first 1-row dispatch
    assert max(s for samples in g.samples.values() for s in samples) < 0.1
    assert r.counters.drafted > 0 and r.forwards < 12
