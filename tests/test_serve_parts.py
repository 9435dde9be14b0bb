"""The server's parts without a server process: the text stream decodes a
bounded window per token and equals a whole decode; the state store keeps
its byte budget, least recently used first; a state's cost is its arrays'
bytes; a generation that fails mid-stream ends the stream with an error
frame, not a broken connection."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from vkspec.serve.store import BudgetError, Saved, StateStore, measure
from vkspec.serve.text import TextStream
from vkspec.tiny import make_tiny
from vkspec.tokenizer import load_tokenizer

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(make_tiny(tmp_path_factory.mktemp("tok"), seed=6, mtp=True, echo=True))


class Counting:
    """A tokenizer that records how many ids each decode call is given."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def decode(self, ids):
        self.calls.append(len(ids))
        return self.tok.decode(ids)


def stream_text(tok, ids, stops=()):
    s = TextStream(tok, list(stops))
    out = "".join(s.push(t) for t in ids) + s.flush()
    return out, s


def test_each_token_decodes_a_bounded_window(tok):
    ids = tok.encode("def f(x):\n    return x + 1\n" * 40 + "héllo wörld ✓ " * 20)
    c = Counting(tok)
    text, _ = stream_text(c, ids)
    assert text == tok.decode(ids)
    assert len(ids) > 300 and max(c.calls) <= 2 * TextStream.WINDOW
    assert sum(c.calls) <= 4 * len(ids)               # not quadratic in the reply


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_the_deltas_add_up_to_the_whole_decode(tok, text):
    ids = tok.encode(text)
    assert stream_text(tok, ids)[0] == tok.decode(ids)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 511), max_size=TextStream.WINDOW - 1))
def test_any_short_id_sequence_adds_up_to_the_whole_decode(tok, ids):
    """Ids that are not text (bytes cut mid-character) too, while no piece
    waits past the window."""
    assert stream_text(tok, ids)[0] == tok.decode(ids)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet="ab c\n", max_size=80), stop=st.text(alphabet="ab c", min_size=1, max_size=4))
def test_a_stop_string_cuts_the_text_where_a_whole_decode_would(tok, text, stop):
    ids = tok.encode(text)
    got, s = stream_text(tok, ids, [stop])
    whole = tok.decode(ids)
    want = whole[:whole.find(stop)] if stop in whole else whole
    assert got == want and s.stopped == (stop in whole)


def test_the_encode_that_spares_the_loop_gives_the_same_ids(tok):
    for text in ("def f(x):\n    return x + 1\n" * 5, "héllo ✓ wörld", ""):
        assert tok.tk.encode_batch([text], add_special_tokens=False)[0].ids == tok.encode(text)


# --- the state store ---------------------------------------------------------------------

def saved(fed, nbytes):
    return Saved(tuple(fed), None, [], nbytes)


def test_turn_states_leave_first_then_pins_least_recently_used():
    log = []
    s = StateStore(100, max_turns=16, log=log.append)
    s.put_pin("a", saved([1], 30))
    s.put_pin("b", saved([2], 30))
    s.put_turn(saved([3], 30))
    assert s.usage()["used_bytes"] == 90
    s.put_turn(saved([4], 30))                    # 120 > 100: the older turn state goes
    assert [k for k in s.turns] == [(4,)] and s.usage()["used_bytes"] == 90
    s.touch(s.pinned["a"])                        # a is used: b is now the least recently used pin
    s.put_pin("c", saved([5], 60))                # needs 60: the turn state, then pin b go
    assert [p["name"] for p in s.usage()["data"]] == ["a", "c"] and not s.turns
    assert log == ["pin 'b' dropped: the state budget of 100 bytes is full"]
    with pytest.raises(BudgetError):
        s.put_pin("huge", saved([6], 101))
    s.put_turn(saved([7], 101))                   # a turn state over the whole budget is not kept
    assert not s.turns and s.usage()["used_bytes"] == 90


def test_a_state_costs_the_bytes_of_its_arrays_each_once():
    a, b = np.zeros(10, np.float32), np.zeros((3, 4), np.float64)
    assert measure([a, (b, a)], {"x": b}, 7, "text") == a.nbytes + b.nbytes


@pytest.fixture
def engine(tmp_path):
    from vkspec.loader import load_model
    from vkspec.serve.engine import Engine
    from vkspec.speculative import SpecConfig
    from vkspec.speculative.sources import build
    model = load_model(make_tiny(tmp_path / "m", seed=6, mtp=True, echo=True), mtp=True)
    sources, gate = build(model, SpecConfig(spec_mode="auto"))
    return Engine(model, None, sources, gate)


def test_an_engine_state_costs_what_its_snapshot_holds(engine):
    sources = engine.sources
    pin = engine.pin("p", list(range(1, 40)))
    snap = pin.snap
    arrays = snap.kv_k + snap.kv_v + snap.conv + snap.ssm + [snap.mtp_k, snap.mtp_v]
    mtp = sources[-1]
    vocab = mtp.vocab
    want = sum(a.nbytes for a in arrays) + mtp.h_last.nbytes + vocab.counts.nbytes + vocab.member.nbytes \
        + vocab.ids.nbytes
    assert pin.nbytes == want
    assert engine.pins()["data"] == [{"name": "p", "tokens": 39, "bytes": want}]


def test_listing_and_deleting_pins_do_not_wait_for_the_engine_lock(engine):
    """The lock is held as a running turn holds it; the routes answer anyway
    (they took it before, and froze every stream and /health meanwhile)."""
    import threading
    from fastapi.testclient import TestClient
    from vkspec.serve.app import create_app
    engine.pin("p", [1, 2, 3])
    app = create_app(engine, None, "m", None, allow_hosts=["testserver"])
    got = {}
    with TestClient(app) as client, engine.lock:
        def calls():
            got["list"] = client.get("/v1/pins").json()
            got["delete"] = client.delete("/v1/pins/p").status_code
            got["health"] = client.get("/health").status_code
        t = threading.Thread(target=calls, daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "a pin route waited for the engine lock"
    assert [p["name"] for p in got["list"]["data"]] == ["p"] and got["delete"] == 200 and got["health"] == 200
    assert engine.pins()["data"] == []


# --- a generation that fails mid-stream ---------------------------------------------------

class FailingEngine:
    """Two tokens, then the device goes away."""
    ctx, turns, cancelled = 64, 0, 0

    class model:
        class cfg:
            vocab_size = 512

    def run(self, prompt, max_tokens, sampler, on_token, cancelled):
        on_token(1, np.zeros(512, np.float32))
        on_token(2, np.zeros(512, np.float32))
        raise RuntimeError("device lost\nwith a second line")


def test_a_generation_that_fails_mid_stream_ends_with_an_error_frame():
    from fastapi.testclient import TestClient
    from vkspec.serve.app import create_app
    app = create_app(FailingEngine(), None, "m", None, allow_hosts=["testserver"])
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"model": "m", "prompt": [1, 2], "max_tokens": 4}
        r = client.post("/v1/completions", json={**body, "stream": True})
        assert r.status_code == 200
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
        assert texts == ["1", " 2"]
        err = json.loads(events[-2])["error"]
        assert err["message"] == "generation failed: RuntimeError: device lost" and err["type"] == "server_error"
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 500 and r.json()["error"]["message"] == "generation failed: RuntimeError: device lost"


# --- the Guard's idea of the server's own name ----------------------------------------------

def test_the_server_answers_to_its_own_names_only():
    from vkspec.serve.guard import Guard, host_name, is_loopback
    loop = Guard(None, bind_host="127.0.0.1", allow_hosts=["llm.lan"])
    assert all(loop.host_allowed(h) for h in ("localhost", "127.0.0.1", "127.0.0.2", "::1", "LLM.lan"))
    assert not any(loop.host_allowed(h) for h in ("evil.example", "10.0.0.2", "localhost.evil.example"))
    anywhere = Guard(None, bind_host="0.0.0.0")
    assert anywhere.host_allowed("192.168.1.5") and anywhere.host_allowed("fe80::1")
    assert not anywhere.host_allowed("evil.example")              # a name can be rebound, an address cannot
    one = Guard(None, bind_host="10.1.2.3")
    assert one.host_allowed("10.1.2.3") and not one.host_allowed("10.1.2.4")
    assert host_name("[::1]:8000") == "::1" and host_name("a:b") is None and host_name("x:99999") is None
    assert is_loopback("localhost") and is_loopback("[::1]") and not is_loopback("0.0.0.0")
