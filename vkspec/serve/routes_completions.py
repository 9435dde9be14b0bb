"""/v1/completions and /v1/chat/completions, streaming (server-sent events)
and not: n choices one after another, logprobs, stop strings, structured
output and tool calls.

Everything that can refuse a request (a 400 or 404) happens before its
first byte is sent; a turn that fails once streaming has begun ends the
stream with an error frame, then [DONE]."""

from __future__ import annotations

import json
import sys
import time
import traceback
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from .constraint import response_constraint
from .controls import samplers
from .schema import ApiError, ChatRequest, CompletionRequest, NamedToolChoice
from .server import Server
from .tools import ToolStream, check_tools, forced_grammar, number_calls, parse
from .turns import run_turn


def plan(server: Server, req, chat: bool):
    """(prompt, constraint factory, tool names to parse or None); every
    refusal (a 400) happens here, off the event loop."""
    tools, choice = (req.tools, req.tool_choice) if chat else (None, None)
    check_tools(tools)
    if choice is not None and choice != "none" and not tools:
        raise ApiError("tool_choice needs tools", "tool_choice")
    if choice == "none":
        tools = None
    names = {t.function.name: t.function.parameters for t in tools or []}
    only = choice.function.name if isinstance(choice, NamedToolChoice) else None
    if only is not None and only not in names:
        raise ApiError(f"tool_choice names {only!r}, which is not among the tools", "tool_choice")
    constraint = response_constraint(req, server.grammars)
    if only is not None or choice == "required":
        if constraint is not None:
            raise ApiError("a forced tool call and response_format / grammar exclude each other",
                           "tool_choice")
        constraint = server.grammars.lark_text(
            forced_grammar(server.family, tools, only, req.parallel_tool_calls), "tool_choice")
    prompt = server.chat_prompt(req.messages, tools) if chat else server.encode(req.prompt)
    return prompt, constraint, (names or None)


def chat_logprobs(info):
    if info is None:
        return None
    tok, lp, best = info
    return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8", "replace")),
                         "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8", "replace"))}
                                          for t, v in best]}]}


def completion_logprobs(infos, offset0=0):
    if not infos:
        return None
    toks = [i[0] for i in infos]
    offsets, pos = [], offset0
    for t in toks:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": toks, "token_logprobs": [i[1] for i in infos],
            "top_logprobs": [dict(i[2]) for i in infos], "text_offset": offsets}


@dataclass
class Reply:
    """One request's answer in the making: its id, its samplers (one a
    choice) and the tokens generated so far over all choices (for usage)."""
    server: Server
    request: Request
    req: CompletionRequest | ChatRequest
    chat: bool
    prompt: list[int]
    names: dict | None
    max_tokens: int
    top: int | None
    choices: list
    rid: str
    created: int
    n_out: int = 0

    @classmethod
    async def start(cls, server: Server, request: Request, req, chat: bool, prompt, constraint, names):
        max_tokens = server.limits(prompt, getattr(req, "max_completion_tokens", None) or req.max_tokens)
        if chat:
            top = (req.top_logprobs or 0) if req.logprobs else None
        else:
            top = req.logprobs
        choices = await server.off_loop(server.text_pool, samplers, req, prompt,
                                        server.engine.model.cfg.vocab_size, constraint)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        return cls(server, request, req, chat, prompt, names, max_tokens, top, choices, rid, int(time.time()))

    @property
    def object_type(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def turn(self, sampler):
        return run_turn(self.server, self.request, self.prompt, self.max_tokens, self.req.stops, sampler, self.top)

    def call_id(self, index: int) -> str:
        return f"{self.rid[-12:]}_{index}"

    def usage(self):
        n = len(self.prompt)
        return {"prompt_tokens": n, "completion_tokens": self.n_out, "total_tokens": n + self.n_out}

    def chunk(self, choice, usage=None) -> str:
        d = {"id": self.rid, "object": self.object_type + (".chunk" if self.chat else ""), "created": self.created,
             "model": self.server.model_name, "choices": [choice] if choice is not None else []}
        if usage is not None:
            d["usage"] = usage
        return "data: " + json.dumps(d) + "\n\n"


# --- streaming -------------------------------------------------------------------------------

def stream_token(reply: Reply, index: int, text: str, info) -> str:
    if reply.chat:
        return reply.chunk({"index": index, "delta": {"content": text},
                            "logprobs": chat_logprobs(info), "finish_reason": None})
    return reply.chunk({"index": index, "text": text, "logprobs": completion_logprobs([info] if info else []),
                        "finish_reason": None})


def stream_end(reply: Reply, index: int, text: str, finish: str, tools: ToolStream | None):
    """The last frames of a choice: the text held back, then its tool calls
    one by one, then the finish reason."""
    if not reply.chat:
        yield reply.chunk({"index": index, "text": text, "logprobs": None, "finish_reason": finish})
        return
    calls = []
    if tools is not None:
        rest, calls = tools.finish()
        text += rest
    if text:
        yield reply.chunk({"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None})
    for k, c in enumerate(number_calls(calls, reply.call_id(index))):
        yield reply.chunk({"index": index, "delta": {"tool_calls": [{"index": k, **c}]},
                           "logprobs": None, "finish_reason": None})
    yield reply.chunk({"index": index, "delta": {}, "logprobs": None,
                       "finish_reason": "tool_calls" if calls else finish})


async def stream_choice(reply: Reply, index: int, sampler):
    tools = ToolStream(reply.server.family, reply.names) if reply.names else None
    if reply.chat:
        yield reply.chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                           "logprobs": None, "finish_reason": None})
    async for kind, text, info in reply.turn(sampler):
        if tools is not None:
            text = tools.push(text)
        if kind == "token":
            if text or info is not None:
                yield stream_token(reply, index, text, info)
            continue
        finish, n = info
        reply.n_out += n
        for frame in stream_end(reply, index, text, finish, tools):
            yield frame


async def events(reply: Reply):
    include_usage = reply.req.stream_options is not None and reply.req.stream_options.include_usage
    try:
        for index, sampler in enumerate(reply.choices):      # one after another
            async for frame in stream_choice(reply, index, sampler):
                yield frame
        if include_usage:
            yield reply.chunk(None, reply.usage())
    except Exception as e:                        # noqa: BLE001 - the stream ends with an error frame
        if not isinstance(e, ApiError):
            traceback.print_exception(e, file=sys.stderr)
        msg = e.message if isinstance(e, ApiError) else f"internal error: {type(e).__name__}"
        yield "data: " + json.dumps({"error": {"message": msg, "type": "server_error",
                                               "param": None, "code": "internal_error"}}) + "\n\n"
    yield "data: [DONE]\n\n"


# --- one JSON answer -------------------------------------------------------------------------

def whole_choice(reply: Reply, index: int, text: str, infos: list, finish: str) -> dict:
    if not reply.chat:
        return {"index": index, "text": text, "logprobs": completion_logprobs(infos), "finish_reason": finish}
    lp = {"content": [c for i in infos for c in chat_logprobs(i)["content"]]} if reply.top is not None else None
    message = {"role": "assistant", "content": text}
    if reply.names:
        content, calls = parse(text, reply.server.family, reply.names)
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": number_calls(calls, reply.call_id(index))}
            finish = "tool_calls"
    return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}


async def collect(reply: Reply) -> dict:
    out = []
    for index, sampler in enumerate(reply.choices):
        text, infos, finish = "", [], "length"
        async for kind, delta, info in reply.turn(sampler):
            text += delta
            if kind == "token" and info is not None:
                infos.append(info)
            if kind == "end":
                finish, n = info
                reply.n_out += n
        out.append(whole_choice(reply, index, text, infos, finish))
    return {"id": reply.rid, "object": reply.object_type, "created": reply.created, "model": reply.server.model_name,
            "choices": out, "usage": reply.usage()}


async def respond(server: Server, request: Request, cls, chat: bool):
    req = await server.body(request, cls)
    server.check_model(req)
    reply = await Reply.start(server, request, req, chat,
                              *await server.off_loop(server.text_pool, plan, server, req, chat))
    if req.stream:
        return StreamingResponse(events(reply), media_type="text/event-stream")
    return await collect(reply)


def register(app: FastAPI, server: Server):
    @app.post("/v1/completions")
    async def completions(request: Request):
        server.metrics.request("completions")
        return await respond(server, request, CompletionRequest, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        server.metrics.request("chat_completions")
        return await respond(server, request, ChatRequest, chat=True)
