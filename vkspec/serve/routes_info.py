"""What this server is: /health (up, which model, turns run and cancelled)
and /v1/models (the one model served, with its context length)."""

from __future__ import annotations

from fastapi import FastAPI

from .server import Server


def register(app: FastAPI, server: Server):
    engine, model_name = server.engine, server.model_name

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "turns": engine.turns, "cancelled": engine.cancelled}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": server.created,
                                            "owned_by": "vkspec", "context_length": engine.ctx,
                                            "max_model_len": engine.ctx}]}
