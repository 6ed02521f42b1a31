"""Curated facts (JSON Lines): every line checked, problems named by line number and
reason, nothing invalid written; facts linked to the chunks of their source document
that name them; an import adds to what a document already has; importing twice
changes nothing. Real engines: LadybugDB, Qdrant Edge and the packaged embedder in a
temp directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from knowledge import Document, KnowledgeBase, KnowledgeGraph, KnowledgeSettings, OntologyRequiredError
from knowledge.embeddings.local import LocalEmbedder
from knowledge.errors import UnknownCollectionError
from knowledge.extraction import parse_curated
from knowledge.graphstore import LadybugStore, entity_id
from knowledge.ontology import load_ontology
from knowledge.settings import GraphSettings
from knowledge.vectorstore.edge import EdgeStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")

BENEFIT = Document(
    id="benefit.md", format="markdown", source="benefit.md",
    text="# Unemployment benefit\n\n## Who may apply\n\nResidents who lost their job may apply for the unemployment benefit.\n\n"
    "## What to bring\n\nYou need a Separation Certificate from your last employer.\n",
)
CERTIFICATE = Document(
    id="certificate.md", format="markdown", source="certificate.md",
    text="# Separation Certificate\n\n## What it states\n\nA signed sheet from your employer.\n\n"
    "## When the employer refuses\n\nThe Labour Arbitration Office at 12 Tallow Lane issues it instead.\n",
)


def _lines(*items: dict[str, object] | str) -> list[str]:
    return [item if isinstance(item, str) else json.dumps(item) for item in items]


@pytest.fixture
async def graph(tmp_path: Path, embedder: LocalEmbedder) -> AsyncIterator[KnowledgeGraph]:
    vectors = EdgeStore(tmp_path / "vectors")
    knowledge = KnowledgeBase(vectors, embedder, KnowledgeSettings())
    await knowledge.ingest("city", [BENEFIT, CERTIFICATE])
    opened = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    knowledge.on_removed = opened.delete_document
    yield opened
    await opened.aclose()
    await vectors.aclose()


def test_every_line_is_checked_with_its_number() -> None:
    lines = _lines(
        {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "source": "certificate.md"},
        "",
        "{not json",
        "[1, 2]",
        {"type": "Office", "name": "X", "source": "certificate.md"},
        {"kind": "person", "name": "X"},
        {"kind": "entity", "type": "Person", "name": "X", "source": "certificate.md"},
        {"kind": "entity", "type": "Office", "name": "X"},
        {"kind": "relation", "type": "KNOWS", "from": "a", "to": "b", "source": "certificate.md"},
        {"kind": "relation", "type": "ISSUED_BY", "from": "a", "to": "b", "source": "certificate.md"},
        {"kind": "entity", "type": "Office", "name": "X", "properties": {"address": 12}, "source": "certificate.md"},
        {"kind": "entity", "type": "Office", "name": "X", "source": 7},
    )
    facts = parse_curated(lines, ONTOLOGY)
    assert facts.lines == 11  # the blank line is not counted
    assert [(e.line, e.item.name) for e in facts.entities] == [(1, "Labour Arbitration Office")]
    assert [(r.line, r.item.type) for r in facts.relations] == [(10, "ISSUED_BY")]  # ends checked later
    assert [(p.where, p.reason) for p in facts.problems] == [
        ("line 3", "bad_json"),
        ("line 4", "bad_json"),
        ("line 5", "missing_field"),
        ("line 6", "missing_field"),
        ("line 7", "unknown_entity_type"),
        ("line 8", "missing_field"),
        ("line 9", "unknown_relation_type"),
        ("line 11", "bad_property"),
        ("line 12", "unknown_document"),
    ]
    assert "kind 'person'" in facts.problems[3].detail and "source is missing" in facts.problems[5].detail


async def test_import_links_facts_to_the_chunks_that_name_them(graph: KnowledgeGraph) -> None:
    lines = _lines(
        {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "aliases": ["jobless pay"], "source": "benefit.md"},
        {"kind": "relation", "type": "REQUIRES", "from": "unemployment benefit", "to": "Separation Certificate", "source": "benefit.md"},
        {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "benefit.md"},
        {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "aliases": ["arbitration office"],
         "properties": {"address": "12 Tallow Lane"}, "description": "Hears both sides.", "source": "certificate.md"},
        {"kind": "relation", "type": "ISSUED_INSTEAD_BY", "from": "Separation Certificate", "to": "Arbitration Office",
         "source": "certificate.md"},
    )
    report = await graph.import_facts("city", lines, ontology=ONTOLOGY, source="facts.jsonl")
    assert report.invalid == {} and report.problems == []
    assert report.documents == 2 and report.chunks == 5
    assert report.entities == {"Document": 1, "Office": 1, "Procedure": 1}
    assert report.relations == {"ISSUED_INSTEAD_BY": 1, "REQUIRES": 1}
    assert report.ontology == ONTOLOGY.describe()

    found = await graph.neighbors("city", "jobless pay", hops=2)
    assert [e.name for e in found.matched] == ["Unemployment Benefit"]
    by_relation = {f.relation: f for f in found.facts}
    # "Unemployment Benefit" is named in both chunks of benefit.md (the heading), the
    # certificate only in the second: the relation is stated where both are named.
    assert by_relation["REQUIRES"].chunk_ids == ("benefit.md#1",) and by_relation["REQUIRES"].hops == 1
    # The office's chunk is the one naming it (by its alias, case-folded) and the certificate.
    assert by_relation["ISSUED_INSTEAD_BY"].chunk_ids == ("certificate.md#1",) and by_relation["ISSUED_INSTEAD_BY"].hops == 2
    office = by_relation["ISSUED_INSTEAD_BY"].target
    assert office.id == entity_id("Office", "Labour Arbitration Office")
    assert office.properties == {"address": "12 Tallow Lane"} and office.description == "Hears both sides."
    assert (await graph.store.mentions("city", [office.id]))[office.id] == ("certificate.md#1",)
    # One entity each in the companion, for linking by meaning.
    companion = await graph.knowledge.store.documents("city__entities")
    assert sorted(companion) == sorted(
        [entity_id("Procedure", "Unemployment Benefit"), entity_id("Document", "Separation Certificate"), office.id]
    )


async def test_invalid_items_are_dropped_and_named_by_line(graph: KnowledgeGraph) -> None:
    lines = _lines(
        {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"},
        {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "nowhere.md"},
        {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Residence Permit", "source": "benefit.md"},
        {"kind": "relation", "type": "HANDLED_BY", "from": "Unemployment Benefit", "to": "Unemployment Benefit", "source": "benefit.md"},
        "not json",
    )
    report = await graph.import_facts("city", lines, ontology=ONTOLOGY)
    assert report.invalid == {"bad_json": 1, "relation_not_allowed": 1, "unknown_document": 1, "unknown_entity": 1}
    assert [(p["where"], p["reason"]) for p in report.problems] == [
        ("line 2", "unknown_document"),
        ("line 3", "unknown_entity"),
        ("line 4", "relation_not_allowed"),
        ("line 5", "bad_json"),
    ]
    assert "'Residence Permit'" in report.problems[1]["detail"]
    assert report.entities == {"Procedure": 1} and report.relations == {}
    stats = await graph.stats("city")
    assert {t: n for t, n in stats.entities.items() if n} == {"Procedure": 1} and sum(stats.relations.values()) == 0


async def test_relation_ends_may_be_entities_the_graph_holds(graph: KnowledgeGraph) -> None:
    first = _lines(
        {"kind": "entity", "type": "Document", "name": "Separation Certificate", "aliases": ["leaving paper"], "source": "certificate.md"},
        {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "source": "certificate.md"},
    )
    await graph.import_facts("city", first, ontology=ONTOLOGY)
    # A later file names the stored entities (one by its alias) without declaring them.
    later = _lines({"kind": "relation", "type": "ISSUED_INSTEAD_BY", "from": "Leaving Paper", "to": "labour arbitration office",
                    "source": "certificate.md"})
    report = await graph.import_facts("city", later)  # the bound ontology
    assert report.invalid == {} and report.relations == {"ISSUED_INSTEAD_BY": 1}
    facts = (await graph.neighbors("city", "Separation Certificate", hops=1)).facts
    assert [(f.source.name, f.relation, f.target.name) for f in facts] == [
        ("Separation Certificate", "ISSUED_INSTEAD_BY", "Labour Arbitration Office")
    ]
    assert facts[0].source.aliases == ("leaving paper",)


async def test_an_alias_one_document_declares_joins_another_documents_name_in_the_same_import(graph: KnowledgeGraph) -> None:
    # benefit.md comes first: its "LAO" is the office certificate.md declares, as
    # it would be were the two imported one after the other.
    lines = _lines(
        {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "aliases": ["LAO"], "source": "certificate.md"},
        {"kind": "entity", "type": "Office", "name": "LAO", "source": "benefit.md"},
        {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "source": "certificate.md"},
    )
    report = await graph.import_facts("city", lines, ontology=ONTOLOGY)
    assert report.invalid == {} and report.entities == {"Office": 1}
    assert (await graph.stats("city")).entities["Office"] == 1
    (office,) = (await graph.neighbors("city", "LAO")).matched
    mentions = await graph.store.mentions("city", [office.id])
    assert {c.split("#")[0] for c in mentions[office.id]} == {"benefit.md", "certificate.md"}


async def test_an_import_adds_to_what_the_document_has_and_is_idempotent(graph: KnowledgeGraph) -> None:
    first = _lines(
        {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"},
        {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "benefit.md"},
        {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "benefit.md"},
    )
    second = _lines(
        {"kind": "entity", "type": "Office", "name": "Employment Office", "source": "benefit.md"},
        {"kind": "relation", "type": "HANDLED_BY", "from": "Unemployment Benefit", "to": "Employment Office", "source": "benefit.md"},
    )
    await graph.import_facts("city", first, ontology=ONTOLOGY)
    await graph.import_facts("city", second)
    facts = (await graph.neighbors("city", "Unemployment Benefit", hops=1)).facts
    assert sorted(f.relation for f in facts) == ["HANDLED_BY", "REQUIRES"]  # the first import's fact stayed
    before = await graph.stats("city")
    again = await graph.import_facts("city", second)
    assert again.invalid == {} and await graph.stats("city") == before
    assert sorted(f.relation for f in (await graph.neighbors("city", "Unemployment Benefit", hops=1)).facts) == [
        "HANDLED_BY", "REQUIRES",
    ]
    # The document's record in the graph is its current version (an extraction skips it).
    entry = await graph.knowledge.store.document("city", "benefit.md")
    assert entry is not None and (await graph.store.documents("city"))["benefit.md"] == entry.version


async def test_an_import_keeps_facts_whose_entities_lost_their_companion_point(graph: KnowledgeGraph) -> None:
    first = _lines(
        {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"},
        {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "benefit.md"},
        {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "benefit.md"},
    )
    await graph.import_facts("city", first, ontology=ONTOLOGY)
    # The certificate's companion point goes (a failed companion write, a DELETE of it):
    # the document's graph is read from the graph, so the next import keeps its fact.
    await graph.knowledge.delete("city__entities", entity_id("Document", "Separation Certificate"))
    second = _lines(
        {"kind": "entity", "type": "Office", "name": "Employment Office", "source": "benefit.md"},
        {"kind": "relation", "type": "HANDLED_BY", "from": "Unemployment Benefit", "to": "Employment Office", "source": "benefit.md"},
    )
    report = await graph.import_facts("city", second)
    assert report.invalid == {} and report.relations == {"HANDLED_BY": 1, "REQUIRES": 1}
    stats = await graph.stats("city")
    assert stats.relations["REQUIRES"] == 1 and stats.relations["HANDLED_BY"] == 1
    # The import wrote the certificate again, so its companion point is back.
    assert entity_id("Document", "Separation Certificate") in await graph.knowledge.store.documents("city__entities")


async def test_import_needs_a_collection_and_an_ontology(graph: KnowledgeGraph) -> None:
    line = _lines({"kind": "entity", "type": "Office", "name": "X", "source": "benefit.md"})
    with pytest.raises(OntologyRequiredError, match="give an ontology"):
        await graph.import_facts("city", line)
    with pytest.raises(UnknownCollectionError, match="unknown collection 'elsewhere'"):
        await graph.import_facts("elsewhere", line, ontology=ONTOLOGY)
