"""LangGraph state machines and the registry that serves them by id.

Imports from ``gateway`` (and, as they are built, ``knowledge`` and ``tools``), never
from ``eval`` or ``serving``.
"""

from graphs.context import RunContext
from graphs.deps import ChatModelProvider, GraphDeps
from graphs.errors import GraphError, GraphLoadError, UnknownGraphError
from graphs.events import Finish, GraphEvent, TextDelta, ToolCallDelta, message_events
from graphs.registry import GraphRegistry, GraphSpec, RegisteredGraph

__all__ = [
    "ChatModelProvider",
    "Finish",
    "GraphDeps",
    "GraphError",
    "GraphEvent",
    "GraphLoadError",
    "GraphRegistry",
    "GraphSpec",
    "RegisteredGraph",
    "RunContext",
    "TextDelta",
    "ToolCallDelta",
    "UnknownGraphError",
    "message_events",
]
