"""`vkspec serve` cannot be knocked over: body size, JSON only, Host and
Origin, API keys, out-of-range values, work kept off the event loop, a
client that hangs up, pins within a byte budget. Raw HTTP (httpx) and the
official openai client against a CPU server."""

import json
import threading
import time

import httpx
import pytest

from conftest import require
from vkspec.tiny import make_tiny

openai = require("openai")
from serve_helpers import Server, free_port  # noqa: E402

pytestmark = pytest.mark.serve

REPEAT = "def f(x):\n    return x + 1\n" * 3
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("model") / "echo0", seed=6, mtp=True, echo=True)


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    s = Server(model_dir, tmp_path_factory.mktemp("limits") / "serve.log", "--backend", "cpu", "--spec", "auto",
               env={"NUMBA_NUM_THREADS": "1"})     # see test_serve_fuzz.py: the input is the point here
    yield s
    s.stop()


def post(s, path, body=None, raw=None, headers=None, timeout=60):
    content = raw if raw is not None else json.dumps(body)
    return httpx.post(s.url + path, content=content, headers={**JSON, **(headers or {})}, timeout=timeout)


def refused(r, status, why=""):
    """An OpenAI-style error object with this status naming the cause."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and why in err["message"], err
    return err


def ok(s):
    return {"model": "echo0", "prompt": "def f(x):", "max_tokens": 2, "temperature": 0}


# --- size, media type, Host, Origin --------------------------------------------------

def test_a_body_over_the_limit_is_refused_before_it_is_read(srv):
    peak = srv.rss_peak_kb()
    refused(post(srv, "/v1/completions", raw=b" " * (50 << 20)), 413, "8388608")

    def chunks():                                  # no Content-Length: counted as it arrives
        for _ in range(50):
            yield b" " * (1 << 20)
    refused(post(srv, "/v1/completions", raw=chunks()), 413, "8388608")
    grew_mb = (srv.rss_peak_kb() - peak) / 1024
    assert grew_mb < 24, f"the server's peak memory grew {grew_mb:.0f} MB for two refused 50 MB bodies"
    under = dict(ok(srv), user="u" * (7 << 20))   # under the limit: parsed and served
    assert post(srv, "/v1/completions", under).status_code == 200


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   None])
def test_only_json_bodies_are_served(srv, ctype):
    headers = {"content-type": ctype} if ctype else {}
    r = httpx.post(srv.url + "/v1/completions", content=json.dumps(ok(srv)).encode(), headers=headers)
    refused(r, 415, "application/json")
    r = post(srv, "/v1/completions", ok(srv), headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_a_foreign_host_or_origin_is_refused(srv):
    port = srv.port
    rebinding = {"host": f"evil.example:{port}"}            # DNS rebinding: the attacker's name
    refused(post(srv, "/v1/completions", ok(srv), headers=rebinding), 403, "Host")
    refused(httpx.get(srv.url + "/v1/models", headers=rebinding), 403, "Host")
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{free_port()}", f"http://evil.example:{port}",
                   f"ftp://127.0.0.1:{port}"):
        refused(post(srv, "/v1/completions", ok(srv), headers={"origin": origin}), 403, "Origin")
    refused(httpx.delete(srv.url + "/v1/pins/x", headers={"origin": "http://evil.example"}), 403, "Origin")
    assert post(srv, "/v1/completions", ok(srv), headers={"origin": f"http://127.0.0.1:{port}"}).status_code == 200
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert post(srv, "/v1/completions", ok(srv), headers={"host": host}).status_code == 200


# --- API keys -------------------------------------------------------------------------

def test_an_api_key_is_required_when_set(model_dir, tmp_path):
    s = Server(model_dir, tmp_path / "keyed.log", "--spec", "off", "--api-key", "sekrit", key="sekrit")
    try:
        assert s.client.completions.create(model="echo0", prompt="x", max_tokens=2).choices[0].text
        wrong = openai.OpenAI(base_url=s.url + "/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="echo0", prompt="x", max_tokens=2)
        r = post(s, "/v1/completions", ok(s))
        refused(r, 401, "API key")
        assert r.headers["www-authenticate"] == "Bearer"
        refused(httpx.get(s.url + "/v1/pins"), 401)
        assert httpx.get(s.url + "/health").status_code == 200     # liveness stays open
        assert "warning" not in open(s.log).read()
    finally:
        s.stop()


def test_listening_beyond_loopback_warns_without_a_key_and_takes_the_environment_key(model_dir, tmp_path):
    s = Server(model_dir, tmp_path / "open.log", "--spec", "off", host="0.0.0.0")
    try:
        assert "warning: listening on 0.0.0.0 without an API key" in open(s.log).read()
        assert post(s, "/v1/completions", ok(s)).status_code == 200      # an IP literal Host is no rebinding
    finally:
        s.stop()
    s = Server(model_dir, tmp_path / "env.log", "--spec", "off", host="0.0.0.0", env={"VKSPEC_API_KEY": "k2"},
               key="k2")
    try:
        assert "warning" not in open(s.log).read()
        refused(post(s, "/v1/completions", ok(s)), 401)
        assert s.client.completions.create(model="echo0", prompt="x", max_tokens=2).choices[0].text
    finally:
        s.stop()


# --- values ------------------------------------------------------------------------------

def body_with(**kw):
    return json.dumps({"model": "echo0", "prompt": "x", "max_tokens": 2, **kw})


BAD_VALUES = [
    (body_with(seed=-1), "seed"),
    (body_with(seed=2 ** 63), "seed"),
    (body_with(seed=10 ** 30), "seed"),
    (body_with(seed=1.5), "seed"),
    (body_with().replace('"max_tokens": 2', '"max_tokens": 2, "temperature": NaN'), "NaN"),
    (body_with().replace('"max_tokens": 2', '"max_tokens": 2, "top_p": Infinity'), "Infinity"),
    (body_with().replace('"max_tokens": 2', '"max_tokens": 2, "temperature": -Infinity'), "Infinity"),
    (body_with().replace('"max_tokens": 2', '"max_tokens": 2, "temperature": 1e999'), "temperature"),
    (body_with(top_p=float("inf")).replace("Infinity", "1e400"), "top_p"),
    (body_with(stop=["a", "b", "c", "d", "e"]), "at most 4 stop strings"),
    (body_with(stop="é" * 129), "256 bytes"),                  # 129 characters, 258 bytes
    (body_with(prompt="\ud800"), "lone surrogate"),
    (body_with(prompt="ok \udfff ok"), "lone surrogate"),
    (body_with(stop=["\ud83d"]), "lone surrogate"),
    (body_with(user="\udc00"), "lone surrogate"),
    (body_with(model="\ud800"), "lone surrogate"),
    (json.dumps({"model": "echo0", "prompt": "x", "\ud800": 1}), "lone surrogate"),
    (body_with(n=9), "n: Input should be less than or equal to 8"),
    (body_with(n=0), "n: Input should be greater than or equal to 1"),
    (body_with(max_tokens=10 ** 20), "context"),
    (body_with(prompt=[1, -5]), "out of range"),
    (body_with(prompt=[1, 2 ** 70]), "out of range"),
    ('{"model": "echo0", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}", "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("raw,why", BAD_VALUES)
def test_out_of_range_values_get_400(srv, raw, why, stream):
    if stream:
        raw = raw.replace('"max_tokens": 2', '"max_tokens": 2, "stream": true') if isinstance(raw, str) else raw
    refused(post(srv, "/v1/completions", raw=raw if isinstance(raw, bytes) else raw.encode()), 400, why)


def test_chat_values_get_400_too(srv):
    base = {"model": "echo0", "max_tokens": 2}
    for body, why in (({"messages": [{"role": "user", "content": "\ud800"}]}, "lone surrogate"),
                      ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "content"),
                      ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text"),
                      ({"messages": [{"role": "user", "content": "x"}], "seed": -1, "stream": True}, "seed")):
        refused(post(srv, "/v1/chat/completions", {**base, **body}), 400, why)


def test_the_official_client_gets_400_not_a_broken_stream(srv):
    for kw in ({"seed": -1}, {"seed": 2 ** 64}, {"stop": ["x"] * 5}, {"n": 9}):
        args = {"model": "echo0", "prompt": "x", "max_tokens": 2, **kw}
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError):
                r = srv.client.completions.create(stream=stream, **args)
                if stream:
                    list(r)


def test_the_edges_of_the_ranges_are_served(srv):
    for kw in ({"seed": 0}, {"seed": 2 ** 63 - 1}, {"stop": ["é" * 128] * 4}, {"temperature": 2.0, "seed": 1},
               {"top_p": 1e-9, "temperature": 1.0, "seed": 3}):
        r = post(srv, "/v1/completions", {"model": "echo0", "prompt": "x", "max_tokens": 2, **kw})
        assert r.status_code == 200, (kw, r.text)


# --- off the event loop ----------------------------------------------------------------------

def test_tokenizing_and_templates_run_off_the_event_loop(srv):
    """A 2 MB prompt takes seconds to tokenize; /health answers within 1 s
    meanwhile (a blocked loop would time out), then the prompt gets 400."""
    big = REPEAT * 25000
    for path, body in (("/v1/completions", {"model": "echo0", "prompt": big, "max_tokens": 1}),
                       ("/v1/chat/completions", {"model": "echo0", "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": big}]})):
        done = {}
        t = threading.Thread(target=lambda: done.update(r=post(srv, path, body, timeout=300)))
        t.start()
        meanwhile = 0
        while t.is_alive():
            assert httpx.get(srv.url + "/health", timeout=1).status_code == 200
            meanwhile += t.is_alive()
            time.sleep(0.05)
        t.join()
        refused(done["r"], 400, "context")
        assert meanwhile >= 3


def stream_in_background(s, prompt, max_tokens, model="echo0"):
    """A streaming turn read in a thread; returns (thread, state dict)."""
    state = {"frames": 0, "done": False, "first": threading.Event()}

    def read():
        try:
            with httpx.stream("POST", s.url + "/v1/completions", timeout=120, headers=JSON,
                              content=json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                  "stream": True, "temperature": 0})) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        state["frames"] += 1
                        if state["frames"] >= 3:
                            state["first"].set()
        except httpx.TransportError as e:       # the server stopped mid-stream (the signal test)
            state["error"] = e
            return
        state["done"] = True
    t = threading.Thread(target=read)
    t.start()
    return t, state


# --- a client that hangs up ------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A wider model (hidden 512, 8 layers: tens of ms a token here), so a
    turn of 1000 tokens is still running when its client hangs up."""
    d = make_tiny(tmp_path_factory.mktemp("wide"), seed=6, echo=True, hidden=512, layers=8)
    s = Server(d, tmp_path_factory.mktemp("slow") / "serve.log", "--spec", "off", env={"NUMBA_NUM_THREADS": "1"})
    yield s
    s.stop()


def wait_cancelled(s, before):
    for _ in range(600):
        if s.health()["cancelled"] > before:
            break
        time.sleep(0.1)
    return s.health()["cancelled"] - before


def long_turn(stream=False):
    return {"model": "slow", "prompt": "class Y:\n", "max_tokens": 1000, "temperature": 0, "stream": stream}


def test_a_non_streaming_client_that_hangs_up_cancels_its_turn(slow):
    slow_name = slow.client.models.list().data[0].id
    before, turns = slow.health()["cancelled"], slow.health()["turns"]
    with pytest.raises(httpx.ReadTimeout):
        post(slow, "/v1/completions", {**long_turn(), "model": slow_name}, timeout=httpx.Timeout(10, read=0.5))
    assert wait_cancelled(slow, before) == 1
    line = [x for x in open(slow.log).read().splitlines() if f"turn {turns + 1}:" in x][0]
    assert "cancelled" in line and " 1000 tokens" not in line
    want = post(slow, "/v1/completions", {**long_turn(), "model": slow_name, "max_tokens": 8}).json()
    assert want["usage"]["completion_tokens"] == 8            # the state left behind serves on


def test_a_streaming_client_that_hangs_up_cancels_its_turn(slow):
    slow_name = slow.client.models.list().data[0].id
    before, turns = slow.health()["cancelled"], slow.health()["turns"]
    with httpx.stream("POST", slow.url + "/v1/completions", headers=JSON, timeout=60,
                      content=json.dumps({**long_turn(stream=True), "model": slow_name})) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break                                       # hang up at the first frame
    assert wait_cancelled(slow, before) == 1
    line = [x for x in open(slow.log).read().splitlines() if f"turn {turns + 1}:" in x][0]
    assert "cancelled" in line and " 1000 tokens" not in line


# --- pins within a byte budget -------------------------------------------------------------

def test_pins_and_turn_states_stay_within_the_byte_budget(model_dir, tmp_path):
    """A pin of a few tokens costs about 28 KB here (measured: the arrays of
    its state); a budget of 2.5 pins keeps the two most recently used, and
    turn states leave before any pin."""
    budget = 70000
    s = Server(model_dir, tmp_path / "budget.log", "--spec", "auto", "--state-budget-mb", str(budget / 2 ** 20),
               env={"NUMBA_NUM_THREADS": "1"})
    try:
        prompts = {n: f"class {n.upper()}{n.upper()}:" for n in "abcd"}
        sizes, tokens = {}, {}
        for n in "abc":
            r = post(s, "/v1/pins", {"name": n, "prompt": prompts[n]})
            assert r.status_code == 200, r.text
            sizes[n], tokens[n] = r.json()["bytes"], r.json()["tokens"]
        assert 2 * max(sizes.values()) <= budget < 3 * min(sizes.values()), sizes
        listed = httpx.get(s.url + "/v1/pins").json()
        assert [p["name"] for p in listed["data"]] == ["b", "c"]            # a, the least recently used, went
        assert {p["name"]: p["bytes"] for p in listed["data"]} == {"b": sizes["b"], "c": sizes["c"]}
        assert listed["budget_bytes"] == budget and listed["used_bytes"] <= budget
        r = post(s, "/v1/completions", {"model": "echo0", "prompt": prompts["b"] + " x", "max_tokens": 3})
        assert r.status_code == 200 and s.turns()[-1][1] == tokens["b"]      # started from pin b
        assert post(s, "/v1/pins", {"name": "d", "prompt": prompts["d"]}).status_code == 200
        listed = httpx.get(s.url + "/v1/pins").json()
        assert [p["name"] for p in listed["data"]] == ["b", "d"]            # b was used: c went
        assert listed["used_bytes"] <= budget and listed["turn_snapshots"] == 0     # turn states go first
        assert "pin 'a' dropped" in open(s.log).read()
        big = post(s, "/v1/pins", {"name": "big", "prompt": "x " * 400})
        refused(big, 400, "state budget")
        assert [p["name"] for p in httpx.get(s.url + "/v1/pins").json()["data"]] == ["b", "d"]
    finally:
        s.stop()


def test_a_signal_stops_the_server_while_turns_run_and_wait(slow):
    """SIGTERM with a turn running and another queued behind it (its client
    gone): the turns are cancelled and the process ends, counts saved. Last
    of the slow server's tests: it stops that server."""
    slow_name = slow.client.models.list().data[0].id
    t, state = stream_in_background(slow, "class Other:\n", 1000, model=slow_name)
    try:
        assert state["first"].wait(60)
        with pytest.raises(httpx.ReadTimeout):
            post(slow, "/v1/completions", {**long_turn(), "model": slow_name}, timeout=httpx.Timeout(10, read=0.3))
    finally:
        slow.proc.terminate()
        slow.proc.wait(timeout=60)
        t.join()
    assert "stopped; counts saved" in open(slow.log).read()


def test_eight_clients_get_what_they_get_alone_through_the_disturbances(srv):
    """tests/bench/load_serve.py for a few seconds: 8 streaming clients while a
    10 MB body (plain and chunked), a DELETE of a pin and two clients that
    hang up arrive; every answer equals the single-client answer."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("load_serve", Path(__file__).parent / "bench" / "load_serve.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    r = load.run_load(srv.url, "echo0", seconds=4, clients=8, tokens=16)
    assert r["problems"] == [] and r["differing"] == 0 and r["requests"] >= 8, r
    assert r["disturbances"]["cancelled turns"] == 2
