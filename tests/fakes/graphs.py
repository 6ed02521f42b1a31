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


def make_parallel_confirm_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """Two branches from the start: ``ask`` (a subgraph that asks with ``interrupt``)
    and ``other`` (finishes at once); ``after`` follows each and appends a message, so
    a test sees whether it ran. Ending the pending ``ask`` also applies ``other``'s
    write, which schedules ``after``: what ``command.goto: "__end__"`` must not run."""

    def inner(state: ChatState) -> dict[str, Any]:
        interrupt({"question": "Go on?"})
        return {}

    ask = StateGraph(ChatState)
    ask.add_node("inner", inner)
    ask.add_edge(START, "inner")

    builder = StateGraph(ChatState)
    builder.add_node("ask", ask.compile())
    builder.add_node("other", lambda state: {"messages": [AIMessage("other ran")]})
    builder.add_node("after", lambda state: {"messages": [AIMessage("after ran")]})
    builder.add_edge(START, "ask")
    builder.add_edge(START, "other")
    builder.add_edge("other", "after")
    builder.add_edge("ask", "after")
    builder.add_edge("after", END)
    return builder


# ---- tool-calling: tools that prove what ran ------------------------------------------

PROBE_LOG_ENV = "SWITCHYARD_TEST_PROBE_LOG"
"""Where the probe tools append a line each time they really run (set by the tests)."""


def _probe_tools() -> list[Any]:
    import asyncio
    import os

    from pydantic import BaseModel, Field

    from tools import Tool, ToolContext

    def mark(line: str) -> None:
        with open(os.environ[PROBE_LOG_ENV], "a") as log:
            log.write(line + "\n")

    class ProbeArgs(BaseModel):
        note: str = Field(max_length=100)

    class NoArgs(BaseModel):
        pass

    async def probe(args: ProbeArgs, context: ToolContext) -> str:
        mark(f"probe {args.note}")
        return f"probe saw {args.note!r}"

    async def tally(args: ProbeArgs, context: ToolContext) -> str:
        mark("tally")
        return "counted"

    async def sleepy(args: NoArgs, context: ToolContext) -> str:
        await asyncio.sleep(30)
        mark("sleepy finished")  # never reached: the executor cancels it at its timeout
        return "slept"

    async def boom(args: NoArgs, context: ToolContext) -> str:
        mark("boom ran")
        raise RuntimeError("the tool broke")

    return [
        Tool(name="probe", description="Records a note.", args_schema=ProbeArgs, run=probe),  # type: ignore[arg-type]
        Tool(name="tally", description="Counts.", args_schema=ProbeArgs, run=tally),  # type: ignore[arg-type]
        Tool(name="sleepy", description="Sleeps.", args_schema=NoArgs, run=sleepy, timeout_s=0.5),  # type: ignore[arg-type]
        Tool(name="boom", description="Fails.", args_schema=NoArgs, run=boom),  # type: ignore[arg-type]
    ]


def make_probe_agent(deps: GraphDeps) -> StateGraph[Any]:
    """The real ``agent`` graph with four more tools that write to a file when they
    really run (so a test can prove a refused call did not)."""
    from dataclasses import replace

    from graphs.agent import make_graph

    assert deps.tools is not None
    return make_graph(replace(deps, tools=deps.tools.with_tools(*_probe_tools())))
