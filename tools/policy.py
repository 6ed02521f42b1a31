"""What a run may call (the graph's allow-list intersected with the tenant's, and the
run's budgets), and where a tool may connect (`NetworkPolicy`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from tools.resolver import IPAddress

__all__ = ["NetworkPolicy", "ToolPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPolicy:
    """One run's tool policy."""

    allowed: frozenset[str]
    """Tools the model is shown and may call."""
    max_tool_calls: int = 8
    max_steps: int = 6
    require_approval: frozenset[str] = frozenset()

    @classmethod
    def intersect(
        cls,
        graph_tools: Iterable[str],
        tenant_tools: Iterable[str],
        available: Iterable[str],
        *,
        max_tool_calls: int = 8,
        max_steps: int = 6,
        require_approval: Iterable[str] = (),
    ) -> ToolPolicy:
        """The graph's list ∩ the tenant's (``*`` on either side: everything the other
        allows) ∩ the tools that exist."""
        names = set(available)
        for allowed in (set(graph_tools), set(tenant_tools)):
            if "*" not in allowed:
                names &= allowed
        return cls(
            allowed=frozenset(names),
            max_tool_calls=max_tool_calls,
            max_steps=max_steps,
            require_approval=frozenset(require_approval),
        )


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud instance-metadata endpoints (AWS, GCP, Azure, OpenStack: 169.254.169.254 and
# AWS's IPv6 fd00:ec2::254; ECS task metadata; Alibaba; Azure's wire server, which is
# in a public range). Named so a refusal says what the address is.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "168.63.129.16")
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix; the local-use one is refused


def _embedded_ipv4(address: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address carries, and the form's name, or None.

    These forms reach the IPv4 address they carry (the kernel for IPv4-mapped, a
    gateway for NAT64 and 6to4), so they are judged as that address too.
    """
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    return None


_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
"""IPv6 site-local (deprecated by RFC 3879): `ipaddress` calls it global."""


def _not_public(address: IPAddress) -> str | None:
    """Why ``address`` is not a public unicast address, or None."""
    if address in _METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.version == 6 and address in _SITE_LOCAL:  # deprecated, yet still routed inside some networks
        return "a site-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private or reserved address"
    if not address.is_global or address.is_reserved:
        return "not a globally reachable address"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPolicy:
    """Where a tool may open connections: public unicast addresses on the allowed
    ports, plus the address ranges configuration allows explicitly.

    Refused unless allowed: loopback, private (RFC 1918, unique-local ``fc00::/7``,
    shared ``100.64.0.0/10``), link-local, cloud metadata addresses, unspecified,
    multicast, reserved and other ranges that are not globally reachable, and the
    IPv6 forms that carry one of those IPv4 addresses (IPv4-mapped ``::ffff:a.b.c.d``,
    NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``).
    """

    allowed_networks: tuple[IPNetwork, ...] = ()
    """Ranges allowed even though they are not public (an address in one is allowed,
    whatever its kind). Empty: public addresses only."""
    allowed_ports: frozenset[int] = frozenset({80, 443})
    """Ports a connection may go to (the URL's, or its scheme's default)."""

    @classmethod
    def from_config(cls, allowed_networks: Iterable[str] = (), allowed_ports: Iterable[int] = (80, 443)) -> NetworkPolicy:
        """From configuration strings (``"127.0.0.0/8"``, ``"fd12:3456::/48"``; a
        single address is a one-address range).

        Raises:
            ValueError: a range is not valid CIDR, or has host bits set.
        """
        return cls(
            allowed_networks=tuple(ipaddress.ip_network(n) for n in allowed_networks),
            allowed_ports=frozenset(allowed_ports),
        )

    def _allows_range(self, address: IPAddress) -> bool:
        return any(address in net for net in self.allowed_networks)

    def address_refusal(self, address: IPAddress) -> str | None:
        """Why a connection to ``address`` is refused, or None."""
        embedded = _embedded_ipv4(address)
        if self._allows_range(address) or (embedded is not None and self._allows_range(embedded[1])):
            return None
        if embedded is not None:
            form, inner = embedded
            if (why := _not_public(inner)) is not None:
                return f"the {form} form of {inner}, {why}"
            if form != "6to4":  # mapped and NAT64 reach the public IPv4 address itself
                return None
        return _not_public(address)

    def port_refusal(self, port: int) -> str | None:
        """Why a connection to ``port`` is refused, or None."""
        if port in self.allowed_ports:
            return None
        return f"port {port} is not allowed (allowed: {', '.join(map(str, sorted(self.allowed_ports))) or 'none'})"
