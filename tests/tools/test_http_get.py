"""``http_get`` against a local HTTP server standing in for third-party sites: an
allowed host works; a host off the list, a redirect off the list, an oversized body
and a slow body are refused or cut."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools import NetworkPolicy, ToolCallRecord, ToolContext, ToolExecutor, ToolPolicy, ToolRegistry, ToolsSettings
from tools.builtin.http import HttpGetArgs, http_get

pytestmark = pytest.mark.integration


class _Site(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        port = self.server.server_address[1]
        if self.path == "/page":
            body = b"<h1>Opening hours</h1><p>9 to 5</p>"
        elif self.path == "/hop":
            self.send_response(302)
            self.send_header("Location", "/page")
            self.end_headers()
            return
        elif self.path == "/away":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/page")
            self.end_headers()
            return
        elif self.path == "/big":
            body = b"a" * 500_000
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"start")
            self.wfile.flush()
            time.sleep(3)
            return
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _executor(records: list[ToolCallRecord], site: str) -> ToolExecutor:
    # the stand-in site is on loopback, which http_get refuses unless configured
    loopback = NetworkPolicy.from_config(["127.0.0.0/8"], [int(site.rsplit(":", 1)[1])])
    tool = http_get(("127.0.0.1",), max_bytes=10_000, timeout_s=1.0, network=loopback)
    registry = ToolRegistry([tool], ToolsSettings())
    return ToolExecutor(registry, ToolPolicy(allowed=frozenset({"http_get"})), ToolContext(), records.append)


async def test_an_allowed_host_is_fetched_and_redirects_on_it_followed(site: str) -> None:
    records: list[ToolCallRecord] = []
    executor = _executor(records, site)
    page = await executor.run("1", "http_get", {"url": f"{site}/page"})
    assert "HTTP 200" in page.content and "Opening hours" in page.content
    hop = await executor.run("2", "http_get", {"url": f"{site}/hop"})
    assert "Opening hours" in hop.content and hop.content.startswith(f"HTTP 200 {site}/page")
    assert [r.decision for r in records] == ["executed", "executed"]


async def test_other_hosts_and_redirects_off_the_list_are_refused(site: str) -> None:
    records: list[ToolCallRecord] = []
    executor = _executor(records, site)
    port = site.rsplit(":", 1)[1]
    other = await executor.run("1", "http_get", {"url": f"http://localhost:{port}/page"})
    assert "host 'localhost' is not on the allow-list (127.0.0.1)" in other.content
    away = await executor.run("2", "http_get", {"url": f"{site}/away"})
    assert "host 'localhost' is not on the allow-list" in away.content and "Opening hours" not in away.content
    scheme = await executor.run("3", "http_get", {"url": "file:///etc/passwd"})
    assert "only http and https" in scheme.content
    assert [r.decision for r in records] == ["failed", "failed", "failed"]


async def test_big_bodies_are_cut_and_slow_ones_time_out(site: str) -> None:
    records: list[ToolCallRecord] = []
    executor = _executor(records, site)
    big = await executor.run("1", "http_get", {"url": f"{site}/big"})
    assert "[cut at 10000 bytes]" in big.content and big.content.count("a") <= 10_000 + 10
    started = asyncio.get_running_loop().time()
    slow = await executor.run("2", "http_get", {"url": f"{site}/slow"})
    assert slow.content.startswith("Timed out") and asyncio.get_running_loop().time() - started < 2.5
    assert [r.decision for r in records] == ["executed", "timed_out"]


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        HttpGetArgs(url="x")
