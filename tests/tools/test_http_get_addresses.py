"""``http_get`` checks where it connects (security review, issue 11, finding 4).

Real local HTTP(S) servers on loopback stand in for third-party sites and for the
internal services a fetch must never reach. An "allowed public name that resolves to
loopback" is a `StaticResolver` entry (names under ``.test``, which no DNS answers, so
a fetch that works proves the connection went to the checked address, not to a second
lookup of the name).
"""

from __future__ import annotations

import ipaddress
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from tools import (
    HttpGetSettings,
    NetworkPolicy,
    StaticResolver,
    SystemResolver,
    ToolCallRecord,
    ToolContext,
    ToolExecutor,
    ToolPolicy,
    ToolRegistry,
    ToolsSettings,
)
from tools.builtin.http import http_get
from tools.resolver import Resolver

pytestmark = pytest.mark.integration


@dataclass
class Server:
    """A local server and what it saw."""

    url: str
    port: int
    hits: list[tuple[str, str]] = field(default_factory=list)
    """(path, Host header) per request."""
    sni: list[str | None] = field(default_factory=list)
    """The TLS server name of each handshake (HTTPS servers)."""


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server.hits.append((self.path, self.headers.get("Host", "")))
            if self.path.startswith("/redirect?to="):
                self._redirect(self.path.removeprefix("/redirect?to="))
            elif self.path.startswith("/chain/") and (n := int(self.path.removeprefix("/chain/"))) > 0:
                self._redirect(f"/chain/{n - 1}")
            else:
                body = f"<h1>Opening hours</h1><p>{self.path}</p>".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def _redirect(self, location: str) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _serve(host: str, tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    httpd = ThreadingHTTPServer((host, 0), BaseHTTPRequestHandler)
    port = httpd.server_address[1]
    server = Server(url=f"{'https' if tls else 'http'}://{host}:{port}", port=port)
    httpd.RequestHandlerClass = _handler(server)
    if tls is not None:
        tls.sni_callback = lambda sock, name, ctx: server.sni.append(name)  # type: ignore[assignment,func-returns-value]
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def site() -> Iterator[Server]:
    """The allowed site, on 127.0.0.1."""
    yield from _serve("127.0.0.1")


@pytest.fixture
def internal() -> Iterator[Server]:
    """An internal service on another loopback port (and address, 127.0.0.2)."""
    yield from _serve("127.0.0.2")


async def _call(url: str, domains: tuple[str, ...], *, network: NetworkPolicy | None = None,
                resolver: Resolver | None = None, verify: ssl.SSLContext | bool = True) -> tuple[str, str]:
    """One ``http_get`` call through the executor: (observation, decision)."""
    records: list[ToolCallRecord] = []
    tool = http_get(domains, max_bytes=10_000, timeout_s=3.0, network=network, resolver=resolver, verify=verify)
    executor = ToolExecutor(
        ToolRegistry([tool], ToolsSettings()), ToolPolicy(allowed=frozenset({"http_get"})), ToolContext(), records.append
    )
    message = await executor.run("1", "http_get", {"url": url})
    return str(message.content), records[0].decision


async def test_localhost_is_refused_by_default(site: Server) -> None:
    content, decision = await _call(f"http://localhost:{site.port}/page", ("localhost",))
    assert decision == "failed"
    assert "host 'localhost' resolves to 127.0.0.1, a loopback address; refused" in content
    assert "tools.http_get.allowed_networks" in content
    assert site.hits == []


async def test_an_allowed_name_resolving_to_loopback_is_refused_unless_its_range_is_allowed(site: Server) -> None:
    names = StaticResolver({"status.example.test": ["127.0.0.1"]})
    url = f"http://status.example.test:{site.port}/page"

    refused, decision = await _call(url, ("example.test",), network=NetworkPolicy(allowed_ports=frozenset({site.port})),
                                    resolver=names)
    assert decision == "failed" and "'status.example.test' resolves to 127.0.0.1, a loopback address" in refused
    other_range = NetworkPolicy.from_config(["127.0.0.2/32", "10.0.0.0/8"], [site.port])
    refused, _ = await _call(url, ("example.test",), network=other_range, resolver=names)
    assert "resolves to 127.0.0.1, a loopback address" in refused
    assert site.hits == []

    allowed = NetworkPolicy.from_config(["127.0.0.0/8"], [site.port])
    page, decision = await _call(url, ("example.test",), network=allowed, resolver=names)
    assert decision == "executed" and "Opening hours" in page
    assert page.startswith(f"HTTP 200 {url}")
    # connected to the checked address, but the server was asked for the name
    assert site.hits == [("/page", f"status.example.test:{site.port}")]


async def test_a_redirect_to_another_loopback_port_is_refused(site: Server, internal: Server) -> None:
    # localhost goes to the system's resolver (the hosts file)
    names = StaticResolver({"site.test": ["127.0.0.1"], "internal.test": ["127.0.0.2"]}, fallback=SystemResolver())
    loopback = NetworkPolicy.from_config(["127.0.0.0/8"], [site.port])

    by_port, decision = await _call(
        f"http://site.test:{site.port}/redirect?to=http://localhost:{internal.port}/secret",
        ("site.test", "localhost"), network=loopback, resolver=names,
    )
    assert decision == "failed" and f"host 'localhost': port {internal.port} is not allowed" in by_port

    only_site = NetworkPolicy.from_config(["127.0.0.1/32"], [site.port, internal.port])
    by_address, decision = await _call(
        f"http://site.test:{site.port}/redirect?to=http://internal.test:{internal.port}/secret",
        ("site.test", "internal.test"), network=only_site, resolver=names,
    )
    assert decision == "failed" and "'internal.test' resolves to 127.0.0.2, a loopback address" in by_address

    literal, _ = await _call(
        f"http://site.test:{site.port}/redirect?to=http://127.0.0.2:{internal.port}/secret",
        ("site.test", "127.0.0.2"), network=only_site, resolver=names,
    )
    assert "host '127.0.0.2' is a loopback address; refused" in literal

    assert [path for path, _ in site.hits] == ["/redirect?to=" + u for u in (
        f"http://localhost:{internal.port}/secret",
        f"http://internal.test:{internal.port}/secret",
        f"http://127.0.0.2:{internal.port}/secret",
    )]
    assert internal.hits == []


async def test_one_forbidden_address_among_several_refuses_the_host(site: Server) -> None:
    names = StaticResolver({"mixed.test": ["127.0.0.1", "127.0.0.2"], "mapped.test": ["127.0.0.1", "::ffff:127.0.0.2"]})
    only_one = NetworkPolicy.from_config(["127.0.0.1/32"], [site.port])
    content, decision = await _call(f"http://mixed.test:{site.port}/page", ("mixed.test",), network=only_one,
                                    resolver=names)
    assert decision == "failed" and "'mixed.test' resolves to 127.0.0.2, a loopback address" in content
    mapped, _ = await _call(f"http://mapped.test:{site.port}/page", ("mapped.test",), network=only_one, resolver=names)
    mapped_address = ipaddress.ip_address("::ffff:127.0.0.2")
    assert f"resolves to {mapped_address}, the IPv4-mapped form of 127.0.0.2, a loopback address" in mapped
    assert site.hits == []


async def test_the_next_address_is_tried_when_one_does_not_answer(site: Server) -> None:
    names = StaticResolver({"two.test": ["127.0.0.3", "127.0.0.1"]})  # nothing listens on 127.0.0.3
    loopback = NetworkPolicy.from_config(["127.0.0.0/8"], [site.port])
    page, decision = await _call(f"http://two.test:{site.port}/page", ("two.test",), network=loopback, resolver=names)
    assert decision == "executed" and "Opening hours" in page


async def test_the_redirect_limit_still_holds(site: Server) -> None:
    names = StaticResolver({"site.test": ["127.0.0.1"]})
    loopback = NetworkPolicy.from_config(["127.0.0.0/8"], [site.port])
    three, decision = await _call(f"http://site.test:{site.port}/chain/3", ("site.test",), network=loopback,
                                  resolver=names)
    assert decision == "executed" and three.startswith(f"HTTP 200 http://site.test:{site.port}/chain/0")
    site.hits.clear()
    four, decision = await _call(f"http://site.test:{site.port}/chain/4", ("site.test",), network=loopback,
                                 resolver=names)
    assert decision == "failed" and "more than 3 redirects" in four and "Opening hours" not in four
    assert [path for path, _ in site.hits] == ["/chain/4", "/chain/3", "/chain/2", "/chain/1"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``secure.test`` (no IP address in it)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=secure.test",
         "-addext", "subjectAltName=DNS:secure.test"],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.fixture
def secure_site(certificate: tuple[Path, Path]) -> Iterator[Server]:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*certificate)
    yield from _serve("127.0.0.1", tls)


async def test_https_keeps_the_name_for_sni_and_certificate_checks(
    secure_site: Server, certificate: tuple[Path, Path]
) -> None:
    trust = ssl.create_default_context(cafile=str(certificate[0]))
    names = StaticResolver({"secure.test": ["127.0.0.1"], "wrong.test": ["127.0.0.1"]})
    loopback = NetworkPolicy.from_config(["127.0.0.0/8"], [secure_site.port])
    url = f"https://secure.test:{secure_site.port}/page"
    page, decision = await _call(url, ("secure.test", "wrong.test"), network=loopback, resolver=names, verify=trust)
    assert decision == "executed" and "Opening hours" in page
    assert secure_site.sni == ["secure.test"]
    assert secure_site.hits == [("/page", f"secure.test:{secure_site.port}")]
    # the certificate is still checked against the name
    wrong, decision = await _call(f"https://wrong.test:{secure_site.port}/page", ("secure.test", "wrong.test"),
                                  network=loopback, resolver=names, verify=trust)
    assert decision == "failed" and "certificate" in wrong.lower()
    assert len(secure_site.hits) == 1


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.255.254", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "the IPv4-mapped form of 127.0.0.1, a loopback address"),
        ("64:ff9b::7f00:1", "the NAT64 form of 127.0.0.1, a loopback address"),
        ("2002:7f00:1::", "the 6to4 form of 127.0.0.1, a loopback address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("::ffff:169.254.169.254", "the IPv4-mapped form of 169.254.169.254, a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("10.1.2.3", "a private or reserved address"),
        ("172.16.0.1", "a private or reserved address"),
        ("192.168.1.1", "a private or reserved address"),
        ("::ffff:192.168.1.1", "the IPv4-mapped form of 192.168.1.1, a private or reserved address"),
        ("fc00::1", "a private or reserved address"),
        ("fec0::1", "a site-local address"),
        ("100.64.0.1", "not a globally reachable address"),
        ("0.0.0.0", "the unspecified address"),
        ("::", "the unspecified address"),
        ("::ffff:0.0.0.0", "the IPv4-mapped form of 0.0.0.0, the unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("239.255.255.250", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a private or reserved address"),
        ("93.184.215.14", None),
        ("::ffff:93.184.215.14", None),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", None),
    ],
)
def test_address_kinds(address: str, why: str | None) -> None:
    assert NetworkPolicy().address_refusal(ipaddress.ip_address(address)) == why


def test_an_allowed_range_allows_only_itself_and_its_mapped_form() -> None:
    policy = NetworkPolicy.from_config(["127.0.0.0/8"])
    assert policy.address_refusal(ipaddress.ip_address("127.0.0.9")) is None
    assert policy.address_refusal(ipaddress.ip_address("::ffff:127.0.0.9")) is None
    assert policy.address_refusal(ipaddress.ip_address("::1")) == "a loopback address"
    assert policy.address_refusal(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"
    assert policy.port_refusal(443) is None and policy.port_refusal(8080) == "port 8080 is not allowed (allowed: 80, 443)"


def test_bad_ranges_and_ports_are_rejected_by_the_settings() -> None:
    with pytest.raises(ValidationError, match="not an address range"):
        HttpGetSettings(allowed_networks=("127.0.0.1/8",))
    with pytest.raises(ValidationError):
        HttpGetSettings(allowed_ports=(0,))


async def test_configured_ranges_and_ports_are_used_by_the_builtin_tool(site: Server) -> None:
    settings = ToolsSettings(http_get=HttpGetSettings(
        allowed_domains=("localhost",), allowed_networks=("127.0.0.0/8",), allowed_ports=(site.port,), timeout_s=3.0
    ))
    records: list[ToolCallRecord] = []
    executor = ToolExecutor(ToolRegistry.builtin(settings), ToolPolicy(allowed=frozenset({"http_get"})), ToolContext(),
                            records.append)
    page = await executor.run("1", "http_get", {"url": f"http://localhost:{site.port}/page"})
    assert "Opening hours" in str(page.content) and [r.decision for r in records] == ["executed"]
