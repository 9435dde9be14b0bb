"""The HTTP app: the Guard in front of every route, OpenAI-style errors, and
the routes, each module with what it serves:

* ``routes_info.py``: /health and /v1/models;
* ``routes_completions.py``: /v1/completions and /v1/chat/completions;
* ``routes_pins.py``: /v1/pins (vkspec's prefix pins);
* ``utility.py``: /tokenize, /detokenize and /metrics.

Every error is an OpenAI-style object ({"error": {"message", "type", "param",
"code"}}) with a 4xx status; the server keeps running. Requests pass the
Guard (guard.py: Host, Origin, API key, JSON only, size) first. What the
routes share (engine, pools, metrics) is one Server (server.py).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from . import routes_completions, routes_info, routes_pins, utility
from .guard import Guard
from .schema import ApiError
from .server import Server


def error(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind,
                                                               "param": param, "code": code}})


def add_error_handlers(app: FastAPI):
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


def create_app(engine, tokenizer, model_name: str, template: str | None, *, api_key: str | None = None,
               max_body: int = 8 << 20, bind_host: str = "127.0.0.1", allow_hosts=()) -> FastAPI:
    server = Server.build(engine, tokenizer, model_name, template)

    @asynccontextmanager
    async def lifespan(app):
        yield
        server.shutdown()

    app = FastAPI(title="vkspec", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.add_middleware(Guard, bind_host=bind_host, allow_hosts=allow_hosts, api_key=api_key, max_body=max_body)
    add_error_handlers(app)
    for routes in (routes_info, utility, routes_completions, routes_pins):
        routes.register(app, server)
    return app
