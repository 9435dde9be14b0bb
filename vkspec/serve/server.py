"""What every route shares: the engine and its tokenizer, the model's name
and chat template, the thread pools, the cancel events of running turns,
the metrics and the grammar compiler; and the request steps the routes have
in common (parsing a body, tokenizing, the context limit).

The event loop only moves bytes: parsing, tokenizing and chat templates run
on text_pool, and everything that takes the engine lock on engine_pool's one
thread (turns, pins), so /health and streams never wait on them."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from ..tokenizer import Tok
from .constraint import Grammars
from .engine import Engine
from .metrics import Metrics
from .schema import ApiError, Message, parse_json, validate
from .text import render_chat
from .tools import family_of, render_messages


@dataclass
class Server:
    engine: Engine
    tokenizer: Tok | None            # None: the model has no tokenizer (token ids only)
    model_name: str
    template: str | None
    metrics: Metrics
    grammars: Grammars
    eos: set[int]
    family: str | None
    engine_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="vkspec-engine"))
    text_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="vkspec-text"))
    active: set[threading.Event] = field(default_factory=set)   # the cancel events of turns not yet ended
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def build(cls, engine, tokenizer, model_name: str, template: str | None) -> Server:
        metrics = Metrics(engine)
        engine.on_turn = metrics.turn
        eos = getattr(engine, "eos", set())
        return cls(engine, tokenizer, model_name, template, metrics,
                   Grammars(tokenizer, engine.model.cfg.vocab_size, eos), eos, family_of(template))

    def shutdown(self):
        for cancel in list(self.active):          # running turns end at their next round
            cancel.set()
        self.engine_pool.shutdown(wait=False, cancel_futures=True)
        self.text_pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, pool, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def body(self, request: Request, cls):
        raw = await request.body()
        return await self.off_loop(self.text_pool, lambda: validate(parse_json(raw), cls))

    def check_model(self, req):
        if req.model != self.model_name:
            raise ApiError(f"model {req.model!r} is not served here (this server has {self.model_name!r})",
                           "model", "model_not_found", status=404)

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < self.engine.model.cfg.vocab_size]
            if bad:
                raise ApiError(f"token id {bad[0]} is out of range", "prompt")
            return list(prompt)
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ApiError("this model has no tokenizer: send token ids", "prompt")
        tk = getattr(tokenizer, "tk", None)
        if hasattr(tk, "encode_batch"):
            # tokenizers' encode holds the GIL for the whole text (/health
            # would stall on a large prompt); encode_batch releases it
            ids = tk.encode_batch([prompt], add_special_tokens=False)[0].ids
            return tokenizer.with_bos(ids) if hasattr(tokenizer, "with_bos") else ids
        return tokenizer.encode(prompt)

    def chat_prompt(self, messages: list[Message], tools=None) -> list[int]:
        if self.template is None:
            raise ApiError("this model has no chat template (tokenizer_config.json)", "messages")
        msgs, extra = render_messages(messages, tools, self.family)
        try:
            text = render_chat(self.template, msgs, extra)
        except Exception as e:                    # noqa: BLE001 - the template's own errors
            raise ApiError(f"the chat template failed: {e}", "messages")
        return self.encode(text)

    async def tokens_of(self, prompt=None, messages=None) -> list[int]:
        if messages is not None:
            return await self.off_loop(self.text_pool, self.chat_prompt, messages)
        return await self.off_loop(self.text_pool, self.encode, prompt)

    def limits(self, prompt: list[int], max_tokens: int | None) -> int:
        """The tokens a turn may generate: max_tokens, checked against the
        room the prompt leaves in the context."""
        if not prompt:
            raise ApiError("the prompt is empty", "prompt")
        ctx = self.engine.ctx
        room = ctx - len(prompt)
        if room < 1:
            raise ApiError(f"the prompt has {len(prompt)} tokens; the context holds {ctx}",
                           "prompt", "context_length_exceeded")
        if max_tokens is None:
            return min(room, 256)
        if max_tokens > room:
            raise ApiError(f"{len(prompt)} prompt tokens + max_tokens {max_tokens} exceed the context "
                           f"of {ctx}", "max_tokens", "context_length_exceeded")
        return max_tokens

    def piece(self, tok: int) -> str:
        return self.tokenizer.decode([tok]) if self.tokenizer else str(tok)
