"""One contract for every graph store: LadybugDB in process (in a fresh directory per
test) and the Neo4j adapter through the official ``neo4j`` driver over Bolt, against
a real FalkorDB server (falkordblite, started once per session by
`tests/contracts/conftest.py`; each test gets its own collection names, and the
graphs it made are dropped in teardown). The same writes must give the same answers
on both.

The ontology is the sample corpus's (config/ontologies/city-services.yaml).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from knowledge.errors import (
    GraphNotFoundError,
    GraphStoreError,
    OntologyError,
    InvalidCollectionNameError,
    OntologyMismatchError,
    OntologyViolationError,
    StoreLockedError,
)
from knowledge.graphstore import DocumentGraph, Entity, Fact, GraphStore, Mention, Relation, entity_id
from knowledge.graphstore.ladybug import LadybugStore
from knowledge.graphstore.neo4j import Neo4jStore
from knowledge.ontology import Ontology, load_ontology, parse_ontology
from tests.falkordb import settle

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")
IMPLEMENTATIONS = ["ladybug", "neo4j"]


@pytest.fixture(params=IMPLEMENTATIONS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def opener(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Callable[[], GraphStore]]:
    """Opens the store of ``kind`` (again, for reopen tests); closes them all after."""
    opened: list[GraphStore] = []
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def open_store() -> GraphStore:
        store: GraphStore
        if kind == "ladybug":
            store = LadybugStore(tmp_path / "graph", timeout_s=30)
        else:
            server = request.getfixturevalue("falkordb")
            settle(server)  # a driver closed before (another test's) leaves one dead connection
            store = Neo4jStore(server.url, user="", password="", timeout_s=30)
        opened.append(store)
        return store

    open_store.prefix = prefix  # type: ignore[attr-defined]
    yield open_store
    for store in opened:
        await store.aclose()
    if kind == "neo4j" and opened:
        # One server holds every test's graphs: drop what this test made.
        cleaner = open_store()
        for name in await cleaner.graphs():
            if name.startswith(prefix):
                await cleaner.drop(name)
        await cleaner.aclose()


@pytest.fixture
def store(opener: Callable[[], GraphStore]) -> GraphStore:
    return opener()


@pytest.fixture
def name(opener: Callable[[], GraphStore]) -> Callable[[str], str]:
    """Collection names unique to this test (the Neo4j server is shared)."""
    prefix: str = opener.prefix  # type: ignore[attr-defined]
    return lambda base: f"{prefix}-{base}"


# ---- building document graphs --------------------------------------------------------------


def ent(entity_type: str, entity_name: str, *aliases: str, description: str = "", **properties: object) -> Entity:
    return Entity(
        id=entity_id(entity_type, entity_name),
        type=entity_type,
        name=entity_name,
        aliases=aliases,
        description=description,
        properties=properties,  # type: ignore[arg-type]
    )


def doc(
    doc_id: str,
    facts: list[tuple[Entity, str, Entity]],
    *,
    chunks: int = 1,
    extra: list[Entity] = (),  # type: ignore[assignment]
    chunk_of: Callable[[int], int] = lambda i: 0,
    content_hash: str | None = None,
) -> DocumentGraph:
    """A document graph stating ``facts`` (the i-th in chunk ``chunk_of(i)``), every
    entity mentioned in the chunks that state its facts (or the first chunk)."""
    chunk_ids = tuple(f"{doc_id}#{i}" for i in range(chunks))
    entities: dict[str, Entity] = {}
    mentions: list[Mention] = []
    relations = []
    for i, (source, rel, target) in enumerate(facts):
        chunk = chunk_ids[chunk_of(i)]
        for e in (source, target):
            entities.setdefault(e.id, e)
            mentions.append(Mention(chunk_id=chunk, entity_id=e.id))
        relations.append(Relation(type=rel, source=source.id, target=target.id, chunk_ids=(chunk,)))
    for e in extra:
        entities.setdefault(e.id, e)
        mentions.append(Mention(chunk_id=chunk_ids[0], entity_id=e.id))
    return DocumentGraph(
        doc_id=doc_id,
        content_hash=content_hash or f"hash-{doc_id}-{len(facts)}",
        chunk_ids=chunk_ids,
        entities=tuple(entities.values()),
        relations=tuple(relations),
        mentions=tuple(dict.fromkeys(mentions)),
    )


BENEFIT = ent("Procedure", "Unemployment Benefit")
CERT = ent("Document", "Separation Certificate", "separation cert")
ID_CARD = ent("Document", "Identity Card")
EMPLOYER = ent("Organisation", "Employer")
ARBITRATION = ent("Office", "Labour Arbitration Office", address="12 Quay Street")
JOB_CENTRE = ent("Office", "Job Centre")
TOWN_HALL = ent("Office", "Town Hall")


def triples(facts: list[Fact]) -> list[tuple[str, str, str, int]]:
    return [(f.source.name, f.relation, f.target.name, f.hops) for f in facts]


async def all_facts(store: GraphStore, collection: str) -> list[tuple[str, str, str]]:
    """Every relation of the graph (expanding from every entity)."""
    stats = await store.stats(collection)
    names = [e.name for e in (BENEFIT, CERT, ID_CARD, EMPLOYER, ARBITRATION, JOB_CENTRE, TOWN_HALL)]
    seeds = [e.id for e in await store.find_entities(collection, names)]
    facts = await store.neighbors(collection, seeds, hops=1, fanout=100, limit=1000) if seeds else []
    assert len(facts) == sum(stats.relations.values())
    return sorted((f.source.name, f.relation, f.target.name) for f in facts)


# ---- binding ----------------------------------------------------------------------------


async def test_bind_creates_graph_and_refuses_another_ontology(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("bind")
    assert await store.ontology(c) is None
    assert c not in await store.graphs()
    with pytest.raises(GraphNotFoundError):
        await store.stats(c)
    with pytest.raises(GraphNotFoundError):
        await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", ARBITRATION)]))
    await store.bind(c, ONTOLOGY)
    await store.bind(c, ONTOLOGY)  # the same ontology again: fine
    bound = await store.ontology(c)
    assert bound is not None and bound.fingerprint == ONTOLOGY.fingerprint
    assert c in await store.graphs()
    other = parse_ontology("name: other\nentity_types:\n  Thing: {}\n")
    with pytest.raises(OntologyMismatchError) as caught:
        await store.bind(c, other)
    assert ONTOLOGY.describe() in str(caught.value) and other.describe() in str(caught.value)
    stats = await store.stats(c)
    assert stats.ontology == ONTOLOGY.describe()
    assert stats.documents == 0 and stats.chunks == 0
    assert stats.entities == {t: 0 for t in ONTOLOGY.entity_types}
    assert stats.relations == {t: 0 for t in ONTOLOGY.relation_types}
    with pytest.raises(InvalidCollectionNameError):
        await store.bind("no spaces", ONTOLOGY)


async def test_graphs_and_drop(store: GraphStore, name: Callable[[str], str]) -> None:
    a, b = name("a"), name("b")
    await store.bind(b, ONTOLOGY)
    await store.bind(a, ONTOLOGY)
    await store.write_document(a, doc("x", [(CERT, "ISSUED_BY", ARBITRATION)]))
    await store.write_document(b, doc("x", [(BENEFIT, "REQUIRES", ID_CARD)]))
    mine = [g for g in await store.graphs() if g in (a, b)]
    assert mine == sorted([a, b])
    assert await store.drop(a) is True
    assert await store.drop(a) is False
    assert a not in await store.graphs()
    assert await store.ontology(a) is None
    # The other collection's graph is untouched.
    assert (await store.stats(b)).relations["REQUIRES"] == 1
    assert await store.find_entities(b, ["Separation Certificate"]) == []
    # A dropped collection can be bound again, to another ontology.
    other = parse_ontology("name: other\nentity_types:\n  Thing: {}\n")
    await store.bind(a, other)
    assert (await store.stats(a)).entities == {"Thing": 0}


# ---- writing ----------------------------------------------------------------------------


async def test_write_is_idempotent_and_typed(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("idem")
    await store.bind(c, ONTOLOGY)
    graph = doc(
        "benefit.md",
        [(BENEFIT, "REQUIRES", CERT), (CERT, "ISSUED_BY", EMPLOYER), (CERT, "ISSUED_INSTEAD_BY", ARBITRATION), (BENEFIT, "HANDLED_BY", JOB_CENTRE)],
        chunks=2,
        chunk_of=lambda i: i % 2,
    )
    await store.write_document(c, graph)
    await store.write_document(c, graph)
    stats = await store.stats(c)
    assert stats.documents == 1 and stats.chunks == 2
    assert stats.entities == {"Document": 1, "Office": 2, "Organisation": 1, "Procedure": 1}
    assert stats.relations == {"HANDLED_BY": 1, "ISSUED_BY": 1, "ISSUED_INSTEAD_BY": 1, "REQUIRES": 1}
    assert await store.documents(c) == {"benefit.md": graph.content_hash}
    # Entities come back with their type, aliases and typed properties.
    [office] = await store.entities(c, [ARBITRATION.id])
    assert office == ARBITRATION
    assert dict(office.properties) == {"address": "12 Quay Street"}
    [cert] = await store.entities(c, [CERT.id, "Document:unknown"])
    assert cert.type == "Document" and cert.aliases == ("separation cert",)
    # Relations are typed: the same two entities with two relation types are two facts.
    facts = await store.neighbors(c, [CERT.id], hops=1)
    assert triples(facts) == [
        ("Separation Certificate", "ISSUED_BY", "Employer", 1),
        ("Separation Certificate", "ISSUED_INSTEAD_BY", "Labour Arbitration Office", 1),
        ("Unemployment Benefit", "REQUIRES", "Separation Certificate", 1),
    ]
    assert facts[0].chunk_ids == ("benefit.md#1",)
    assert facts[0].doc_ids == ("benefit.md",)
    assert facts[0].source == cert and facts[0].target.type == "Organisation"


async def test_entity_merge_across_documents(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("merge")
    await store.bind(c, ONTOLOGY)
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", ARBITRATION)]))
    # Another document names the same entity with another alias, a description and a property.
    again = Entity(
        id=ARBITRATION.id,
        type="Office",
        name="labour arbitration office",
        aliases=("LAO",),
        description="Settles disputes between employers and employees.",
        properties={"opening_hours": "9-17"},
    )
    await store.write_document(c, doc("b", [(CERT, "ISSUED_INSTEAD_BY", again)]))
    [office] = await store.entities(c, [ARBITRATION.id])
    assert office.name == "Labour Arbitration Office"
    assert set(office.aliases) == {"labour arbitration office", "LAO"}
    assert office.description == "Settles disputes between employers and employees."
    assert dict(office.properties) == {"address": "12 Quay Street", "opening_hours": "9-17"}
    assert (await store.stats(c)).entities["Office"] == 1


async def test_ontology_violation_writes_nothing(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("violation")
    await store.bind(c, ONTOLOGY)
    good = doc("a", [(CERT, "ISSUED_BY", ARBITRATION)])
    await store.write_document(c, good)
    before = await store.stats(c)
    # REQUIRES goes from Procedure to Document, not from Office to Document.
    bad = doc("a", [(BENEFIT, "REQUIRES", ID_CARD), (JOB_CENTRE, "REQUIRES", ID_CARD)], content_hash="new")
    with pytest.raises(OntologyViolationError) as caught:
        await store.write_document(c, bad)
    assert "REQUIRES" in str(caught.value) and "Office" in str(caught.value)
    unknown_type = doc("a", [(CERT, "ISSUED_BY", ARBITRATION)], extra=[ent("Planet", "Mars")])
    with pytest.raises(OntologyViolationError, match="Planet"):
        await store.write_document(c, unknown_type)
    unknown_rel = doc("a", [(CERT, "ORBITS", ARBITRATION)])
    with pytest.raises(OntologyViolationError, match="ORBITS"):
        await store.write_document(c, unknown_rel)
    bad_property = doc("a", [(CERT, "ISSUED_BY", ent("Office", "Town Hall", address=12))])
    with pytest.raises(OntologyViolationError, match="address"):
        await store.write_document(c, bad_property)
    assert await store.stats(c) == before
    assert await store.documents(c) == {"a": good.content_hash}
    assert triples(await store.neighbors(c, [CERT.id])) == [("Separation Certificate", "ISSUED_BY", "Labour Arbitration Office", 1)]


async def test_inconsistent_document_graph_is_a_value_error(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("inconsistent")
    await store.bind(c, ONTOLOGY)
    graph = doc("a", [(CERT, "ISSUED_BY", ARBITRATION)])
    stray = DocumentGraph(
        doc_id="a",
        content_hash="h",
        chunk_ids=("a#0",),
        entities=graph.entities,
        relations=(Relation(type="ISSUED_BY", source=CERT.id, target=ARBITRATION.id, chunk_ids=("b#0",)),),
        mentions=graph.mentions,
    )
    with pytest.raises(ValueError, match="b#0"):
        await store.write_document(c, stray)
    assert (await store.stats(c)).documents == 0


# ---- provenance ---------------------------------------------------------------------------


async def test_rewrite_and_delete_remove_only_what_the_document_supported(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("provenance")
    await store.bind(c, ONTOLOGY)
    first = doc("a", [(BENEFIT, "REQUIRES", CERT), (CERT, "ISSUED_BY", EMPLOYER), (BENEFIT, "REQUIRES", ID_CARD)])
    second = doc("b", [(CERT, "ISSUED_BY", EMPLOYER), (CERT, "ISSUED_INSTEAD_BY", ARBITRATION)])
    await store.write_document(c, first)
    await store.write_document(c, second)
    [shared] = [f for f in await store.neighbors(c, [EMPLOYER.id], hops=1)]
    assert shared.chunk_ids == ("a#0", "b#0")

    # Document a is re-written without the identity card: that fact and the entity go.
    rewritten = doc("a", [(BENEFIT, "REQUIRES", CERT), (CERT, "ISSUED_BY", EMPLOYER)], content_hash="v2")
    await store.write_document(c, rewritten)
    assert await store.entities(c, [ID_CARD.id]) == []
    assert await all_facts(store, c) == [
        ("Separation Certificate", "ISSUED_BY", "Employer"),
        ("Separation Certificate", "ISSUED_INSTEAD_BY", "Labour Arbitration Office"),
        ("Unemployment Benefit", "REQUIRES", "Separation Certificate"),
    ]
    assert await store.documents(c) == {"a": "v2", "b": second.content_hash}

    # Deleting a: what only a supported goes, the fact b also states stays (with b's chunk only).
    assert await store.delete_document(c, "a") is True
    assert await store.delete_document(c, "a") is False
    assert await store.entities(c, [BENEFIT.id]) == []
    assert await all_facts(store, c) == [
        ("Separation Certificate", "ISSUED_BY", "Employer"),
        ("Separation Certificate", "ISSUED_INSTEAD_BY", "Labour Arbitration Office"),
    ]
    [kept] = await store.neighbors(c, [EMPLOYER.id], hops=1)
    assert kept.chunk_ids == ("b#0",)
    assert await store.mentions(c, [CERT.id, BENEFIT.id]) == {CERT.id: ("b#0",)}
    stats = await store.stats(c)
    assert (stats.documents, stats.chunks) == (1, 1)
    assert await store.delete_document(c, "b") is True
    stats = await store.stats(c)
    assert (stats.documents, stats.chunks, sum(stats.entities.values()), sum(stats.relations.values())) == (0, 0, 0, 0)


def ordered(graph: DocumentGraph | None) -> DocumentGraph | None:
    """``graph`` with its parts sorted, to compare document graphs up to order."""
    if graph is None:
        return None
    return DocumentGraph(
        doc_id=graph.doc_id,
        content_hash=graph.content_hash,
        chunk_ids=tuple(sorted(graph.chunk_ids)),
        entities=tuple(sorted(graph.entities, key=lambda e: e.id)),
        relations=tuple(
            sorted(
                (Relation(type=r.type, source=r.source, target=r.target, chunk_ids=tuple(sorted(r.chunk_ids))) for r in graph.relations),
                key=lambda r: (r.type, r.source, r.target),
            )
        ),
        mentions=tuple(sorted(set(graph.mentions), key=lambda m: (m.chunk_id, m.entity_id))),
    )


async def test_document_graph_reads_back_what_a_document_contributes(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("docgraph")
    await store.bind(c, ONTOLOGY)
    with pytest.raises(GraphNotFoundError):
        await store.document_graph(name("nothing"), "a")
    assert await store.document_graph(c, "a") is None
    first = doc(
        "a",
        [(BENEFIT, "REQUIRES", CERT), (CERT, "ISSUED_BY", EMPLOYER), (CERT, "ISSUED_INSTEAD_BY", ARBITRATION)],
        chunks=12,
        chunk_of=lambda i: (0, 10, 10)[i],
        extra=[TOWN_HALL],
    )
    await store.write_document(c, first)
    assert ordered(await store.document_graph(c, "a")) == ordered(first)
    # Another document sharing a fact and entities: each reads back its own chunks only.
    second = doc("b", [(CERT, "ISSUED_BY", EMPLOYER)], chunks=2, chunk_of=lambda i: 1)
    await store.write_document(c, second)
    assert ordered(await store.document_graph(c, "b")) == ordered(second)
    assert ordered(await store.document_graph(c, "a")) == ordered(first)
    # Re-written and deleted: what it contributes now.
    smaller = doc("a", [(BENEFIT, "REQUIRES", CERT)], chunks=1, content_hash="v2")
    await store.write_document(c, smaller)
    assert ordered(await store.document_graph(c, "a")) == ordered(smaller)
    assert ordered(await store.document_graph(c, "b")) == ordered(second)
    assert await store.delete_document(c, "a") is True
    assert await store.document_graph(c, "a") is None
    # A document with chunks but no entities still has a graph (its hash and chunks).
    empty = doc("e", [], chunks=2)
    await store.write_document(c, empty)
    assert await store.document_graph(c, "e") == empty


async def test_a_fact_moving_between_chunks_of_a_document(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("moving")
    await store.bind(c, ONTOLOGY)
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", EMPLOYER)], chunks=3, chunk_of=lambda i: 2))
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", EMPLOYER)], chunks=2, chunk_of=lambda i: 1, content_hash="v2"))
    [fact] = await store.neighbors(c, [CERT.id])
    assert fact.chunk_ids == ("a#1",)
    assert await store.mentions(c, [CERT.id, EMPLOYER.id]) == {CERT.id: ("a#1",), EMPLOYER.id: ("a#1",)}
    assert (await store.stats(c)).chunks == 2


async def test_mentions(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("mentions")
    await store.bind(c, ONTOLOGY)
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", EMPLOYER), (BENEFIT, "REQUIRES", CERT)], chunks=2, chunk_of=lambda i: i))
    await store.write_document(c, doc("b", [], extra=[CERT]))
    assert await store.mentions(c, [CERT.id, BENEFIT.id, "Office:nothing"]) == {
        CERT.id: ("a#0", "a#1", "b#0"),
        BENEFIT.id: ("a#1",),
    }
    assert await store.mentions(c, []) == {}
    # An entity mentioned without relations is still an entity.
    assert [e.name for e in await store.find_entities(c, ["separation certificate"])] == ["Separation Certificate"]


# ---- lookups and expansion ----------------------------------------------------------------


async def test_find_entities_by_normalised_name_and_alias(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("find")
    await store.bind(c, ONTOLOGY)
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", ARBITRATION), (BENEFIT, "REQUIRES", CERT)]))
    assert [e.id for e in await store.find_entities(c, ["  the SEPARATION   certificate "])] == []
    assert [e.id for e in await store.find_entities(c, ["  SEPARATION   certificate. "])] == [CERT.id]
    assert [e.id for e in await store.find_entities(c, ["Separation Cert"])] == [CERT.id]
    found = await store.find_entities(c, ["labour arbitration office", "unemployment benefit", "nothing", ""])
    assert [e.id for e in found] == [ARBITRATION.id, BENEFIT.id]  # by type, then name
    assert len(await store.find_entities(c, ["labour arbitration office", "unemployment benefit"], limit=1)) == 1
    assert await store.find_entities(c, []) == []


async def test_k_hop_expansion_with_fanout_limit_and_order(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("khop")
    await store.bind(c, ONTOLOGY)
    offices = [ent("Office", f"Office {i:02d}") for i in range(6)]
    far = ent("Organisation", "Far Away Company")
    facts: list[tuple[Entity, str, Entity]] = [(BENEFIT, "REQUIRES", CERT), (BENEFIT, "REQUIRES", ID_CARD), (BENEFIT, "HANDLED_BY", JOB_CENTRE)]
    facts += [(CERT, "ISSUED_INSTEAD_BY", o) for o in offices]
    facts += [(ID_CARD, "ISSUED_BY", TOWN_HALL), (ID_CARD, "ISSUED_BY", far)]
    await store.write_document(c, doc("a", facts))

    one = await store.neighbors(c, [BENEFIT.id], hops=1)
    assert triples(one) == [
        ("Unemployment Benefit", "HANDLED_BY", "Job Centre", 1),
        ("Unemployment Benefit", "REQUIRES", "Identity Card", 1),
        ("Unemployment Benefit", "REQUIRES", "Separation Certificate", 1),
    ]
    two = await store.neighbors(c, [BENEFIT.id], hops=2)
    assert triples(two) == [
        *triples(one),
        ("Identity Card", "ISSUED_BY", "Far Away Company", 2),
        ("Identity Card", "ISSUED_BY", "Town Hall", 2),
        *[("Separation Certificate", "ISSUED_INSTEAD_BY", o.name, 2) for o in offices],
    ]
    # Fan-out: each entity gives at most 2 relations per hop, in (type, names) order.
    narrow = await store.neighbors(c, [BENEFIT.id], hops=2, fanout=2)
    assert triples(narrow) == [
        ("Unemployment Benefit", "HANDLED_BY", "Job Centre", 1),
        ("Unemployment Benefit", "REQUIRES", "Identity Card", 1),
        ("Identity Card", "ISSUED_BY", "Far Away Company", 2),
        ("Identity Card", "ISSUED_BY", "Town Hall", 2),
    ]
    # Limit keeps the nearest.
    assert triples(await store.neighbors(c, [BENEFIT.id], hops=2, limit=4)) == triples(two)[:4]
    # Either direction: from an office, the certificate it issues, then the rest.
    back = await store.neighbors(c, [offices[3].id], hops=2, fanout=100)
    assert triples(back)[0] == ("Separation Certificate", "ISSUED_INSTEAD_BY", "Office 03", 1)
    assert ("Unemployment Benefit", "REQUIRES", "Separation Certificate", 2) in triples(back)
    assert len(back) == 1 + 5 + 1
    # Several seeds; unknown seeds are ignored; the same answer on every call.
    both = await store.neighbors(c, [TOWN_HALL.id, far.id, "Office:unknown"], hops=1)
    assert triples(both) == [("Identity Card", "ISSUED_BY", "Far Away Company", 1), ("Identity Card", "ISSUED_BY", "Town Hall", 1)]
    assert await store.neighbors(c, ["Office:unknown"]) == []
    assert await store.neighbors(c, []) == []
    for bad in ({"hops": 0}, {"fanout": 0}, {"limit": 0}):
        with pytest.raises(ValueError):
            await store.neighbors(c, [BENEFIT.id], **bad)  # type: ignore[arg-type]


async def test_fanout_with_a_hub_counts_only_fresh_relations(store: GraphStore, name: Callable[[str], str]) -> None:
    """A hub's relations beyond the fan-out are not needed (the Neo4j store reads at
    most fanout plus the relations already taken per entity); a relation taken at an
    earlier hop does not use up an entity's fan-out at the next."""
    c = name("hub")
    await store.bind(c, ONTOLOGY)
    docs = [ent("Document", f"Form {i:02d}") for i in range(40)]
    offices = [ent("Office", f"Desk {i:02d}") for i in range(40)]
    facts = [(BENEFIT, "REQUIRES", d) for d in docs] + [(d, "ISSUED_BY", o) for d, o in zip(docs, offices)]
    await store.write_document(c, doc("a", facts))
    found = await store.neighbors(c, [BENEFIT.id], hops=2, fanout=3, limit=100)
    assert triples(found) == [
        *[("Unemployment Benefit", "REQUIRES", f"Form {i:02d}", 1) for i in range(3)],
        *[(f"Form {i:02d}", "ISSUED_BY", f"Desk {i:02d}", 2) for i in range(3)],
    ]
    # From the far end: each office's one relation, then the hub's first three.
    back = await store.neighbors(c, [offices[39].id, offices[38].id], hops=3, fanout=3, limit=100)
    assert triples(back) == [
        ("Form 38", "ISSUED_BY", "Desk 38", 1),
        ("Form 39", "ISSUED_BY", "Desk 39", 1),
        ("Unemployment Benefit", "REQUIRES", "Form 38", 2),
        ("Unemployment Benefit", "REQUIRES", "Form 39", 2),
        *[("Unemployment Benefit", "REQUIRES", f"Form {i:02d}", 3) for i in range(3)],
    ]


async def test_ontology_without_relations(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("flat")
    flat = parse_ontology("name: flat\nentity_types:\n  Thing: {properties: {weight: number, count: integer, ok: boolean}}\n")
    await store.bind(c, flat)
    thing = Entity(id=entity_id("Thing", "Rock"), type="Thing", name="Rock", properties={"weight": 2.5, "count": 3, "ok": True})
    await store.write_document(c, doc("a", [], extra=[thing]))
    assert await store.entities(c, [thing.id]) == [thing]
    assert await store.neighbors(c, [thing.id]) == []
    assert (await store.stats(c)).entities == {"Thing": 1}


# ---- concurrency, cancellation, reopening --------------------------------------------------


async def test_concurrent_writers_and_readers(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("concurrent")
    await store.bind(c, ONTOLOGY)

    def graph_of(i: int) -> DocumentGraph:
        office = ent("Office", f"Office {i}")
        return doc(f"d{i}", [(BENEFIT, "HANDLED_BY", office), (CERT, "ISSUED_BY", office)])

    async def writer(i: int) -> None:
        await store.write_document(c, graph_of(i))

    async def reader() -> int:
        total = 0
        for _ in range(5):
            facts = await store.neighbors(c, [BENEFIT.id], hops=2, fanout=100, limit=1000)
            # A reader sees whole documents: every office it reaches has both relations.
            offices = {f.target.id for f in facts if f.target.type == "Office"}
            per_office = {o: sum(1 for f in facts if f.target.id == o) for o in offices}
            assert all(n == 2 for n in per_office.values()), per_office
            total += len(facts)
            await asyncio.sleep(0)
        return total

    await asyncio.gather(*(writer(i) for i in range(12)), *(reader() for _ in range(4)))
    stats = await store.stats(c)
    assert stats.documents == 12 and stats.relations == {"HANDLED_BY": 12, "ISSUED_BY": 12, "ISSUED_INSTEAD_BY": 0, "REQUIRES": 0}
    # Concurrent deletes and re-writes of the shared entities' documents keep the graph whole.
    await asyncio.gather(*(store.delete_document(c, f"d{i}") for i in range(0, 12, 2)), *(writer(i) for i in range(1, 12, 2)))
    stats = await store.stats(c)
    assert stats.documents == 6 and stats.entities["Office"] == 6 and stats.relations["HANDLED_BY"] == 6
    if isinstance(store, Neo4jStore):
        assert store._write_locks == {}  # per-collection locks do not outlive their users


async def test_calls_waiting_for_a_collection_hold_no_worker_thread(tmp_path: Path) -> None:
    """Calls queued on one embedded collection wait on the event loop, not on the
    default executor's threads, which the embedder and vector store use too."""
    store = LadybugStore(tmp_path / "graph")
    try:
        await store.bind("c", ONTOLOGY)
        offices = [ent("Office", f"Office {i}") for i in range(3000)]
        big = doc("big", [(CERT, "ISSUED_INSTEAD_BY", o) for o in offices], chunks=30, chunk_of=lambda i: i % 30)
        write = asyncio.create_task(store.write_document("c", big))
        readers = [asyncio.create_task(store.stats("c")) for _ in range(40)]
        await asyncio.sleep(0.01)
        await asyncio.to_thread(lambda: None)
        assert not write.done()  # the executor was free while the write ran
        await write
        await asyncio.gather(*readers)
    finally:
        await store.aclose()


async def test_cancelled_write_leaves_a_whole_graph(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("cancel")
    await store.bind(c, ONTOLOGY)
    offices = [ent("Office", f"Office {i}") for i in range(300)]
    big = doc("big", [(CERT, "ISSUED_INSTEAD_BY", o) for o in offices], chunks=30, chunk_of=lambda i: i % 30)
    cancelled = 0
    for delay in (0.0, 0.005, 0.02, 0.05):
        await store.delete_document(c, "big")
        task = asyncio.create_task(store.write_document(c, big))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        stats = await store.stats(c)
        # All or nothing: either the document was written whole or not at all.
        assert (stats.documents, stats.chunks, stats.entities["Office"], stats.relations["ISSUED_INSTEAD_BY"]) in (
            (0, 0, 0, 0),
            (1, 30, 300, 300),
        ), (delay, stats)
    assert cancelled  # at least the one cancelled before its first await
    # The store still works after cancellations.
    await store.write_document(c, big)
    assert (await store.stats(c)).relations["ISSUED_INSTEAD_BY"] == 300


async def test_reopen_after_close(kind: str, opener: Callable[[], GraphStore], name: Callable[[str], str], tmp_path: Path) -> None:
    c = name("reopen")
    first = opener()
    await first.bind(c, ONTOLOGY)
    graph = doc("a", [(CERT, "ISSUED_BY", ARBITRATION)])
    await first.write_document(c, graph)
    if kind == "ladybug":
        with pytest.raises(StoreLockedError, match="the graph store at .* is in use by another process"):
            LadybugStore(tmp_path / "graph")
    await first.aclose()
    second = opener()
    bound = await second.ontology(c)
    assert isinstance(bound, Ontology) and bound.fingerprint == ONTOLOGY.fingerprint
    assert await second.documents(c) == {"a": graph.content_hash}
    assert triples(await second.neighbors(c, [ARBITRATION.id])) == [("Separation Certificate", "ISSUED_BY", "Labour Arbitration Office", 1)]
    assert c in await second.graphs()


async def test_close_now_releases_the_store(kind: str, opener: Callable[[], GraphStore], name: Callable[[str], str]) -> None:
    """``close_now`` (synchronous, for a failed start-up) closes the store; the
    embedded one releases its directory, so a new store opens it at once."""
    c = name("closenow")
    first = opener()
    await first.bind(c, ONTOLOGY)
    await first.write_document(c, doc("a", [(CERT, "ISSUED_BY", ARBITRATION)]))
    first.close_now()  # type: ignore[attr-defined]
    first.close_now()  # type: ignore[attr-defined]  # twice is fine
    with pytest.raises(GraphStoreError, match="closed"):
        await first.stats(c)
    await first.aclose()  # and aclose after it
    second = opener()
    assert await second.documents(c) == {"a": "hash-a-1"}


def test_close_now_without_an_event_loop(tmp_path: Path) -> None:
    """What a failed start-up does: no loop, the lock released."""
    store = LadybugStore(tmp_path / "graph")
    store.close_now()
    LadybugStore(tmp_path / "graph").close_now()
    neo = Neo4jStore("bolt://127.0.0.1:1", user="", password="")
    neo.close_now()


async def test_a_cancelled_open_opens_the_database_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LadybugDB allows one Database per path in a process: a caller cancelled while
    the collection's database opens must not let the next caller open it again."""
    import knowledge.graphstore.ladybug as embedded

    first = LadybugStore(tmp_path / "graph")
    await first.bind("c", ONTOLOGY)
    await first.write_document("c", doc("a", [(CERT, "ISSUED_BY", ARBITRATION)]))
    await first.aclose()
    opened: list[object] = []
    real = embedded.ladybug.Database

    def counting(*args: object, **kwargs: object) -> object:
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(embedded.ladybug, "Database", counting)
    store = LadybugStore(tmp_path / "graph")
    try:
        for delay in range(4):
            task = asyncio.create_task(store.documents("c"))
            for _ in range(delay):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert await store.documents("c") == {"a": "hash-a-1"}
        assert await asyncio.gather(*(store.documents("c") for _ in range(3))) == [{"a": "hash-a-1"}] * 3
        assert len(opened) == 1
    finally:
        await store.aclose()


async def test_type_names_folding_to_the_stores_own_tables() -> None:
    """LadybugDB table names ignore case, so an entity type ``chunk`` would be the
    stores' own ``Chunk`` table there: the ontology refuses it, in any case."""
    with pytest.raises(OntologyError, match="chunk"):
        parse_ontology("name: clash\nentity_types:\n  chunk: {}\n  Thing: {}\n")


async def test_a_closed_store_says_so(store: GraphStore, name: Callable[[str], str]) -> None:
    c = name("closed")
    await store.bind(c, ONTOLOGY)
    await store.aclose()
    await store.aclose()  # twice is fine
    with pytest.raises(GraphStoreError, match="closed"):
        await store.stats(c)


async def test_neo4j_urls() -> None:
    store = Neo4jStore("bolt://graph.internal:7687", user="neo4j", password="secret")
    assert store.location == "bolt://graph.internal:7687"
    await store.aclose()
    # Credentials belong in user and password; the message does not repeat them.
    with pytest.raises(GraphStoreError, match="credentials") as caught:
        Neo4jStore("bolt://neo4j:secret@graph.internal:7687", user="neo4j", password="secret")
    assert "secret" not in str(caught.value)
    with pytest.raises(GraphStoreError, match="not usable"):
        Neo4jStore("redis://graph.internal:6379", user="neo4j", password="secret")


# ---- values that are hard to quote ---------------------------------------------------------------

AWKWARD = [
    "Harbor Master's Office",
    'The "Quoted" Office',
    "Back\\slash Office",
    "Ends with a backslash\\",
    "Escaped \\' quote",
    "Bürgeramt Köln — 日本語 😀",
    "Line\nbreak Office",
    "x'}) MATCH (n) DETACH DELETE n //",
]


async def test_names_with_quotes_backslashes_and_non_ascii(store: GraphStore, name: Callable[[str], str]) -> None:
    """Every value travels as data (FalkorDB's Bolt endpoint splices parameters into
    the query text: a quote or a backslash once broke the statement or could end the
    quote and run Cypher of its own)."""
    c = name("quotes")
    quirky = parse_ontology(
        "name: quirky\n"
        "entity_types:\n  Office: {description: \"Harbor Master's \\\\ 'office'\", properties: {address: string}}\n"
        "  Document: {}\nrelation_types:\n  ISSUED_BY: {from: [Document], to: [Office]}\n"
    )
    await store.bind(c, quirky)
    assert (await store.ontology(c)).fingerprint == quirky.fingerprint  # type: ignore[union-attr]
    note = ent("Document", "doctor's note", "the doc's \"note\"\\", description="It's a \\'note\\'")
    offices = [ent("Office", n, f"{n} alias'", description=f"{n}'s description", address=f"1 O'Connell St\\{i}") for i, n in enumerate(AWKWARD)]
    graph = doc("doctor's \"notes\"\\.md", [(note, "ISSUED_BY", o) for o in offices], content_hash="h'\\")
    await store.write_document(c, graph)
    await store.write_document(c, graph)  # idempotent with these values too
    assert await store.documents(c) == {"doctor's \"notes\"\\.md": "h'\\"}
    for office in offices:
        assert await store.find_entities(c, [office.name]) == [office]
        assert await store.find_entities(c, [office.aliases[0]]) == [office]
        assert await store.entities(c, [office.id]) == [office]
    assert await store.find_entities(c, ["DOCTOR'S NOTE", "the doc's \"note\"\\"]) == [note]
    facts = await store.neighbors(c, [note.id], hops=1, fanout=100)
    assert sorted(f.target.name for f in facts) == sorted(AWKWARD)
    assert {f.chunk_ids for f in facts} == {("doctor's \"notes\"\\.md#0",)}
    assert await store.mentions(c, [note.id]) == {note.id: ("doctor's \"notes\"\\.md#0",)}
    stats = await store.stats(c)
    assert (stats.documents, stats.chunks, stats.entities["Office"], stats.relations["ISSUED_BY"]) == (1, 1, len(AWKWARD), len(AWKWARD))
    assert await store.delete_document(c, "doctor's \"notes\"\\.md") is True
    assert sum((await store.stats(c)).entities.values()) == 0


async def test_a_nul_in_a_name_on_falkordb_is_refused_before_writing(kind: str, store: GraphStore, name: Callable[[str], str]) -> None:
    """FalkorDB cuts a string at a NUL: refused as a ValueError naming it, with nothing
    written; lookups with one find nothing. (Neo4j and LadybugDB keep it.)"""
    if kind != "neo4j":
        pytest.skip("FalkorDB only")
    c = name("nul")
    await store.bind(c, ONTOLOGY)
    await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", ARBITRATION)]))
    before = await store.stats(c)
    with pytest.raises(ValueError, match="NUL"):
        await store.write_document(c, doc("a", [(CERT, "ISSUED_BY", ent("Office", "Nul\x00Office"))]))
    assert await store.stats(c) == before
    assert await store.find_entities(c, ["Labour Arbitration Office\x00"]) == []
