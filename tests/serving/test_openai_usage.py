"""Streamed usage follows OpenAI: with ``stream_options.include_usage`` every chunk says
``"usage": null`` but the last, which has empty ``choices`` and the usage; without it no
chunk has ``usage``. Counted once, so LangChain's ``stream_usage`` total matches the
whole answer's (issue 12, item 4: it was counted twice).

The server runs over the FAKE backend of ``tests/fakes`` (``fake-ok``: usage on its own
last chunk) and, below, a FAKE backend putting usage where some real servers do (on the
finish chunk as well, or on every chunk), which a real model server cannot be made to
switch between on demand.
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
from langchain_openai import ChatOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e]

QUESTION = [{"role": "user", "content": "Say hello."}]
USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
"""What the placement fake reports (the ``tests/fakes`` backend reports 5 / 4 / 9)."""
PLACEMENTS = ("usage-twice", "usage-every-chunk", "usage-on-finish")
"""Served names of the placement fake, each an alias of the same name:

- ``usage-twice``: usage on the finish chunk and on a usage-only chunk (some llama.cpp versions);
- ``usage-every-chunk``: usage on every chunk, growing, then a usage-only chunk (vLLM's
  continuous usage stats);
- ``usage-on-finish``: usage only on the finish chunk, sent even if not asked for.
"""


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> str:
    body: dict[str, Any] = {"id": "chatcmpl-placement", "object": "chat.completion.chunk", "created": 0, "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


async def _chat(request: Request) -> Response:
    body = await request.json()
    model = body["model"]
    if not body.get("stream"):
        return JSONResponse({
            "id": "chatcmpl-placement", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there friend"}, "finish_reason": "stop"}],
            "usage": USAGE,
        })

    def partial(done: int) -> dict[str, int] | None:
        if model != "usage-every-chunk":
            return None
        return {"prompt_tokens": 11, "completion_tokens": done, "total_tokens": 11 + done}

    async def events() -> AsyncIterator[str]:
        yield _chunk(model, {"role": "assistant", "content": ""}, usage=partial(0))
        for done, word in enumerate(["Hi", " there", " friend"], start=1):
            yield _chunk(model, {"content": word}, usage=partial(done))
        yield _chunk(model, {}, "stop", usage=USAGE)
        if model != "usage-on-finish":
            yield "data: " + json.dumps({"id": "chatcmpl-placement", "object": "chat.completion.chunk", "created": 0,
                                         "model": model, "choices": [], "usage": USAGE}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def placement_url() -> Iterator[str]:
    """FAKE backend putting usage where llama.cpp and vLLM variants do (see `PLACEMENTS`)."""
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
def usage_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str, placement_url: str) -> Iterator[ServerHandle]:
    """Graph ``chat-fake`` and alias ``fake-ok`` over the shared fake; one alias per placement."""
    tmp: Path = tmp_path_factory.mktemp("usage")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    registry = yaml.safe_load(models.read_text())
    for name in PLACEMENTS:
        registry["backends"][name] = {
            "kind": "vllm", "base_url": placement_url, "model": name, "timeouts": {"connect_s": 2, "read_s": 10},
            "capabilities": {"context_window": 4096, "tools": False, "json_schema": False},
        }
        registry["aliases"][name] = name
    models.write_text(yaml.safe_dump(registry))
    handle = start_server(tmp, {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat-fake": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
    })
    try:
        yield handle
    finally:
        stop_server(handle)


def _stream(server: ServerHandle, model: str, **fields: Any) -> list[dict[str, Any]]:
    """The chunks of a streamed answer, read as raw SSE; checks it ends with ``[DONE]``."""
    body = {"model": model, "messages": QUESTION, "max_tokens": 8, "stream": True, **fields}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        payloads = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


def _whole_usage(server: ServerHandle, model: str) -> dict[str, int]:
    body = {"model": model, "messages": QUESTION, "max_tokens": 8}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    usage: dict[str, int] = response.json()["usage"]
    return usage


MODELS = ["chat-fake", "fake-ok", *PLACEMENTS]


@pytest.mark.parametrize("model", MODELS)
def test_include_usage_puts_usage_on_the_last_chunk_only(usage_server: ServerHandle, model: str) -> None:
    chunks = _stream(usage_server, model, stream_options={"include_usage": True})
    with_usage = [i for i, chunk in enumerate(chunks) if chunk.get("usage") is not None]
    assert with_usage == [len(chunks) - 1], [c.get("usage") for c in chunks]
    last = chunks[-1]
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk" and last["model"] == model
    assert last["usage"] == _whole_usage(usage_server, model)
    # The others say so explicitly, as OpenAI does.
    assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks[:-1])
    assert all(chunk["choices"] for chunk in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("model", MODELS)
def test_no_usage_unless_asked(usage_server: ServerHandle, model: str) -> None:
    for fields in ({}, {"stream_options": {"include_usage": False}}):
        chunks = _stream(usage_server, model, **fields)
        assert [chunk for chunk in chunks if "usage" in chunk] == []
        assert all(chunk["choices"] for chunk in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()


@pytest.mark.parametrize("model", ["chat-fake", "fake-ok", "usage-twice"])
def test_langchain_stream_usage_matches_invoke(usage_server: ServerHandle, model: str) -> None:
    llm = ChatOpenAI(base_url=usage_server.url + "/v1", api_key="unused-in-dev-mode", model=model,  # type: ignore[arg-type]
                     stream_usage=True, max_retries=0, max_tokens=8)
    whole = llm.invoke(QUESTION)
    streamed = None
    for chunk in llm.stream(QUESTION):
        streamed = chunk if streamed is None else streamed + chunk
    assert whole.usage_metadata is not None and streamed is not None and streamed.usage_metadata is not None
    keys = ("input_tokens", "output_tokens", "total_tokens")
    assert {k: streamed.usage_metadata[k] for k in keys} == {k: whole.usage_metadata[k] for k in keys}
    assert whole.usage_metadata["output_tokens"] > 0
