"""Graphs for tests of the serving layer's error handling (not models: nothing here
stands in for the LLM)."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph

from graphs import GraphDeps
from graphs.chat.state import ChatState


def make_crashing_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """A graph whose only node fails with an unexpected error (a bug in a node)."""

    async def crash(state: ChatState) -> dict[str, Any]:
        raise RuntimeError("a bug in a node")

    builder = StateGraph(ChatState)
    builder.add_node("crash", crash)
    builder.add_edge(START, "crash")
    builder.add_edge("crash", END)
    return builder
