"""A graph with subgraphs two levels deep, for the assistants' ``graph`` (xray) and
``subgraphs`` routes. Not a model: its nodes answer fixed text."""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from graphs import GraphDeps, RunContext


class NestedState(TypedDict):
    """``typing_extensions.TypedDict``: pydantic describes it on Python 3.11 too."""

    messages: Annotated[list[AnyMessage], add_messages]
    hops: int


def _answer(text: str) -> Any:
    def node(state: NestedState) -> dict[str, Any]:
        return {"messages": [AIMessage(text)], "hops": state.get("hops", 0) + 1}

    return node


def make_nested_graph(deps: GraphDeps) -> StateGraph[NestedState, RunContext]:
    """``outer``: ``inner`` (a subgraph whose ``deeper`` node is a subgraph too),
    then ``after``."""
    deeper = StateGraph(NestedState)
    deeper.add_node("bottom", _answer("from the bottom"))
    deeper.add_edge(START, "bottom")
    deeper.add_edge("bottom", END)

    inner = StateGraph(NestedState)
    inner.add_node("deeper", deeper.compile())
    inner.add_node("middle", _answer("from the middle"))
    inner.add_edge(START, "deeper")
    inner.add_edge("deeper", "middle")
    inner.add_edge("middle", END)

    outer = StateGraph(NestedState, context_schema=RunContext)
    outer.add_node("inner", inner.compile())
    outer.add_node("after", _answer("after"))
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "after")
    outer.add_edge("after", END)
    return outer
