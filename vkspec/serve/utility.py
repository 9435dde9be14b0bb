"""The routes around generation: /tokenize and /detokenize (llama-server's
shapes, also under /v1 where the openai client's base URL points) and
/metrics (Prometheus text)."""

from __future__ import annotations

from fastapi import Request, Response

from .metrics import CONTENT_TYPE
from .schema import ApiError, DetokenizeRequest, TokenizeRequest
from .server import Server


def register(app, server: Server):
    engine, tokenizer, model_name, metrics = server.engine, server.tokenizer, server.model_name, server.metrics

    def check(req):
        if req.model is not None and req.model != model_name:
            raise ApiError(f"model {req.model!r} is not served here (this server has {model_name!r})",
                           "model", "model_not_found", status=404)
        if tokenizer is None:
            raise ApiError("this model has no tokenizer", code="no_tokenizer")

    def tokenize(req: TokenizeRequest):
        check(req)
        if (req.content is None) == (req.prompt is None):
            raise ApiError("send exactly one of content and prompt", "content")
        text = req.content if req.content is not None else req.prompt
        ids = tokenizer.tk.encode(text, add_special_tokens=False).ids
        if req.add_special and hasattr(tokenizer, "with_bos"):
            ids = tokenizer.with_bos(ids)
        if req.with_pieces:
            return {"tokens": [{"id": t, "piece": tokenizer.decode([t])} for t in ids]}
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.ctx}

    def detokenize(req: DetokenizeRequest):
        check(req)
        vocab = engine.model.cfg.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"token id {bad[0]} is out of range (the vocabulary has {vocab})", "tokens")
        return {"content": tokenizer.decode(req.tokens), "prompt": tokenizer.decode(req.tokens)}

    async def tokenize_route(request: Request):
        metrics.request("tokenize")
        req = await server.body(request, TokenizeRequest)
        return await server.off_loop(server.text_pool, tokenize, req)

    async def detokenize_route(request: Request):
        metrics.request("detokenize")
        req = await server.body(request, DetokenizeRequest)
        return await server.off_loop(server.text_pool, detokenize, req)

    for prefix in ("", "/v1"):
        app.add_api_route(prefix + "/tokenize", tokenize_route, methods=["POST"])
        app.add_api_route(prefix + "/detokenize", detokenize_route, methods=["POST"])

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)
