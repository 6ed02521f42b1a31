"""Graph retrieval: linking a question's entities by name, alias and meaning; the fact
ranking (a path through a hub counts less than one through a specific entity, facts
alongside the path less than facts continuing it, the question's relation words and
chunks count); facts carrying their source chunks; the two-hop example of the issue.

The ranking tests build facts by hand (no store, no embedder): they are about the
ranking logic. The retrieval tests run on LadybugDB, Qdrant Edge and the packaged
embedder in a temp directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from knowledge import Document, KnowledgeBase, KnowledgeGraph, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.graphstore import Entity, Fact, LadybugStore, entity_id
from knowledge.ontology import load_ontology
from knowledge.retrieval import LinkedEntity, question_ngrams, rank_facts
from knowledge.settings import GraphRetrievalSettings, GraphSettings
from knowledge.vectorstore.edge import EdgeStore

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")


def _entity(entity_type: str, name: str) -> Entity:
    return Entity(id=entity_id(entity_type, name), type=entity_type, name=name)


def _fact(source: Entity, relation: str, target: Entity, hops: int, chunk: str) -> Fact:
    return Fact(source=source, relation=relation, target=target, chunk_ids=(chunk,), hops=hops)


def test_question_ngrams() -> None:
    grams = question_ngrams("Where is the Labour Office, please?")
    keys = list(grams)
    assert keys[0] == "where is the labour office, please"  # longest first
    assert grams["labour office"] == "Labour Office"  # as written, outer punctuation off
    assert grams["please"] == "please"
    assert "the labour office" in grams and "office" in grams
    assert question_ngrams("  ") == {}
    assert max(len(k.split()) for k in question_ngrams(" ".join(f"w{i}" for i in range(20)))) == 6


# ---- ranking -----------------------------------------------------------------------------------

BENEFIT = _entity("Procedure", "Unemployment Benefit")
CARD = _entity("Document", "Resident Card")  # a hub: every procedure requires it
CERTIFICATE = _entity("Document", "Separation Certificate")
EMPLOYMENT = _entity("Office", "Employment Office")
ARBITRATION = _entity("Office", "Labour Arbitration Office")
DESK = _entity("Office", "Citizen Desk")
OTHERS = [_entity("Procedure", name) for name in ("Housing Benefit", "Childcare Allowance", "School Enrolment")]

# In the store's order: nearer first, then relation type, then names.
FACTS = [
    _fact(BENEFIT, "HANDLED_BY", EMPLOYMENT, 1, "benefit#0"),
    _fact(BENEFIT, "REQUIRES", CARD, 1, "benefit#0"),
    _fact(BENEFIT, "REQUIRES", CERTIFICATE, 1, "benefit#0"),
    *(_fact(other, "REQUIRES", CARD, 2, f"{other.name}#0") for other in OTHERS),
    _fact(CARD, "ISSUED_BY", DESK, 2, "card#0"),
    _fact(CERTIFICATE, "ISSUED_INSTEAD_BY", ARBITRATION, 2, "certificate#1"),
]
LINKED = [LinkedEntity(entity=BENEFIT, how="exact", score=1.0, mention="unemployment benefit")]


def _texts(ranked: list[tuple[Fact, float]]) -> list[str]:
    return [f"{f.source.name} {f.relation} {f.target.name}" for f, _ in ranked]


def test_a_hub_passes_on_less_and_siblings_rank_last() -> None:
    question = "Where do I get the document the unemployment benefit requires if my employer refuses?"
    ranked = rank_facts(FACTS, LINKED, question, {})
    texts = _texts(ranked)
    # Facts touching the linked entity first, the ones it requires before the other.
    assert texts[:3] == [
        "Unemployment Benefit REQUIRES Resident Card",
        "Unemployment Benefit REQUIRES Separation Certificate",
        "Unemployment Benefit HANDLED_BY Employment Office",
    ]
    # Then the chain through the certificate (two relations) before the chain through
    # the card (five), and the other procedures requiring the card (siblings) last,
    # although "requires" is in the question.
    assert texts[3:5] == [
        "Separation Certificate ISSUED_INSTEAD_BY Labour Arbitration Office",
        "Resident Card ISSUED_BY Citizen Desk",
    ]
    assert set(texts[5:]) == {f"{o.name} REQUIRES Resident Card" for o in OTHERS}
    scores = [score for _, score in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 < s <= 1 for s in scores)


def test_ties_keep_the_store_order_and_chunks_break_them() -> None:
    question = "Which office?"
    ranked = rank_facts(FACTS, LINKED, question, {})
    siblings = [t for t in _texts(ranked) if t.endswith("REQUIRES Resident Card") and not t.startswith("Unemployment")]
    assert siblings == [f"{o.name} REQUIRES Resident Card" for o in OTHERS]
    # The question's words in a fact's chunk, or its meaning, lift it among equals.
    by_words = rank_facts(FACTS, LINKED, "school enrolment papers", {"School Enrolment#0": "School enrolment papers"})
    assert [t for t in _texts(by_words) if t in siblings][0] == "School Enrolment REQUIRES Resident Card"
    by_meaning = rank_facts(FACTS, LINKED, question, {}, {"Childcare Allowance#0": 0.9})
    assert [t for t in _texts(by_meaning) if t in siblings][0] == "Childcare Allowance REQUIRES Resident Card"


def test_a_relation_the_question_names_comes_first() -> None:
    handled = _texts(rank_facts(FACTS, LINKED, "Which office handles the unemployment benefit?", {}))
    assert handled[0] == "Unemployment Benefit HANDLED_BY Employment Office"
    issued = _texts(rank_facts(FACTS[-2:], [LinkedEntity(entity=CARD, how="alias", score=0.9, mention="card"),
                                             LinkedEntity(entity=CERTIFICATE, how="exact", score=1.0, mention="certificate")],
                               "Who issues it instead?", {}))
    assert issued[0] == "Separation Certificate ISSUED_INSTEAD_BY Labour Arbitration Office"  # better link, "issue"


def test_no_linked_entity_no_path() -> None:
    ranked = rank_facts(FACTS, [], "anything", {})
    assert len(ranked) == len(FACTS)  # still ranked (by distance), nothing dropped


# ---- retrieval -----------------------------------------------------------------------------------

DOCUMENTS = [
    Document(id="benefit.md", format="markdown", source="benefit.md", title="Unemployment benefit",
             text="# Unemployment benefit\n\nThe unemployment benefit requires a Separation Certificate from your last "
             "employer and your Resident Card.\n"),
    Document(id="certificate.md", format="markdown", source="certificate.md", title="Separation Certificate",
             text="# Separation Certificate\n\nWhen the company will not sign it, the Labour Arbitration Office issues "
             "the Separation Certificate instead, at 12 Tallow Lane.\n"),
    Document(id="card.md", format="markdown", source="card.md",
             text="# Resident Card\n\nThe Citizen Desk issues the Resident Card.\n"),
    # Other procedures need the card too: it is a hub of the graph.
    Document(id="housing.md", format="markdown", source="housing.md",
             text="# Housing benefit\n\nThe housing benefit requires your Resident Card.\n"),
    Document(id="school.md", format="markdown", source="school.md",
             text="# School enrolment\n\nSchool enrolment requires the Resident Card of a parent.\n"),
]
CURATED = [
    {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "aliases": ["jobless pay"],
     "description": "A monthly payment for residents who lost their job.", "source": "benefit.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "benefit.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Resident Card", "source": "benefit.md"},
    {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "certificate.md"},
    {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "source": "certificate.md"},
    {"kind": "relation", "type": "ISSUED_INSTEAD_BY", "from": "Separation Certificate", "to": "Labour Arbitration Office",
     "source": "certificate.md"},
    {"kind": "entity", "type": "Document", "name": "Resident Card", "source": "card.md"},
    {"kind": "entity", "type": "Office", "name": "Citizen Desk", "source": "card.md"},
    {"kind": "relation", "type": "ISSUED_BY", "from": "Resident Card", "to": "Citizen Desk", "source": "card.md"},
    {"kind": "entity", "type": "Procedure", "name": "Housing Benefit", "source": "housing.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Housing Benefit", "to": "Resident Card", "source": "housing.md"},
    {"kind": "entity", "type": "Procedure", "name": "School Enrolment", "source": "school.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "School Enrolment", "to": "Resident Card", "source": "school.md"},
]


@pytest.fixture
async def city(tmp_path: Path, embedder: LocalEmbedder) -> AsyncIterator[KnowledgeGraph]:
    vectors = EdgeStore(tmp_path / "vectors")
    knowledge = KnowledgeBase(vectors, embedder, KnowledgeSettings())
    await knowledge.ingest("city", DOCUMENTS)
    graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    report = await graph.import_facts("city", [json.dumps(f) for f in CURATED], ontology=ONTOLOGY)
    assert report.invalid == {}
    yield graph
    await graph.aclose()
    await vectors.aclose()


@pytest.mark.integration
async def test_the_issue_example(city: KnowledgeGraph) -> None:
    found = await city.retrieve("city", "Where do I get the document the unemployment benefit requires if my employer refuses?")
    assert [(e.entity.name, e.how, e.score, e.mention) for e in found.linked][:1] == [
        ("Unemployment Benefit", "exact", 1.0, "unemployment benefit")
    ]
    texts = [f.fact.text() for f in found.facts]
    chain = "Separation Certificate (Document) ISSUED_INSTEAD_BY Labour Arbitration Office (Office)"
    # The first fact two hops out: the chain through the certificate, not through the
    # card every procedure requires, nor another procedure requiring the card.
    assert [t for t, f in zip(texts, found.facts, strict=True) if f.fact.hops == 2][0] == chain
    fact = found.facts[texts.index(chain)]
    assert fact.fact.hops == 2
    # The fact carries the chunk that states it: the second document, which shares no
    # words with the question's "employer refuses".
    assert [(s.chunk_id, s.doc_id, s.title, s.source) for s in fact.sources] == [
        ("certificate.md#0", "certificate.md", "Separation Certificate", "certificate.md")
    ]
    assert "12 Tallow Lane" in fact.sources[0].text
    as_json = fact.json()
    assert as_json["subject"] == "Separation Certificate" and as_json["relation"] == "ISSUED_INSTEAD_BY"
    assert as_json["object"] == "Labour Arbitration Office" and as_json["object_type"] == "Office"
    assert as_json["doc_id"] == "certificate.md" and as_json["doc_ids"] == ["certificate.md"]
    assert as_json["chunk_ids"] == ["certificate.md#0"] and as_json["sources"][0]["text"] == fact.sources[0].text
    assert as_json["text"] == chain and as_json["hops"] == 2 and 0 < as_json["score"] <= 1
    assert json.loads(json.dumps(found.json()))["collection"] == "city"
    capped = await city.retrieve("city", "unemployment benefit", max_facts=2, hops=1)
    assert len(capped.facts) == 2 and all(f.fact.hops == 1 for f in capped.facts)


@pytest.mark.integration
async def test_linking_by_alias_and_by_meaning(city: KnowledgeGraph) -> None:
    by_alias = await city.retrieve("city", "How do I claim jobless pay?")
    assert [(e.entity.name, e.how, e.score, e.mention) for e in by_alias.linked if e.how != "vector"] == [
        ("Unemployment Benefit", "alias", 0.9, "jobless pay")
    ]
    everything = KnowledgeGraph(city.store, city.knowledge, GraphSettings(retrieval=GraphRetrievalSettings(min_link_relevance=-1.0)))
    meant = await everything.retrieve("city", "a monthly payment after losing my work")
    vector = [e for e in meant.linked if e.how == "vector"]
    assert vector and all(e.mention == "a monthly payment after losing my work" for e in vector)
    assert len(vector) <= GraphRetrievalSettings().link_k
    assert [e.score for e in vector] == sorted((e.score for e in vector), reverse=True)
    strict = KnowledgeGraph(city.store, city.knowledge, GraphSettings(retrieval=GraphRetrievalSettings(min_link_relevance=0.99)))
    none = await strict.retrieve("city", "a monthly payment after losing my work")
    assert none.linked == () and none.facts == ()


@pytest.mark.integration
async def test_a_chunk_the_vector_store_lost_is_left_out_of_the_sources(city: KnowledgeGraph) -> None:
    # No on_removed hook here: the graph still holds the card's facts.
    await city.knowledge.delete("city", "card.md")
    found = await city.retrieve("city", "Who issues the Resident Card?")
    fact = next(f for f in found.facts if f.fact.relation == "ISSUED_BY")
    assert fact.fact.chunk_ids == ("card.md#0",) and fact.sources == ()


@pytest.mark.integration
async def test_a_name_many_entities_share_does_not_crowd_out_an_exact_match(tmp_path: Path, embedder: LocalEmbedder) -> None:
    # A question naming 120 forms (Documents, which sort before any Procedure): the
    # store's first hundred answers to its words would hold none of the procedures.
    vectors = EdgeStore(tmp_path / "vectors")
    knowledge = KnowledgeBase(vectors, embedder, KnowledgeSettings())
    await knowledge.ingest("city", DOCUMENTS[:1])
    graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    try:
        forms = [f"F{i:03d}" for i in range(120)]
        lines = [json.dumps({"kind": "entity", "type": "Document", "name": f, "source": "benefit.md"}) for f in forms]
        lines.append(json.dumps(CURATED[0]))
        report = await graph.import_facts("city", lines, ontology=ONTOLOGY)
        assert report.invalid == {} and report.entities == {"Document": 120, "Procedure": 1}
        found = await graph.retriever.link("city", f"Does the unemployment benefit need {' '.join(forms)}?")
        named = [(e.entity.name, e.how) for e in found if e.how != "vector"]
        assert ("Unemployment Benefit", "exact") in named
        assert len(named) == 100  # the longest names first, at most a hundred
    finally:
        await graph.aclose()
        await vectors.aclose()
