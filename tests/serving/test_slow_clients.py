"""Slow and oversized clients (issue 11, finding 2), with raw sockets against the real
server on 127.0.0.1 and no API key: an oversized head or too many header fields is
refused (431) without the server buffering it, a head or body that trickles or stalls
is refused (408) or closed within the configured time, memory stays bounded, and the
server answers a normal request right after."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_HEADER_BYTES = 65_536
MAX_HEADERS = 100
MARGIN_S = 2.5
"""Slack on a shared, busy machine: the server's timer plus scheduling."""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("slow-clients")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
            "auth": {"tenants": {"acme": {}}},
            "server": {
                "header_timeout_s": HEADER_TIMEOUT_S,
                "body_timeout_s": BODY_TIMEOUT_S,
                "max_header_bytes": MAX_HEADER_BYTES,
                "max_headers": MAX_HEADERS,
                "max_body_bytes": 32 << 20,
            },
        },
        dev=False,
    )
    try:
        yield handle
    finally:
        stop_server(handle)


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int | None
    """The status line's code, if the server answered."""
    closed_after_s: float
    """Seconds from the start until the server closed or reset the connection."""


def _connect(server: ServerHandle) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _status(answer: bytes) -> int | None:
    if not answer.startswith(b"HTTP/1.1 "):
        return None
    return int(answer[9:12])


def _read_until_closed(sock: socket.socket, started: float, limit_s: float) -> Outcome:
    """Read what the server sends until it closes (or ``limit_s`` from ``started``)."""
    answer = b""
    while True:
        remaining = started + limit_s - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"connection still open after {limit_s:.1f} s (received {answer[:80]!r})")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        except TimeoutError:
            continue
        if not chunk:
            break
        answer += chunk
    return Outcome(status=_status(answer), closed_after_s=time.monotonic() - started)


def _send_head(server: ServerHandle, head: bytes, *, limit_s: float = 15.0) -> Outcome:
    """Send ``head`` in 64 KiB pieces, stopping when the server refuses; then read."""
    started = time.monotonic()
    with _connect(server) as sock:
        view = memoryview(head)
        try:
            for start in range(0, len(view), 65536):
                sock.sendall(view[start : start + 65536])
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass  # refused while sending
        try:
            return _read_until_closed(sock, started, limit_s)
        except ConnectionResetError:
            return Outcome(status=None, closed_after_s=time.monotonic() - started)


def _trickle(server: ServerHandle, first: bytes, piece: bytes, every_s: float, limit_s: float) -> Outcome:
    """Send ``first``, then ``piece`` every ``every_s`` until the server closes."""
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(first)
        answer = b""
        while time.monotonic() - started < limit_s:
            sock.settimeout(every_s)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                try:
                    sock.sendall(piece)
                except (ConnectionResetError, BrokenPipeError):
                    break
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        else:
            raise AssertionError(f"connection still open after {limit_s:.1f} s (received {answer[:80]!r})")
    return Outcome(status=_status(answer), closed_after_s=time.monotonic() - started)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _still_serves(server: ServerHandle) -> None:
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401  # and auth still holds


def test_an_oversized_header_is_431(guarded: ServerHandle) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 << 20) + b"\r\n\r\n"
    outcome = _send_head(guarded, big)
    assert outcome.status in (431, None), outcome  # 431, or reset while the client still sent
    assert outcome.closed_after_s < 10
    just_over = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n"
    assert _send_head(guarded, just_over).status == 431
    under = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES - 100) + b"\r\nConnection: close\r\n\r\n"
    assert _send_head(guarded, under).status == 200
    _still_serves(guarded)


def test_too_many_headers_are_431(guarded: ServerHandle) -> None:
    def head(count: int) -> bytes:
        fields = b"".join(b"X-%d: 1\r\n" % i for i in range(count))
        return b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"Connection: close\r\n\r\n"

    assert _send_head(guarded, head(MAX_HEADERS + 10)).status == 431
    assert _send_head(guarded, head(MAX_HEADERS - 5)).status == 200
    flood = _send_head(guarded, head(100_000))
    assert flood.status in (431, None), flood
    _still_serves(guarded)


def test_oversized_heads_do_not_grow_the_server(guarded: ServerHandle) -> None:
    pid = guarded.process.pid
    _still_serves(guarded)
    before = _rss_bytes(pid)
    endless = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (16 << 20)  # never ends

    with ThreadPoolExecutor(20) as pool:
        outcomes = list(pool.map(lambda _: _send_head(guarded, endless, limit_s=20), range(20)))
    after = _rss_bytes(pid)
    assert all(o.status in (431, None) for o in outcomes), outcomes
    # 20 x 16 MB were sent; the server keeps at most a head's limit per connection.
    assert after - before < 64 << 20, f"server RSS grew by {(after - before) >> 20} MiB"
    _still_serves(guarded)


def test_a_trickled_or_idle_head_is_cut_off(guarded: ServerHandle) -> None:
    limit = HEADER_TIMEOUT_S + MARGIN_S

    def trickle(_: int) -> Outcome:
        return _trickle(guarded, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n", 0.3, limit)

    def idle(_: int) -> Outcome:
        started = time.monotonic()
        with _connect(guarded) as sock:
            return _read_until_closed(sock, started, limit)

    with ThreadPoolExecutor(20) as pool:
        trickled = list(pool.map(trickle, range(10)))
        idled = list(pool.map(idle, range(10)))
    assert all(o.status == 408 for o in trickled), trickled
    assert all(o.status is None for o in idled), idled  # never sent a byte: closed without an answer
    assert all(o.closed_after_s >= HEADER_TIMEOUT_S - 0.2 for o in trickled + idled)
    _still_serves(guarded)


def test_a_stalled_or_trickled_body_is_cut_off(guarded: ServerHandle) -> None:
    limit = BODY_TIMEOUT_S + MARGIN_S
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )

    def stall(_: int) -> Outcome:
        return _trickle(guarded, head + b'{"model": ', b"", 0.3, limit)  # sends nothing more

    def trickle(_: int) -> Outcome:
        return _trickle(guarded, head + b'{"model": ', b" ", 0.3, limit)

    with ThreadPoolExecutor(20) as pool:
        stalled = list(pool.map(stall, range(10)))
        trickled = list(pool.map(trickle, range(10)))
    # The app waits for the body, so the server answers 408 itself.
    assert all(o.status == 408 for o in stalled + trickled), stalled + trickled
    _still_serves(guarded)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(guarded.url + "/v1/chat/completions", json=body, timeout=10)
    assert answer.status_code == 401  # a whole body in time is read and handled as before


def test_a_kept_alive_connection_idle_past_the_header_timeout_still_works(guarded: ServerHandle) -> None:
    # The header timer runs from a request's first byte, not from the previous answer
    # (idle kept-alive connections are uvicorn's timeout_keep_alive's business, 5 s).
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        for _ in range(2):
            assert client.get("/healthz").status_code == 200
            time.sleep(HEADER_TIMEOUT_S + 0.5)
        assert client.get("/healthz").status_code == 200
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 401


# Chunked framing and trailers (what the parser is fed after the head but that is not body)


def _chunked(body: bytes, size: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))


CHUNKED_POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
LAST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _statuses(server: ServerHandle, payload: bytes, *, limit_s: float = 30.0) -> list[int]:
    """Send ``payload`` on one connection, read until the server closes: the statuses."""
    started = time.monotonic()
    with _connect(server) as sock:
        sock.settimeout(limit_s)
        sock.sendall(payload)
        answer = b""
        while time.monotonic() - started < limit_s:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def test_endless_trailers_are_refused_and_do_not_grow_the_server(guarded: ServerHandle) -> None:
    pid = guarded.process.pid
    _still_serves(guarded)
    before = _rss_bytes(pid)
    endless = CHUNKED_POST + b"5\r\nhello\r\n0\r\nX-T: " + b"t" * (8 << 20)  # never ends

    with ThreadPoolExecutor(20) as pool:
        outcomes = list(pool.map(lambda _: _send_head(guarded, endless, limit_s=20), range(20)))
    after = _rss_bytes(pid)
    # Refused as framing past the limit, not left to the body timer (which answers 408).
    assert all(o.status in (431, None) for o in outcomes), outcomes
    assert any(o.status == 431 for o in outcomes), outcomes
    assert after - before < 64 << 20, f"server RSS grew by {(after - before) >> 20} MiB"
    _still_serves(guarded)


def test_too_many_trailer_fields_are_431(guarded: ServerHandle) -> None:
    trailers = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 10))
    assert _statuses(guarded, CHUNKED_POST + b"2\r\n{}\r\n0\r\n" + trailers + b"\r\n" + LAST) == [431]
    _still_serves(guarded)


def test_a_chunked_upload_with_a_trailer_still_works(guarded: ServerHandle) -> None:
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'
    request = CHUNKED_POST + _chunked(body, 7) + b"0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n"
    # Read, answered (no key), and the kept-alive connection serves the next request.
    assert _statuses(guarded, request + request + LAST) == [401, 401, 200]


@pytest.mark.parametrize("chunk", [4096, 1024])
def test_a_large_chunked_upload_within_the_body_limit_still_works(guarded: ServerHandle, chunk: int) -> None:
    # 10 MB in 1 KiB chunks carries 70 KiB of chunk-size lines, more than max_header_bytes.
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "' + b"a" * (10 << 20) + b'"}]}'
    framed = _chunked(body, chunk) + b"0\r\n\r\n"
    assert len(framed) - len(body) > MAX_HEADER_BYTES or chunk != 1024
    assert _statuses(guarded, CHUNKED_POST + framed + LAST, limit_s=60) == [401, 200]


def test_the_next_request_on_a_kept_alive_connection_is_counted_from_its_first_byte(guarded: ServerHandle) -> None:
    first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    oversized = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 20_000) + b"\r\nConnection: close\r\n\r\n"
    with _connect(guarded) as sock:
        sock.sendall(first)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < int(
            re.search(rb"(?i)content-length: (\d+)", answer).group(1)  # type: ignore[union-attr]
        ):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        assert _status(answer) == 200
        time.sleep(0.2)  # the first request is over: the next one begins in a new read
        sock.sendall(oversized)
        outcome = _read_until_closed(sock, time.monotonic(), 15)
    assert outcome.status == 431, outcome
    _still_serves(guarded)


def test_expect_100_continue_with_a_chunked_body_still_works(guarded: ServerHandle) -> None:
    head = CHUNKED_POST.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n")
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'
    with _connect(guarded) as sock:
        sock.sendall(head)
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim  # the app reads the body: the server asks for it
        sock.sendall(_chunked(body, 16) + b"0\r\nX-Checksum: abc\r\n\r\n" + LAST)
        answer = interim
        while chunk := sock.recv(65536):
            answer += chunk
    assert [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)] == [100, 401, 200]
