"""Errors raised by the graphs layer. One root, `GraphError`."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["GraphError", "GraphLoadError", "UnknownGraphError"]


class GraphError(Exception):
    """Root of every error the graphs layer raises."""


class UnknownGraphError(GraphError):
    """No graph is registered under this id.

    Attributes:
        graph_id: the id asked for.
        available: the registered ids.
    """

    def __init__(self, graph_id: str, available: Iterable[str]) -> None:
        self.graph_id = graph_id
        self.available = sorted(available)
        super().__init__(f"unknown graph {graph_id!r}; registered: {', '.join(self.available) or 'none'}")


class GraphLoadError(GraphError):
    """A registered graph could not be imported or built.

    Attributes:
        graph_id: the registry id.
        path: the ``module:attribute`` or ``file.py:attribute`` it points at.
    """

    def __init__(self, graph_id: str, path: str, reason: str) -> None:
        self.graph_id = graph_id
        self.path = path
        super().__init__(f"graphs.{graph_id} ({path}): {reason}")
