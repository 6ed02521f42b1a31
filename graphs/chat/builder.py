"""Builder of the ``chat`` graph: one model call over the conversation."""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from graphs.chat.nodes import make_call_model
from graphs.chat.prompts import SYSTEM_PROMPT
from graphs.chat.state import CALL_MODEL, ChatState
from graphs.context import RunContext
from graphs.deps import GraphDeps

__all__ = ["make_graph"]


def make_graph(deps: GraphDeps, *, system_prompt: str = SYSTEM_PROMPT) -> StateGraph[ChatState, RunContext]:
    """The ``chat`` graph: ``START -> call_model -> END``.

    Args:
        deps: the graph's dependencies; ``deps.model`` answers.
        system_prompt: used when the conversation has no system message.

    Returns:
        The uncompiled builder; the registry compiles it.
    """
    builder = StateGraph(ChatState, context_schema=RunContext)
    builder.add_node(CALL_MODEL, make_call_model(deps.model, system_prompt))
    builder.add_edge(START, CALL_MODEL)
    builder.add_edge(CALL_MODEL, END)
    return builder
