"""Graphs for the LangGraph thread and run operation tests: a node that waits at a gate
the test opens, and a graph whose subgraph stops at an interrupt. Not models: nothing
here stands in for the LLM.

A message ``gate:NAME`` makes the ``gate`` node wait until the file ``NAME`` exists in
the directory named by ``SWITCHYARD_TEST_GATE_DIR`` (the test creates it), so a run is
in progress for exactly as long as a test needs, with no timing in the test; past the
gate it creates ``NAME.passed``. Any other message passes at once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from graphs import GraphDeps
from graphs.chat.state import ChatState

GATE_DIR_ENV = "SWITCHYARD_TEST_GATE_DIR"


def make_gated_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """``gate`` (waits for its file, then answers) then ``reply``."""

    async def gate(state: ChatState) -> dict[str, Any]:
        text = str(state["messages"][-1].content)
        if text.startswith("gate:"):
            get_stream_writer()({"gate": "waiting"})
            path = Path(os.environ[GATE_DIR_ENV]) / text.removeprefix("gate:")
            while not path.exists():
                await asyncio.sleep(0.02)
            path.with_suffix(".passed").touch()  # the test's proof that the run went on
        return {"messages": [AIMessage("through the gate")]}

    def reply(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"{len(state['messages'])} messages")]}

    builder = StateGraph(ChatState)
    builder.add_node("gate", gate)
    builder.add_node("reply", reply)
    builder.add_edge(START, "gate")
    builder.add_edge("gate", "reply")
    builder.add_edge("reply", END)
    return builder


def make_nested_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """A parent whose node ``child`` is a subgraph that asks a question (``interrupt``)."""

    def ask(state: ChatState) -> dict[str, Any]:
        answer = interrupt({"question": "inner?"})
        return {"messages": [AIMessage(f"inner got {answer}")]}

    inner = StateGraph(ChatState)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)

    builder = StateGraph(ChatState)
    builder.add_node("child", inner.compile())
    builder.add_edge(START, "child")
    builder.add_edge("child", END)
    return builder
