"""The search observers (`KnowledgeBase.on_search`, `KnowledgeGraph.on_search`): told
of every completed search with its number of results, never of a refused one, and
never able to break a search. Real stores (Qdrant Edge, LadybugDB) and the packaged
embedder in a temp directory."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from knowledge import Document, KnowledgeBase, KnowledgeError, KnowledgeGraph, KnowledgeSettings, UnknownCollectionError
from knowledge.embeddings.local import LocalEmbedder
from knowledge.graphstore import LadybugStore
from knowledge.knowledge_base import RetrievalSource
from knowledge.ontology import load_ontology
from knowledge.settings import GraphSettings
from knowledge.vectorstore.base import SearchFilter
from knowledge.vectorstore.edge import EdgeStore

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")

DOCUMENTS = [
    Document(id="card.md", format="markdown", source="card.md",
             text="# Resident Card\n\nThe Citizen Desk issues the Resident Card.\n"),
    Document(id="housing.md", format="markdown", source="housing.md",
             text="# Housing benefit\n\nThe housing benefit requires your Resident Card.\n"),
]
FACTS = [
    {"kind": "entity", "type": "Document", "name": "Resident Card", "source": "card.md"},
    {"kind": "entity", "type": "Office", "name": "Citizen Desk", "source": "card.md"},
    {"kind": "relation", "type": "ISSUED_BY", "from": "Resident Card", "to": "Citizen Desk", "source": "card.md"},
    {"kind": "entity", "type": "Procedure", "name": "Housing Benefit", "source": "housing.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Housing Benefit", "to": "Resident Card", "source": "housing.md"},
]

Seen = list[tuple[str, RetrievalSource, int]]


@pytest.fixture
async def city(tmp_path: Path, embedder: LocalEmbedder) -> AsyncIterator[KnowledgeGraph]:
    vectors = EdgeStore(tmp_path / "vectors")
    knowledge = KnowledgeBase(vectors, embedder, KnowledgeSettings())
    await knowledge.ingest("city", DOCUMENTS)
    graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    report = await graph.import_facts("city", [json.dumps(f) for f in FACTS], ontology=ONTOLOGY)
    assert report.invalid == {}
    yield graph
    await graph.aclose()
    await vectors.aclose()


@pytest.mark.integration
async def test_every_search_is_reported_with_its_hits(city: KnowledgeGraph) -> None:
    knowledge = city.knowledge
    seen: Seen = []
    knowledge.on_search = lambda collection, source, hits: seen.append((collection, source, hits))
    city.on_search = lambda collection, source, hits: seen.append((collection, source, hits))

    for mode in ("dense", "sparse", "hybrid"):
        found = await knowledge.search("city", "Who issues the Resident Card?", k=1, mode=mode)  # type: ignore[arg-type]
        assert len(found) == 1
    # Nothing found: no chunk carries the tag (the 0 a dashboard counts as empty).
    assert await knowledge.search("city", "Resident Card", where=SearchFilter(tags=["none"])) == []
    retrieved = await city.retrieve("city", "Who issues the Resident Card?")
    assert retrieved.facts
    unlinked = await city.retrieve("city", "zeppelin mast height")
    assert unlinked.facts == ()  # no entity linked: an empty retrieval
    assert seen == [
        ("city", "vectors", 1), ("city", "vectors", 1), ("city", "vectors", 1), ("city", "vectors", 0),
        ("city", "graph", len(retrieved.facts)), ("city", "graph", 0),
    ]
    # The graph's own lookups (entity linking, fact sources) read the stores directly:
    # one retrieval is one report, not one per chunk it reads.
    assert sum(1 for _, source, _ in seen if source == "vectors") == 4


@pytest.mark.integration
async def test_a_refused_search_is_not_reported(city: KnowledgeGraph) -> None:
    knowledge = city.knowledge
    seen: Seen = []
    knowledge.on_search = city.on_search = lambda collection, source, hits: seen.append((collection, source, hits))
    with pytest.raises(UnknownCollectionError):
        await knowledge.search("nope", "anything")
    with pytest.raises(KnowledgeError, match="empty"):
        await knowledge.search("city", "  ")
    with pytest.raises(KnowledgeError, match="empty"):
        await city.retrieve("city", " ")
    assert seen == []


@pytest.mark.integration
async def test_an_observer_that_raises_never_breaks_a_search(city: KnowledgeGraph, caplog: pytest.LogCaptureFixture) -> None:
    def broken(collection: str, source: RetrievalSource, hits: int) -> None:
        raise RuntimeError("metrics are down")

    city.knowledge.on_search = city.on_search = broken
    with caplog.at_level(logging.ERROR, logger="knowledge.knowledge_base"):
        assert len(await city.knowledge.search("city", "Resident Card", k=2)) == 2
        assert (await city.retrieve("city", "Who issues the Resident Card?")).facts
    failures = [r for r in caplog.records if "search observer failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
    assert "a vectors search of 'city'" in failures[0].getMessage()
    assert "a graph search of 'city'" in failures[1].getMessage()


async def test_no_observer_by_default(knowledge: KnowledgeBase) -> None:
    assert knowledge.on_search is None
    await knowledge.ingest("c", DOCUMENTS[:1])
    assert len(await knowledge.search("c", "Resident Card", k=1)) == 1
