"""Scripted OpenAI-compatible backend used as the benchmark floor.

A benchmark tool, not a test fake: it answers chat completions with a fixed number of tokens
at a fixed pace so that anything measured above it (Switchyard's added latency, CPU, lost
throughput) is attributable to the layer under test. It is a hand-rolled asyncio HTTP/1.1
server with keep-alive, because a framework stack (ASGI server + app + SSE helper) would cost
more CPU per token than the proxy we want to measure, and the whole bench shares two cores.

Endpoints:
    ``POST /v1/chat/completions``  streaming (SSE ``chat.completion.chunk``) and non-streaming.
    ``GET /v1/models``             one model, named by ``--model``.
    ``GET /health``                200 ``{"status": "ok"}``.

Streaming timeline for N tokens and delay D: headers and the role chunk at t=0, token i
(0-based) at t=(i+1)*D measured from the request's arrival (absolute deadlines, so loop jitter
does not accumulate), ``finish_reason`` in the last token chunk, an optional usage chunk, then
``data: [DONE]``. N is ``max_completion_tokens`` or ``max_tokens`` from the request, else
``--tokens``; ``finish_reason`` is ``"length"`` when the request set the limit, else ``"stop"``.

Usage::

    python bench/scripted_backend.py --port 8100 [--delay-ms 10] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["BackendSettings", "ScriptedBackend", "main"]

_VOCAB: tuple[str, ...] = (
    " lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
    " sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
)
_VOCAB_JSON: tuple[bytes, ...] = tuple(json.dumps(t).encode() for t in _VOCAB)
_MAX_HEADER_BYTES = 64 * 1024
_MAX_BODY_BYTES = 16 * 1024 * 1024
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendSettings:
    """How the scripted backend answers."""

    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = 8100
    """TCP port to bind (0 picks a free one)."""
    delay_s: float = 0.010
    """Delay before each token, in seconds."""
    tokens: int = 64
    """Tokens per completion when the request sets no limit."""
    model: str = "scripted"
    """Model id listed by ``GET /v1/models``."""


class _BadRequest(Exception):
    """A request we answer with an error status and then close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def _chunk(payload: bytes) -> bytes:
    """Frame ``payload`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _response(status: int, body: bytes, keep_alive: bool,
              content_type: bytes = b"application/json") -> bytes:
    """Build a complete fixed-length HTTP/1.1 response."""
    return b"".join((
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, "Error").encode()),
        b"content-type: " + content_type + b"\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: keep-alive\r\n" if keep_alive else b"connection: close\r\n",
        b"\r\n",
        body,
    ))


def _error_body(status: int, message: str) -> bytes:
    """OpenAI-shaped error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": None}}).encode()


def _prompt_tokens(messages: list[Any]) -> int:
    """Crude prompt size estimate (4 characters a token); only reported in ``usage``."""
    chars = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        chars += len(content) if isinstance(content, str) else len(json.dumps(content))
    return max(1, chars // 4)


class ScriptedBackend:
    """The asyncio HTTP/1.1 server; one instance serves many keep-alive connections."""

    def __init__(self, settings: BackendSettings) -> None:
        self._s = settings
        self._models_body = json.dumps({"object": "list", "data": [
            {"id": settings.model, "object": "model", "created": 0, "owned_by": "bench"},
        ]}).encode()

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        server = await asyncio.start_server(
            self._connection, self._s.host, self._s.port, backlog=1024, limit=_MAX_HEADER_BYTES)
        port = server.sockets[0].getsockname()[1]
        print(f"scripted backend listening on http://{self._s.host}:{port} "
              f"(delay {self._s.delay_s * 1000:g} ms, {self._s.tokens} tokens)", flush=True)
        async with server:
            await stop.wait()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until it closes or asks to."""
        try:
            while True:
                try:
                    request = await self._read_request(reader)
                except _BadRequest as exc:
                    writer.write(_response(exc.status, _error_body(exc.status, exc.message),
                                           keep_alive=False))
                    await writer.drain()
                    return
                if request is None:
                    return
                if request.headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await self._dispatch(request, writer)
                if not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # client went away mid-request or mid-stream: nothing to clean up
        finally:
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> _Request | None:
        """Read one request; ``None`` on a clean EOF between requests."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise _BadRequest(400, "truncated request head") from None
            return None
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "request head too large") from None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            raise _BadRequest(400, "malformed request line") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" and (version != "HTTP/1.0" or connection == "keep-alive")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked(reader)
        else:
            length = int(headers.get("content-length", "0") or 0)
            if length > _MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            body = await reader.readexactly(length) if length else b""
        return _Request(method=method, path=target.split("?", 1)[0], headers=headers, body=body,
                        keep_alive=keep_alive)

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        """Read a chunked request body (trailers are discarded)."""
        parts: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            total += size
            if total > _MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            parts.append((await reader.readexactly(size + 2))[:-2])

    async def _dispatch(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        """Route one request."""
        ka = request.keep_alive
        if request.path == "/v1/chat/completions":
            if request.method != "POST":
                writer.write(_response(405, _error_body(405, "use POST"), ka))
            else:
                await self._chat(request, writer)
                return
        elif request.path in ("/v1/models", "/models") and request.method == "GET":
            writer.write(_response(200, self._models_body, ka))
        elif request.path == "/health" and request.method == "GET":
            writer.write(_response(200, b'{"status":"ok"}', ka))
        else:
            writer.write(_response(404, _error_body(404, f"no route {request.path}"), ka))
        await writer.drain()

    async def _chat(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        """Answer one chat completion, streamed or not."""
        start = time.monotonic()
        ka = request.keep_alive
        try:
            payload = json.loads(request.body)
            if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
                raise ValueError("'messages' must be a list")
        except ValueError as exc:
            writer.write(_response(400, _error_body(400, f"invalid body: {exc}"), ka))
            await writer.drain()
            return
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        n_tokens = int(limit) if isinstance(limit, int) and limit > 0 else self._s.tokens
        finish = "length" if limit else "stop"
        model = str(payload.get("model") or self._s.model)
        prompt_tokens = _prompt_tokens(payload["messages"])
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                 "total_tokens": prompt_tokens + n_tokens}
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if not payload.get("stream"):
            await asyncio.sleep(n_tokens * self._s.delay_s)
            body = {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {
                    "role": "assistant",
                    "content": "".join(_VOCAB[i % len(_VOCAB)] for i in range(n_tokens)),
                }, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            }
            writer.write(_response(200, json.dumps(body).encode(), ka))
            await writer.drain()
            return
        stream_options = payload.get("stream_options") or {}
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage"))
        await self._stream(writer, ka=ka, start=start, cid=cid, created=created, model=model,
                           n_tokens=n_tokens, finish=finish,
                           usage=usage if include_usage else None)

    async def _stream(self, writer: asyncio.StreamWriter, *, ka: bool, start: float, cid: str,
                      created: int, model: str, n_tokens: int, finish: str,
                      usage: dict[str, int] | None) -> None:
        """Write the SSE stream, one chunk per token, pacing on absolute deadlines."""
        # Everything except the token text is fixed per request, so the JSON is assembled
        # from pre-encoded pieces: the per-token cost stays a few byte joins.
        head = (b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                b'"choices":[{"index":0,"delta":' % (cid.encode(), created,
                                                      json.dumps(model).encode()))
        tail_usage = b',"usage":null' if usage is not None else b""
        mid = b'},"logprobs":null,"finish_reason":null}]' + tail_usage + b"}\n\n"
        last = (b'},"logprobs":null,"finish_reason":"%s"}]' % finish.encode()) + tail_usage \
            + b"}\n\n"
        writer.write(b"".join((
            b"HTTP/1.1 200 OK\r\n",
            b"content-type: text/event-stream; charset=utf-8\r\n",
            b"cache-control: no-cache\r\n",
            b"transfer-encoding: chunked\r\n",
            b"connection: keep-alive\r\n" if ka else b"connection: close\r\n",
            b"\r\n",
            _chunk(head + b'{"role":"assistant","content":""' + mid),
        )))
        await writer.drain()
        delay = self._s.delay_s
        loop = asyncio.get_running_loop()
        for i in range(n_tokens):
            wait = start + (i + 1) * delay - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if writer.is_closing():
                return
            token = _VOCAB_JSON[i % len(_VOCAB_JSON)]
            is_last = i == n_tokens - 1
            writer.write(_chunk(head + b'{"content":' + token + (last if is_last else mid)))
            if not is_last:
                await writer.drain()
        tail: list[bytes] = []
        if usage is not None:
            tail.append(_chunk(
                b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                b'"choices":[],"usage":%s}\n\n' % (cid.encode(), created,
                                                   json.dumps(model).encode(),
                                                   json.dumps(usage).encode())))
        tail.append(_chunk(b"data: [DONE]\n\n"))
        tail.append(b"0\r\n\r\n")
        writer.write(b"".join(tail))
        await writer.drain()


async def _run(settings: BackendSettings) -> None:
    """Serve until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await ScriptedBackend(settings).serve(stop)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--delay-ms", type=float, default=10.0,
                        help="delay before each token (default 10)")
    parser.add_argument("--tokens", type=int, default=64,
                        help="tokens per completion when the request sets no limit (default 64)")
    parser.add_argument("--model", default="scripted", help="model id for /v1/models")
    args = parser.parse_args(argv)
    settings = BackendSettings(host=args.host, port=args.port, delay_s=args.delay_ms / 1000,
                               tokens=args.tokens, model=args.model)
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
