"""`vkspec serve` driven by the official openai client: every frame of a
session with drafts equals the frame without drafts; sessions, pins, bad
input, cancellation, concurrency."""

import json
import os
import threading
import time

import httpx
import pytest

from conftest import require
from vkspec.tiny import make_tiny

openai = require("openai")
from serve_helpers import plain_and_spec  # noqa: E402

pytestmark = pytest.mark.serve

REPEAT = "def f(x):\n    return x + 1\n" * 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("model") / "echo0", seed=6, mtp=True, echo=True)


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
    assert "stopped; counts saved" in open(logs / "spec.log").read()


def frames(server, stream=True, **kw):
    """The content of every frame (ids and timestamps aside)."""
    kw.setdefault("model", "echo0")
    if "messages" in kw:
        call = server.client.chat.completions.create
    else:
        call = server.client.completions.create
    if not stream:
        r = call(**kw).model_dump()
        return [r["choices"], r["usage"]]
    out = []
    for ch in call(stream=True, **kw):
        d = ch.model_dump()
        out.append([d["choices"], d.get("usage")])
    return out


def text_of(fr, chat):
    key = "content"
    return "".join((c["delta"].get(key) or "") if chat else c["text"] for f in fr for c in f[0])


def test_models_and_health(servers):
    plain, _ = servers
    assert [m.id for m in plain.client.models.list()] == ["echo0"]
    assert httpx.get(plain.url + "/health").json()["status"] == "ok"


def test_repeating_prompt_and_its_continuation_reuse_the_prefix(servers):
    plain, spec = servers
    msgs = [{"role": "user", "content": REPEAT}]
    first = [frames(s, messages=msgs, max_tokens=24, temperature=0) for s in servers]
    assert first[0] == first[1]
    reply = text_of(first[0], chat=True)
    msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    second = [frames(s, messages=msgs2, max_tokens=24, temperature=0) for s in servers]
    assert second[0] == second[1]
    for s in servers:                         # the second turn started from the first's state
        assert s.turns()[-1][1] > 0


def test_pinned_prompt_is_restored(servers):
    pinned = "class Counter:\n    def __init__(self):\n        self.count = 0"   # ends on a token boundary
    for s in servers:
        r = httpx.post(s.url + "/v1/pins", json={"name": "counter", "prompt": pinned})
        assert r.status_code == 200, r.text
        n_pin = r.json()["tokens"]
        frames(s, prompt="something else entirely", max_tokens=4, temperature=0)   # the live state moves on
    got = [frames(s, prompt=pinned + "\n    def inc(self):", max_tokens=20, temperature=0) for s in servers]
    assert got[0] == got[1]
    for s in servers:
        assert s.turns()[-1][1] == n_pin       # restored from the pin
    assert httpx.delete(servers[0].url + "/v1/pins/counter").status_code == 200
    assert httpx.delete(servers[0].url + "/v1/pins/counter").status_code == 404


def test_seeded_sampled_turn(servers):
    got = [frames(s, prompt=REPEAT, max_tokens=24, temperature=0.8, seed=42) for s in servers]
    assert got[0] == got[1]
    again = frames(servers[1], prompt=REPEAT, max_tokens=24, temperature=0.8, seed=42)
    assert again == got[1]


def test_logprobs_turns(servers):
    got = [frames(s, prompt=REPEAT, max_tokens=12, temperature=0, logprobs=3) for s in servers]
    assert got[0] == got[1]
    assert got[0][0][0][0]["logprobs"]["top_logprobs"]
    chat = [frames(s, messages=[{"role": "user", "content": REPEAT}], max_tokens=12, temperature=0,
                   logprobs=True, top_logprobs=2) for s in servers]
    assert chat[0] == chat[1]


def test_streaming_and_not_give_the_same_text(servers):
    for s in servers:
        st = frames(s, prompt=REPEAT, max_tokens=20, temperature=0)
        whole = frames(s, stream=False, prompt=REPEAT, max_tokens=20, temperature=0)
        assert text_of(st, chat=False) == whole[0][0]["text"]
        msgs = [{"role": "user", "content": "hello"}]
        st = frames(s, messages=msgs, max_tokens=20, temperature=0)
        whole = frames(s, stream=False, messages=msgs, max_tokens=20, temperature=0)
        assert text_of(st, chat=True) == whole[0][0]["message"]["content"]


def test_stop_strings_end_the_turn_the_same_way(servers):
    got = [frames(s, prompt=REPEAT, max_tokens=40, temperature=0, stop=["ab"]) for s in servers]
    assert got[0] == got[1]
    whole = frames(servers[1], stream=False, prompt=REPEAT, max_tokens=40, temperature=0, stop=["ab"])
    assert "ab" not in whole[0][0]["text"]


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "echo0", "prompt": "x", "bogus": 1}).encode(), 400, "unknown field 'bogus'"),
    (json.dumps({"model": "echo0", "prompt": "x", "temperature": 3}).encode(), 400, "temperature"),
    (json.dumps({"model": "echo0", "prompt": "x", "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"model": "echo0", "prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "echo0", "prompt": "x", "n": 9}).encode(), 400, "n"),
    (json.dumps({"model": "echo0", "prompt": [1, 99999]}).encode(), 400, "out of range"),
    (json.dumps({"model": "echo0", "prompt": "x " * 3000}).encode(), 400, "context"),
    (json.dumps({"model": "echo0", "prompt": "x", "max_tokens": 5000}).encode(), 400, "exceed the context"),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), 404, "not served here"),
]


@pytest.mark.parametrize("body,status,why", BAD)
def test_bad_completion_requests(servers, body, status, why):
    s = servers[0]
    r = httpx.post(s.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert why in err["message"] and err["type"] == "invalid_request_error"
    assert httpx.get(s.url + "/health").status_code == 200      # still serving


def test_bad_chat_requests_and_routes(servers):
    s = servers[0]
    for body, why in (({"model": "echo0", "messages": []}, "messages"),
                      ({"model": "echo0", "messages": [{"role": "robot", "content": "x"}]}, "role"),
                      ({"model": "echo0", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 99},
                       "top_logprobs")):
        r = httpx.post(s.url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and why in r.json()["error"]["message"]
    r = httpx.get(s.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError):
        s.client.completions.create(model="echo0", prompt="x", max_tokens=0)


def test_a_client_that_leaves_mid_stream_cancels_its_turn(servers):
    """The turn is cancelled (the server's count says so) and the state it
    leaves serves the next turns as before."""
    plain, spec = servers
    prompt = "class Other:\n"                   # no end-of-text for hundreds of tokens
    want = frames(spec, prompt=prompt, max_tokens=60, temperature=0)
    assert len(want) > 30
    cancelled = spec.health()["cancelled"]
    with httpx.stream("POST", spec.url + "/v1/completions",
                      json={"model": "echo0", "prompt": prompt, "max_tokens": 900, "stream": True,
                            "temperature": 0}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break                               # hang up
    for _ in range(300):                            # the turn ends at its next round
        if spec.health()["cancelled"] > cancelled:
            break
        time.sleep(0.1)
    assert spec.health()["cancelled"] == cancelled + 1
    assert frames(spec, prompt=prompt, max_tokens=60, temperature=0) == want
    assert frames(plain, prompt=prompt, max_tokens=60, temperature=0) == want


def test_concurrent_clients_get_what_they_get_alone(servers):
    _, spec = servers
    prompts = [REPEAT[:20 + 7 * i] for i in range(8)]
    alone = [frames(spec, prompt=p, max_tokens=16, temperature=0) for p in prompts]
    errors, stop = [], time.time() + float(os.environ.get("VKSPEC_LOAD_SECONDS", "6"))

    def client(i):
        try:
            while time.time() < stop:
                if frames(spec, prompt=prompts[i], max_tokens=16, temperature=0) != alone[i]:
                    errors.append(i)
        except Exception as e:                     # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
