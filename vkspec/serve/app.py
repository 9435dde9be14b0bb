"""The HTTP routes: /v1/completions, /v1/chat/completions (streaming and not),
/v1/models, /health, and /v1/pins (vkspec's prefix pins).

Every error is an OpenAI-style object ({"error": {"message", "type", "param",
"code"}}) with a 4xx status; the server keeps running."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import uuid
from typing import Literal, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..sampling import Sampler, logprobs as token_logprobs
from .text import TextStream, render_chat


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind,
                                                               "param": param, "code": code}})


class Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: dict | None = None
    n: int = Field(1, ge=1, le=1)
    user: str | None = None
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)


class CompletionRequest(Common):
    prompt: Union[str, list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: Literal[False] = False


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[str, list[dict], None] = None
    name: str | None = None


class ChatRequest(Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    prompt: Union[str, list[int], None] = None
    messages: list[Message] | None = None


def _validation_message(e: ValidationError):
    err = e.errors()[0]
    param = ".".join(str(x) for x in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return f"unknown field {param!r}", param
    return f"{param}: {err['msg']}", param


def create_app(engine, tokenizer, model_name: str, template: str | None) -> FastAPI:
    app = FastAPI(title="vkspec", docs_url=None, redoc_url=None)
    created = int(time.time())

    async def body(request: Request, cls):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(f"the body is not valid JSON ({e})")
        if not isinstance(data, dict):
            raise ApiError("the body must be a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            msg, param = _validation_message(e)
            raise ApiError(msg, param)

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error(e.status, e.message, e.param, e.code)

    @app.exception_handler(404)
    async def _not_found(request, e):
        return error(404, f"no route {request.url.path}", code="not_found")

    @app.exception_handler(405)
    async def _bad_method(request, e):
        return error(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "turns": engine.turns}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "vkspec"}]}

    def encode(prompt) -> list[int]:
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < engine.model.cfg.vocab_size]
            if bad:
                raise ApiError(f"token id {bad[0]} is out of range", "prompt")
            return list(prompt)
        if tokenizer is None:
            raise ApiError("this model has no tokenizer: send token ids", "prompt")
        return tokenizer.encode(prompt)

    def chat_prompt(messages: list[Message]) -> list[int]:
        if template is None:
            raise ApiError("this model has no chat template (tokenizer_config.json)", "messages")
        msgs = []
        for m in messages:
            content = m.content
            if isinstance(content, list):
                if any(p.get("type") != "text" for p in content):
                    raise ApiError("only text content parts are supported", "messages")
                content = "".join(p.get("text", "") for p in content)
            msgs.append({"role": m.role, "content": content or ""})
        try:
            text = render_chat(template, msgs)
        except Exception as e:
            raise ApiError(f"the chat template failed: {e}", "messages")
        return encode(text)

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

    async def run_turn(prompt, max_tokens, req, top: int | None, chat: bool):
        """Yields (delta text, logprob info or None, finish reason or None) as tokens come."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        stream = TextStream(tokenizer, stops)
        cancel = threading.Event()
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        sampler = Sampler(temperature=req.temperature, top_p=req.top_p, seed=seed)

        def on_token(tok, row):
            delta = stream.push(tok)
            info = None
            if top is not None:
                lp, best = token_logprobs(row, tok, top)
                info = (piece(tok), lp, [(piece(t), v) for t, v in best])
            loop.call_soon_threadsafe(queue.put_nowait, ("token", delta, info))
            return stream.stopped

        def work():
            try:
                turn = engine.run(prompt, max_tokens, sampler, on_token, cancel.is_set)
                tail = stream.flush()
                finish = "stop" if stream.stopped or turn.finish == "stop" else "length"
                loop.call_soon_threadsafe(queue.put_nowait, ("end", tail, (finish, len(turn.tokens))))
            except BaseException as e:                          # noqa: BLE001 - reported to the client
                loop.call_soon_threadsafe(queue.put_nowait, ("error", str(e), None))

        task = loop.run_in_executor(None, work)
        try:
            while True:
                kind, text, info = await queue.get()
                if kind == "error":
                    raise ApiError(f"generation failed: {text}", code="internal_error", status=500)
                yield kind, text, info
                if kind == "end":
                    break
        finally:
            cancel.set()                       # a client that went away cancels the turn

    def chat_logprobs(info):
        if info is None:
            return None
        tok, lp, best = info
        return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                             "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
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

    async def respond(req, prompt, chat: bool):
        check_model(req)
        max_tokens = limits(prompt, getattr(req, "max_completion_tokens", None) or req.max_tokens)
        if chat:
            top = (req.top_logprobs or 0) if req.logprobs else None
        else:
            top = req.logprobs
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def chunk(choice, usage=None):
            d = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": now,
                 "model": model_name, "choices": [choice] if choice is not None else []}
            if usage is not None:
                d["usage"] = usage
            return "data: " + json.dumps(d) + "\n\n"

        if req.stream:
            include_usage = bool((req.stream_options or {}).get("include_usage"))

            async def events():
                if chat:
                    yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None})
                try:
                    async for kind, text, info in run_turn(prompt, max_tokens, req, top, chat):
                        if kind == "token":
                            if not text and info is None:
                                continue
                            if chat:
                                yield chunk({"index": 0, "delta": {"content": text},
                                             "logprobs": chat_logprobs(info), "finish_reason": None})
                            else:
                                yield chunk({"index": 0, "text": text,
                                             "logprobs": completion_logprobs([info] if info else []),
                                             "finish_reason": None})
                        else:
                            finish, n_out = info
                            if chat:
                                if text:
                                    yield chunk({"index": 0, "delta": {"content": text}, "logprobs": None,
                                                 "finish_reason": None})
                                yield chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish})
                            else:
                                yield chunk({"index": 0, "text": text, "logprobs": None,
                                             "finish_reason": finish})
                            if include_usage:
                                yield chunk(None, {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                                                   "total_tokens": len(prompt) + n_out})
                except ApiError as e:
                    yield "data: " + json.dumps({"error": {"message": e.message, "type": "server_error",
                                                           "param": None, "code": e.code}}) + "\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        text, infos, finish, n_out = "", [], "length", 0
        async for kind, delta, info in run_turn(prompt, max_tokens, req, top, chat):
            text += delta
            if kind == "token" and info is not None:
                infos.append(info)
            if kind == "end":
                finish, n_out = info
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out, "total_tokens": len(prompt) + n_out}
        if chat:
            lp = {"content": [c for i in infos for c in chat_logprobs(i)["content"]]} if top is not None else None
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": completion_logprobs(infos), "finish_reason": finish}
        return {"id": rid, "object": obj, "created": now, "model": model_name, "choices": [choice],
                "usage": usage}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await body(request, CompletionRequest)
        return await respond(req, encode(req.prompt), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await body(request, ChatRequest)
        return await respond(req, chat_prompt(req.messages), chat=True)

    @app.post("/v1/pins")
    async def pin(request: Request):
        req = await body(request, PinRequest)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError("a pin needs exactly one of prompt and messages", "prompt")
        toks = chat_prompt(req.messages) if req.messages is not None else encode(req.prompt)
        limits(toks, 1)
        n = await asyncio.get_running_loop().run_in_executor(None, engine.pin, req.name, toks)
        return {"name": req.name, "tokens": n}

    @app.delete("/v1/pins/{name}")
    async def unpin(name: str):
        if not engine.unpin(name):
            raise ApiError(f"no pin {name!r}", "name", "not_found", status=404)
        return {"name": name, "deleted": True}

    return app
