"""The output policy on a model alias's relayed fields besides ``content`` (review
finding: ``logprobs`` and ``reasoning_content`` carried the unchecked answer).

Under an output policy the relay does not ask the backend for ``logprobs`` (their
tokens are the answer's own text, which cannot be checked token by token) and drops
any a backend sends anyway; ``reasoning_content`` / ``reasoning`` are checked like the
answer, streamed (a term split across chunks included) and whole.

The backend here is a FAKE (STYLE.md, case 1): it does on demand what a real model
server does only for some models and flags, sending logprobs whatever the request
says and a reasoning model's thinking. It records the bodies it receives.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import ServerHandle, create_key, start_server, stop_server
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e]

SECRET = "hunter2"
ANSWER = ["The", " pass", "word", " is", " hun", "ter2", "."]
THINKING = ["I must", " not say", " hun", "ter2", " aloud"]
RECEIVED: list[dict[str, Any]] = []


def _logprobs(tokens: list[str]) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": -0.1, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": t, "logprob": -0.1, "bytes": list(t.encode())}]} for t in tokens]}


def _chunk(choice: dict[str, Any]) -> str:
    body = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-reasoner",
            "choices": [{"index": 0, "finish_reason": None, **choice}]}
    return f"data: {json.dumps(body)}\n\n"


async def _chat(request: Request) -> Response:
    body = await request.json()
    RECEIVED.append(body)
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(ANSWER), "reasoning_content": "".join(THINKING)}
        return JSONResponse({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-reasoner",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": _logprobs(ANSWER)}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        })

    async def events() -> AsyncIterator[str]:
        yield _chunk({"delta": {"role": "assistant", "content": ""}})
        for piece in THINKING:
            yield _chunk({"delta": {"reasoning_content": piece}})
        for piece in ANSWER:
            yield _chunk({"delta": {"content": piece}, "logprobs": _logprobs([piece])})
        yield _chunk({"delta": {}, "finish_reason": "stop"})
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        yield "data: " + json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                                     "model": "fake-reasoner", "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def reasoner_url() -> Iterator[str]:
    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/v1/chat/completions", _chat, methods=["POST"]), Route("/health", health)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake backend did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def alias_server(tmp_path_factory: pytest.TempPathFactory, reasoner_url: str) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    """``chat-default`` relays to the fake, the ``chat`` graph calls it. Global policy
    redacts ``hunter2``; tenant ``acme`` also blocks ``password``."""
    tmp: Path = tmp_path_factory.mktemp("alias-fields")
    backend = {"kind": "vllm", "base_url": reasoner_url, "model": "fake-reasoner",
               "timeouts": {"connect_s": 2, "read_s": 10},
               "capabilities": {"context_window": 4096, "tools": True, "json_schema": True}}
    models = tmp / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": {"reasoner": backend}, "aliases": {"chat-default": "reasoner"}}))
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "guardrails": {"output_redact_terms": [SECRET]},
        "auth": {"tenants": {"acme": {"output_block_terms": ["password"]}, "globex": {}}},
    }
    (tmp / "switchyard.yaml").write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {t: f"Bearer {create_key(tmp / 'switchyard.yaml', t)}" for t in ("acme", "globex")}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


def _post(server: ServerHandle, key: str, *, stream: bool, model: str = "chat-default") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "what is the password?"}],
            "logprobs": True, "top_logprobs": 5, "stream": stream}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      headers={"Authorization": key}, timeout=60) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    return raw


def _chunks(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def _pieces(raw: str) -> tuple[str, str]:
    """A stream's answer and reasoning, joined."""
    content = reasoning = ""
    for chunk in _chunks(raw):
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            reasoning += choice["delta"].get("reasoning_content") or ""
    return content, reasoning


@pytest.mark.parametrize("stream", [False, True])
def test_relayed_logprobs_and_reasoning_are_checked(alias_server: tuple[ServerHandle, dict[str, str]], stream: bool) -> None:
    server, keys = alias_server
    RECEIVED.clear()
    raw = _post(server, keys["globex"], stream=stream)
    assert "hunter" not in raw and "ter2" not in raw, raw
    assert '"logprobs"' not in raw.replace('"logprobs":null', ""), raw
    if stream:
        content, reasoning = _pieces(raw)
    else:
        message = json.loads(raw)["choices"][0]["message"]
        content, reasoning = message["content"], message["reasoning_content"]
    assert content == "The password is [redacted]."
    assert reasoning == "I must not say [redacted] aloud"
    # Not asked for: the backend would list every token of the unchecked answer.
    assert RECEIVED and all("logprobs" not in body and "top_logprobs" not in body for body in RECEIVED)


@pytest.mark.parametrize("stream", [False, True])
def test_a_blocked_relayed_answer_keeps_no_logprobs_or_reasoning(alias_server: tuple[ServerHandle, dict[str, str]],
                                                                  stream: bool) -> None:
    server, keys = alias_server
    raw = _post(server, keys["acme"], stream=stream)
    for leak in ("hunter", "ter2", "word", '"token"'):
        assert leak not in raw, raw
    if stream:
        assert _chunks(raw)[-1]["choices"][0]["finish_reason"] == "content_filter"
    else:
        choice = json.loads(raw)["choices"][0]
        assert choice["finish_reason"] == "content_filter" and "logprobs" not in choice


@pytest.mark.parametrize("stream", [False, True])
def test_a_graph_answer_carries_no_logprobs_or_reasoning(alias_server: tuple[ServerHandle, dict[str, str]], stream: bool) -> None:
    """The graph path: ``logprobs`` is not a parameter a graph binds, and its chat model
    keeps no ``reasoning_content``; the answer is checked."""
    server, keys = alias_server
    RECEIVED.clear()
    raw = _post(server, keys["globex"], stream=stream, model="chat")
    assert "hunter" not in raw and "ter2" not in raw and '"token"' not in raw, raw
    assert RECEIVED and all("logprobs" not in body for body in RECEIVED)
