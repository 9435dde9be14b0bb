"""The speculative harness: every run with drafts against the same run without
drafts, tokens and final logits byte for byte, on both backends; forwards,
drafts and accepted drafts against a simulator of the loop."""

import numpy as np
import pytest

from vkspec.speculative import generate
from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate_spec
from vkspec.speculative.round import Cancelled
from vkspec.speculative.forced import wrong_rows
from vkspec.speculative.sources import build
from vkspec.tiny import make_tiny

N = 24
PROMPT = [5, 9, 14, 200, 33, 7, 61, 5, 9, 14, 200, 33]
# a tiny model's greedy output tends to cycle; this prompt repeats itself
REPEAT = [40, 41, 42, 43, 44, 45, 46, 47] * 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=4, mtp=True)


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory):
    """Greedy output walks 8-token cycles: natural drafts get accepted."""
    return make_tiny(tmp_path_factory.mktemp("echo"), seed=4, mtp=True, echo=True)


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def models(request, tiny_dir, echo_dir):
    """backend -> {(fmt, echo): model}; built once (device pipelines are slow to make)."""
    if request.param == "vulkan":
        request.getfixturevalue("vk")
    cache = {}

    def get(fmt="f32", echo=False):
        if (fmt, echo) not in cache:
            cache[fmt, echo] = load_model(echo_dir if echo else tiny_dir, fmt=fmt, backend=request.param)
        return cache[fmt, echo]
    return get


def simulate(mode, k_max, snapshots, n, ref_len):
    """What the loop must do with forced drafts and the gate off:
    (forwards, drafted, accepted, replays)."""
    m, cap, v = 1, k_max, 0
    forwards = drafted = accepted = replays = 0
    while m < n:
        k = min(cap, n - m - 1, ref_len - m)
        forwards += 1
        if k <= 0:
            m += 1
            continue
        wrong = [j for j in wrong_rows(mode, v, k) if j < k]
        v += 1
        i = min(wrong) if wrong else k
        drafted += k
        accepted += i
        if i < k and i >= snapshots:
            forwards += 1
            replays += 1
            cap = min(cap, snapshots)
        m += i + 1
    return forwards, drafted, accepted, replays


def run_pair(model, prompt, spec, forced=None, n=N, sampling=None):
    sampling = sampling or {}
    ref = generate(model, prompt, n, Sampler(**sampling))
    cfg = SpecConfig(**spec).check()
    sources, gate = build(model, cfg, forced=forced, reference=ref.tokens)
    got = generate_spec(model, prompt, n, Sampler(**sampling), sources, gate,
                        snapshots=cfg.spec_mtp_recurrent_snapshots)
    assert got.tokens == ref.tokens
    assert got.digest == ref.digest          # the last logits row, byte for byte
    if forced:
        c = got.counters
        want = simulate(forced, min(cfg.spec_draft_max, model.max_rows - 1),
                        cfg.spec_mtp_recurrent_snapshots, n, len(ref.tokens))
        assert (c.forwards, c.drafted, c.accepted, c.replays) == want
    return ref, got


FORCED = ["accept", "reject", "mixed", "cycle", "row1", "row2"]


@pytest.mark.parametrize("depth,mode", [(d, m) for d in (1, 2, 3, 7) for m in FORCED
                                        if not (m == "row2" and d < 2)])
def test_mtp_forced(models, depth, mode):
    run_pair(models(), PROMPT, dict(spec_mode="mtp", spec_draft_max=depth, spec_gate=False), mode)


@pytest.mark.parametrize("drafts", [5, 2])
@pytest.mark.parametrize("mode", ["accept", "reject", "mixed", "cycle"])
def test_lookup_forced(models, drafts, mode):
    run_pair(models(), REPEAT, dict(spec_mode="lookup", spec_draft_max=drafts, spec_gate=False), mode)


@pytest.mark.parametrize("gate", [False, True])
def test_lookup_natural_on_a_repeating_prompt(models, gate):
    ref, got = run_pair(models(echo=True), REPEAT, dict(spec_mode="lookup", spec_gate=gate), n=40)
    assert got.counters.accepted > 0 and got.forwards < ref.forwards


@pytest.mark.parametrize("forced", [None, "mixed"])
def test_mtp_and_lookup_together(models, forced):
    ref, got = run_pair(models(echo=forced is None), REPEAT,
                        dict(spec_mode="auto", spec_draft_max=3, spec_gate=False), forced)
    assert got.counters.accepted > 0


@pytest.mark.parametrize("echo", [False, True])
def test_gate_picks_its_own_depth(models, echo):
    ref, got = run_pair(models(echo=echo), PROMPT, dict(spec_mode="auto", spec_gate=True), n=48)
    if echo:
        assert got.forwards < ref.forwards


@pytest.mark.parametrize("snapshots,replays", [(6, 1), (7, 0)])
def test_snapshots_guard(models, snapshots, replays):
    """K7/S6: a rejection at draft 7 has no copy slot: exactly one exact replay,
    then the request is clamped to 6 drafts. K7/S7: no replay."""
    _, got = run_pair(models(), PROMPT, dict(spec_mode="mtp", spec_draft_max=7, spec_gate=False,
                                             spec_mtp_recurrent_snapshots=snapshots), "row7", n=40)
    assert got.counters.replays == replays


@pytest.mark.parametrize("fmt", ["int8", "int4-g64"])
@pytest.mark.parametrize("mode", ["mixed", "cycle"])
def test_quantised_weights(models, fmt, mode):
    run_pair(models(fmt), PROMPT, dict(spec_mode="mtp", spec_draft_max=3, spec_gate=False), mode)


@pytest.mark.parametrize("spec,forced", [(dict(spec_mode="mtp", spec_draft_max=3, spec_gate=False), "mixed"),
                                         (dict(spec_mode="lookup", spec_gate=False), None)])
def test_seeded_sampling(models, spec, forced):
    run_pair(models(echo=forced is None), REPEAT, spec, forced, n=32,
             sampling=dict(temperature=0.8, seed=11))


def test_vulkan_spec_equals_cpu_plain(tiny_dir, vk):
    cpu = load_model(tiny_dir)
    dev = load_model(tiny_dir, backend="vulkan")
    ref = generate(cpu, PROMPT, N)
    sources, gate = build(dev, SpecConfig(spec_mode="mtp", spec_draft_max=3, spec_gate=False),
                          forced="cycle", reference=ref.tokens)
    got = generate_spec(dev, PROMPT, N, Sampler(), sources, gate)
    assert got.tokens == ref.tokens and got.digest == ref.digest


def state_bytes(model, st):
    s = model.read_state(st) if hasattr(model, "read_state") else st
    parts = [np.asarray(a)[:s.kv_len].tobytes() for a in s.kv_k + s.kv_v]
    return b"".join(parts + [a.tobytes() for a in s.conv + s.ssm]), s.kv_len


@pytest.mark.parametrize("at", [6, 7])
def test_cancel_mid_round_restores_the_last_commit(models, at):
    """Cancel before the pick that would make `at` tokens: the round in flight
    is undone (model rows, sampler draws, draft sources, output)."""
    model = models()
    sampling = dict(temperature=0.8, seed=3)
    ref = generate(model, PROMPT, N, Sampler(**sampling))
    sources, gate = build(model, SpecConfig(spec_mode="mtp", spec_draft_max=3, spec_gate=False),
                          forced="accept", reference=ref.tokens)
    sampler = Sampler(**sampling)
    st = model.new_state()
    with pytest.raises(Cancelled) as e:
        generate_spec(model, PROMPT, N, sampler, sources, gate, state=st,
                      cancel=lambda emitted: emitted == at)
    committed = e.value.tokens
    assert committed == ref.tokens[:len(committed)] and len(committed) < at   # mid-round
    assert sampler.draws == len(committed)
    got = state_bytes(model, st)
    plain = model.new_state()
    fed = PROMPT + committed[:-1]
    for i in range(0, len(fed), model.max_rows):
        model.forward(fed[i:i + model.max_rows], plain)
    assert got == state_bytes(model, plain)
