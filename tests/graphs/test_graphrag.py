"""The ``graphrag`` graph: graph retrieval and vector retrieval in one step, one
numbered context, facts that cite their chunks, chunks only for a collection without
a graph, the collection rules of ``rag``; and the whole graph against the real local
model, its facts reaching the event stream next to the citations.

Real engines throughout: the packaged embedder, Qdrant Edge and LadybugDB in a temp
directory, the curated facts of the graphrag suite under its ontology."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from eval.datasets import DATASETS_DIR
from gateway import Backend, ModelGateway, load_registry
from gateway.chat import GatewayChatModel
from graphs import Citations, Finish, GraphDeps, GraphRegistry, GraphSpec, RunContext, TextDelta, message_events
from graphs.events import Facts
from graphs.graphrag import make_graph
from graphs.graphrag.nodes import GRAPH_EXTRA_SOURCES, GraphRagNodes, _interleave
from knowledge import CollectionNotAllowedError, Document, KnowledgeBase, KnowledgeGraph, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.graphstore import LadybugStore
from knowledge.ingestion.loaders import discover, load_file
from knowledge.ontology import load_ontology
from knowledge.settings import GraphSettings, RagSettings
from knowledge.vectorstore.edge import EdgeStore
from tests.conftest import REPO
from tools import ToolRegistry, ToolsSettings

pytestmark = pytest.mark.integration

CITY = DATASETS_DIR / "graphrag-corpus"
QUESTION = "Where do I get the document the unemployment benefit requires if my employer refuses?"
CHILDCARE = "How much does each extract cost that I must bring for the childcare allowance?"


class _NoModels:
    def chat_model(self, alias: str) -> Any:
        raise AssertionError("no other model is used")


def _documents() -> list[Document]:
    found = []
    for file, doc_id, named in (f for f in discover([CITY / "documents"]) if not isinstance(f, Exception)):
        found += load_file(file, doc_id, follow_links=named).documents
    return found


@pytest.fixture(scope="module")
async def knowledge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[KnowledgeBase, KnowledgeGraph]]:
    tmp = tmp_path_factory.mktemp("graphrag")
    store = EdgeStore(tmp / "vectors")
    kb = KnowledgeBase(store, LocalEmbedder.packaged("use-multilingual-v3"), KnowledgeSettings())
    await kb.ingest("city", _documents())
    await kb.ingest("plain", _documents())  # the same documents, no graph
    graph = KnowledgeGraph(LadybugStore(tmp / "graph"), kb, GraphSettings())
    lines = (CITY / "facts.jsonl").read_text(encoding="utf-8").splitlines()
    report = await graph.import_facts("city", lines, ontology=load_ontology(CITY / "ontology.yaml"))
    assert report.invalid == {} and sum(report.relations.values()) == 33
    yield kb, graph
    await graph.aclose()
    await store.aclose()


def _model(url: str = "http://127.0.0.1:9/v1") -> GatewayChatModel:
    # Port 9 is closed: a model that is never reached by the tests that stop before it.
    return GatewayChatModel(model="m", api_key="k", base_url=url, max_retries=0)


@pytest.fixture
def graph(knowledge: tuple[KnowledgeBase, KnowledgeGraph]) -> Any:
    kb, kg = knowledge
    deps = GraphDeps(graph_id="graphrag", model=_model(), models=_NoModels(), knowledge=kb, graph=kg)
    # Stops before the model: the state after `assemble` is what generation would get.
    return make_graph(deps).compile(checkpointer=InMemorySaver(), interrupt_before=["generate", "no_answer"])


async def _state(graph: Any, question: str, context: RunContext, thread: str = "t") -> Any:
    config = {"configurable": {"thread_id": thread}}
    await graph.ainvoke({"messages": [HumanMessage(question)]}, config, context=context)
    return await graph.aget_state(config)


async def test_a_two_hop_question_gets_the_document_only_the_graph_finds(graph: Any) -> None:
    # The second document (39) is not among the searched chunks for this question: only
    # the chain Childcare Allowance -REQUIRES-> Birth Register Extract -ISSUED_BY-> Civil
    # Registry Hall leads to it.
    state = await _state(graph, CHILDCARE, RunContext(collection="city"))
    values = state.values
    assert state.next == ("generate",) and values["graph_status"] == "ok"
    assert [link["name"] for link in values["linked"]][:1] == ["Childcare Allowance"]
    assert "39-birth-register-extract.md" not in {c["doc_id"] for c in values["candidates"] if c["relevance"] >= RagSettings().min_relevance}
    docs = [s["doc_id"] for s in values["sources"]]
    assert {"38-childcare-allowance.md", "39-birth-register-extract.md"} <= set(docs)
    assert [s["index"] for s in values["sources"]] == list(range(1, len(docs) + 1))
    assert len(docs) <= RagSettings().max_sources + GRAPH_EXTRA_SOURCES
    by_index = {s["index"]: s for s in values["sources"]}
    texts = {f["text"]: f for f in values["facts"]}
    second = texts["Birth Register Extract (Document) ISSUED_BY Civil Registry Hall (Office)"]
    assert second["hops"] == 2 and [by_index[n]["doc_id"] for n in second["cited_as"]] == ["39-birth-register-extract.md"]
    # A chunk only the graph found has no similarity score.
    assert by_index[second["cited_as"][0]]["relevance"] == 0.0
    assert "4 crowns" in by_index[second["cited_as"][0]]["text"]
    for fact in values["facts"]:
        # Every fact names the sources that state it; chunk texts travel once, in sources.
        assert fact["cited_as"] and "sources" not in fact
        assert {by_index[n]["chunk_id"] for n in fact["cited_as"]} <= set(fact["chunk_ids"])


async def test_the_issue_example_gets_both_documents(graph: Any) -> None:
    # The chain fact must outrank the facts that come back into the hub "Resident Card"
    # from other procedures (it did not before the graph retrieval's path-aware ranking).
    state = await _state(graph, QUESTION, RunContext(collection="city"))
    values = state.values
    assert {"31-unemployment-benefit.md", "32-separation-certificate.md"} <= {s["doc_id"] for s in values["sources"]}
    two_hop = [f["text"] for f in values["facts"] if f["hops"] == 2]
    assert two_hop[0] == "Separation Certificate (Document) ISSUED_INSTEAD_BY Labour Arbitration Office (Office)"


async def test_a_failing_graph_store_leaves_the_chunks_to_answer(
    knowledge: tuple[KnowledgeBase, KnowledgeGraph], tmp_path: Path
) -> None:
    kb, _ = knowledge
    broken = KnowledgeGraph(LadybugStore(tmp_path / "graph"), kb, GraphSettings())
    await broken.store.aclose()  # every call now fails with GraphStoreError
    deps = GraphDeps(graph_id="graphrag", model=_model(), models=_NoModels(), knowledge=kb, graph=broken)
    compiled = make_graph(deps).compile(checkpointer=InMemorySaver(), interrupt_before=["generate", "no_answer"])
    state = await _state(compiled, QUESTION, RunContext(collection="city"), thread="broken")
    values = state.values
    assert values["graph_status"] == "error" and values["facts"] == []
    assert values["sources"] and state.next == ("generate",)


async def test_a_collection_without_a_graph_answers_from_its_chunks(graph: Any) -> None:
    state = await _state(graph, QUESTION, RunContext(collection="plain"))
    values = state.values
    assert values["graph_status"] == "no_graph" and values["facts"] == [] and values["linked"] == []
    assert values["sources"] and all(s["relevance"] >= RagSettings().min_relevance for s in values["sources"])
    assert len(values["sources"]) <= RagSettings().max_sources
    assert state.next == ("generate",)


async def test_nothing_found_on_either_side_is_no_answer(graph: Any) -> None:
    state = await _state(graph, "Who painted the Mona Lisa?", RunContext(collection="city"))
    assert state.values["sources"] == [] and state.values["facts"] == [] and state.next == ("no_answer",)


async def test_a_collection_the_tenant_may_not_use_is_refused(graph: Any) -> None:
    context = RunContext(collection="city", tenant="acme", allowed_collections=("handbook",))
    with pytest.raises(CollectionNotAllowedError, match="tenant 'acme' may not use collection 'city'"):
        await graph.ainvoke({"messages": [HumanMessage(QUESTION)]}, {"configurable": {"thread_id": "x"}}, context=context)


def test_the_builder_needs_the_knowledge_graph(knowledge: tuple[KnowledgeBase, KnowledgeGraph]) -> None:
    kb, _ = knowledge
    with pytest.raises(ValueError, match="needs the knowledge graph"):
        make_graph(GraphDeps(graph_id="graphrag", model=_model(), models=_NoModels(), knowledge=kb))
    with pytest.raises(ValueError, match="needs the knowledge base"):
        make_graph(GraphDeps(graph_id="graphrag", model=_model(), models=_NoModels()))


class _OneModel:
    def chat_model(self, alias: str) -> Any:
        return _model()


def test_graphrag_builds_next_to_other_graphs(knowledge: tuple[KnowledgeBase, KnowledgeGraph]) -> None:
    # As config/switchyard.yaml lists them: graphrag after rag, the agent after both;
    # each gets the knowledge graph itself, whatever was built before it.
    kb, kg = knowledge
    specs = {
        "rag": GraphSpec(path="graphs.rag:make_graph"),
        "graphrag": GraphSpec(path="graphs.graphrag:make_graph"),
        "agent": GraphSpec(path="graphs.agent:make_graph", tools=("graph_neighbors",)),
    }
    tools = ToolRegistry.builtin(ToolsSettings(), kb, graph=kg)
    registry = GraphRegistry.load(specs, _OneModel(), knowledge=kb, tools=tools, graph=kg)
    assert registry.ids() == ["rag", "graphrag", "agent"]
    assert "facts" in registry.get("graphrag").graph.channels


def test_sources_interleave_graph_and_search_each_chunk_once() -> None:
    assert list(_interleave(["a", "b", "c"], ["x", "a", "y"])) == ["a", "x", "b", "c", "y"]
    assert list(_interleave([], ["x", "y"])) == ["x", "y"]


async def test_assembly_bounds_the_context_and_drops_facts_it_cannot_cite(knowledge: tuple[KnowledgeBase, KnowledgeGraph]) -> None:
    kb, kg = knowledge
    settings = RagSettings(max_sources=2)
    nodes = GraphRagNodes(_model(), kb, kg, settings, GraphSettings().retrieval)

    def chunk(name: str, relevance: float) -> dict[str, Any]:
        return {"chunk_id": f"{name}#0", "doc_id": name, "text": name, "title": None, "source": "", "heading": "", "relevance": relevance}

    def fact(name: str, *chunks: str) -> dict[str, Any]:
        sources = [{"chunk_id": c, "doc_id": c.split("#")[0], "text": c, "title": None, "source": ""} for c in chunks]
        return {"text": name, "chunk_ids": list(chunks), "sources": sources}

    state: Any = {
        "candidates": [chunk("v1", 0.9), chunk("v2", 0.8), chunk("v3", 0.7), chunk("low", 0.1)],
        "graph_facts": [fact("f1", "g1#0"), fact("f2", "v2#0"), fact("f3", "g2#0"), fact("f4", "g3#0", "g4#0"), fact("f5", "g5#0")],
    }
    out = await nodes.assemble(state, None)  # type: ignore[arg-type]
    # Graph and search in turn (g1, v1, g2 after v2 is taken by f2's turn...), at most 2 + 2.
    assert [s["chunk_id"] for s in out["sources"]] == ["g1#0", "v1#0", "v2#0", "g2#0"]
    assert [s["relevance"] for s in out["sources"]] == [0.0, 0.9, 0.8, 0.0]
    # f4 and f5 are stated by chunks that did not fit: not given to the model.
    assert [(f["text"], f["cited_as"]) for f in out["facts"]] == [("f1", [1]), ("f2", [3]), ("f3", [4])]


@pytest.mark.llm
async def test_the_real_model_answers_and_the_facts_reach_the_stream(
    local_backend: Backend, knowledge: tuple[KnowledgeBase, KnowledgeGraph]
) -> None:
    kb, kg = knowledge
    gateway = ModelGateway(load_registry(REPO / "config/models.yaml"))
    try:
        registry = GraphRegistry.load(
            {"graphrag": GraphSpec(path="graphs.graphrag:make_graph")}, gateway, knowledge=kb, graph=kg
        )
        stream = registry.get("graphrag").graph.astream(
            {"messages": [HumanMessage(CHILDCARE)]},
            context=RunContext(collection="city", model_params={"max_tokens": 60, "temperature": 0}),
            stream_mode=["messages", "updates"],
            version="v2",
        )
        async with aclosing(message_events(stream)) as events:
            seen = [event async for event in events]
    finally:
        await gateway.aclose()
    kinds = [type(e).__name__ for e in seen]
    first_text = kinds.index("TextDelta")
    assert kinds.index("Citations") < kinds.index("Facts") < first_text
    citations = next(e for e in seen if isinstance(e, Citations)).sources
    facts = next(e for e in seen if isinstance(e, Facts)).facts
    assert {"38-childcare-allowance.md", "39-birth-register-extract.md"} <= {s["doc_id"] for s in citations}
    assert all(set(f["cited_as"]) <= {s["index"] for s in citations} for f in facts)
    answer = "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert answer.strip()
    finish = seen[-1]
    assert isinstance(finish, Finish) and finish.completion_tokens > 0
