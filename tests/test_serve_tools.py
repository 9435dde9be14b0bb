"""Tool calling and structured output through the official openai client.

Each family's tool-call format is read back from what its own chat template
writes (SmolLM2's, Gemma 3's, Qwen3's, written into tiny checkpoints); a
random tiny model only makes tool calls when the grammar forces them
(tool_choice required or named), so free-running turns test that text which
is no call comes back as content."""

import json
from pathlib import Path

import pytest

from conftest import require
from vkspec.serve.schema import ChatRequest
from vkspec.serve.text import render_chat
from vkspec.serve.tools import family_of, parse, render_messages
from vkspec.tiny import make_tiny

openai = require("openai")
from serve_helpers import Server  # noqa: E402

pytestmark = pytest.mark.serve

TEMPLATES = {name: (Path(__file__).parent / "templates" / f"{name}.jinja").read_text()
             for name in ("smollm2", "gemma3", "qwen3", "qwen3_5", "llama3")}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                         "maximum": 99},
                                                                   "b": {"type": "integer", "minimum": 0,
                                                                         "maximum": 99}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def checkpoint(root: Path, name: str) -> Path:
    d = make_tiny(root / name, seed=4, mtp=True, ctx=4096)     # room for the tools' prompt
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATES[name]}))
    return d


# --- the formats, from each template ------------------------------------------------------------

@pytest.mark.parametrize("name,fmt,native", [("smollm2", "hermes", False), ("gemma3", "gemma", False),
                                             ("qwen3", "hermes", True), ("qwen3_5", "qwen_xml", True),
                                             ("llama3", "llama3", True)])
def test_each_template_is_read_as_its_family(name, fmt, native):
    fam = family_of(TEMPLATES[name])
    assert (fam.fmt, fam.native) == (fmt, native)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_calls_a_template_writes_parse_back(name):
    """An assistant turn with two calls, rendered by the template, then the
    rendered assistant text parsed: the same calls."""
    fam = family_of(TEMPLATES[name])
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Oslo", "days": 2}'}},
             {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
    calls = calls[:1] if name == "llama3" else calls         # Llama 3's template takes one call a turn
    req = ChatRequest.model_validate({"model": "m", "tools": TOOLS, "messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": c["id"], "content": f"sunny {c['id']}"} for c in calls]})
    msgs, extra = render_messages(req.messages, req.tools, fam)
    at = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    assistant = render_chat(TEMPLATES[name], msgs[:at + 1], extra)[len(render_chat(TEMPLATES[name], msgs[:at],
                                                                                   extra)):]
    whole = render_chat(TEMPLATES[name], msgs, extra)
    assert all(f"sunny {c['id']}" in whole for c in calls)
    for end in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>"):
        assistant = assistant.split(end)[0]
    content, got = parse(assistant, fam, {"get_weather", "add"})
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == \
        [("get_weather", {"city": "Oslo", "days": 2}), ("add", {"a": 1, "b": 2})][:len(calls)]
    # Qwen3 writes an empty thought before the calls; Qwen3.5's generation prompt opens it
    assert content in ("", "<think>\n\n</think>", "</think>")


def test_qwen3_5_values_keep_their_declared_types():
    fam = family_of(TEMPLATES["qwen3_5"])
    text = ("<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n"
            "<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n</function>\n</tool_call>")
    names = {"f": {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}
    content, calls = parse(text, fam, names)
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == \
        {"s": "42", "n": 42, "b": True, "o": {"k": [1]}}
    assert parse(text.replace("</function>", "stray</function>"), fam, names)[1] == []


def test_gemma_calls_take_python_or_json_literals():
    fam = family_of(TEMPLATES["gemma3"])
    text = '```tool_code\nf(a=True, b=null, c=[1, {"d": false}], e="x")\n```'
    content, calls = parse(text, fam, {"f"})
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == \
        {"a": True, "b": None, "c": [1, {"d": False}], "e": "x"}
    assert parse('[f(a=1), f(a=2)]', fam, {"f"})[1] != []                # the bare list form
    assert parse('f(a=1)', fam, {"f"}) == ('f(a=1)', [])                   # as streaming sees it: content


def test_a_stream_sends_content_until_a_call_starts():
    from vkspec.serve.tools import ToolStream
    fam = family_of(TEMPLATES["qwen3"])
    text = 'Let me look.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    ts = ToolStream(fam, {"add"})
    sent = "".join(ts.push(ch) for ch in text)
    rest, calls = ts.finish()
    assert sent == "Let me look.\n" and rest.strip() == "" and [c["function"]["name"] for c in calls] == ["add"]
    ts = ToolStream(fam, {"add"})                     # a marker's start that goes nowhere is content after all
    sent = "".join(ts.push(ch) for ch in "a <tool_c b")
    assert sent + ts.finish()[0] == "a <tool_c b" and sent.startswith("a ")
    ts = ToolStream(fam, {"add"})                     # a call that never closes is content
    sent = "".join(ts.push(ch) for ch in "<tool_call>\n{\"name\": \"add\"")
    assert (sent, ts.finish()) == ("", ('<tool_call>\n{"name": "add"', []))


@pytest.mark.parametrize("fmt_template", sorted(TEMPLATES))
@pytest.mark.parametrize("text", ["<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
                                  "<tool_call>\n{not json", "```tool_code\nget_weather(city=Oslo)\n```",
                                  "[get_weather(city=open('x'))]", "plain words", ""])
def test_text_that_is_no_call_of_a_declared_tool_is_content(fmt_template, text):
    assert parse(text, family_of(TEMPLATES[fmt_template]), {"get_weather"}) == (text, [])


# --- through the server -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def qwen(request, root, tmp_path_factory):
    """(plain, speculative) servers on the Qwen3-template checkpoint."""
    if request.param == "vulkan":
        request.getfixturevalue("vk")
    d, logs = checkpoint(root, "qwen3"), tmp_path_factory.mktemp("logs")
    pair = (Server(d, logs / "plain.log", "--backend", request.param, "--spec", "off"),
            Server(d, logs / "spec.log", "--backend", request.param, "--spec", "auto", "--no-gate", "--drafts", "4"))
    yield pair
    for s in pair:
        s.stop()


@pytest.fixture(scope="module", params=["smollm2", "gemma3", "qwen3_5", "llama3"])
def other(request, root, tmp_path_factory):
    s = Server(checkpoint(root, request.param), tmp_path_factory.mktemp("logs") / "s.log", "--spec", "auto",
               "--no-gate", "--drafts", "4")
    yield s
    s.stop()


def ask(server, stream=False, **kw):
    """(message dict, finish reason) of choice 0, streamed or not; tool call ids dropped."""
    kw = {"model": server.client.models.list().data[0].id, "messages": USER, "max_tokens": 200,
          "temperature": 0, **kw}
    if not stream:
        c = server.client.chat.completions.create(**kw).choices[0]
        m = c.message.model_dump(exclude_none=True)
        calls = [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in m.get("tool_calls", [])]
        return {"content": m.get("content"), "calls": calls}, c.finish_reason
    content, calls, finish = "", {}, None
    for ch in server.client.chat.completions.create(stream=True, **kw):
        c = ch.choices[0]
        content += c.delta.content or ""
        for t in c.delta.tool_calls or []:
            calls.setdefault(t.index, ["", ""])
            calls[t.index][0] += t.function.name or ""
            calls[t.index][1] += t.function.arguments or ""
        finish = c.finish_reason or finish
    return {"content": content or None, "calls": [(n, json.loads(a)) for n, a in calls.values()]}, finish


def valid_weather(args):
    return set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo", "Lima") and 1 <= args["days"] <= 7


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_comes_back_as_tool_calls_the_same_with_drafts(qwen, stream, choice):
    got = [ask(s, stream, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False) for s in qwen]
    assert got[0] == got[1]
    (msg, finish) = got[0]
    assert finish == "tool_calls" and len(msg["calls"]) == 1 and not msg["content"]
    name, args = msg["calls"][0]
    assert name == "get_weather" if isinstance(choice, dict) else name in ("get_weather", "add")
    if name == "get_weather":
        assert valid_weather(args)


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_parallel_calls_gives_one_call_per_tool_at_most(qwen, stream):
    got = [ask(s, stream, tools=TOOLS, tool_choice="required", max_tokens=400) for s in qwen]
    assert got[0] == got[1]
    msg, finish = got[0]
    names = [n for n, _ in msg["calls"]]
    assert finish == "tool_calls" and 1 <= len(names) <= 2 and len(set(names)) <= 2


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_in_the_other_families(other, stream):
    msg, finish = ask(other, stream, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert finish == "tool_calls" and [n for n, _ in msg["calls"]] == ["get_weather"]
    assert valid_weather(msg["calls"][0][1])
    msg, finish = ask(other, stream, tools=TOOLS, max_tokens=30)       # free text: content, never a 500
    assert msg["calls"] == [] and msg["content"] and finish == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_free_text_with_tools_is_content(qwen, stream):
    got = [ask(s, stream, tools=TOOLS, max_tokens=30) for s in qwen]
    assert got[0] == got[1]
    msg, finish = got[0]
    assert msg["calls"] == [] and msg["content"] and finish == "length"


def test_an_agent_loop_runs_five_turns(qwen):
    """user -> call -> result -> call -> result -> answer, each turn through the client."""
    for s in qwen:
        msgs, named = list(USER), {"type": "function", "function": {"name": "get_weather"}}
        for turn, choice in enumerate([named, "required", "none"]):
            r = s.client.chat.completions.create(model="qwen3", messages=msgs, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=400 if choice != "none" else 12, temperature=0)
            m = r.choices[0].message
            if choice == "none":
                assert m.tool_calls is None and m.content and r.choices[0].finish_reason == "length"
                break
            assert r.choices[0].finish_reason == "tool_calls"
            msgs.append(m.model_dump(exclude_none=True))
            for call in m.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": call.id, "content": f"result {turn}"})
        msgs.append(m.model_dump(exclude_none=True))                  # the final answer
        roles = [m["role"] for m in msgs]
        assert len(msgs) >= 6 and roles[:3] == ["user", "assistant", "tool"] and roles[-1] == "assistant"
        assert roles.count("assistant") == 3 and "tool" in roles[3:]


# --- structured output ------------------------------------------------------------------------

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "tag": {"type": "string", "maxLength": 5},
                                          "ok": {"type": "boolean"}},
         "required": ["x", "tag", "ok"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_parses_and_is_the_same_with_drafts(qwen, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT, "strict": True}}
    got = [ask(s, stream, response_format=fmt) for s in qwen]
    assert got[0] == got[1] and got[0][1] == "stop"
    v = json.loads(got[0][0]["content"])
    assert set(v) == {"x", "tag", "ok"} and -9 <= v["x"] <= 9 and len(v["tag"]) <= 5 and isinstance(v["ok"], bool)


def test_json_object_and_a_grammar(qwen):
    for s in qwen:
        msg, finish = ask(s, response_format={"type": "json_object"}, max_tokens=400)
        assert finish == "length" or isinstance(json.loads(msg["content"]), dict)
        gbnf = 'root ::= "yes" | "no" | ("maybe " [0-9])'
        lark = 'start: ("yes" | "no" | "maybe " /[0-9]/)'
        for g in (gbnf, lark):
            msg, finish = ask(s, extra_body={"grammar": g})
            assert finish == "stop" and (msg["content"] in ("yes", "no") or
                                         (msg["content"][:6] == "maybe " and msg["content"][6:].isdigit()))
        r = s.client.completions.create(model="qwen3", prompt="x", max_tokens=50, temperature=0,
                                        extra_body={"grammar": gbnf})
        assert r.choices[0].text in ("yes", "no") or r.choices[0].text.startswith("maybe ")


# --- bad input: a 4xx with one line ---------------------------------------------------------------

BAD = [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "schema is required"),
    (dict(extra_body={"grammar": "start: foo"}), "grammar"),
    (dict(extra_body={"grammar": "root ::= ("}), "grammar"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
     "tools.0.function.parameters"),
    (dict(tools=[WEATHER, WEATHER]), "declared twice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "not among the tools"),
    (dict(tool_choice="required"), "tool_choice needs tools"),
    (dict(messages=USER + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]), "answers no earlier"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "exclude each other"),
]


@pytest.mark.parametrize("body,why", BAD)
def test_bad_tools_and_formats_get_a_400_with_one_line(qwen, body, why):
    kw = {"model": "qwen3", "messages": USER, "max_tokens": 5, **body}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            list(qwen[0].client.chat.completions.create(stream=stream, **kw)) if stream else \
                qwen[0].client.chat.completions.create(**kw)
        msg = e.value.body["message"]
        assert why in msg and "\n" not in msg


# --- hypothesis: generated schemas ----------------------------------------------------------------

def conforms(v, s) -> bool:
    """The JSON-schema subset the strategy below writes, checked by hand."""
    if "enum" in s:
        return v in s["enum"]
    t = s["type"]
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool) and s["minimum"] <= v <= s["maximum"]
    if t == "string":
        return isinstance(v, str) and len(v) <= s["maxLength"]
    if t == "array":
        return isinstance(v, list) and len(v) <= s["maxItems"] and all(conforms(x, s["items"]) for x in v)
    return isinstance(v, dict) and set(v) == set(s["properties"]) and \
        all(conforms(v[k], s["properties"][k]) for k in v)


def schema_strategy():
    from hypothesis import strategies as st
    names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
    leaf = st.one_of(
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-50, 50), st.integers(0, 100)),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
        st.lists(names, min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}))
    inner = st.recursive(leaf, lambda kids: st.one_of(
        st.dictionaries(names, kids, min_size=1, max_size=3).map(
            lambda p: {"type": "object", "properties": p, "required": sorted(p), "additionalProperties": False}),
        st.builds(lambda it, n: {"type": "array", "items": it, "maxItems": n}, kids, st.integers(0, 3))),
        max_leaves=5)
    return st.dictionaries(names, inner, min_size=1, max_size=3).map(
        lambda p: {"type": "object", "properties": p, "required": sorted(p), "additionalProperties": False})


@pytest.mark.slow
def test_generated_schemas_constrain_every_answer_the_same_with_drafts(qwen, request):
    from hypothesis import HealthCheck, given, settings
    examples = 200 if "cpu" in request.node.name else 20        # Lavapipe is slow; the CPU takes 200
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(schema=schema_strategy())
    def check(schema):
        fmt = {"type": "json_schema", "json_schema": {"name": "g", "schema": schema, "strict": True}}
        got = [ask(s, response_format=fmt, max_tokens=600) for s in qwen]
        assert got[0] == got[1], schema
        (msg, finish) = got[0]
        assert finish == "stop", (schema, msg)
        assert conforms(json.loads(msg["content"]), schema), (schema, msg["content"])
    before = drafted(qwen[1])
    check()
    assert drafted(qwen[1]) > before            # the speculative server did draft


def drafted(server) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
               for s in f.samples if s.name == "vkspec_drafted_tokens_total")
