"""LangGraph state machines and the registry that serves them by id.

Imports from ``gateway`` (and, as they are built, ``knowledge`` and ``tools``), never
from ``eval`` or ``serving``.
"""

from graphs.context import CLIENT_CONTEXT_FIELDS, RunBudget, RunContext
from graphs.deps import ChatModelProvider, GraphDeps
from graphs.errors import GraphError, GraphLoadError, UnknownGraphError
from graphs.guards import OutputBlockedError, OutputPolicy, StreamGuard, checked, checked_value
from graphs.events import Citations, Finish, GraphEvent, TextDelta, ToolCallDelta, ToolResult, message_events
from graphs.registry import GraphRegistry, GraphSpec, RegisteredGraph

__all__ = [
    "CLIENT_CONTEXT_FIELDS",
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
    "RunBudget",
    "RunContext",
    "StreamGuard",
    "TextDelta",
    "ToolCallDelta",
    "ToolResult",
    "UnknownGraphError",
    "checked",
    "checked_value",
    "message_events",
]
