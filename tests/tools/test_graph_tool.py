"""``graph_neighbors`` through the executor (the only way a tool runs), over a real
knowledge graph (LadybugDB in a temp directory, the graphrag suite's curated facts):
facts with their documents, hops, the collection rules of ``knowledge_search``, a
collection without a graph and an unknown name as answers, bad arguments refused."""

from __future__ import annotations

from collections.abc import AsyncIterator


import pytest

from eval.datasets import DATASETS_DIR
from knowledge import Document, KnowledgeBase, KnowledgeGraph, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.graphstore import LadybugStore
from knowledge.ontology import load_ontology
from knowledge.settings import GraphSettings
from knowledge.vectorstore.edge import EdgeStore
from tools import ToolCallRecord, ToolContext, ToolExecutor, ToolPolicy, ToolRegistry, ToolsSettings

pytestmark = pytest.mark.integration

CITY = DATASETS_DIR / "graphrag-corpus"


@pytest.fixture(scope="module")
async def graph(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KnowledgeGraph]:
    tmp = tmp_path_factory.mktemp("graph-tool")
    store = EdgeStore(tmp / "vectors")
    kb = KnowledgeBase(store, LocalEmbedder.packaged("use-multilingual-v3"), KnowledgeSettings(default_collection="city"))
    documents = [Document(id=p.name, text=p.read_text(encoding="utf-8")) for p in sorted((CITY / "documents").glob("*.md"))]
    await kb.ingest("city", documents)
    await kb.ingest("plain", documents[:1])
    kg = KnowledgeGraph(LadybugStore(tmp / "graph"), kb, GraphSettings())
    await kg.import_facts("city", (CITY / "facts.jsonl").read_text(encoding="utf-8").splitlines(), ontology=load_ontology(CITY / "ontology.yaml"))
    yield kg
    await kg.aclose()
    await store.aclose()


def _executor(graph: KnowledgeGraph, context: ToolContext, records: list[ToolCallRecord] | None = None) -> ToolExecutor:
    registry = ToolRegistry.builtin(ToolsSettings(), graph.knowledge, graph=graph)
    policy = ToolPolicy.intersect(["graph_neighbors"], ["*"], registry.names(), max_tool_calls=8)
    return ToolExecutor(registry, policy, context, (records if records is not None else []).append)


def test_the_tool_is_built_in_only_with_a_graph(graph: KnowledgeGraph) -> None:
    assert "graph_neighbors" in ToolRegistry.builtin(ToolsSettings(), graph.knowledge, graph=graph).names()
    assert "graph_neighbors" not in ToolRegistry.builtin(ToolsSettings(), graph.knowledge).names()


async def test_facts_around_a_name_with_their_documents(graph: KnowledgeGraph) -> None:
    executor = _executor(graph, ToolContext(collection="city"))
    one = await executor.run("c1", "graph_neighbors", {"name": "separation certificate"})
    assert one.status == "success"
    lines = str(one.content).splitlines()
    assert "Separation Certificate (Document) ISSUED_INSTEAD_BY Labour Arbitration Office (Office) [32-separation-certificate.md]" in lines
    assert "Unemployment Benefit (Procedure) REQUIRES Separation Certificate (Document) [31-unemployment-benefit.md]" in lines
    assert len(lines) == 2  # one hop: only the relations touching it
    # An alias finds the same entity; two hops reach the benefit's other relations.
    two = await executor.run("c2", "graph_neighbors", {"name": "leaving certificate", "hops": 2})
    assert set(lines) < set(str(two.content).splitlines())
    assert "Unemployment Benefit (Procedure) HANDLED_BY Verrin Employment Office (Office) [31-unemployment-benefit.md]" in str(two.content)


async def test_unknown_names_and_collections_without_a_graph_are_answers(graph: KnowledgeGraph) -> None:
    executor = _executor(graph, ToolContext(collection="plain"))
    plain = await executor.run("c1", "graph_neighbors", {"name": "Resident Card"})
    assert plain.status == "success" and "has no knowledge graph" in str(plain.content)
    city = _executor(graph, ToolContext())  # the default collection: city
    nothing = await city.run("c2", "graph_neighbors", {"name": "Mona Lisa"})
    assert nothing.status == "success" and str(nothing.content) == "No entity named 'Mona Lisa' in the knowledge graph."


async def test_the_collection_rules_and_bad_arguments(graph: KnowledgeGraph) -> None:
    records: list[ToolCallRecord] = []
    refused = _executor(graph, ToolContext(collection="city", tenant="acme", allowed_collections=("handbook",)), records)
    message = await refused.run("c1", "graph_neighbors", {"name": "Resident Card"})
    assert message.status == "error" and "may not use collection 'city'" in str(message.content)
    executor = _executor(graph, ToolContext(collection="city"), records)
    for args, problem in [({"name": "Resident Card", "hops": 4}, "hops"), ({"name": ""}, "name"), ({}, "name")]:
        bad = await executor.run("c2", "graph_neighbors", args)
        assert bad.status == "error" and "invalid arguments" in str(bad.content) and problem in str(bad.content)
    assert [r.decision for r in records] == ["failed", "refused", "refused", "refused"]
