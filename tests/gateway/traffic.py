"""Traffic for the gateway tests (issue 13): scripted backends behind weighted aliases, and
clients that record which backend served each request.

The backends are ``bench/scripted_backend.py`` processes (`tests.scripted`); the server is
a real ``switchyard serve`` (`tests.conftest.start_server`). Every client here speaks raw
HTTP through ``httpx`` so that it sees the response header ``x-switchyard-backend`` and the
SSE wire format itself (the final ``data: {"error": ...}`` / ``event: error``), and records
what happened instead of raising: the tests decide what is a failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from tests.conftest import ServerHandle, start_server, stop_server
from tests.scripted import SERVED_MODEL, ScriptedBackend, running_scripted_backend

__all__ = [
    "BACKEND_HEADER",
    "VOCAB",
    "Answer",
    "acceptance_region",
    "backend_entry",
    "gateway_config",
    "gather_limited",
    "langgraph_stream",
    "langgraph_wait",
    "new_thread",
    "openai_complete",
    "openai_stream",
    "running_backends",
    "running_server",
    "run_metadata",
    "server_text",
    "splice_problem",
    "targets",
    "write_models",
]

BACKEND_HEADER = "x-switchyard-backend"
"""The response header naming the backend that produced the tokens."""
VOCAB: tuple[str, ...] = (
    " lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
    " sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
)
"""The scripted backend's answer, token by token, cycled (``_VOCAB`` in
``bench/scripted_backend.py``): token i of every answer is ``VOCAB[i % 16]``, so an answer
that restarts mid-way (two answers spliced) is visible in the text alone."""


T = TypeVar("T")


# ---------------------------------------------------------------- processes


@contextmanager
def running_backends(tmp: Path, names: Sequence[str], *, delay_ms: float, tokens: int = 64) -> Iterator[dict[str, ScriptedBackend]]:
    """One scripted backend process per name, each on its own port; all stopped on exit."""
    with ExitStack() as stack:
        yield {name: stack.enter_context(running_scripted_backend(tmp, delay_ms=delay_ms, tokens=tokens)) for name in names}


@contextmanager
def running_server(tmp: Path, config: dict[str, Any], *, dev: bool = True) -> Iterator[ServerHandle]:
    """``switchyard serve`` (``--dev`` unless told otherwise) with ``config``, stopped on exit."""
    handle = start_server(tmp, config, dev=dev)
    try:
        yield handle
    finally:
        stop_server(handle)


async def gather_limited(limit: int, jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``jobs`` with at most ``limit`` at a time; results in job order."""
    semaphore = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


# ---------------------------------------------------------------- models files and config


def backend_entry(backend: ScriptedBackend) -> dict[str, Any]:
    """A registry entry for one scripted backend (a dead port is refused at once)."""
    return {
        "kind": "vllm",
        "base_url": backend.base_url,
        "model": SERVED_MODEL,
        "timeouts": {"connect_s": 1, "read_s": 10},
        "capabilities": {"context_window": 4096, "tools": False, "json_schema": False},
    }


def targets(**weights: int) -> list[dict[str, Any]]:
    """``targets(a=90, b=10)`` -> ``[{backend: a, weight: 90}, {backend: b, weight: 10}]``."""
    return [{"backend": name, "weight": weight} for name, weight in weights.items()]


def write_models(
    path: Path,
    backends: Mapping[str, ScriptedBackend],
    aliases: Mapping[str, Any],
    *,
    breaker: Mapping[str, Any] | None = None,
    extra_backends: Mapping[str, Any] | None = None,
) -> Path:
    """Write a models file atomically (a temporary file in the same directory, then
    ``os.replace``), as an operator's deploy tool would: the watcher never reads half a file."""
    document: dict[str, Any] = {
        "backends": {name: backend_entry(b) for name, b in backends.items()} | dict(extra_backends or {}),
        "aliases": dict(aliases),
    }
    if breaker is not None:
        document["breaker"] = dict(breaker)
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    scratch.write_text(yaml.safe_dump(document, sort_keys=False))
    os.replace(scratch, path)
    return path


def gateway_config(models_file: Path, graphs: Mapping[str, str], *, reload_check_s: float = 0.5) -> dict[str, Any]:
    """A `tests.conftest.start_server` config: the gateway watching ``models_file``, and one
    ``graphs.chat`` graph per entry of ``graphs`` (graph name -> alias)."""
    return {
        "gateway": {"models_file": str(models_file), "reload_check_s": reload_check_s},
        "graphs": {name: {"path": "graphs.chat:make_graph", "model": alias} for name, alias in graphs.items()},
    }


def server_text(handle: ServerHandle) -> str:
    """Everything the server wrote: its log file and its stdout/stderr."""
    parts = [handle.log_file, handle.config.parent / "server.out"]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in parts if p.is_file())


# ---------------------------------------------------------------- statistics


def _log_pmf(n: int, k: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def acceptance_region(n: int, p: float, confidence: float = 0.99) -> tuple[int, int]:
    """The central ``confidence`` region of Binomial(n, p), computed exactly: the smallest
    ``lo`` and largest ``hi`` with P(X < lo) <= (1-c)/2 and P(X > hi) <= (1-c)/2. A count
    outside [lo, hi] happens with probability at most 1-c when the split really is p."""
    tail = (1 - confidence) / 2
    pmf = [math.exp(_log_pmf(n, k, p)) for k in range(n + 1)]
    lo, below = 0, 0.0
    while below + pmf[lo] <= tail:
        below += pmf[lo]
        lo += 1
    hi, above = n, 0.0
    while above + pmf[hi] <= tail:
        above += pmf[hi]
        hi -= 1
    return lo, hi


# ---------------------------------------------------------------- answers


@dataclass(slots=True)
class Answer:
    """One request, as the client saw it."""

    kind: str
    """``openai``, ``openai-stream``, ``langgraph-wait`` or ``langgraph-stream``."""
    started: float = 0.0
    """``time.monotonic()`` when the request was sent."""
    seconds: float = 0.0
    status: int = 0
    backend: str | None = None
    """The ``x-switchyard-backend`` header (``None`` when absent)."""
    tokens: list[str] = field(default_factory=list)
    """Content tokens, in order (for a whole answer: the text split into the scripted words)."""
    finish_reason: str | None = None
    error: str | None = None
    """Why this did not end as a complete answer: the status and body, the error event,
    a transport exception, or a stream that ended without its terminator."""
    error_event: Any = None
    """The in-band error event's payload, when the stream ended with one."""
    after_error: list[str] = field(default_factory=list)
    """What the stream sent after its error event (only ``[DONE]`` is allowed, on OpenAI)."""
    done: int = 0
    """How many ``data: [DONE]`` the OpenAI stream sent."""
    thread_id: str | None = None
    run_id: str | None = None
    events: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self) -> str:
        return (f"[{self.kind} {self.status} backend={self.backend} tokens={len(self.tokens)} "
                f"finish={self.finish_reason} error={self.error}]")


def _split_words(text: str) -> list[str]:
    return [" " + word for word in text.split()]


def splice_problem(tokens: list[str]) -> str | None:
    """``None`` when ``tokens`` are a prefix of one scripted answer; else where it breaks."""
    for i, token in enumerate(tokens):
        if token != VOCAB[i % len(VOCAB)]:
            return f"token {i} is {token!r}, not {VOCAB[i % len(VOCAB)]!r}: {''.join(tokens[max(0, i - 3):i + 3])!r}"
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def openai_complete(
    client: httpx.AsyncClient, model: str, *, max_tokens: int, text: str = "hello", request_id: str | None = None
) -> Answer:
    """``POST /v1/chat/completions`` without streaming; ``request_id`` is sent as
    ``x-request-id`` (a stateless request's sticky key), else the server makes one."""
    answer = Answer(kind="openai", started=time.monotonic())
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    headers = {"x-request-id": request_id} if request_id else None
    try:
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        answer.status = response.status_code
        answer.backend = response.headers.get(BACKEND_HEADER)
        if response.status_code != 200:
            answer.error = f"HTTP {response.status_code}: {response.text[:300]}"
        else:
            choice = response.json()["choices"][0]
            answer.tokens = _split_words(choice["message"]["content"] or "")
            answer.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as exc:
        answer.error = _describe(exc)
    answer.seconds = time.monotonic() - answer.started
    return answer


async def openai_stream(
    client: httpx.AsyncClient,
    model: str,
    *,
    max_tokens: int,
    text: str = "tell me a story",
    on_token: Callable[[int], None] | None = None,
) -> Answer:
    """``POST /v1/chat/completions`` with ``stream: true``, read to the end; ``on_token(n)``
    after each content token (n tokens so far)."""
    answer = Answer(kind="openai-stream", started=time.monotonic())
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            answer.status = response.status_code
            answer.backend = response.headers.get(BACKEND_HEADER)
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    answer.events.append(payload[:200])
                    if answer.error_event is not None:
                        answer.after_error.append(payload)
                    if payload == "[DONE]":
                        answer.done += 1
                        continue
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        answer.error_event = chunk
                        continue
                    for choice in chunk.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            answer.tokens.append(content)
                            if on_token is not None:
                                on_token(len(answer.tokens))
                        answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
                if answer.error_event is not None:
                    answer.error = f"error event: {answer.error_event}"
                elif answer.done != 1 or answer.events[-1:] != ["[DONE]"]:
                    answer.error = f"the stream ended without one final [DONE] (last: {answer.events[-2:]})"
    except (httpx.HTTPError, ValueError) as exc:
        answer.error = _describe(exc)
    answer.seconds = time.monotonic() - answer.started
    return answer


def _lg_body(assistant: str, text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "assistant_id": assistant,
        "input": {"messages": [{"role": "user", "content": text}]},
        "context": {"model_params": {"max_tokens": max_tokens}},
        **extra,
    }


async def langgraph_wait(
    client: httpx.AsyncClient,
    thread_id: str | None,
    assistant: str,
    *,
    max_tokens: int,
    text: str = "hello",
    request_id: str | None = None,
) -> Answer:
    """``POST /threads/{thread_id}/runs/wait`` (``None``: the stateless ``POST /runs/wait``);
    the run id from ``Content-Location``; ``request_id`` as in `openai_complete`."""
    answer = Answer(kind="langgraph-wait", started=time.monotonic(), thread_id=thread_id)
    path = "/runs/wait" if thread_id is None else f"/threads/{thread_id}/runs/wait"
    headers = {"x-request-id": request_id} if request_id else None
    try:
        response = await client.post(path, json=_lg_body(assistant, text, max_tokens), headers=headers)
        answer.status = response.status_code
        answer.backend = response.headers.get(BACKEND_HEADER)
        location = response.headers.get("content-location", "")
        answer.run_id = location.rstrip("/").rsplit("/", 1)[-1] or None
        if response.status_code != 200:
            answer.error = f"HTTP {response.status_code}: {response.text[:300]}"
        else:
            values = response.json()
            if "__error__" in values:
                answer.error = f"run error: {values['__error__']}"
            else:
                last = values["messages"][-1]
                answer.tokens = _split_words(last["content"] if isinstance(last["content"], str) else "")
                answer.finish_reason = (last.get("response_metadata") or {}).get("finish_reason")
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        answer.error = _describe(exc)
    answer.seconds = time.monotonic() - answer.started
    return answer


async def langgraph_stream(
    client: httpx.AsyncClient,
    thread_id: str,
    assistant: str,
    *,
    max_tokens: int,
    text: str = "tell me a story",
    on_token: Callable[[int], None] | None = None,
) -> Answer:
    """``POST /threads/{thread_id}/runs/stream`` (``messages-tuple`` and ``values``), parsed
    as SSE by hand; ``on_token(n)`` after each AI content token."""
    answer = Answer(kind="langgraph-stream", started=time.monotonic(), thread_id=thread_id)
    body = _lg_body(assistant, text, max_tokens, stream_mode=["messages-tuple", "values"])
    try:
        async with client.stream("POST", f"/threads/{thread_id}/runs/stream", json=body) as response:
            answer.status = response.status_code
            answer.backend = response.headers.get(BACKEND_HEADER)
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}"
            else:
                event, data = "message", []
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif line == "" and data:
                        _lg_event(answer, event, json.loads("\n".join(data)), on_token)
                        event, data = "message", []
                if answer.error_event is not None:
                    answer.error = f"error event: {answer.error_event}"
                elif "values" not in answer.events:
                    answer.error = f"the stream ended without its values (events: {answer.events[-5:]})"
    except (httpx.HTTPError, ValueError) as exc:
        answer.error = _describe(exc)
    answer.seconds = time.monotonic() - answer.started
    return answer


def _lg_event(answer: Answer, event: str, data: Any, on_token: Callable[[int], None] | None) -> None:
    answer.events.append(event)
    if answer.error_event is not None:
        answer.after_error.append(event)
    if event == "metadata":
        answer.run_id = data.get("run_id")
    elif event == "error":
        answer.error_event = data
    elif event == "messages" and isinstance(data, list) and data:
        message = data[0]
        if message.get("type") in ("AIMessageChunk", "ai") and isinstance(message.get("content"), str) and message["content"]:
            answer.tokens.append(message["content"])
            finish = (message.get("response_metadata") or {}).get("finish_reason")
            answer.finish_reason = finish or answer.finish_reason
            if on_token is not None:
                on_token(len(answer.tokens))


async def run_metadata(client: httpx.AsyncClient, thread_id: str, run_id: str) -> dict[str, Any]:
    """``GET /threads/{thread_id}/runs/{run_id}`` -> the run's ``metadata``."""
    response = await client.get(f"/threads/{thread_id}/runs/{run_id}")
    response.raise_for_status()
    metadata: dict[str, Any] = response.json().get("metadata") or {}
    return metadata


async def new_thread(client: httpx.AsyncClient) -> str:
    """``POST /threads`` -> its id."""
    response = await client.post("/threads", json={})
    response.raise_for_status()
    thread_id: str = response.json()["thread_id"]
    return thread_id
