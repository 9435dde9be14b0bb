"""The history-dependent sampling controls (logit bias, repetition, presence
and frequency penalties, min-p) on their own, and under speculation: every
run with drafts equals the run without, token for token, on both backends."""

import numpy as np
import pytest

from vkspec.loader import load_model
from vkspec.sampling import Sampler
from vkspec.speculative import SpecConfig, generate, generate_spec
from vkspec.speculative.round import Cancelled
from vkspec.speculative.sources import build
from vkspec.tiny import make_tiny

N = 24
REPEAT = [40, 41, 42, 43, 44, 45, 46, 47] * 4
BIAS = dict(logit_bias={44: 3.0})        # makes the tiny model repeat 44: the penalties have work
# (echo model?, controls that are a base, the control under test)
CONTROLS = [
    (False, {}, BIAS),
    (False, BIAS, dict(frequency_penalty=0.4)),
    (False, BIAS, dict(presence_penalty=1.0)),
    (False, BIAS, dict(repetition_penalty=1.5)),
    (False, dict(temperature=0.9, seed=5, logit_bias={44: 2.0}), dict(presence_penalty=0.5, min_p=0.05, top_k=40)),
    (False, dict(temperature=0.7, seed=2), dict(frequency_penalty=-0.5, repetition_penalty=0.8)),
    (True, {}, dict(repetition_penalty=3.0)),     # the echo model's cycle, which lookup drafts, is broken
]


def row(*values):
    return np.array(values, np.float32)


def test_presence_and_frequency_follow_the_output_counts():
    s = Sampler(presence_penalty=0.5, frequency_penalty=0.3)
    logits = row(0.0, 2.0, 1.5)
    picks = [s.pick(logits) for _ in range(4)]
    # 1: 2.0; then 1 has 2.0-0.8=1.2 < 1.5 -> 2; then 1.2 vs 1.5-0.8=0.7 -> 1;
    # then 1 has 2.0-0.5-0.6=0.9 vs 0.7 -> 1
    assert picks == [1, 2, 1, 1]


def test_repetition_penalty_covers_the_prompt_and_divides_or_multiplies():
    s = Sampler(repetition_penalty=2.0, prompt=(0, 3))
    assert s.pick(row(3.0, 2.0, -5.0, -1.0)) == 1           # 3.0 / 2 = 1.5 < 2.0
    s = Sampler(repetition_penalty=2.0, prompt=(3,))
    assert s.pick(row(-9.0, -9.0, -1.5, -1.0)) == 2         # -1.0 * 2 = -2.0 < -1.5


def test_logit_bias_moves_the_greedy_pick():
    logits = row(1.0, 0.5, 0.2)
    assert Sampler().pick(logits) == 0
    assert Sampler(logit_bias={2: 1.0}).pick(logits) == 2
    assert Sampler(logit_bias={0: -100.0}).pick(logits) == 1


def test_min_p_one_keeps_only_the_most_likely_token():
    logits = row(0.3, 0.2, 0.25, 0.1)
    assert {Sampler(temperature=1.0, seed=s, min_p=1.0).pick(logits) for s in range(50)} == {0}
    assert len({Sampler(temperature=1.0, seed=s).pick(logits) for s in range(50)}) > 1


def test_a_restored_state_forgets_the_picks_after_it():
    s = Sampler(presence_penalty=2.0)
    logits = row(0.0, 2.0, 1.5)
    st = s.state()
    s.pick(logits)
    s.set_state(st)
    assert s.out == [] and not s.counts and s.pick(logits) == 1


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def models(request, tmp_path_factory):
    """echo? -> model: the tiny model (close logits) and the echo one (cycles)."""
    if request.param == "vulkan":
        request.getfixturevalue("vk")
    root = tmp_path_factory.mktemp("models")
    out = {echo: load_model(make_tiny(root / f"echo{echo:d}", seed=4, mtp=True, echo=echo),
                            backend=request.param) for echo in (False, True)}
    out["dir"] = root / "echo0"
    return out


def sampler(prompt, controls):
    return Sampler(prompt=tuple(prompt), **controls)


@pytest.mark.parametrize("echo,base,control", CONTROLS, ids=str)
@pytest.mark.parametrize("spec,forced", [("lookup", "mixed"), ("mtp", "reject"), ("auto", None)])
def test_drafts_change_nothing_under_the_controls(models, echo, base, control, spec, forced):
    model, controls = models[echo], {**base, **control}
    ref = generate(model, REPEAT, N, sampler(REPEAT, controls))
    assert ref.tokens != generate(model, REPEAT, N, sampler(REPEAT, base)).tokens, "the control did nothing"
    cfg = SpecConfig(spec_mode=spec, spec_draft_max=4, spec_gate=False).check()
    sources, gate = build(model, cfg, forced=forced, reference=ref.tokens)
    got = generate_spec(model, REPEAT, N, sampler(REPEAT, controls), sources, gate,
                        snapshots=cfg.spec_mtp_recurrent_snapshots)
    assert got.tokens == ref.tokens
    assert got.digest == ref.digest
    if forced is None:
        assert got.counters.drafted > 0


def test_a_cancelled_round_leaves_the_sampler_of_the_commit(models):
    model = models[False]
    controls = dict(temperature=0.8, seed=3, presence_penalty=1.0, repetition_penalty=1.2)
    ref = generate(model, REPEAT, N, sampler(REPEAT, controls))
    cfg = SpecConfig(spec_mode="mtp", spec_draft_max=3, spec_gate=False).check()
    sources, gate = build(model, cfg, forced="accept", reference=ref.tokens)
    s = sampler(REPEAT, controls)
    with pytest.raises(Cancelled) as e:
        generate_spec(model, REPEAT, N, s, sources, gate, cancel=lambda emitted: emitted == 7)
    assert s.out == e.value.tokens and sum(s.counts.values()) == len(s.out)


POINT = {"type": "object", "additionalProperties": False, "required": ["x", "tag"],
         "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"type": "string",
                                                                                       "maxLength": 6}}}


@pytest.mark.parametrize("spec,forced", [("lookup", "mixed"), ("lookup", "reject"), ("mtp", "mixed"),
                                         ("mtp", "accept"), ("auto", None)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_mask_on_every_verify_row_leaves_the_output_of_plain_decoding(models, spec, forced, temperature):
    """A JSON-schema constraint (llguidance): forced drafts that break the
    grammar are rejected at their row, and the answer is the plain one."""
    import json

    from vkspec.serve.constraint import Grammars
    from vkspec.tokenizer import load_tokenizer
    model = models[False]
    eos = set(model.cfg.eos_token_id)
    grammars = Grammars(load_tokenizer(models["dir"]), model.cfg.vocab_size, eos)
    make = grammars.json_schema(POINT, "schema")

    def run(sources=(), gate=None):
        s = Sampler(temperature=temperature, seed=9, prompt=tuple(REPEAT), constraint=make())
        return generate_spec(model, REPEAT, 120, s, sources, gate, stop=eos,
                             on_token=lambda tok, row: s.finished), s

    ref, s = run()
    text = load_tokenizer(models["dir"]).decode(ref.tokens)
    assert s.finished and set(json.loads(text)) == {"x", "tag"}
    cfg = SpecConfig(spec_mode=spec, spec_draft_max=4, spec_gate=False).check()
    got, _ = run(*build(model, cfg, forced=forced, reference=ref.tokens))
    assert got.tokens == ref.tokens and got.digest == ref.digest
    assert got.counters.drafted > 0
