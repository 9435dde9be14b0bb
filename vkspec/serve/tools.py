"""Tool calling: the tools and the turns around them go into the prompt the
way the model's chat template writes them, and the model's tool-call text
comes back as `tool_calls`.

Each family's convention, found from its own template:
* **hermes**: `<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`,
  results in `<tool_response>` (Qwen3's template writes this; SmolLM2 was
  trained on it, with a JSON list inside the tags, but its template has no
  tools variable).
* **llama3**: a bare JSON object `{"name": .., "parameters": {..}}`, after an
  optional `<|python_tag|>`; results in the `ipython` role (Llama 3.1+).
* **qwen_xml**: `<tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n
  </function>\n</tool_call>` (Qwen3.5's template: strings raw, other values
  as JSON).
* **gemma**: Python calls in a ```` ```tool_code ```` block, results in a
  ```` ```tool_output ```` block (Gemma 3's function-calling guide: its
  template has no tools variable and only alternating user/model turns).
A template that reads `tools` renders them itself (native); for the others
the tools and the format go into the system message, assistant calls are
written as the model would write them and tool results become user turns.
Output that does not parse as calls of the declared tools is content.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from .constraint import check_schema
from .schema import ApiError

HERMES, QWEN_XML, LLAMA3, GEMMA = "hermes", "qwen_xml", "llama3", "gemma"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_CODE = "```tool_code"


@dataclass(frozen=True)
class Family:
    fmt: str
    native: bool            # the template renders `tools`, tool_calls and role tool itself


def family_of(template: str | None) -> Family:
    t = template or ""
    if OPEN in t and "<function=" in t:
        return Family(QWEN_XML, "tools" in t)
    if OPEN in t:
        return Family(HERMES, "tools" in t)
    if "<|python_tag|>" in t or "ipython" in t:
        return Family(LLAMA3, "tools" in t)
    if "<start_of_turn>" in t:
        return Family(GEMMA, False)
    return Family(HERMES, False)


def tool_dicts(tools) -> list[dict]:
    return [t.model_dump(exclude_none=True) for t in tools or []]


def check_tools(tools):
    names = set()
    for i, t in enumerate(tools or []):
        f = t.function
        if f.name in names:
            raise ApiError(f"tools.{i}.function.name: {f.name!r} is declared twice", f"tools.{i}")
        names.add(f.name)
        if f.parameters is not None:
            check_schema(f.parameters, f"tools.{i}.function.parameters")


def arguments_of(call) -> object:
    """A call's arguments as the templates expect them (an object, else the string)."""
    try:
        v = json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments
    return v if isinstance(v, dict) else call.function.arguments


# --- the prompt ------------------------------------------------------------------------------

def system_text(fam: Family, tools: list[dict]) -> str:
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if fam.fmt == GEMMA:
        return ("You have access to functions. If you decide to invoke any of the function(s), you MUST put it "
                "in the format of\n```tool_code\nfunction_name(param=value, ...)\n```\nYou SHOULD NOT include any "
                f"other text in the response if you call a function.\n<functions>\n{listed}\n</functions>")
    if fam.fmt == LLAMA3:
        return ("You have access to the following functions. To call a function, respond with only a JSON object "
                '{"name": function name, "parameters": an object of argument names and values}.\n' + listed)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
            f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each "
            "function call, return a json object with function name and arguments within <tool_call></tool_call> "
            'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def call_text(fam: Family, name: str, args) -> str:
    if fam.fmt == GEMMA:
        kw = ", ".join(f"{k}={v!r}" for k, v in args.items()) if isinstance(args, dict) else ""
        return f"{TOOL_CODE}\n{name}({kw})\n```"
    if fam.fmt == LLAMA3:
        return json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
    return f'{OPEN}\n{json.dumps({"name": name, "arguments": args}, ensure_ascii=False)}\n{CLOSE}'


def result_text(fam: Family, content: str) -> str:
    if fam.fmt == GEMMA:
        return f"```tool_output\n{content}\n```"
    return f"<tool_response>\n{content}\n</tool_response>"


def render_messages(messages, tools, fam: Family) -> tuple[list[dict], dict]:
    """The messages and the extra template variables a chat template gets.
    A tool result must answer a call made before it (else a 400)."""
    tools = tool_dicts(tools)
    calls: set[str] = set()
    out: list[dict] = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise ApiError("only text content parts are supported", "messages")
            content = "".join(p.text or "" for p in content)
        content = content or ""
        if m.role == "tool":
            if m.tool_call_id is None or m.tool_call_id not in calls:
                raise ApiError(f"messages.{i}: a tool result whose tool_call_id {m.tool_call_id!r} answers "
                               "no earlier tool call", f"messages.{i}.tool_call_id")
            if fam.native:
                out.append({"role": "tool", "content": content, "tool_call_id": m.tool_call_id})
            elif out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result_text(fam, content)
            else:
                out.append({"role": "user", "content": result_text(fam, content), "tool_results": True})
            continue
        if m.tool_calls and m.role != "assistant":
            raise ApiError(f"messages.{i}: only an assistant message has tool_calls", f"messages.{i}.tool_calls")
        d = {"role": m.role, "content": content}
        if m.tool_calls:
            calls.update(c.id for c in m.tool_calls)
            if fam.native:
                d["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.function.name, "arguments": arguments_of(c)}}
                                   for c in m.tool_calls]
            else:
                written = "\n".join(call_text(fam, c.function.name, arguments_of(c)) for c in m.tool_calls)
                d["content"] = (content + "\n" if content else "") + written
        out.append(d)
    for d in out:
        d.pop("tool_results", None)
    if not tools:
        return out, {}
    if fam.native:
        return out, {"tools": tools}
    text = system_text(fam, tools)
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, {}


# --- the answer ------------------------------------------------------------------------------

def new_call(name: str, args) -> dict:
    return {"id": "", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def number_calls(calls: list[dict], prefix: str) -> list[dict]:
    """Ids from the request's own id: unique per answer, and the same in a
    run with drafts as without."""
    return [{**c, "id": f"call_{prefix}_{k}"} for k, c in enumerate(calls)]


# --- tool_choice required / named: a grammar ---------------------------------------------------

COMPACT = {"whitespace_flexible": False}


def _params(f) -> dict:
    return f.parameters if f.parameters is not None else {"type": "object"}


def _xml_value(schema: dict) -> str:
    """A parameter's value as Qwen3.5 writes it: a string raw (no markup, one
    line, at most maxLength), anything else as JSON."""
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        return f"/[^<\\n]{{0,{int(schema.get('maxLength', 256))}}}/"
    return "%json " + json.dumps({**schema, "x-guidance": COMPACT})


def _props_required(f) -> tuple[dict, list]:
    p = _params(f)
    return p.get("properties") or {}, p.get("required") or []


def forced_grammar(fam: Family, tools, only: str | None, parallel: bool) -> str:
    """Lark for llguidance: one call of the named tool, or one or more (one
    unless parallel) of any declared tool, written in the family's format."""
    fs = [t.function for t in tools if only is None or t.function.name == only]
    if fam.fmt == GEMMA:
        alts = []
        for f in fs:
            props, req = _props_required(f)
            kws = ' ", " '.join(f'"{k}=" %json {json.dumps({**props.get(k, {}), "x-guidance": COMPACT})}'
                                for k in req if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k))
            alts.append(f'"{f.name}(" {kws} ")"' if kws else f'"{f.name}()"')
        call = '"```tool_code\\n" (' + " | ".join(alts) + ') "\\n```"'
    elif fam.fmt == QWEN_XML:
        alts = []
        for f in fs:
            props, req = _props_required(f)
            params = " ".join(f'"<parameter={k}>\\n" {_xml_value(props.get(k, {}))} "\\n</parameter>\\n"'
                              for k in req if re.fullmatch(r"[A-Za-z0-9_.-]+", k))
            alts.append(f'"<tool_call>\\n<function={f.name}>\\n" {params} "</function>\\n</tool_call>"')
        call = "(" + " | ".join(alts) + ")"
    else:
        key = "parameters" if fam.fmt == LLAMA3 else "arguments"
        one = [{"type": "object", "properties": {"name": {"const": f.name}, key: _params(f)},
                "required": ["name", key], "additionalProperties": False} for f in fs]
        schema = {"anyOf": one, "x-guidance": COMPACT} if len(one) > 1 else {**one[0], "x-guidance": COMPACT}
        call = "%json " + json.dumps(schema)
        if fam.fmt == HERMES:
            call = '"<tool_call>\\n" ' + call + ' "\\n</tool_call>"'
    sep = '"; "' if fam.fmt == LLAMA3 else '"\\n"'
    if parallel and only is None and len(fs) > 1:
        # at most one call per tool: the grammar ends, so a turn that keeps
        # calling cannot run on to max_tokens and lose its calls
        return f"start: call ({sep} call)~0..{len(fs) - 1}\ncall: {call}\n"
    return f"start: {call}\n"


def _json_calls(body: str, names: set[str], key: str) -> list[dict] | None:
    try:
        v = json.loads(body)
    except ValueError:
        return None
    items = v if isinstance(v, list) else [v]
    out = []
    for it in items:
        if not isinstance(it, dict) or it.get("name") not in names:
            return None
        args = it.get(key, it.get("arguments", it.get("parameters", {})))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        out.append(new_call(it["name"], args))
    return out or None


class _JsonNames(ast.NodeTransformer):
    """JSON's true / false / null as Python's: the forced grammar writes
    argument values as JSON, and a model may too."""
    VALUES = {"true": True, "false": False, "null": None}

    def visit_Name(self, node):
        return ast.Constant(self.VALUES[node.id]) if node.id in self.VALUES else node


def _json_names(node):
    return _JsonNames().visit(node)


def _python_calls(body: str, names: set[str]) -> list[dict] | None:
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for c in items:
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in names and not c.args):
            return None
        try:
            args = {k.arg: ast.literal_eval(_json_names(k.value)) for k in c.keywords if k.arg is not None}
            json.dumps(args)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
        out.append(new_call(c.func.id, args))
    return out or None


def _xml_calls(body: str, names) -> list[dict] | None:
    m = re.fullmatch(r"\s*<function=([^>\s]+)>\s*(.*?)</function>\s*", body, flags=re.S)
    if m is None or m.group(1) not in names:
        return None
    props = ((names.get(m.group(1)) or {}).get("properties") or {}) if isinstance(names, dict) else {}
    args, rest = {}, m.group(2)
    for k, v in re.findall(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", rest, flags=re.S):
        args[k] = v if (props.get(k) or {}).get("type") == "string" else _xml_literal(v)
    if re.sub(r"<parameter=([^>\s]+)>.*?</parameter>", "", rest, flags=re.S).strip():
        return None
    return [new_call(m.group(1), args)]


def _xml_literal(v: str):
    try:
        return json.loads(v)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(v.strip(), v)


def parse(text: str, fam: Family, names) -> tuple[str, list[dict]]:
    """(content, tool calls) of a whole answer; text that does not parse is
    content. `names`: the declared tools (a dict name -> parameters schema
    lets Qwen3.5's raw values keep their declared type)."""
    if fam.fmt in (HERMES, QWEN_XML):
        pieces = re.split(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.S)
        if len(pieces) == 1:
            return text, []
        calls = []
        for body in pieces[1::2]:
            got = _json_calls(body.strip(), names, "arguments") if fam.fmt == HERMES else _xml_calls(body, names)
            if got is None:
                return text, []
            calls += got
        return "".join(pieces[0::2]).strip(), calls
    if fam.fmt == LLAMA3:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        got = _json_calls(body, names, "parameters")
        if got is None:
            got = []
            for part in body.split(";"):       # several calls, the way Llama 3.2 separates them
                one = _json_calls(part.strip(), names, "parameters")
                if one is None:
                    return text, []
                got += one
        return "", got
    blocks = re.split(r"```tool_code\s*\n(.*?)(?:```|$)", text, flags=re.S)
    if len(blocks) == 1:               # no block: only a whole answer that is a list of calls
        body = text.strip()
        got = _python_calls(body, names) if body.startswith("[") else None
        return ("", got) if got else (text, [])
    calls = []
    for body in blocks[1::2]:
        for line in [x for x in body.strip().splitlines() if x.strip()]:
            got = _python_calls(line, names)
            if got is None:
                return text, []
            calls += got
    return ("".join(blocks[0::2]).strip(), calls) if calls else (text, [])


class ToolStream:
    """Streams content until a tool call may be starting; from there the text
    is held and parsed at the end (calls go out as tool_calls deltas, text
    that does not parse as content). Depends on the text alone, so a run with
    drafts streams the frames of a run without."""

    def __init__(self, fam: Family, names: set[str]):
        self.fam, self.names = fam, names
        self.text, self.sent, self.holding = "", 0, False

    def push(self, delta: str) -> str:
        self.text += delta
        if self.holding:
            return ""
        start = self._start()
        if start is not None:
            self.holding = True
            end = start
        else:
            end = len(self.text) - self._partial()
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def _markers(self):
        if self.fam.fmt in (HERMES, QWEN_XML):
            return [OPEN]
        if self.fam.fmt == GEMMA:
            return [TOOL_CODE]
        return ["<|python_tag|>"]

    def _start(self):
        body = self.text.lstrip()
        if self.fam.fmt == LLAMA3 and body.startswith("{") and not self.text[:self.sent].strip():
            return self.sent
        if self.fam.fmt == GEMMA and body.startswith("[") and not self.text[:self.sent].strip():
            return self.sent
        found = [i for i in (self.text.find(m, max(0, self.sent - len(m))) for m in self._markers()) if i >= 0]
        return min(found) if found else None

    def _partial(self) -> int:
        """Characters at the end that could begin a marker (or, before any
        content, a bare call)."""
        if not self.text[:self.sent].strip() and self.fam.fmt in (LLAMA3, GEMMA) and not self.text.strip():
            return len(self.text) - self.sent
        for m in self._markers():
            for k in range(min(len(m) - 1, len(self.text) - self.sent), 0, -1):
                if m.startswith(self.text[len(self.text) - k:]):
                    return k
        return 0

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, tool calls)."""
        rest = self.text[self.sent:]
        if not self.holding:
            return rest, []
        content, calls = parse(rest, self.fam, self.names)
        return (content if calls else rest), calls
