"""A served turn whose device fails: without a fallback the client gets a
5xx error object (or an error frame, mid-stream) and the server goes on
answering; with --fallback cpu the turn completes on the CPU with the frames
an unfaulted turn sends, and later turns stay there. Faults come from
VKSPEC_FAULT (backends/vulkan/faults.py), as a real device's would."""

import json

import httpx
import pytest

from serve_helpers import Server
from vkspec.tiny import make_tiny

pytestmark = pytest.mark.serve

PROMPT = [5, 9, 14, 200, 33, 7, 61, 5, 9, 14, 200, 33]
BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0.8, "seed": 7}
SPEC = ("--backend", "vulkan", "--spec", "mtp", "--drafts", "3")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("serve-faults") / "tiny", seed=4, mtp=True)


def stream(url, body):
    """(text deltas, finish reason, error message) of a streamed completion."""
    deltas, finish, error = [], None, None
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if "error" in d:
                error = d["error"]["message"]
                continue
            c = d["choices"][0]
            if c["text"]:
                deltas.append(c["text"])
            finish = c["finish_reason"] or finish
    return deltas, finish, error


def complete(url, body):
    return httpx.post(url + "/v1/completions", json=body, timeout=300)


@pytest.fixture(scope="module")
def fallback_frames(vk, tiny_dir, tmp_path_factory):
    """A lost device mid-turn (the 6th forward: decoding), with --fallback cpu."""
    log = tmp_path_factory.mktemp("fb") / "serve.log"
    srv = Server(tiny_dir, log, *SPEC, "--fallback", "cpu", env={"VKSPEC_FAULT": "forward@6!"})
    try:
        first = stream(srv.url, BODY)
        second = stream(srv.url, BODY)                 # on the CPU now, from a reused prefix
        plain = complete(srv.url, BODY)
        health = srv.health()
    finally:
        srv.stop()
    return first, second, plain, health, open(log).read()


def test_fallback_turn_completes_with_the_same_frames(fallback_frames, tiny_dir, tmp_path):
    first, second, plain, health, log = fallback_frames
    assert first[2] is None and first[1] == "length" and first[0]
    assert first == second
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == "".join(first[0])
    assert "continuing on the CPU" in log and health["turns"] == 3


def test_a_failed_turn_is_a_5xx_and_the_server_goes_on(vk, tiny_dir, tmp_path, fallback_frames):
    """Transient faults: the first turn's stream ends with an error frame, the
    second turn's non-streaming answer is a 500 error object; the third turn
    is the unfaulted one, and it equals the fallback server's."""
    srv = Server(tiny_dir, tmp_path / "serve.log", *SPEC, env={"VKSPEC_FAULT": "forward@4+12"})
    try:
        deltas, finish, error = stream(srv.url, BODY)
        assert error is not None and "the Vulkan device failed in a forward" in error and finish is None
        assert srv.health()["status"] == "ok"
        r = complete(srv.url, BODY)
        assert r.status_code == 500
        err = r.json()["error"]
        assert "the Vulkan device failed" in err["message"] and err["type"] == "server_error"
        r = complete(srv.url, BODY)
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == "".join(fallback_frames[0][0])
    finally:
        srv.stop()


def test_a_lost_device_answers_every_turn_with_an_error(vk, tiny_dir, tmp_path):
    srv = Server(tiny_dir, tmp_path / "serve.log", *SPEC, env={"VKSPEC_FAULT": "forward@2!"})
    try:
        for _ in range(2):
            r = complete(srv.url, BODY)
            assert r.status_code == 500 and "ErrorDeviceLost" in r.json()["error"]["message"]
        _, _, error = stream(srv.url, BODY)
        assert error is not None and "ErrorDeviceLost" in error
        assert srv.health()["status"] == "ok"
    finally:
        srv.stop()


def test_a_pin_whose_device_fails_moves_the_engine_to_the_cpu(vk, tiny_dir):
    """Outside a turn's rounds (a pin's prefill, a saved state brought in) the
    engine moves to the CPU with a fresh state and does the work there."""
    from vkspec.backends.vulkan.faults import Faults
    from vkspec.loader import load_model
    from vkspec.sampling import Sampler
    from vkspec.serve.engine import Engine
    from vkspec.speculative import SpecConfig, generate
    from vkspec.speculative.fallback import Fallback
    from vkspec.speculative.sources import build
    dev, cpu = load_model(tiny_dir, backend="vulkan", mtp=True), load_model(tiny_dir, mtp=True)
    sources, gate = build(dev, SpecConfig(spec_mode="mtp").check())
    engine = Engine(dev, None, sources, gate, fallback=Fallback(lambda: cpu, quiet=True))
    dev.faults = Faults("forward", 1)
    saved = engine.pin("p", PROMPT)
    assert engine.model is cpu and saved.fed == tuple(PROMPT)
    turn = engine.run(PROMPT + [3], 8, Sampler(temperature=0.8, seed=7))
    assert turn.reused == len(PROMPT)                      # the pin serves, on the CPU
    assert turn.tokens == generate(cpu, PROMPT + [3], 8, Sampler(temperature=0.8, seed=7)).tokens
