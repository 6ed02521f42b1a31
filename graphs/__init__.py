"""LangGraph state machines and the registry that serves them by id.

Imports from ``gateway`` (and, as they are built, ``knowledge`` and ``tools``), never
from ``eval`` or ``serving``.
"""

from graphs.context import RunContext
from graphs.deps import ChatModelProvider, GraphDeps
from graphs.errors import GraphError, GraphLoadError, UnknownGraphError
from graphs.guards import OutputBlockedError, OutputPolicy, StreamGuard, checked
from graphs.events import Citations, Finish, GraphEvent, TextDelta, ToolCallDelta, ToolResult, message_events
from graphs.registry import GraphRegistry, GraphSpec, RegisteredGraph

__all__ = [
    "ChatModelProvider",
    "Citations",
    "Finish",
    "GraphDeps",
    "GraphError",
    "GraphEvent",
    "GraphLoadError",
    "GraphRegistry",
    "GraphSpec",
    "OutputBlockedError",
    "OutputPolicy",
    "RegisteredGraph",
    "RunContext",
    "StreamGuard",
    "TextDelta",
    "ToolCallDelta",
    "ToolResult",
    "UnknownGraphError",
    "checked",
    "message_events",
]
