"""The tools layer's errors."""

from __future__ import annotations

__all__ = ["NameResolutionError", "TargetRefusedError", "ToolError", "UnknownToolError"]


class ToolError(Exception):
    """Root of the tools layer's errors."""


class UnknownToolError(ToolError):
    """A configuration names a tool the registry does not have."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown tool {name!r} (tools: {', '.join(sorted(known))})")


class TargetRefusedError(ToolError):
    """A tool was asked to reach a network target its policy refuses (a host off the
    allow-list, a forbidden address or port, too many redirects).

    Raised inside the tool, so the executor turns it into an error observation for the
    model; the run goes on.
    """

    def __init__(self, host: str, reason: str, *, address: str | None = None, port: int | None = None) -> None:
        self.host = host
        """The host as the URL named it."""
        self.address = address
        """The resolved address that was refused, when an address was the reason."""
        self.port = port
        self.reason = reason
        """Why, in words the model can act on; names the host (and address)."""
        super().__init__(reason)


class NameResolutionError(ToolError):
    """A host name a tool was asked to reach did not resolve."""

    def __init__(self, host: str, detail: str) -> None:
        self.host = host
        super().__init__(f"host {host!r} could not be resolved: {detail}")
