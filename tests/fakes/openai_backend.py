"""FAKE OpenAI-compatible backend, for failure injection only.

STYLE.md allows one kind of model fake: a scripted backend that does on demand what a
real model server cannot be made to do (break a stream, answer 5xx). Every graph is
also tested against the real local model. The behaviour is picked by the request's
``model`` (the served name in the test registry):

- ``fake-ok``: streams "Hello from the fake" with usage, or answers it whole.
- ``fake-break``: streams three content chunks, then drops the connection.
- ``fake-500``: answers 500 with an OpenAI-shaped error body.
- ``fake-tools``: forges tool calls a real model will not make on demand. The last
  user message names the script (`TOOL_SCRIPTS`); while the conversation has no tool
  result yet (or, for ``loop``, always) it answers with those calls, then as
  ``fake-ok`` does. Streamed calls arrive as OpenAI ``tool_calls`` deltas.

It records every request body in `RECEIVED`, so tests can check what reached it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " from", " the", " fake"]

RECEIVED: list[dict[str, object]] = []
"""Every request body the fake received, in order (the tests run it in-process)."""


def _chunk(model: str, delta: dict[str, object], finish: str | None = None) -> str:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


class _DropConnection(Exception):
    pass


TOOL_SCRIPTS: dict[str, list[tuple[str, str]]] = {
    "disallowed": [("http_get", '{"url": "https://example.com/"}')],
    "unknown": [("rm_rf", '{"path": "/"}')],
    "malformed": [("probe", '{"note": "unterminated')],
    "invalid-args": [("probe", '{"note": 42, "extra": true}')],
    "probe": [("probe", '{"note": "hello"}')],
    "sleepy": [("sleepy", "{}")],
    "boom": [("boom", "{}")],
    "calc": [("calculator", '{"expression": "6 * 7"}')],
    "loop": [("tally", '{"note": "again"}')] * 13,
}


def _text(content: object) -> str:
    """A message's text: a string, or OpenAI's content parts (the text parts joined), as
    a client that sends typed messages (Agent Chat UI) writes it."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def _tool_turn(body: dict[str, object]) -> list[tuple[str, str]] | None:
    messages = body.get("messages") or []
    assert isinstance(messages, list)
    user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    script = _text(user.get("content")).removeprefix("SCRIPT:").strip()
    calls = TOOL_SCRIPTS.get(script)
    answered = any(m.get("role") == "tool" for m in messages)
    if calls is None or (answered and script != "loop"):
        return None
    return calls


async def _tool_events(model: str, calls: list[tuple[str, str]]) -> AsyncIterator[str]:
    yield _chunk(model, {"role": "assistant", "content": None})
    for index, (name, arguments) in enumerate(calls):
        call_id = f"call_{index}_{int(time.time() * 1000) % 100000}"
        head = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        yield _chunk(model, {"tool_calls": [head]})
        half = len(arguments) // 2
        for part in (arguments[:half], arguments[half:]):
            yield _chunk(model, {"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    yield _chunk(model, {}, "tool_calls")
    yield "data: [DONE]\n\n"


async def chat(request: Request) -> Response:
    body = await request.json()
    RECEIVED.append(body)
    model = body.get("model", "")
    if model == "fake-tools" and (calls := _tool_turn(body)) is not None:
        if body.get("stream"):
            return StreamingResponse(_tool_events(model, calls), media_type="text/event-stream")
        tool_calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)
        ]
        return JSONResponse({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
        })
    if model == "fake-tools":
        model = "fake-ok"  # the plain answer below: "Hello from the fake"
    if model == "fake-500":
        return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}}, status_code=500)
    if not body.get("stream"):
        return JSONResponse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(WORDS)}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
            }
        )

    async def events() -> AsyncIterator[str]:
        yield _chunk(model, {"role": "assistant", "content": ""})
        for i, word in enumerate(WORDS):
            if model == "fake-break" and i == 3:
                await asyncio.sleep(0.05)
                raise _DropConnection
            yield _chunk(model, {"content": word})
        yield _chunk(model, {}, "stop")
        usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        yield "data: " + json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def run_fake_backend() -> Iterator[str]:
    """Serve the fake on a free loopback port in a thread; yields its ``/v1`` URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("fake backend did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
