"""Sampling controls, n > 1 and include_usage through the official openai
client: each frame with drafts equals the frame without, on both backends.
And the routes around generation: /tokenize, /detokenize, /metrics, the
context length in /v1/models."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import require
from vkspec.tiny import make_tiny

openai = require("openai")
from serve_helpers import plain_and_spec  # noqa: E402

pytestmark = pytest.mark.serve

PROMPT = "def f(x):\n    return x + 1\n" * 3
CONTROLS = dict(temperature=0.9, seed=11, top_p=0.95,
                extra_body=dict(top_k=50, min_p=0.02, repetition_penalty=1.2),
                presence_penalty=0.6, frequency_penalty=0.3, logit_bias={"44": 2.0, "7": -100})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("model") / "tiny", seed=4, mtp=True)


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def servers(request, model_dir, tmp_path_factory):
    """(plain, speculative) servers of one backend on the same model."""
    if request.param == "vulkan":
        request.getfixturevalue("vk")
    logs = tmp_path_factory.mktemp("logs")
    plain, spec = plain_and_spec(model_dir, logs, request.param)
    yield plain, spec
    plain.stop()
    spec.stop()


def frames(server, stream, chat, **kw):
    kw.setdefault("model", "tiny")
    kw.setdefault("max_tokens", 20)
    if chat:
        call, kw = server.client.chat.completions.create, {"messages": [{"role": "user", "content": PROMPT}], **kw}
    else:
        call, kw = server.client.completions.create, {"prompt": PROMPT, **kw}
    if not stream:
        r = call(**kw).model_dump()
        return [r["choices"], r["usage"]]
    return [[c.model_dump()["choices"], c.model_dump().get("usage")] for c in call(stream=True, **kw)]


def texts(fr, chat, stream):
    """index -> the choice's text."""
    out = {}
    for f in fr if stream else [fr]:
        for c in f[0]:
            t = (c["delta"].get("content") if stream else c["message"]["content"]) if chat else c["text"]
            out[c["index"]] = out.get(c["index"], "") + (t or "")
    return out


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_controls_give_the_same_frames_with_drafts(servers, chat, stream):
    got = [frames(s, stream, chat, **CONTROLS) for s in servers]
    assert got[0] == got[1]
    loose = frames(servers[0], stream, chat, temperature=0.9, seed=11, top_p=0.95)
    assert texts(got[0], chat, stream) != texts(loose, chat, stream), "the controls did nothing"


def test_logit_bias_forces_a_token(servers):
    for s in servers:
        r = s.client.completions.create(model="tiny", prompt="x", max_tokens=6, temperature=0,
                                        logit_bias={"300": 100})
        assert r.choices[0].text == s.client.completions.create(
            model="tiny", prompt=[300] * 6, max_tokens=1, temperature=0, logit_bias={"300": 100},
            echo=False).choices[0].text * 6


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_each_with_its_own_seed(servers, stream):
    plain, spec = servers
    kw = dict(temperature=1.0, seed=5, max_tokens=12)
    many = [frames(s, stream, True, n=3, **kw) for s in servers]
    assert many[0] == many[1]
    by_index = texts(many[0], True, stream)
    assert sorted(by_index) == [0, 1, 2] and len(set(by_index.values())) == 3
    assert by_index[0] == texts(frames(plain, stream, True, **kw), True, stream)[0]   # choice 0: the request seed
    assert texts(frames(spec, stream, True, n=3, **kw), True, stream) == by_index    # seeded: repeats


def test_include_usage_counts_every_choice(servers):
    for s in servers:
        fr = frames(s, True, True, n=2, temperature=0, max_tokens=7, stream_options={"include_usage": True})
        assert fr[-1][0] == [] and fr[-1][1]["completion_tokens"] == 14
        assert all(u is None for _, u in fr[:-1])
        assert frames(s, True, False, max_tokens=7, temperature=0)[-1][1] is None   # not asked: none


@pytest.mark.parametrize("body,why", [
    (dict(logit_bias={"100000": 1}), "out of range"),
    (dict(logit_bias={"abc": 1}), "token ids"),
    (dict(logit_bias={"5": 101}), "-100..100"),
    (dict(extra_body=dict(min_p=1.5)), "min_p"),
    (dict(extra_body=dict(top_k=-1)), "top_k"),
    (dict(extra_body=dict(repetition_penalty=0)), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(n=9), "n"),
    (dict(stream_options={"include_usage": True, "x": 1}), "stream_options.x"),
])
def test_bad_controls_get_400(servers, body, why):
    with pytest.raises(openai.BadRequestError) as e:
        servers[0].client.completions.create(model="tiny", prompt="x", max_tokens=2, **body)
    assert why in str(e.value)


# --- /tokenize, /detokenize, /metrics, /v1/models ------------------------------------------

def test_models_list_the_context_length(servers):
    m = servers[0].client.models.list().data[0].model_dump()
    assert m["id"] == "tiny" and m["context_length"] == m["max_model_len"] > 0


def test_tokenize_and_detokenize_round_trip(servers):
    s = servers[0]
    ids = s.client.post("/tokenize", body={"content": PROMPT}, cast_to=object)["tokens"]
    turn = s.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0)
    assert len(ids) == turn.usage.prompt_tokens
    assert s.client.post("/detokenize", body={"tokens": ids}, cast_to=object)["content"] == PROMPT
    raw = httpx.post(s.url + "/tokenize", json={"content": "ab", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in raw) == "ab" and all(isinstance(p["id"], int) for p in raw)
    for path, bad, why in (("/detokenize", {"tokens": [10 ** 6]}, "out of range"),
                           ("/tokenize", {"content": "x", "model": "other"}, "not served here"),
                           ("/tokenize", {"content": "x", "bogus": 1}, "unknown field")):
        r = httpx.post(s.url + path, json=bad)
        assert 400 <= r.status_code < 500 and why in r.json()["error"]["message"]


def scrape(server) -> dict:
    text = httpx.get(server.url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_count_requests_tokens_and_drafts(servers):
    plain, spec = servers
    before = scrape(spec)
    r = spec.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, temperature=0)
    after = scrape(spec)

    def grew(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)
    assert grew("vkspec_requests_total", (("route", "completions"),)) == 1
    assert grew("vkspec_completion_tokens_total") == r.usage.completion_tokens == 9
    assert grew("vkspec_prompt_tokens_total") == r.usage.prompt_tokens
    assert grew("vkspec_drafted_tokens_total", (("source", "mtp"),)) > 0
    assert after[("vkspec_decode_tokens_per_second", ())] > 0
    assert after[("vkspec_prefill_tokens_per_second", ())] > 0
    assert 0 <= after[("vkspec_acceptance_ratio", ())] <= 1
    assert ("vkspec_cancelled_turns_total", ()) in after
    assert ("vkspec_gate_decisions_total", (("decision", "declined"),)) in after
