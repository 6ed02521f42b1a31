"""The tools layer's errors."""

from __future__ import annotations

__all__ = ["ToolError", "UnknownToolError"]


class ToolError(Exception):
    """Root of the tools layer's errors."""


class UnknownToolError(ToolError):
    """A configuration names a tool the registry does not have."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown tool {name!r} (tools: {', '.join(sorted(known))})")
