"""``http_get``: fetch a page from an allowed domain, within size and time limits.

Every hop (the first URL and each redirect, at most 3, followed by hand) is checked
before anything is sent:

1. the scheme is http or https, and the host is on the allow-list (a domain and its
   subdomains);
2. the host is resolved once, by the tool's `Resolver`, and every address it
   resolves to must pass the `NetworkPolicy` (no loopback, private, link-local,
   metadata, unspecified or multicast address unless configuration allows its
   range); one forbidden address refuses the host;
3. the port (the URL's, or the scheme's default) is on the policy's ports;
4. the connection goes to a checked address: the request URL carries the address,
   while the ``Host`` header and TLS SNI (and so certificate verification) carry the
   name. httpx never resolves the name itself, so a second DNS answer cannot send the
   request somewhere unchecked (DNS rebinding).

A refused target raises `TargetRefusedError` naming the host, the address and why;
the executor hands it to the model as an error observation. The body is read up to
``max_bytes`` and cut there; the whole call has the tool's timeout.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, Field

from tools.base import Tool, ToolContext
from tools.errors import TargetRefusedError
from tools.policy import NetworkPolicy
from tools.resolver import IPAddress, Resolver, SystemResolver

__all__ = ["http_get"]

_MAX_REDIRECTS = 3
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttpGetArgs(BaseModel):
    url: str = Field(min_length=8, max_length=2000, description="An http(s) URL on an allowed domain")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Target:
    """One hop, checked: where the request goes and under which name."""

    url: httpx.URL
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


def _on_allow_list(host: str, domains: tuple[str, ...]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


async def _check(url: httpx.URL, domains: tuple[str, ...], policy: NetworkPolicy, resolver: Resolver) -> _Target:
    """The checked target of ``url``.

    Raises:
        TargetRefusedError: the scheme, host, port or an address is refused.
        NameResolutionError: the host does not resolve.
    """
    host = url.host.lower().rstrip(".")  # as written (Unicode), for the allow-list and messages
    if url.scheme not in _DEFAULT_PORTS:
        raise TargetRefusedError(host or "none", f"only http and https URLs are fetched, not {url.scheme or 'none'!r}")
    if not host:
        raise TargetRefusedError("none", "the URL has no host")
    if not _on_allow_list(host, domains):
        raise TargetRefusedError(host, f"host {host!r} is not on the allow-list ({', '.join(domains) or 'empty'})")
    port = url.port or _DEFAULT_PORTS[url.scheme]
    try:
        addresses: tuple[IPAddress, ...] = (ipaddress.ip_address(host),)
        literal = True
    except ValueError:  # a name, not an address literal
        addresses = await resolver.resolve(url.raw_host.decode("ascii").rstrip("."), port)  # IDNA-encoded
        literal = False
    for address in addresses:
        if (why := policy.address_refusal(address)) is not None:
            what = f"host {host!r} is" if literal else f"host {host!r} resolves to {address},"
            raise TargetRefusedError(
                host,
                f"{what} {why}; refused (configuration can allow its range: tools.http_get.allowed_networks)",
                address=str(address), port=port,
            )
    if (why := policy.port_refusal(port)) is not None:
        raise TargetRefusedError(host, f"host {host!r}: {why}", port=port)
    return _Target(url=url, host=host, port=port, addresses=addresses)


async def _open(client: httpx.AsyncClient, target: _Target) -> httpx.Response:
    """Send the GET to the first checked address that accepts a connection."""
    headers = {"Accept": "text/*, application/json", "Host": target.url.netloc.decode("ascii")}
    # the name, not the address, for TLS: SNI and certificate verification
    sni = target.url.raw_host.decode("ascii").rstrip(".")  # IDNA-encoded; SNI has no trailing dot
    extensions = {"sni_hostname": sni} if target.url.scheme == "https" else {}
    failure: httpx.ConnectError | None = None
    for address in target.addresses:
        request = client.build_request(
            "GET", target.url.copy_with(host=str(address)), headers=headers, extensions=extensions
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:  # the next address may answer
            failure = exc
    assert failure is not None  # _check never returns a target without addresses
    raise failure


def http_get(
    allowed_domains: tuple[str, ...],
    *,
    max_bytes: int = 200_000,
    timeout_s: float = 10.0,
    network: NetworkPolicy | None = None,
    resolver: Resolver | None = None,
    verify: ssl.SSLContext | bool = True,
) -> Tool:
    """The ``http_get`` tool.

    Args:
        allowed_domains: hosts it may fetch (a domain allows its subdomains).
        max_bytes: the body is cut there.
        timeout_s: the whole call, redirects included.
        network: the addresses and ports it may connect to; default: public
            addresses on ports 80 and 443.
        resolver: turns host names into addresses; default: the system's.
        verify: TLS verification (an SSL context to trust other authorities).
    """
    domains = tuple(d.lower().strip(".") for d in allowed_domains)
    policy = network or NetworkPolicy()
    names = resolver or SystemResolver()

    async def run(args: HttpGetArgs, context: ToolContext) -> str:
        url = httpx.URL(args.url)
        # No connection pool reuse: a kept connection was checked and verified for the
        # name that opened it, not for the next hop's. No proxies from the environment:
        # a proxy would resolve the name itself.
        async with httpx.AsyncClient(
            follow_redirects=False, timeout=timeout_s, trust_env=False, verify=verify,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                target = await _check(url, domains, policy, names)
                response = await _open(client, target)
                try:
                    if response.is_redirect:
                        url = url.join(response.headers["location"])
                        continue
                    body = bytearray()
                    cut = False
                    async for piece in response.aiter_bytes():
                        body += piece
                        if len(body) > max_bytes:
                            cut = True
                            break
                    text = bytes(body[:max_bytes]).decode(response.encoding or "utf-8", errors="replace")
                    note = f"\n[cut at {max_bytes} bytes]" if cut else ""
                    return f"HTTP {response.status_code} {url}\n\n{text}{note}"
                finally:
                    await response.aclose()
        raise TargetRefusedError(url.host, f"more than {_MAX_REDIRECTS} redirects (the next pointed to {url})")

    return Tool(
        name="http_get",
        description=f"Fetch a web page (GET) from an allowed domain: {', '.join(domains) or 'none'}.",
        args_schema=HttpGetArgs,
        run=run,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        idempotent=True,
        max_output_chars=max_bytes + 500,  # the status line and the cut note fit too
        examples=('User: What does the status page say? -> http_get({"url": "https://status.example.com/"})',),
    )
