"""/v1/pins: vkspec's prefix pins. POST saves the state after a prompt (or
chat messages) under a name, so later turns that start with it skip its
prefill; GET lists the pins, DELETE /v1/pins/{name} drops one.

Saving a pin runs a prefill, so it waits its turn on the engine thread;
listing and deleting touch only the pin store, on a worker thread, so they
never wait for a running turn."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from .schema import ApiError, PinRequest
from .server import Server
from .store import BudgetError


def register(app: FastAPI, server: Server):
    engine = server.engine

    @app.post("/v1/pins")
    async def pin(request: Request):
        req = await server.body(request, PinRequest)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError("a pin needs exactly one of prompt and messages", "prompt")
        toks = await server.tokens_of(prompt=req.prompt, messages=req.messages)
        server.limits(toks, 1)
        try:
            saved = await server.off_loop(server.engine_pool, engine.pin, req.name, toks)
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
