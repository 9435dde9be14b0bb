"""One generation turn, seen from the event loop: the turn runs on the
engine thread and its tokens come back through a queue as they are made.
A client that goes away (streaming or not) cancels its turn."""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback

from fastapi import Request

from ..sampling import logprobs as token_logprobs
from .schema import ApiError
from .server import Server
from .text import TextStream

DISCONNECT_POLL_S = 0.1


async def watch(request: Request, cancel: threading.Event):
    """Sets cancel once the client has gone (a non-streaming client is
    otherwise never noticed: nothing is written to it until the end)."""
    while not cancel.is_set():
        await asyncio.sleep(DISCONNECT_POLL_S)
        if await request.is_disconnected():
            cancel.set()


async def run_turn(server: Server, request: Request, prompt: list[int], max_tokens: int, stops, sampler,
                   top: int | None):
    """Yields (kind, delta text, info) as tokens come: ("token", text, logprob
    info or None), then ("end", text, (finish reason, tokens))."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stream = TextStream(server.tokenizer, stops)
    cancel = threading.Event()
    engine, eos, piece = server.engine, server.eos, server.piece

    def put(item):
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:                      # the loop is closed: nobody is waiting
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

    def work():                                   # always ends with one "end" or "error"
        try:
            turn = engine.run(prompt, max_tokens, sampler, on_token, cancel.is_set)
            tail = stream.flush()
            finish = "stop" if stream.stopped or turn.finish == "stop" or sampler.finished else "length"
            put(("end", tail, (finish, len(turn.tokens))))
        except Exception as e:                    # noqa: BLE001 - reported to the client
            traceback.print_exception(e, file=sys.stderr)
            put(("error", f"{type(e).__name__}: {e}".splitlines()[0], None))

    def never_ran(fut):                           # the pool was shut down before the turn's turn
        if fut.cancelled():
            put(("error", "the server is shutting down", None))

    server.active.add(cancel)
    watcher = asyncio.create_task(watch(request, cancel))
    server.engine_pool.submit(work).add_done_callback(never_ran)
    try:
        while True:
            kind, text, info = await queue.get()
            if kind == "error":
                raise ApiError(f"generation failed: {text}", code="internal_error", status=500)
            yield kind, text, info
            if kind == "end":
                break
    finally:
        cancel.set()                              # a client that went away cancels the turn
        server.active.discard(cancel)
        watcher.cancel()
