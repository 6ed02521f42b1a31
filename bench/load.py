"""Streaming load test for Switchyard against a scripted backend floor.

Modes:
    ``floor``       start ``scripted_backend.py`` and load it directly (the floor).
    ``switchyard``  start the scripted backend and ``switchyard serve`` in front of it, then load
                    through Switchyard, sampling its CPU per level: ``model: "chat"`` (LangGraph
                    chat graph) and ``model: "chat-default"`` (alias passthrough) on the OpenAI
                    endpoint, the ``chat`` graph on the LangGraph Server API as a stateless run
                    (``POST /runs/stream``, ``messages-tuple``), and as a thread create plus a
                    run on that thread, the way chat UIs work, on SQLite (``langgraph-thread``)
                    and on a PostgreSQL server started here (``langgraph-thread-pg``), each on a
                    fresh Switchyard of its own; ``--targets`` picks among them.
    ``all``         (default) floor, then switchyard; print deltas vs floor.
    ``url``         load an already running server (``--base-url``, ``--model``).

Each level runs ``concurrency`` closed-loop workers over a bounded number of requests, with a
hard time cap. Results print as a markdown table and are written to ``bench/results/``.

Usage::

    .venv/bin/python bench/load.py [--mode all] [--levels 1,10,50] [--targets chat,langgraph-chat]
    .venv/bin/python bench/load.py --targets langgraph-thread,langgraph-thread-pg --levels 1,10,50,1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import platform
import resource
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn
from urllib.parse import quote, urlsplit

import httpx

__all__ = ["LoadOptions", "SwitchyardTarget", "Target", "main"]

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_SWITCHYARD_BIN = REPO_ROOT / ".venv" / "bin" / "switchyard"
_CLK_TCK = os.sysconf("SC_CLK_TCK")

Mode = Literal["floor", "switchyard", "all", "url"]
ClientKind = Literal["raw", "httpx"]
Protocol = Literal["openai", "langgraph", "langgraph-thread"]
ThreadStore = Literal["sqlite", "postgres"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SwitchyardTarget:
    """What one ``--targets`` name loads, and on which server."""

    protocol: Protocol
    """``openai``: ``POST /v1/chat/completions``; ``langgraph``: a stateless
    ``POST /runs/stream``; ``langgraph-thread``: ``POST /threads`` then
    ``POST /threads/{id}/runs/stream`` on the new thread."""
    model: str
    """``model`` (OpenAI) or ``assistant_id`` (LangGraph) of each request."""
    store: ThreadStore | None = None
    """Thread store of a fresh Switchyard started for this target alone (and stopped after
    it), so that what it writes, or breaks, does not touch the other targets; ``None``: the
    shared server, default data dir."""


SWITCHYARD_TARGETS: dict[str, SwitchyardTarget] = {
    "chat": SwitchyardTarget(protocol="openai", model="chat"),
    "chat-default": SwitchyardTarget(protocol="openai", model="chat-default"),
    "langgraph-chat": SwitchyardTarget(protocol="langgraph", model="chat"),
    "langgraph-thread": SwitchyardTarget(protocol="langgraph-thread", model="chat",
                                         store="sqlite"),
    "langgraph-thread-pg": SwitchyardTarget(protocol="langgraph-thread", model="chat",
                                            store="postgres"),
}
"""``--targets`` names; loaded in the order given on the command line."""
PROMPT = "Write a short paragraph about load testing."
_DETAIL_CHARS = 300
"""How much of an error body or error event is kept as a sample."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Targets:
    """Pass/fail thresholds, checked at ``concurrency`` streams."""

    concurrency: int = 50
    """Level at which the targets apply."""
    added_ttft_p50_ms: float = 60.0
    """Max TTFT p50 added over the floor."""
    added_ttft_p95_ms: float = 150.0
    """Max TTFT p95 added over the floor."""
    throughput_ratio: float = 0.8
    """Min completed-requests/s relative to the floor."""
    server_cpu_ms_per_req: float = 15.0
    """Max Switchyard CPU per request (stated for 64-token completions)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadOptions:
    """How each level is driven."""

    levels: tuple[int, ...]
    """Concurrency levels, in order."""
    requests_per_level: int | None
    """Requests per level; ``None`` means 30 at c=1 and 200 otherwise."""
    level_timeout_s: float
    """Hard cap on a level's duration; unfinished requests are cancelled and reported."""
    request_timeout_s: float
    """Cap on one request."""
    ramp_s: float
    """Worker start times are spread over this window so arrivals are not one burst."""
    warmup: int
    """Unrecorded sequential requests per target before its first level."""
    tokens: int
    """``max_tokens`` sent with each request."""
    client: ClientKind
    """``raw`` asyncio HTTP/1.1 client (default) or ``httpx.AsyncClient``."""
    api_key: str | None
    """Bearer token sent when set."""

    def requests_for(self, concurrency: int) -> int:
        """Requests to send at ``concurrency``."""
        if self.requests_per_level is not None:
            return self.requests_per_level
        return 30 if concurrency == 1 else 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One thing to load: a base URL plus a model name."""

    label: str
    """Name used in tables and JSON."""
    base_url: str
    """OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``; for ``langgraph`` the server root."""
    model: str
    """``model`` field of each request (``assistant_id`` for ``langgraph``)."""
    protocol: Protocol = "openai"
    """``openai``: ``POST {base}/chat/completions``; ``langgraph``: ``POST {base}/runs/stream``;
    ``langgraph-thread``: ``POST {base}/threads``, then ``POST {base}/threads/{id}/runs/stream``."""
    server_pid: int | None = None
    """Process (tree) whose CPU is charged to the server column."""
    backend_pid: int | None = None
    """Scripted backend process, sampled separately when it is not the server."""
    db_pid: int | None = None
    """Database server (PostgreSQL postmaster) process tree, sampled separately: with SQLite
    the database work is inside the server's own CPU, with PostgreSQL it is here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestResult:
    """Outcome of one streamed request; times in seconds from sending it."""

    ok: bool
    latency_s: float
    ttft_s: float | None
    tokens: int
    error: str | None = None
    create_s: float | None = None
    """``langgraph-thread``: time to the ``POST /threads`` answer (TTFT and latency include it)."""
    detail: str | None = None
    """Start of the error body or error event, when there was one."""


# --------------------------------------------------------------------------- SSE parsing


class _StreamAccumulator:
    """Incremental, cheap parser for an OpenAI ``chat.completion.chunk`` SSE body.

    Only ``data:`` lines are looked at (both ``\\n`` and ``\\r\\n`` line ends work); each is
    one JSON chunk, which is all OpenAI-compatible servers send.
    """

    __slots__ = ("_buf", "t_first", "t_done", "chunks", "usage_tokens", "error", "detail", "raw")

    def __init__(self) -> None:
        self._buf = b""
        self.t_first: float | None = None
        self.t_done: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.error: str | None = None
        self.detail: str | None = None
        self.raw: bytearray | None = None

    def status_seen(self, status: int) -> None:
        """Called with the response status: the body of a non-200 is kept, not parsed."""
        if status != 200:
            self.raw = bytearray()

    def feed(self, data: bytes) -> None:
        """Consume a piece of the body."""
        if self.raw is not None:
            _keep(self.raw, data)
            return
        buf = self._buf + data if self._buf else data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            line = buf[start:nl]
            start = nl + 1
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        self._buf = buf[start:]

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.t_done = time.perf_counter()
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = self.error or "bad_json"
            return
        if "error" in obj:
            if self.error is None:
                self.error = "error_event"
                self.detail = payload[:_DETAIL_CHARS].decode(errors="replace")
            return
        choices = obj.get("choices")
        if choices and (choices[0].get("delta") or {}).get("content"):
            self.chunks += 1
            if self.t_first is None:
                self.t_first = time.perf_counter()
        usage = obj.get("usage")
        if usage:
            self.usage_tokens = usage.get("completion_tokens")

    def body_end(self) -> None:
        """The response body ended; OpenAI streams must have said ``[DONE]`` before."""


class _LangGraphAccumulator:
    """Incremental parser for a LangGraph Server ``/runs/stream`` SSE body (``messages-tuple``).

    Events are ``event:``/``data:`` (/``id:``) lines ended by a blank line; ``metadata`` comes
    first, then ``messages`` events whose data is ``[message_chunk, metadata]``. A chunk with
    non-empty ``content`` is a token. There is no ``[DONE]``: the stream ends with the body.
    """

    __slots__ = ("_buf", "_event_name", "_data", "t_first", "t_done", "chunks", "usage_tokens",
                 "error", "detail", "raw", "_saw_metadata")

    def __init__(self) -> None:
        self._buf = b""
        self._event_name = b"message"
        self._data: bytes | None = None
        self.t_first: float | None = None
        self.t_done: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None  # never set: tokens are counted as content chunks
        self.error: str | None = None
        self.detail: str | None = None
        self.raw: bytearray | None = None
        self._saw_metadata = False

    def status_seen(self, status: int) -> None:
        """Called with the response status: the body of a non-200 is kept, not parsed."""
        if status != 200:
            self.raw = bytearray()

    def feed(self, data: bytes) -> None:
        """Consume a piece of the body."""
        if self.raw is not None:
            _keep(self.raw, data)
            return
        buf = self._buf + data if self._buf else data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            line = buf[start:nl].rstrip(b"\r")
            start = nl + 1
            if not line:  # blank line: dispatch the event
                if self._data is not None:
                    self._event(self._event_name, self._data)
                self._event_name, self._data = b"message", None
            elif line.startswith(b"data:"):
                payload = line[5:].strip()
                self._data = payload if self._data is None else self._data + b"\n" + payload
            elif line.startswith(b"event:"):
                self._event_name = line[6:].strip()
            # "id:", "retry:" and ": ping" comments are ignored
        self._buf = buf[start:]

    def _event(self, name: bytes, payload: bytes) -> None:
        if name == b"messages" or name.startswith(b"messages|"):
            try:
                chunk = json.loads(payload)[0]
            except (ValueError, IndexError, KeyError, TypeError):
                self.error = self.error or "bad_json"
                return
            if isinstance(chunk, dict) and chunk.get("content"):
                self.chunks += 1
                if self.t_first is None:
                    self.t_first = time.perf_counter()
        elif name == b"metadata":
            self._saw_metadata = True
        elif name == b"error":
            if self.error is None:
                self.error = "error_event"
                self.detail = payload[:_DETAIL_CHARS].decode(errors="replace")

    def body_end(self) -> None:
        """The response body ended: that is the end of the run."""
        if self.t_done is None:
            self.t_done = time.perf_counter()
        if self.raw is not None:
            return
        if self._buf:  # last line without its line end
            self.feed(b"\n")
        if self._data is not None:  # last event without its blank line
            self._event(self._event_name, self._data)
            self._data = None
        if not self._saw_metadata:
            self.error = self.error or "no_metadata"


class _BodyAccumulator:
    """Keeps a whole (small) JSON response body: ``POST /threads``."""

    __slots__ = ("raw", "t_done")

    def __init__(self) -> None:
        self.raw = bytearray()
        self.t_done: float | None = None

    def status_seen(self, status: int) -> None:
        """Every status keeps its body."""

    def feed(self, data: bytes) -> None:
        """Consume a piece of the body."""
        self.raw += data

    def body_end(self) -> None:
        """The body is complete."""
        self.t_done = time.perf_counter()

    def thread_id(self) -> str | None:
        """``thread_id`` of a ``Thread`` body, ``None`` if the body is not one."""
        try:
            value = json.loads(self.raw).get("thread_id")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None


def _keep(raw: bytearray, data: bytes) -> None:
    """Append to an error body sample, up to its cap."""
    room = _DETAIL_CHARS - len(raw)
    if room > 0:
        raw += data[:room]


def _detail(raw: bytearray | None) -> str | None:
    return bytes(raw).decode(errors="replace") if raw else None


_Accumulator = _StreamAccumulator | _LangGraphAccumulator | _BodyAccumulator


def _new_accumulator(protocol: Protocol) -> _StreamAccumulator | _LangGraphAccumulator:
    return _StreamAccumulator() if protocol == "openai" else _LangGraphAccumulator()


# --------------------------------------------------------------------------- clients


class _SSEClientProtocol(asyncio.Protocol):
    """Response decoder driven straight from ``data_received``.

    No task wakes up per chunk: framing and SSE parsing run in the protocol callback and only
    the finished response resolves a future. This keeps the load generator, which shares the
    cores with the servers under test, at a few ms of CPU per 64-token stream.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._state = "idle"
        self._acc: _Accumulator | None = None
        self._future: asyncio.Future[int] | None = None
        self._status = 0
        self._remaining = 0
        self._close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: bytes, acc: _Accumulator) -> asyncio.Future[int]:
        """Write ``request``; the future resolves to the status once the body is read."""
        assert self.transport is not None
        self._acc = acc
        self._future = asyncio.get_running_loop().create_future()
        self._state = "head"
        self._buf = b""
        self.transport.write(request)
        return self._future

    def data_received(self, data: bytes) -> None:
        self._buf = self._buf + data if self._buf else data
        if self._acc is None:
            return
        try:
            self._advance()
        except ValueError as exc:  # malformed framing: fail this request, drop the connection
            if self._future is not None and not self._future.done():
                self._future.set_exception(exc)
            self._acc = None
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._future is not None and not self._future.done():
            if self._state == "until_eof":
                assert self._acc is not None
                self._acc.feed(self._buf)
                self._acc.body_end()
                self._future.set_result(self._status)
            else:
                self._future.set_exception(ConnectionResetError("connection closed mid-response"))

    def _advance(self) -> None:
        assert self._acc is not None
        buf, pos, acc = self._buf, 0, self._acc
        while True:
            if self._state == "chunk_size":
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                self._remaining = int(buf[pos:nl].split(b";", 1)[0], 16)
                pos = nl + 2
                self._state = "chunk_data" if self._remaining else "trailer"
            elif self._state == "chunk_data":
                end = pos + self._remaining
                if len(buf) < end + 2:
                    break
                acc.feed(buf[pos:end])
                pos = end + 2
                self._state = "chunk_size"
            elif self._state == "head":
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    break
                self._start_body(buf[pos:end])
                pos = end + 4
            elif self._state == "trailer":  # trailer lines up to an empty one
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    self._finish()
                    break
            elif self._state == "length":
                if len(buf) - pos < self._remaining:
                    break
                acc.feed(buf[pos:pos + self._remaining])
                pos += self._remaining
                self._finish()
                break
            else:  # "until_eof" (body is fed on connection_lost) or "idle"
                break
        self._buf = buf[pos:]

    def _start_body(self, head: bytes) -> None:
        self._status = int(head[9:12])
        assert self._acc is not None
        self._acc.status_seen(self._status)
        headers: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self._close_after = headers.get(b"connection") == b"close"
        if headers.get(b"transfer-encoding") == b"chunked":
            self._state = "chunk_size"
        elif b"content-length" in headers:
            self._state = "length"
            self._remaining = int(headers[b"content-length"])
        else:
            self._state = "until_eof"

    def _finish(self) -> None:
        self._state = "idle"
        if self._acc is not None:
            self._acc.body_end()
        self._acc = None
        if self._future is not None and not self._future.done():
            self._future.set_result(self._status)
        if self._close_after and self.transport is not None:
            self.transport.close()


_ENDPOINTS: dict[Protocol, str] = {"openai": "/chat/completions", "langgraph": "/runs/stream",
                                   "langgraph-thread": "/threads/{thread_id}/runs/stream"}
"""Path of the streamed request, appended to a target's base URL."""
_THREADS_PATH = "/threads"
_THREAD_CREATE_BODY = b"{}"
"""``POST /threads`` as ``langgraph_sdk``'s ``threads.create()`` sends it without arguments."""


class _RawConnection:
    """One keep-alive HTTP/1.1 connection with just enough client to POST and read SSE.

    httpx (httpcore + h11, pure Python) costs over twice the client CPU per SSE chunk, and the
    load generator shares the cores with the servers, so that cost would read as server latency.
    """

    def __init__(self, target: Target, api_key: str | None) -> None:
        url = urlsplit(target.base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"raw client needs an http:// URL, got {target.base_url}")
        self._host = url.hostname
        self._port = url.port or 80
        self._prefix = url.path.rstrip("/")
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._headers = (f"Host: {self._host}:{self._port}\r\nContent-Type: application/json\r\n"
                         f"{auth}")
        self._protocol: _SSEClientProtocol | None = None

    async def connect(self) -> None:
        """Open the connection if it is not open."""
        if self._protocol is None or self._protocol.transport is None:
            _, self._protocol = await asyncio.get_running_loop().create_connection(
                _SSEClientProtocol, self._host, self._port)

    def close(self) -> None:
        """Drop the connection; the next request reconnects."""
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None

    async def post(self, path: str, body: bytes, acc: _Accumulator,
                   accept: str = "text/event-stream") -> int:
        """POST ``body`` to ``path`` (after the base URL's path), feed the response body to
        ``acc``, return the HTTP status."""
        await self.connect()
        assert self._protocol is not None
        request = (f"POST {self._prefix}{path} HTTP/1.1\r\n{self._headers}Accept: {accept}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        return await self._protocol.send(request, acc)


class _HttpxConnection:
    """Same interface over a shared ``httpx.AsyncClient`` (for comparison with raw)."""

    def __init__(self, client: httpx.AsyncClient, target: Target, api_key: str | None) -> None:
        self._client = client
        self._base = target.base_url.rstrip("/")
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"

    async def connect(self) -> None:
        """The pool connects lazily."""

    def close(self) -> None:
        """The pool owns connections."""

    async def post(self, path: str, body: bytes, acc: _Accumulator,
                   accept: str = "text/event-stream") -> int:
        """POST ``body`` to ``path``, feed the response body to ``acc``, return the status."""
        async with self._client.stream("POST", self._base + path, content=body,
                                       headers={**self._headers, "accept": accept}) as response:
            acc.status_seen(response.status_code)
            async for data in response.aiter_raw():
                acc.feed(data)
            acc.body_end()
            return response.status_code


_Connection = _RawConnection | _HttpxConnection


async def _one_request(conn: _Connection, timeout_s: float, protocol: Protocol,
                       body: bytes) -> RequestResult:
    """Run one streamed completion, LangGraph run, or thread create plus run, and classify it.

    For ``langgraph-thread`` every time (TTFT, latency) counts from the start of the thread
    create, which is what the user waits for; a failure in the create phase is reported with
    a ``create_`` prefix (``create_http_500``, ``create_timeout``, ``create_bad_json``).
    """
    acc = _new_accumulator(protocol)
    t0 = time.perf_counter()
    error: str | None = None
    detail: str | None = None
    status = 0
    create_s: float | None = None
    phase = "create_" if protocol == "langgraph-thread" else ""
    try:
        async with asyncio.timeout(timeout_s):
            path = _ENDPOINTS[protocol]
            if protocol == "langgraph-thread":
                created = _BodyAccumulator()
                create_status = await conn.post(_THREADS_PATH, _THREAD_CREATE_BODY, created,
                                                accept="application/json")
                create_s = time.perf_counter() - t0
                thread_id = created.thread_id()
                if create_status != 200:
                    error, detail = f"create_http_{create_status}", _detail(created.raw)
                elif thread_id is None:
                    error, detail = "create_bad_json", _detail(created.raw)
                else:
                    path = path.format(thread_id=quote(thread_id, safe=""))
                    phase = ""
            if error is None:
                status = await conn.post(path, body, acc)
    except TimeoutError:
        error = f"{phase}timeout"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
            httpx.HTTPError) as exc:
        error = f"{phase}{type(exc).__name__}"
    if error is not None:
        conn.close()
    end = time.perf_counter()
    if error is None and status != 200:
        error, detail = f"http_{status}", _detail(acc.raw)
    if error is None and acc.error is not None:
        error, detail = acc.error, acc.detail
    if error is None and acc.t_done is None:
        error = "no_done"
    if error is None and acc.chunks == 0:
        error = "no_content"
    return RequestResult(
        ok=error is None,
        latency_s=(acc.t_done or end) - t0,
        ttft_s=acc.t_first - t0 if acc.t_first is not None else None,
        tokens=acc.usage_tokens if acc.usage_tokens is not None else acc.chunks,
        error=error,
        create_s=create_s,
        detail=detail,
    )


def _request_body(target: Target, tokens: int) -> bytes:
    if target.protocol != "openai":  # a run of graph ``model``, stateless or on a thread
        return json.dumps({
            "assistant_id": target.model,
            "input": {"messages": [{"role": "user", "content": PROMPT}]},
            "stream_mode": ["messages-tuple"],
            "context": {"model_params": {"max_tokens": tokens}},
        }).encode()
    return json.dumps({
        "model": target.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
    }).encode()


# --------------------------------------------------------------------------- CPU sampling


def _proc_cpu_s(pid: int) -> float:
    """utime+stime of one process, in seconds (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _tree_cpu_s(root: int) -> float:
    """CPU of ``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += _proc_cpu_s(pid)
        stack.extend(children.get(pid, ()))
    return total


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- levels


def _pct(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


async def run_level(target: Target, concurrency: int, opts: LoadOptions) -> dict[str, Any]:
    """Drive one concurrency level against ``target`` and summarise it."""
    n_requests = opts.requests_for(concurrency)
    body = _request_body(target, opts.tokens)
    results: list[RequestResult] = []
    remaining = n_requests
    async with contextlib.AsyncExitStack() as stack:
        conns: list[_Connection]
        if opts.client == "httpx":
            client = await stack.enter_async_context(httpx.AsyncClient(
                limits=httpx.Limits(max_connections=concurrency,
                                    max_keepalive_connections=concurrency),
                timeout=opts.request_timeout_s))
            conns = [_HttpxConnection(client, target, opts.api_key) for _ in range(concurrency)]
        else:
            conns = [_RawConnection(target, opts.api_key) for _ in range(concurrency)]
            stack.callback(lambda: [c.close() for c in conns])
        # Connect up front so the first round does not pay for it; a failure here is
        # recorded by the requests themselves.
        await asyncio.gather(*(c.connect() for c in conns), return_exceptions=True)

        async def worker(index: int, conn: _Connection) -> None:
            nonlocal remaining
            await asyncio.sleep(opts.ramp_s * index / concurrency)
            while remaining > 0:
                remaining -= 1
                results.append(await _one_request(conn, opts.request_timeout_s, target.protocol,
                                                  body))

        cpu0 = _sample_cpu(target)
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker(i, c)) for i, c in enumerate(conns)]
        _, pending = await asyncio.wait(tasks, timeout=opts.level_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
        cpu1 = _sample_cpu(target)
    return _summarise(concurrency, n_requests, results, wall, bool(pending),
                      {k: cpu1[k] - cpu0[k] for k in cpu0})


def _host_busy_s() -> float:
    """Busy CPU time of the whole host (all cores), from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def _sample_cpu(target: Target) -> dict[str, float]:
    sample = {"client": _self_cpu_s(), "host": _host_busy_s()}
    if target.server_pid is not None:
        sample["server"] = _tree_cpu_s(target.server_pid)
    if target.backend_pid is not None:
        sample["backend"] = _tree_cpu_s(target.backend_pid)
    if target.db_pid is not None:
        sample["db"] = _tree_cpu_s(target.db_pid)
    return sample


def _summarise(concurrency: int, n_requests: int, results: list[RequestResult], wall: float,
               capped: bool, cpu: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    latencies = [r.latency_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    done = max(len(results), 1)
    samples: dict[str, str] = {}
    for r in results:
        if r.error and r.detail and r.error not in samples:
            samples[r.error] = r.detail
    summary: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": n_requests,
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": dict(Counter(r.error for r in results if r.error)),
        "error_samples": samples,
        "unfinished": n_requests - len(results),
        "capped": capped,
        "wall_s": round(wall, 3),
        "ttft_p50_ms": _ms(_pct(ttfts, 50)),
        "ttft_p95_ms": _ms(_pct(ttfts, 95)),
        "latency_p50_ms": _ms(_pct(latencies, 50)),
        "latency_p95_ms": _ms(_pct(latencies, 95)),
        "req_per_s": round(len(ok) / wall, 2),
        "tok_per_s": round(tokens / wall, 1),
        "tokens_per_req": round(tokens / len(ok), 1) if ok else 0,
        "client_cpu_ms_per_req": round(cpu["client"] * 1000 / done, 3),
        # Cores busy with anything but this harness, its client and its servers: noise.
        "other_cpu_cores": round(max(0.0, cpu["host"] - cpu["client"] - cpu.get("server", 0.0)
                                     - cpu.get("backend", 0.0) - cpu.get("db", 0.0)) / wall, 2),
    }
    creates = [r.create_s for r in results if r.create_s is not None]
    if creates:  # every finished thread create, whether its run then succeeded or not
        summary["create_p50_ms"] = _ms(_pct(creates, 50))
        summary["create_p95_ms"] = _ms(_pct(creates, 95))
    for name in ("server", "backend", "db"):
        if name in cpu:
            summary[f"{name}_cpu_ms_per_req"] = round(cpu[name] * 1000 / done, 3)
    return summary


async def run_target(target: Target, opts: LoadOptions) -> list[dict[str, Any]]:
    """Warm up, then run every level against ``target``."""
    if opts.warmup:
        body = _request_body(target, opts.tokens)
        conn: _Connection
        async with httpx.AsyncClient(timeout=opts.request_timeout_s) as client:
            conn = (_HttpxConnection(client, target, opts.api_key) if opts.client == "httpx"
                    else _RawConnection(target, opts.api_key))
            for _ in range(opts.warmup):
                result = await _one_request(conn, opts.request_timeout_s, target.protocol, body)
                if not result.ok:
                    print(f"  warmup request to {target.label} failed: {result.error}"
                          + (f" ({result.detail[:160]})" if result.detail else ""),
                          file=sys.stderr)
            conn.close()
    levels = []
    for concurrency in opts.levels:
        level = await run_level(target, concurrency, opts)
        print(f"  {target.label:<32} c={concurrency:<3} ok={level['ok']}/{level['requests']} "
              f"ttft p50={level['ttft_p50_ms']} ms p95={level['ttft_p95_ms']} ms "
              + (f"create p50={level['create_p50_ms']} ms p95={level['create_p95_ms']} ms "
                 if "create_p50_ms" in level else "")
              + f"req/s={level['req_per_s']} cpu ms/req server={level.get('server_cpu_ms_per_req')} "
              + (f"db={level['db_cpu_ms_per_req']} " if "db_cpu_ms_per_req" in level else "")
              + f"client={level['client_cpu_ms_per_req']} other-load={level['other_cpu_cores']} cores"
              + (f" errors={level['error_kinds']}" if level["error_kinds"] else "")
              + (f" unfinished={level['unfinished']}" if level["unfinished"] else "")
              + ("  [time cap hit]" if level["capped"] else ""),
              file=sys.stderr, flush=True)
        for kind, text in level["error_samples"].items():
            print(f"    {kind}: {text[:160]!r}", file=sys.stderr)
        levels.append(level)
    return levels


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """A subprocess in its own session, stopped (whole process group) on exit."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> None:
        self.name = name
        self._log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        """Process id (also its process-group id)."""
        return self.proc.pid

    async def wait_ready(self, url: str, timeout_s: float) -> None:
        """Poll ``url`` until it answers 200.

        Raises:
            RuntimeError: the process exited or did not become ready in time.
        """
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                       f"{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout_s:g}s:\n"
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the process's combined output."""
        self._log.flush()
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def _start_backend(stack: contextlib.ExitStack, workdir: Path, delay_ms: float,
                   tokens: int) -> tuple[ManagedProcess, int]:
    port = _free_port()
    backend = ManagedProcess(
        "scripted backend",
        [sys.executable, str(BENCH_DIR / "scripted_backend.py"), "--port", str(port),
         "--delay-ms", str(delay_ms), "--tokens", str(tokens)],
        workdir / "backend.log")
    stack.callback(backend.stop)
    return backend, port


def _write_switchyard_config(workdir: Path, backend_port: int) -> Path:
    models = workdir / "models.yaml"
    models.write_text(
        "backends:\n"
        "  scripted:\n"
        "    kind: openai\n"
        f"    base_url: http://127.0.0.1:{backend_port}/v1\n"
        "    model: scripted\n"
        # The registry requires a capability contract per backend; the scripted backend has
        # no real context limit, tools or JSON mode, so declare only a window.
        "    capabilities: {context_window: 8192}\n"
        "aliases:\n"
        "  chat-default: scripted\n")
    config = workdir / "switchyard.yaml"
    config.write_text(f"gateway:\n  models_file: {models}\n")
    return config


def _git(*argv: str) -> str:
    done = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO_ROOT), *argv],
                          capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


_CODE_PATHS = ("serving", "gateway", "graphs", "knowledge", "tools", "eval", "pyproject.toml")
"""What the server runs; a working tree with changes here is recorded as dirty."""


def _export_rev(rev: str, workdir: Path) -> tuple[Path, str]:
    """``git archive`` commit ``rev`` into ``workdir``; returns (directory, full sha).

    The server then runs from that directory (its cwd, first on ``PYTHONPATH``, ahead of
    the venv's editable install of the working tree), so a commit can be measured while
    the working tree is being edited.
    """
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    src = workdir / f"src-{sha[:12]}"
    archive = workdir / f"src-{sha[:12]}.tar"
    _git("archive", "--format=tar", "-o", str(archive), sha)
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    archive.unlink()
    return src, sha


def _source_record(rev: str | None, sha: str | None) -> dict[str, Any]:
    """Which code the server ran, for the results file."""
    if rev is not None:
        return {"rev": rev, "commit": sha}
    try:
        dirty = bool(_git("status", "--porcelain", "--", *_CODE_PATHS))
        return {"working_tree": True, "head": _git("rev-parse", "HEAD"), "dirty": dirty}
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return {"working_tree": True}


def _start_switchyard(stack: contextlib.ExitStack, workdir: Path, binary: Path,
                      backend_port: int, name: str = "", postgres_dsn: str | None = None,
                      src: Path | None = None) -> tuple[ManagedProcess, int]:
    """Start ``switchyard serve`` on a free loopback port with its own data dir.

    ``name`` suffixes the data dir and log (``data-<name>``, ``switchyard-<name>.log``);
    ``postgres_dsn`` sets ``SWITCHYARD_THREADS__POSTGRES_DSN``, and without it any such
    variable inherited from the caller is dropped so that the thread store is SQLite;
    ``src`` runs the code exported there (`_export_rev`) instead of the working tree.
    """
    config = _write_switchyard_config(workdir, backend_port)
    suffix = f"-{name}" if name else ""
    data_dir = workdir / f"data{suffix}"
    data_dir.mkdir()
    port = _free_port()
    env = dict(os.environ, SWITCHYARD_DATA_DIR=str(data_dir))
    env.pop("SWITCHYARD_THREADS__POSTGRES_DSN", None)
    if postgres_dsn is not None:
        env["SWITCHYARD_THREADS__POSTGRES_DSN"] = postgres_dsn
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    server = ManagedProcess(
        f"switchyard{suffix}",
        [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port),
         "--config", str(config), "--dev"],
        workdir / f"switchyard{suffix}.log", env=env, cwd=src or REPO_ROOT)
    stack.callback(server.stop)
    return server, port


def _as_postgres(*command: str) -> list[str]:
    # PostgreSQL refuses to run as root; these machines run the bench as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


class ManagedPostgres:
    """A throwaway PostgreSQL cluster from Debian's package on a free loopback port.

    The same recipe as the ``postgres`` fixture in ``tests/conftest.py`` (``initdb`` and
    ``pg_ctl`` as the ``postgres`` user when run as root, trust auth, listening on 127.0.0.1
    only), but with the server's default durability settings unless ``settings`` says
    otherwise (``fsync=off`` would flatter it against SQLite). Stopped, and its data directory
    removed unless ``keep``, by `stop`.
    """

    def __init__(self, settings: list[str], keep: bool) -> None:
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not binaries:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self._bindir = binaries[-1].parent
        self.version = self._bindir.parent.name
        self._settings = settings
        self._keep = keep
        self.port = _free_port()
        self.data = Path(tempfile.mkdtemp(prefix="switchyard-bench-pg-"))
        self._started = False

    def _run(self, *argv: str, timeout_s: float) -> None:
        done = subprocess.run(_as_postgres(*argv), capture_output=True, text=True,
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def start(self) -> None:
        """initdb, start and wait (``pg_ctl -w``), create the ``switchyard_bench`` database.

        Raises:
            RuntimeError: a step failed; its output is in the message.
        """
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        self._run(str(self._bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", timeout_s=120)
        options = " ".join([f"-p {self.port}", f"-k {self.data}",
                            "-c listen_addresses=127.0.0.1",
                            *(f"-c {setting}" for setting in self._settings)])
        self._started = True  # from here on `stop` has something to stop
        self._run(str(self._bindir / "pg_ctl"), "-D", str(self.data), "-o", options,
                  "-l", str(self.data / "server.log"), "-w", "-t", "60", "start", timeout_s=90)
        self._run(str(self._bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", "switchyard_bench", timeout_s=60)

    @property
    def dsn(self) -> str:
        """DSN of the ``switchyard_bench`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/switchyard_bench"

    @property
    def pid(self) -> int:
        """The postmaster's pid (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def stop(self) -> None:
        """``pg_ctl stop -m fast``, then ``-m immediate`` if that fails; remove the data dir."""
        if self._started:
            for mode in ("fast", "immediate"):
                try:
                    self._run(str(self._bindir / "pg_ctl"), "-D", str(self.data), "-m", mode,
                              "-w", "-t", "30", "stop", timeout_s=45)
                    break
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"postgres: pg_ctl stop -m {mode} failed: {exc}", file=sys.stderr)
            self._started = False
        if self._keep:
            print(f"kept the PostgreSQL data dir {self.data}", file=sys.stderr)
        else:
            shutil.rmtree(self.data, ignore_errors=True)


# --------------------------------------------------------------------------- report


def _deltas(floor: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per level of ``other``, in order: the n-th level at some concurrency is
    compared with the floor's n-th level at that concurrency (or its last one), so a level
    list that comes back to c=1 after c=50 compares like with like."""
    by_c: dict[int, list[dict[str, Any]]] = {}
    for level in floor:
        by_c.setdefault(level["concurrency"], []).append(level)
    seen: Counter[int] = Counter()
    out: list[dict[str, Any]] = []
    for level in other:
        c = level["concurrency"]
        bases = by_c.get(c)
        seen[c] += 1
        if not bases:
            out.append({"concurrency": c, "added_ttft_p50_ms": None, "added_ttft_p95_ms": None,
                        "added_latency_p50_ms": None, "throughput_ratio": None})
            continue
        base = bases[min(seen[c], len(bases)) - 1]

        def diff(key: str, level: dict[str, Any] = level,
                 base: dict[str, Any] = base) -> float | None:
            if level[key] is None or base[key] is None:
                return None
            return round(level[key] - base[key], 2)

        out.append({
            "concurrency": level["concurrency"],
            "added_ttft_p50_ms": diff("ttft_p50_ms"),
            "added_ttft_p95_ms": diff("ttft_p95_ms"),
            "added_latency_p50_ms": diff("latency_p50_ms"),
            "throughput_ratio": (round(level["req_per_s"] / base["req_per_s"], 3)
                                 if base["req_per_s"] else None),
        })
    return out


def _verdicts(label: str, levels: list[dict[str, Any]], deltas: list[dict[str, Any]],
              targets: Targets) -> list[str]:
    level = next((lv for lv in levels if lv["concurrency"] == targets.concurrency), None)
    delta = next((d for d in deltas if d["concurrency"] == targets.concurrency), None)
    if level is None or delta is None:
        return []

    def check(name: str, value: float | None, limit: float, higher_is_better: bool = False,
              unit: str = " ms") -> str:
        if value is None:
            return f"{name} n/a"
        good = value >= limit if higher_is_better else value <= limit
        op = ">=" if higher_is_better else "<="
        return f"{name} {value}{unit} ({op} {limit:g}) {'PASS' if good else 'FAIL'}"

    cpu, cpu_name = level.get("server_cpu_ms_per_req"), "server CPU"
    if not level["ok"]:
        cpu = None  # CPU per failed request says nothing about the cost of a run
    if cpu is not None and "db_cpu_ms_per_req" in level:
        # With SQLite the database work is in the server's CPU; with PostgreSQL add it back.
        cpu, cpu_name = round(cpu + level["db_cpu_ms_per_req"], 3), "server+db CPU"
    parts = [
        check("+TTFT p50", delta["added_ttft_p50_ms"], targets.added_ttft_p50_ms),
        check("+TTFT p95", delta["added_ttft_p95_ms"], targets.added_ttft_p95_ms),
        check("throughput", delta["throughput_ratio"], targets.throughput_ratio, True, "x"),
        check(cpu_name, cpu, targets.server_cpu_ms_per_req, unit=" ms/req"),
    ]
    if level["errors"] or level["unfinished"]:
        parts.append(f"errors {level['errors']} unfinished {level['unfinished']} FAIL")
    return [f"- `{label}` @ c={targets.concurrency}: " + "; ".join(parts)]


def render_markdown(results: dict[str, Any], targets: Targets) -> str:
    """Markdown table (one row per target and level), the errors of every level that had
    any, by kind, and the target verdicts."""
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    def cpu_cell(lv: dict[str, Any]) -> str:
        server = lv.get("server_cpu_ms_per_req")
        if server is None or "db_cpu_ms_per_req" not in lv:
            return cell(server)
        return f"{server} + {lv['db_cpu_ms_per_req']} db"

    header = ("| target | c | ok/n | err | TTFT p50 | TTFT p95 | create p50 | create p95 "
              "| total p50 | total p95 | req/s | tok/s | server CPU ms/req | other load "
              "| +TTFT p50 | +TTFT p95 | thr ratio |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    verdicts: list[str] = []
    errors: list[str] = []
    for label, run in results["runs"].items():
        deltas = run.get("vs_floor") or [{}] * len(run["levels"])
        for lv, d in zip(run["levels"], deltas, strict=True):
            rows.append("| " + " | ".join(cell(v) for v in (
                label, lv["concurrency"], f"{lv['ok']}/{lv['requests']}",
                lv["errors"] + lv["unfinished"], lv["ttft_p50_ms"], lv["ttft_p95_ms"],
                lv.get("create_p50_ms"), lv.get("create_p95_ms"),
                lv["latency_p50_ms"], lv["latency_p95_ms"], lv["req_per_s"], lv["tok_per_s"],
                cpu_cell(lv), lv["other_cpu_cores"], d.get("added_ttft_p50_ms"),
                d.get("added_ttft_p95_ms"), d.get("throughput_ratio"))) + " |")
            kinds = [f"{kind} ×{n}" for kind, n in lv["error_kinds"].items()]
            if lv["unfinished"]:
                kinds.append(f"unfinished ×{lv['unfinished']}")
            if kinds:
                errors.append(f"- `{label}` c={lv['concurrency']}: " + ", ".join(kinds))
        if run.get("vs_floor"):
            verdicts += _verdicts(label, run["levels"], run["vs_floor"], targets)
    text = "\n".join(rows)
    if errors:
        text += "\n\nErrors (per level, by kind; samples in the JSON):\n" + "\n".join(errors)
    if verdicts:
        text += "\n\nTargets:\n" + "\n".join(verdicts)
    return text + "\n"


# --------------------------------------------------------------------------- main


async def _bench(args: argparse.Namespace, opts: LoadOptions, stack: contextlib.ExitStack,
                 workdir: Path, src: Path | None) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    mode: Mode = args.mode
    if mode == "url":
        for model in args.model or ["chat"]:
            target = Target(label=model, base_url=args.base_url, model=model,
                            server_pid=args.server_pid)
            print(f"loading {target.base_url} model={model}", file=sys.stderr)
            runs[model] = {"base_url": args.base_url, "model": model,
                           "levels": await run_target(target, opts)}
        return runs

    backend, backend_port = _start_backend(stack, workdir, args.delay_ms, args.tokens)
    await backend.wait_ready(f"http://127.0.0.1:{backend_port}/health", 30)
    if mode in ("floor", "all"):
        target = Target(label="floor", base_url=f"http://127.0.0.1:{backend_port}/v1",
                        model="scripted", server_pid=backend.pid)
        print("floor: scripted backend direct", file=sys.stderr)
        runs["floor"] = {"model": "scripted", "levels": await run_target(target, opts)}
    if mode in ("switchyard", "all"):
        binary = Path(args.switchyard_bin)
        if not binary.exists():
            raise SystemExit(f"switchyard binary not found: {binary}")
        shared: tuple[ManagedProcess, int] | None = None
        postgres: ManagedPostgres | None = None
        for name in args.targets:
            spec = SWITCHYARD_TARGETS[name]
            # A target with a store of its own gets a fresh server, stopped after it.
            with contextlib.ExitStack() as own:
                db_pid: int | None = None
                run: dict[str, Any] = {"model": spec.model, "protocol": spec.protocol}
                if spec.store is None:
                    if shared is None:
                        shared = _start_switchyard(stack, workdir, binary, backend_port,
                                                   src=src)
                        await shared[0].wait_ready(f"http://127.0.0.1:{shared[1]}/readyz",
                                                   args.ready_timeout)
                    server, port = shared
                else:
                    dsn: str | None = None
                    if spec.store == "postgres":
                        if postgres is None:
                            postgres = ManagedPostgres(args.pg_setting or [], args.keep_tmp)
                            stack.callback(postgres.stop)
                            print(f"postgres {postgres.version}: starting on 127.0.0.1:"
                                  f"{postgres.port}", file=sys.stderr)
                            await asyncio.to_thread(postgres.start)
                        dsn, db_pid = postgres.dsn, postgres.pid
                        run["postgres"] = {"version": postgres.version,
                                           "settings": args.pg_setting or []}
                    server, port = _start_switchyard(own, workdir, binary, backend_port, name,
                                                     postgres_dsn=dsn, src=src)
                    await server.wait_ready(f"http://127.0.0.1:{port}/readyz",
                                            args.ready_timeout)
                    run["thread_store"] = spec.store
                base_url = f"http://127.0.0.1:{port}" + ("/v1" if spec.protocol == "openai" else "")
                target = Target(label=f"switchyard:{name}", base_url=base_url, model=spec.model,
                                protocol=spec.protocol, server_pid=server.pid,
                                backend_pid=backend.pid, db_pid=db_pid)
                print(f"switchyard: {name} ({spec.protocol}, {spec.model}"
                      + (f", {spec.store} thread store" if spec.store else "") + ")",
                      file=sys.stderr)
                levels = await run_target(target, opts)
                run["levels"] = levels
                if "floor" in runs:
                    run["vs_floor"] = _deltas(runs["floor"]["levels"], levels)
                runs[target.label] = run
                if server.proc.poll() is not None:
                    raise RuntimeError(f"switchyard exited during the run:\n{server.log_tail()}")
    return runs


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mode", choices=["floor", "switchyard", "all", "url"], default="all")
    parser.add_argument("--levels", default="1,10,50", help="concurrency levels (default 1,10,50)")
    parser.add_argument("--targets", default=",".join(SWITCHYARD_TARGETS),
                        help="switchyard targets, comma list among "
                             f"{', '.join(SWITCHYARD_TARGETS)} (default all)")
    parser.add_argument("--requests-per-level", type=int, default=None,
                        help="requests per level (default 30 at c=1, else 200)")
    parser.add_argument("--level-timeout", type=float, default=60.0,
                        help="hard cap per level in seconds (default 60)")
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--ramp-ms", type=float, default=None,
                        help="spread worker starts over this window (default tokens*delay)")
    parser.add_argument("--warmup", type=int, default=3, help="warmup requests per target")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="backend inter-token delay")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--switchyard-bin", default=str(DEFAULT_SWITCHYARD_BIN))
    parser.add_argument("--switchyard-rev", default=None, metavar="REV",
                        help="run the server from this commit (git archive into the temp dir) "
                             "instead of the working tree")
    parser.add_argument("--ready-timeout", type=float, default=60.0)
    parser.add_argument("--base-url", default=None, help="url mode: OpenAI base URL")
    parser.add_argument("--model", action="append", help="url mode: model (repeatable)")
    parser.add_argument("--server-pid", type=int, default=None, help="url mode: pid to sample")
    parser.add_argument("--pg-setting", action="append", metavar="NAME=VALUE",
                        help="PostgreSQL server setting for the -pg targets, passed as "
                             "-c NAME=VALUE (repeatable; default: the server's defaults)")
    parser.add_argument("--keep-tmp", action="store_true", help="keep configs and logs")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/")
    args = parser.parse_args(argv)
    if args.mode == "url" and not args.base_url:
        parser.error("--mode url needs --base-url")
    targets = list(dict.fromkeys(t.strip() for t in args.targets.split(",") if t.strip()))
    unknown = [t for t in targets if t not in SWITCHYARD_TARGETS]
    if unknown or not targets:
        parser.error(f"--targets: unknown {', '.join(unknown) or '(empty)'}; "
                     f"choose among {', '.join(SWITCHYARD_TARGETS)}")
    args.targets = targets
    return args


def _loadavg() -> list[float]:
    """1/5/15-minute load average: other work on the box skews every number here."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; every process started here is stopped on the way out."""
    args = _parse_args(argv)
    levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    ramp_ms = args.tokens * args.delay_ms if args.ramp_ms is None else args.ramp_ms
    opts = LoadOptions(levels=levels, requests_per_level=args.requests_per_level,
                       level_timeout_s=args.level_timeout, request_timeout_s=args.request_timeout,
                       ramp_s=ramp_ms / 1000, warmup=args.warmup, tokens=args.tokens,
                       client=args.client, api_key=args.api_key)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.gmtime()
    loadavg_before = _loadavg()
    try:
        with contextlib.ExitStack() as stack:  # unwinding stops every process started
            if args.keep_tmp:
                workdir = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
                print(f"keeping configs and logs in {workdir}", file=sys.stderr)
            else:
                workdir = Path(stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="switchyard-bench-")))
            src: Path | None = None
            sha: str | None = None
            if args.switchyard_rev is not None and args.mode != "url":
                src, sha = _export_rev(args.switchyard_rev, workdir)
                print(f"switchyard: running commit {sha[:12]} from {src}", file=sys.stderr)
            runs = asyncio.run(_bench(args, opts, stack, workdir, src))
    except KeyboardInterrupt:
        print("interrupted; subprocesses stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    results = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", started),
        "mode": args.mode,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "platform": platform.platform(), "loadavg_before": loadavg_before,
                 "loadavg_after": _loadavg()},
        "settings": {"levels": list(levels), "tokens": args.tokens, "delay_ms": args.delay_ms,
                     "requests_per_level": {c: opts.requests_for(c) for c in levels},
                     "level_timeout_s": args.level_timeout, "ramp_ms": ramp_ms,
                     "warmup": args.warmup, "client": args.client,
                     "switchyard_targets": args.targets,
                     "switchyard_source": _source_record(args.switchyard_rev, sha),
                     "pg_settings": args.pg_setting or []},
        "targets": dataclasses.asdict(Targets()),
        "runs": runs,
    }
    print(render_markdown(results, Targets()))
    if not args.no_save:
        RESULTS_DIR.mkdir(exist_ok=True)
        path = RESULTS_DIR / (time.strftime("%Y%m%dT%H%M%SZ", started) + ".json")
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {path.relative_to(REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
