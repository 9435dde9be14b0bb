"""The HTTP routes: /v1/completions, /v1/chat/completions (streaming and not),
/v1/models, /health, and /v1/pins (vkspec's prefix pins); utility.py adds
/tokenize, /detokenize and /metrics.

Every error is an OpenAI-style object ({"error": {"message", "type", "param",
"code"}}) with a 4xx status; the server keeps running. Requests pass the
Guard (guard.py: Host, Origin, API key, JSON only, size) first.

The event loop only moves bytes: parsing, tokenizing and chat templates run
on a small pool of their own, and everything that takes the engine lock on
one engine thread (turns, pins), so /health and streams never wait on them.
A client that goes away (streaming or not) cancels its turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..sampling import logprobs as token_logprobs
from .constraint import Grammars, response_constraint
from .controls import samplers
from .guard import Guard
from .metrics import Metrics
from .schema import (ApiError, ChatRequest, CompletionRequest, Message, NamedToolChoice, PinRequest,
                     parse_json, validate)
from .store import BudgetError
from .text import TextStream, render_chat
from .tools import ToolStream, check_tools, family_of, forced_grammar, number_calls, parse, render_messages
from .utility import add_utility_routes

DISCONNECT_POLL_S = 0.1


def error(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind,
                                                               "param": param, "code": code}})


def create_app(engine, tokenizer, model_name: str, template: str | None, *, api_key: str | None = None,
               max_body: int = 8 << 20, bind_host: str = "127.0.0.1", allow_hosts=()) -> FastAPI:
    engine_pool = ThreadPoolExecutor(1, thread_name_prefix="vkspec-engine")
    text_pool = ThreadPoolExecutor(2, thread_name_prefix="vkspec-text")
    active: set[threading.Event] = set()         # the cancel events of turns not yet ended

    @asynccontextmanager
    async def lifespan(app):
        yield
        for cancel in list(active):               # shutting down: running turns end at their next round
            cancel.set()
        engine_pool.shutdown(wait=False, cancel_futures=True)
        text_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="vkspec", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.add_middleware(Guard, bind_host=bind_host, allow_hosts=allow_hosts, api_key=api_key, max_body=max_body)
    created = int(time.time())
    metrics = Metrics(engine)
    engine.on_turn = metrics.turn

    async def off_loop(pool, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def body(request: Request, cls):
        raw = await request.body()
        return await off_loop(text_pool, lambda: validate(parse_json(raw), cls))

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error(e.status, e.message, e.param, e.code,
                     kind="server_error" if e.status >= 500 else "invalid_request_error")

    @app.exception_handler(404)
    async def _not_found(request, e):
        return error(404, f"no route {request.url.path}", code="not_found")

    @app.exception_handler(405)
    async def _bad_method(request, e):
        return error(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")

    @app.exception_handler(Exception)
    async def _bug(request, e):                   # a bug: one line to the client (uvicorn logs the traceback)
        return error(500, f"internal error: {type(e).__name__}", code="internal_error", kind="server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "turns": engine.turns, "cancelled": engine.cancelled}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "vkspec", "context_length": engine.ctx,
                                            "max_model_len": engine.ctx}]}

    def encode(prompt) -> list[int]:
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < engine.model.cfg.vocab_size]
            if bad:
                raise ApiError(f"token id {bad[0]} is out of range", "prompt")
            return list(prompt)
        if tokenizer is None:
            raise ApiError("this model has no tokenizer: send token ids", "prompt")
        tk = getattr(tokenizer, "tk", None)
        if hasattr(tk, "encode_batch"):
            # tokenizers' encode holds the GIL for the whole text (seconds for
            # megabytes: /health would stall); encode_batch releases it
            ids = tk.encode_batch([prompt], add_special_tokens=False)[0].ids
            return tokenizer.with_bos(ids) if hasattr(tokenizer, "with_bos") else ids
        return tokenizer.encode(prompt)

    eos = getattr(engine, "eos", set())
    family = family_of(template)
    grammars = Grammars(tokenizer, engine.model.cfg.vocab_size, eos)

    def chat_prompt(messages: list[Message], tools=None) -> list[int]:
        if template is None:
            raise ApiError("this model has no chat template (tokenizer_config.json)", "messages")
        msgs, extra = render_messages(messages, tools, family)
        try:
            text = render_chat(template, msgs, extra)
        except Exception as e:                    # noqa: BLE001 - the template's own errors
            raise ApiError(f"the chat template failed: {e}", "messages")
        return encode(text)

    async def tokens_of(prompt=None, messages=None) -> list[int]:
        if messages is not None:
            return await off_loop(text_pool, chat_prompt, messages)
        return await off_loop(text_pool, encode, prompt)

    def plan(req, chat: bool):
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
        constraint = response_constraint(req, grammars)
        if only is not None or choice == "required":
            if constraint is not None:
                raise ApiError("a forced tool call and response_format / grammar exclude each other",
                               "tool_choice")
            constraint = grammars.lark_text(forced_grammar(family, tools, only, req.parallel_tool_calls),
                                            "tool_choice")
        prompt = chat_prompt(req.messages, tools) if chat else encode(req.prompt)
        return prompt, constraint, (names or None)

    def check_model(req):
        if req.model != model_name:
            raise ApiError(f"model {req.model!r} is not served here (this server has {model_name!r})",
                           "model", "model_not_found", status=404)

    def limits(prompt: list[int], max_tokens: int | None) -> int:
        if not prompt:
            raise ApiError("the prompt is empty", "prompt")
        room = engine.ctx - len(prompt)
        if room < 1:
            raise ApiError(f"the prompt has {len(prompt)} tokens; the context holds {engine.ctx}",
                           "prompt", "context_length_exceeded")
        if max_tokens is None:
            return min(room, 256)
        if max_tokens > room:
            raise ApiError(f"{len(prompt)} prompt tokens + max_tokens {max_tokens} exceed the context "
                           f"of {engine.ctx}", "max_tokens", "context_length_exceeded")
        return max_tokens

    def piece(tok: int) -> str:
        return tokenizer.decode([tok]) if tokenizer else str(tok)

    async def watch(request: Request, cancel: threading.Event):
        """Sets cancel once the client has gone (a non-streaming client is
        otherwise never noticed: nothing is written to it until the end)."""
        while not cancel.is_set():
            await asyncio.sleep(DISCONNECT_POLL_S)
            if await request.is_disconnected():
                cancel.set()

    async def run_turn(request, prompt, max_tokens, req, sampler, top: int | None):
        """Yields (kind, delta text, info) as tokens come: ("token", text, logprob
        info or None), then ("end", text, (finish reason, tokens))."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stream = TextStream(tokenizer, req.stops)
        cancel = threading.Event()

        def put(item):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:                  # the loop is closed: nobody is waiting
                pass

        def on_token(tok, row):
            # an end-of-sequence token ends the turn; its text ("<|im_end|>") is no part of the answer
            delta = "" if tok in eos else stream.push(tok)
            info = None
            if top is not None:
                lp, best = token_logprobs(row, tok, top)
                info = (piece(tok), lp, [(piece(t), v) for t, v in best])
            put(("token", delta, info))
            return stream.stopped or sampler.finished

        def work():                               # always ends with one "end" or "error"
            try:
                turn = engine.run(prompt, max_tokens, sampler, on_token, cancel.is_set)
                tail = stream.flush()
                finish = "stop" if stream.stopped or turn.finish == "stop" or sampler.finished else "length"
                put(("end", tail, (finish, len(turn.tokens))))
            except Exception as e:                # noqa: BLE001 - reported to the client
                traceback.print_exception(e, file=sys.stderr)
                put(("error", f"{type(e).__name__}: {e}".splitlines()[0], None))

        def never_ran(fut):                       # the pool was shut down before the turn's turn
            if fut.cancelled():
                put(("error", "the server is shutting down", None))

        active.add(cancel)
        watcher = asyncio.create_task(watch(request, cancel))
        engine_pool.submit(work).add_done_callback(never_ran)
        try:
            while True:
                kind, text, info = await queue.get()
                if kind == "error":
                    raise ApiError(f"generation failed: {text}", code="internal_error", status=500)
                yield kind, text, info
                if kind == "end":
                    break
        finally:
            cancel.set()                          # a client that went away cancels the turn
            active.discard(cancel)
            watcher.cancel()

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

    async def respond(request, req, prompt, constraint, names, chat: bool):
        check_model(req)
        max_tokens = limits(prompt, getattr(req, "max_completion_tokens", None) or req.max_tokens)
        if chat:
            top = (req.top_logprobs or 0) if req.logprobs else None
        else:
            top = req.logprobs
        # everything that can refuse the request happens before the first byte is sent
        choices = await off_loop(text_pool, samplers, req, prompt, engine.model.cfg.vocab_size, constraint)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def chunk(choice, usage=None):
            d = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": now,
                 "model": model_name, "choices": [choice] if choice is not None else []}
            if usage is not None:
                d["usage"] = usage
            return "data: " + json.dumps(d) + "\n\n"

        def usage(n_out):
            return {"prompt_tokens": len(prompt), "completion_tokens": n_out, "total_tokens": len(prompt) + n_out}

        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage

            async def events():
                n_out = 0
                try:
                    for index, sampler in enumerate(choices):      # one after another
                        tools = ToolStream(family, names) if names else None
                        if chat:
                            yield chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None})
                        async for kind, text, info in run_turn(request, prompt, max_tokens, req, sampler, top):
                            if tools is not None:
                                text = tools.push(text)
                            if kind == "token":
                                if not text and info is None:
                                    continue
                                if chat:
                                    yield chunk({"index": index, "delta": {"content": text},
                                                 "logprobs": chat_logprobs(info), "finish_reason": None})
                                else:
                                    yield chunk({"index": index, "text": text,
                                                 "logprobs": completion_logprobs([info] if info else []),
                                                 "finish_reason": None})
                            else:
                                finish, n = info
                                n_out += n
                                if chat:
                                    calls = []
                                    if tools is not None:
                                        rest, calls = tools.finish()
                                        text += rest
                                    if text:
                                        yield chunk({"index": index, "delta": {"content": text},
                                                     "logprobs": None, "finish_reason": None})
                                    for k, c in enumerate(number_calls(calls, f"{rid[-12:]}_{index}")):
                                        yield chunk({"index": index, "delta": {"tool_calls": [{"index": k, **c}]},
                                                     "logprobs": None, "finish_reason": None})
                                    yield chunk({"index": index, "delta": {}, "logprobs": None,
                                                 "finish_reason": "tool_calls" if calls else finish})
                                else:
                                    yield chunk({"index": index, "text": text, "logprobs": None,
                                                 "finish_reason": finish})
                    if include_usage:
                        yield chunk(None, usage(n_out))
                except Exception as e:            # noqa: BLE001 - the stream ends with an error frame
                    if not isinstance(e, ApiError):
                        traceback.print_exception(e, file=sys.stderr)
                    msg = e.message if isinstance(e, ApiError) else f"internal error: {type(e).__name__}"
                    yield "data: " + json.dumps({"error": {"message": msg, "type": "server_error",
                                                           "param": None, "code": "internal_error"}}) + "\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        out, n_out = [], 0
        for index, sampler in enumerate(choices):
            text, infos, finish = "", [], "length"
            async for kind, delta, info in run_turn(request, prompt, max_tokens, req, sampler, top):
                text += delta
                if kind == "token" and info is not None:
                    infos.append(info)
                if kind == "end":
                    finish, n = info
                    n_out += n
            if chat:
                lp = {"content": [c for i in infos for c in chat_logprobs(i)["content"]]} \
                    if top is not None else None
                message = {"role": "assistant", "content": text}
                if names:
                    content, calls = parse(text, family, names)
                    if calls:
                        message = {"role": "assistant", "content": content or None,
                                   "tool_calls": number_calls(calls, f"{rid[-12:]}_{index}")}
                        finish = "tool_calls"
                out.append({"index": index, "message": message, "logprobs": lp, "finish_reason": finish})
            else:
                out.append({"index": index, "text": text, "logprobs": completion_logprobs(infos),
                            "finish_reason": finish})
        return {"id": rid, "object": obj, "created": now, "model": model_name, "choices": out,
                "usage": usage(n_out)}

    add_utility_routes(app, engine=engine, tokenizer=tokenizer, model_name=model_name, metrics=metrics,
                       body=body, off_loop=off_loop, text_pool=text_pool)

    @app.post("/v1/completions")
    async def completions(request: Request):
        metrics.request("completions")
        req = await body(request, CompletionRequest)
        check_model(req)
        return await respond(request, req, *await off_loop(text_pool, plan, req, False), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        metrics.request("chat_completions")
        req = await body(request, ChatRequest)
        check_model(req)
        return await respond(request, req, *await off_loop(text_pool, plan, req, True), chat=True)

    @app.post("/v1/pins")
    async def pin(request: Request):
        req = await body(request, PinRequest)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError("a pin needs exactly one of prompt and messages", "prompt")
        toks = await tokens_of(prompt=req.prompt, messages=req.messages)
        limits(toks, 1)
        try:
            saved = await off_loop(engine_pool, engine.pin, req.name, toks)
        except BudgetError as e:
            raise ApiError(str(e), "name", "state_budget_exceeded") from None
        return {"name": req.name, "tokens": len(saved.fed), "bytes": saved.nbytes}

    @app.get("/v1/pins")
    async def list_pins():
        return {"object": "list", **await asyncio.to_thread(engine.pins)}

    @app.delete("/v1/pins/{name}")
    async def unpin(name: str):
        if not await asyncio.to_thread(engine.unpin, name):
            raise ApiError(f"no pin {name!r}", "name", "not_found", status=404)
        return {"name": name, "deleted": True}

    return app
