"""The ``rag`` graph's retrieval rules, without a model call: a collection the tenant
may not use is refused before anything is searched, an unknown one names the
existing ones, and grading keeps only what passes the threshold, numbered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from gateway.chat import GatewayChatModel
from graphs import GraphDeps, RunContext
from graphs.rag import make_graph
from knowledge import CollectionNotAllowedError, Document, KnowledgeBase, KnowledgeSettings, UnknownCollectionError
from knowledge.embeddings.local import LocalEmbedder
from knowledge.vectorstore.edge import EdgeStore

pytestmark = pytest.mark.integration


class _NoModels:
    def chat_model(self, alias: str) -> Any:
        raise AssertionError("no other model is used")


@pytest.fixture
async def graph(tmp_path: Path) -> AsyncIterator[Any]:
    store = EdgeStore(tmp_path / "vectors")
    knowledge = KnowledgeBase(store, LocalEmbedder.packaged("use-multilingual-v3"), KnowledgeSettings())
    await knowledge.ingest("shelf", [
        Document(id="ferry", text="The Saltmarsh ferry leaves the north pier at 06:40 every weekday."),
        Document(id="bread", text="Brannock's bakery sells rye bread baked in a wood oven."),
    ])
    # A model that is never reached in these tests (its port is closed).
    model = GatewayChatModel(model="m", api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0)
    deps = GraphDeps(graph_id="rag", model=model, models=_NoModels(), knowledge=knowledge)
    # Stops before the model: the state after `grade` is what generation would get.
    yield make_graph(deps).compile(checkpointer=InMemorySaver(), interrupt_before=["generate", "no_answer"])
    await store.aclose()


def _input(question: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(question)]}


_T = {"configurable": {"thread_id": "t"}}


async def test_a_collection_the_tenant_may_not_use_is_refused(graph: Any) -> None:
    context = RunContext(collection="shelf", tenant="acme", allowed_collections=("handbook",))
    with pytest.raises(CollectionNotAllowedError, match="tenant 'acme' may not use collection 'shelf'"):
        await graph.ainvoke(_input("When does the ferry leave?"), _T, context=context)


async def test_an_unknown_collection_names_the_existing_ones(graph: Any) -> None:
    with pytest.raises(UnknownCollectionError, match=r"collections: shelf"):
        await graph.ainvoke(_input("When does the ferry leave?"), _T, context=RunContext(collection="nope"))


async def test_grading_numbers_the_sources_that_pass(graph: Any) -> None:
    config = {"configurable": {"thread_id": "t"}}
    await graph.ainvoke(_input("What time does the Saltmarsh ferry leave?"), config, context=RunContext(collection="shelf"))
    state = (await graph.aget_state(config)).values
    assert [s["doc_id"] for s in state["sources"]][:1] == ["ferry"]
    assert [s["index"] for s in state["sources"]] == list(range(1, len(state["sources"]) + 1))
    assert all(s["relevance"] >= 0.28 for s in state["sources"])
    assert (await graph.aget_state(config)).next == ("generate",)

    await graph.ainvoke(_input("Who painted the Mona Lisa?"), {"configurable": {"thread_id": "u"}}, context=RunContext(collection="shelf"))
    off = await graph.aget_state({"configurable": {"thread_id": "u"}})
    assert off.values["sources"] == [] and off.next == ("no_answer",)
