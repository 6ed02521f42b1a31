"""The ``tools`` section of ``config/switchyard.yaml``."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["HttpGetSettings", "ToolsSettings"]


class HttpGetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_domains: tuple[str, ...] = ()
    """Hosts ``http_get`` may fetch (a domain allows its subdomains). Empty: none."""
    allowed_networks: tuple[str, ...] = ()
    """Address ranges (CIDR, e.g. ``10.20.0.0/16``; a bare address is one address)
    ``http_get`` may connect to although they are not public: loopback, private,
    link-local, metadata... Empty: public addresses only."""
    allowed_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = (80, 443)
    """Ports ``http_get`` may connect to (the URL's, or its scheme's default)."""
    max_bytes: int = Field(default=200_000, ge=1, le=10_000_000)
    timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("allowed_networks")
    @classmethod
    def _networks_are_cidr(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            try:
                ipaddress.ip_network(network)
            except ValueError as exc:
                raise ValueError(f"{network!r} is not an address range such as 10.20.0.0/16 ({exc})") from None
        return value


class ToolsSettings(BaseModel):
    """Built-in tools' settings and the default per-run budgets.

    Override from the environment with ``SWITCHYARD_TOOLS__<FIELD>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    http_get: HttpGetSettings = HttpGetSettings()
    require_approval: tuple[str, ...] = ()
    """Tools whose every call waits for a person's approval (on top of the tools that
    always do)."""
    max_tool_calls: int = Field(default=8, ge=0, le=1000)
    """Tool calls a run may make; past it, calls are refused and the model told so."""
    max_steps: int = Field(default=6, ge=1, le=100)
    """Model turns a run may take; the last one gets no tools and must answer."""
