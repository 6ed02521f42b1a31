"""A probe's reason for the operator's log and its public form for ``/readyz`` (open to
anyone): the public one carries no address and nothing the backend said (issue 11
review: a backend's error page, with internal addresses or a masked key, was shown)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from gateway.health import probe
from gateway.registry import Backend, Capabilities
from tests.conftest import free_port

LEAKY = b"upstream 10.1.2.3:8000 refused: invalid key sk-...abcd (proxy/2.4)"


@pytest.fixture
def failing_backend() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the library's name
            self.send_response(503)
            self.send_header("content-length", str(len(LEAKY)))
            self.end_headers()
            self.wfile.write(LEAKY)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _backend(url: str) -> Backend:
    return Backend(id="b", kind="vllm", base_url=url, model="m", capabilities=Capabilities(context_window=2048))


async def test_the_public_reason_keeps_only_the_status(failing_backend: str) -> None:
    async with httpx.AsyncClient() as client:
        result = await probe(_backend(failing_backend), client, 2.0)
    assert not result.ready
    assert "10.1.2.3" in result.reason and "127.0.0.1" in result.reason  # the log keeps it all
    assert result.public_reason == "the backend answered 503"


async def test_an_unreachable_backend_is_named_without_its_address() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens
    async with httpx.AsyncClient() as client:
        result = await probe(_backend(url), client, 2.0)
    assert not result.ready and "127.0.0.1" in result.reason
    assert result.public_reason == "cannot reach the backend: ConnectError"
