"""Graphs for serving-layer tests: a node that crashes, and a graph that asks for
confirmation. Not models: nothing here stands in for the LLM."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

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


def make_confirm_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """Drafts an answer with the (real) model, reports progress as a custom event,
    then asks for confirmation with ``interrupt``: resumed with "yes" the draft stands,
    anything else replaces it with "Cancelled." (the approval path tools will use)."""

    async def draft(state: ChatState) -> dict[str, Any]:
        get_stream_writer()({"progress": "drafting"})
        reply = await deps.model.bind(max_tokens=16, temperature=0).ainvoke(state["messages"])
        return {"messages": [reply]}

    def confirm(state: ChatState) -> dict[str, Any]:
        decision = interrupt({"question": "Send this answer?", "draft": state["messages"][-1].content})
        if decision == "yes":
            return {}
        return {"messages": [AIMessage("Cancelled.")]}

    builder = StateGraph(ChatState)
    builder.add_node("draft", draft)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "confirm")
    builder.add_edge("confirm", END)
    return builder
