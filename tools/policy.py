"""What a run may call: the graph's allow-list intersected with the tenant's, and
the run's budgets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ToolPolicy"]


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
