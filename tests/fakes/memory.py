"""A graph with long-term memory in LangGraph's store (``runtime.store``), for the tests
that a run's nodes get their tenant's view of the server's store. Not a model:
nothing here stands in for the LLM.

Each run answers with what the previous run of the same tenant said (``nothing yet``
the first time), then keeps its own message under namespace ``("memories",)``, key
``last``: the item ``/store/items?namespace=memories&key=last`` shows.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from graphs import GraphDeps
from graphs.chat.state import ChatState


def make_memory_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    async def remember(state: ChatState, runtime: Runtime[Any]) -> dict[str, Any]:
        store = runtime.store
        if store is None:
            return {"messages": [AIMessage("no store")]}
        before = await store.aget(("memories",), "last")
        await store.aput(("memories",), "last", {"text": str(state["messages"][-1].content)})
        return {"messages": [AIMessage(f"I remembered: {before.value['text'] if before else 'nothing yet'}")]}

    builder = StateGraph(ChatState)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder
