"""Host name resolution for tools that open connections (``http_get``).

A tool resolves a name once, checks every address against its `NetworkPolicy`, and
connects to an address it checked: it never hands the name to a library that would
resolve it again (a second answer could differ: DNS rebinding). The resolver is a
port so a deployment can pin names (`StaticResolver`, like ``curl --resolve``) and so
tests can make an allowed name resolve to loopback without a network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from typing import Protocol

from tools.errors import NameResolutionError

__all__ = ["IPAddress", "Resolver", "StaticResolver", "SystemResolver"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Resolver(Protocol):
    """Turns a host name into the addresses a connection may go to."""

    async def resolve(self, host: str, port: int) -> tuple[IPAddress, ...]:
        """Every address ``host`` resolves to for a TCP connection on ``port``, in the
        order to try them.

        Raises:
            NameResolutionError: the name does not resolve.
        """
        ...


class SystemResolver:
    """The operating system's resolver (``getaddrinfo``: hosts file, then DNS), run
    off the event loop by asyncio."""

    async def resolve(self, host: str, port: int) -> tuple[IPAddress, ...]:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (socket.gaierror, UnicodeError) as exc:
            raise NameResolutionError(host, str(exc)) from None
        addresses: dict[IPAddress, None] = {}  # ordered, without repeats
        for family, *_, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                addresses[ipaddress.ip_address(sockaddr[0])] = None
        if not addresses:
            raise NameResolutionError(host, "no IPv4 or IPv6 address")
        return tuple(addresses)


class StaticResolver:
    """Names pinned to addresses; other names go to ``fallback`` (or fail).

    Args:
        table: host name (case-insensitive, without a trailing dot) → its addresses.
        fallback: resolves names not in the table; None: they do not resolve.
    """

    def __init__(self, table: Mapping[str, Iterable[str]], fallback: Resolver | None = None) -> None:
        self._table = {
            name.lower().rstrip("."): tuple(ipaddress.ip_address(a) for a in addresses)
            for name, addresses in table.items()
        }
        self._fallback = fallback

    async def resolve(self, host: str, port: int) -> tuple[IPAddress, ...]:
        addresses = self._table.get(host.lower().rstrip("."))
        if addresses:
            return addresses
        if self._fallback is not None:
            return await self._fallback.resolve(host, port)
        raise NameResolutionError(host, "not in the static table")
