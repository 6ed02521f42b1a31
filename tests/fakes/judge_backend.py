"""FAKE OpenAI-compatible judge, for DeepEval tests: canned verdicts with known scores.

A real model cannot be made to give a known verdict, nor unparseable JSON, on demand.
This server answers each DeepEval step by the JSON schema it asks for
(``response_format.json_schema.name``), so the judged scores are known in advance
(`EXPECTED`). The behaviour is picked by the request's ``model``:

- ``judge-ok``: valid JSON for every step.
- ``judge-bad-json``: as ``judge-ok``, except the G-Eval score step (``ReasonScore``)
  answers text that is not JSON.

Every request body is kept in `RECEIVED`. The judged metrics are also tested against the
real local model (tests/eval/test_judge.py, marked ``llm``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.openai_backend import free_port

RECEIVED: list[dict[str, Any]] = []
"""Every request body, in order."""

# Faithfulness: four claims, three supported -> 0.75. Answer relevancy: two statements,
# one relevant -> 0.5. G-Eval: 8 on its 0-10 scale -> 0.8.
EXPECTED = {"faithfulness": 0.75, "answer_relevancy": 0.5, "correctness": 0.8}
"""The scores ``judge-ok`` leads DeepEval to."""

_ANSWERS: dict[str, object] = {
    "Truths": {"truths": ["Verrin Harbor's spring tidal range is 5.8 metres."]},
    "Claims": {"claims": ["The range is 5.8 m.", "It is a spring range.", "It is at Verrin.", "It is the largest."]},
    "Statements": {"statements": ["The range is 5.8 metres.", "The weather is nice."]},
    "ReasonScore": {"reason": "States the expected fact.", "score": 8},
}
_FAITHFULNESS_VERDICTS = {"verdicts": [{"verdict": "yes"}, {"verdict": "yes"}, {"verdict": "yes"}, {"verdict": "no", "reason": "not in the context"}]}
_RELEVANCY_VERDICTS = {"verdicts": [{"verdict": "yes"}, {"verdict": "no", "reason": "off topic"}]}


def _prompt(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])


def answer_for(body: dict[str, Any]) -> str:
    """The judge's text for one request."""
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("name") if isinstance(fmt, dict) else None
    if schema == "ReasonScore" and body.get("model") == "judge-bad-json":
        return "Score: eight out of ten, because it is mostly right"
    if schema == "Verdicts":
        # Faithfulness asks about claims against a retrieval context; relevancy about statements.
        verdicts = _FAITHFULNESS_VERDICTS if "claim" in _prompt(body).lower() else _RELEVANCY_VERDICTS
        return json.dumps(verdicts)
    if schema in _ANSWERS:
        return json.dumps(_ANSWERS[schema])
    return "ok"


def _chunk(model: str, delta: dict[str, object], finish: str | None = None) -> str:
    body = {"id": "chatcmpl-judge", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


async def chat(request: Request) -> Response:
    body = await request.json()
    RECEIVED.append(body)
    model = str(body.get("model", ""))
    text = answer_for(body)
    usage = {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}
    if not body.get("stream"):
        return JSONResponse({
            "id": "chatcmpl-judge", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        })

    async def events() -> AsyncIterator[str]:
        yield _chunk(model, {"role": "assistant", "content": ""})
        half = len(text) // 2
        for part in (text[:half], text[half:]):
            yield _chunk(model, {"content": part})
        yield _chunk(model, {}, "stop")
        yield "data: " + json.dumps({"id": "chatcmpl-judge", "object": "chat.completion.chunk", "created": 0,
                                     "model": model, "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


@contextmanager
def run_judge_backend() -> Iterator[str]:
    """Serve the fake judge on a free loopback port in a thread; yields its ``/v1`` URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("fake judge did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def write_judge_models_file(path: Path, url: str, down_port: int) -> Path:
    """A registry with the fake judge's behaviours (aliases of the same names) and ``down``,
    a closed loopback port."""
    def backend(base_url: str, served: str) -> dict[str, object]:
        return {"kind": "vllm", "base_url": base_url, "model": served, "timeouts": {"connect_s": 2, "read_s": 10},
                "capabilities": {"context_window": 8192, "tools": False, "json_schema": True},
                "breaker": {"failures": 1000}}

    backends = {
        "judge-ok": backend(url, "judge-ok"),
        "judge-bad-json": backend(url, "judge-bad-json"),
        "down": backend(f"http://127.0.0.1:{down_port}/v1", "nothing"),
    }
    path.write_text(yaml.safe_dump({"backends": backends, "aliases": {name: name for name in backends}}))
    return path

