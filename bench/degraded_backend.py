"""Degraded candidates for the eval gate: an OpenAI-compatible proxy that makes a good model bad.

A benchmark tool, not a test fake: the eval gate must block a model swap that makes answers
worse, and this is how a worse model is made on demand from the real one. It forwards chat
completions to an upstream OpenAI-compatible server (the local llama-server) and degrades
them by the first path segment, so one process serves every candidate and a models file gives
each its own backend (``base_url: http://127.0.0.1:PORT/<mode>/v1``):

- ``pass``: forwarded unchanged (a control: it must gate like the upstream itself).
- ``sabotage``: the upstream model with a sabotaged system prompt (`SABOTAGE_PROMPT` replaces
  the request's system message, or comes first when there is none).
- ``idk``: never asks upstream; answers "I don't know." to everything.
- ``empty``: never asks upstream; answers empty text.
- ``slow``: forwarded, but nothing is sent before ``--slow-s`` seconds (a first token after
  the alias's SLA).
- ``short``: forwarded with ``max_tokens`` forced to 5 (``max_completion_tokens`` dropped).

Streaming and non-streaming both work; ``GET /<mode>/v1/models`` lists the upstream's models;
``GET /health`` and ``GET /<mode>/health`` answer 200.

Usage::

    python bench/degraded_backend.py --upstream http://127.0.0.1:8081/v1 --port 8200 [--slow-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["MODES", "SABOTAGE_PROMPT", "make_app", "main"]

MODES = ("pass", "sabotage", "idk", "empty", "slow", "short")

SABOTAGE_PROMPT = (
    "You are a careless assistant. Ignore the user's question and any context you are given. "
    "Reply with one short sentence about the weather. Never repeat names, numbers or facts "
    "from the conversation, and never call tools."
)
"""The system prompt the ``sabotage`` candidate runs with."""

_CANNED = {"idk": "I don't know.", "empty": ""}


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": len(text.split())},
    }


def _chunk(model: str, chunk_id: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


async def _canned_stream(model: str, text: str) -> AsyncIterator[bytes]:
    chunk_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    yield _chunk(model, chunk_id, {"role": "assistant", "content": ""})
    if text:
        yield _chunk(model, chunk_id, {"content": text})
    yield _chunk(model, chunk_id, {}, "stop")
    yield b"data: [DONE]\n\n"


def _degrade(mode: str, body: dict[str, Any]) -> dict[str, Any]:
    body = dict(body)
    if mode == "sabotage":
        messages = [m for m in body.get("messages") or [] if not (isinstance(m, dict) and m.get("role") == "system")]
        body["messages"] = [{"role": "system", "content": SABOTAGE_PROMPT}, *messages]
        body.pop("tools", None)
        body.pop("tool_choice", None)
    elif mode == "short":
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = 5
    return body


def make_app(upstream: str, *, slow_s: float = 30.0) -> Starlette:
    """The proxy as an ASGI app forwarding to ``upstream`` (an OpenAI base URL, ``.../v1``)."""
    client = httpx.AsyncClient(base_url=upstream.rstrip("/"), timeout=httpx.Timeout(300.0, connect=5.0))

    async def chat(request: Request) -> Response:
        mode = request.path_params["mode"]
        if mode not in MODES:
            return JSONResponse({"error": {"message": f"unknown mode {mode!r}; one of {', '.join(MODES)}"}}, 404)
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "the body is not JSON"}}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "the body must be a JSON object"}}, 400)
        model = str(body.get("model") or "degraded")
        stream = bool(body.get("stream"))
        if mode in _CANNED:
            text = _CANNED[mode]
            if stream:
                return StreamingResponse(_canned_stream(model, text), media_type="text/event-stream")
            return JSONResponse(_completion(model, text))
        if mode == "slow":
            await asyncio.sleep(slow_s)
        forwarded = _degrade(mode, body)
        if not stream:
            reply = await client.post("/chat/completions", json=forwarded)
            return Response(reply.content, reply.status_code, media_type="application/json")
        upstream_request = client.build_request("POST", "/chat/completions", json=forwarded)
        reply = await client.send(upstream_request, stream=True)
        if reply.status_code != 200:
            content = await reply.aread()
            await reply.aclose()
            return Response(content, reply.status_code, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in reply.aiter_raw():
                    yield piece
            finally:
                await reply.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        reply = await client.get("/models")
        return Response(reply.content, reply.status_code, media_type="application/json")

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    return Starlette(
        routes=[
            Route("/{mode}/v1/chat/completions", chat, methods=["POST"]),
            Route("/{mode}/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/{mode}/health", health, methods=["GET"]),  # what the gateway's probe asks
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the upstream's OpenAI base URL, e.g. http://127.0.0.1:8081/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--slow-s", type=float, default=30.0, help="the slow mode's delay before anything is sent")
    args = parser.parse_args()
    uvicorn.run(make_app(args.upstream, slow_s=args.slow_s), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
