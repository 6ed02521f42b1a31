"""The graph store port: what the knowledge layer needs from a graph database, and the
values that cross it.

Two implementations keep the same graph (`tests/contracts/test_graph_store.py` runs one
contract on both): LadybugDB in process (`ladybug.py`, the embedded default) and Neo4j
through the official async driver (`neo4j.py`, production).

The graph of a collection:

- one node per entity, labelled with its ontology type, keyed by a stable ``id``
  (`entity_id`: the type and the normalised name), with ``name``, ``aliases``,
  ``description``, the ontology's typed properties, and ``keys`` (the normalised
  name and aliases, what `GraphStore.find_entities` matches);
- one edge per (source, relation type, target), carrying ``chunk_ids``: every chunk
  that states it (provenance, and what retrieval cites);
- ``(:Chunk {id, doc_id})-[:MENTIONS]->(entity)`` for every chunk that names an
  entity, and a record per document (its content hash) so unchanged documents are
  not extracted again.

Writing a document replaces what that document supported: its chunks' mentions and
its chunk ids on relations go, then the new ones are written; a relation no chunk
supports any more is removed, and so is an entity no chunk mentions. Facts that
other documents also support stay.

An entity's attributes have no provenance yet: its aliases accumulate, and a
document's properties and non-empty description overwrite what another document
gave; they stay after the document that gave them is removed (until the entity
itself goes). Callers sharing a collection between sources should know this.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from knowledge.ontology import Ontology, normalise_name

__all__ = [
    "DocumentGraph",
    "Entity",
    "Fact",
    "GraphStats",
    "GraphStore",
    "Mention",
    "PropertyValue",
    "Relation",
    "entity_id",
]

PropertyValue = str | int | float | bool


def entity_id(entity_type: str, name: str) -> str:
    """The stable id of the entity of ``entity_type`` named ``name`` (any spelling
    that normalises the same gives the same id)."""
    digest = hashlib.sha256(f"{entity_type}\x1f{normalise_name(name)}".encode()).hexdigest()
    return f"{entity_type}:{digest[:20]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Entity:
    """A node of the graph."""

    id: str
    """`entity_id` of its type and canonical name."""
    type: str
    """An entity type of the collection's ontology."""
    name: str
    """The canonical name (as first written)."""
    aliases: tuple[str, ...] = ()
    """Other names it goes by (declared, or merged from other spellings)."""
    description: str = ""
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    """The ontology's typed properties of its type that are known."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The normalised name and aliases: what name lookups match."""
        return tuple(dict.fromkeys(normalise_name(n) for n in (self.name, *self.aliases)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Relation:
    """A typed edge between two entities, with the chunks that state it."""

    type: str
    source: str
    """Source entity id."""
    target: str
    """Target entity id."""
    chunk_ids: tuple[str, ...]
    """Chunks supporting it (at least one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Mention:
    """A chunk names an entity."""

    chunk_id: str
    entity_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentGraph:
    """Everything one document contributes to a collection's graph, written (and
    replaced) as a unit by `GraphStore.write_document`."""

    doc_id: str
    content_hash: str
    """The document's content hash in the vector store (unchanged documents are skipped)."""
    chunk_ids: tuple[str, ...]
    """Every chunk of the document (``<doc_id>#<index>``), mentions or not."""
    entities: tuple[Entity, ...] = ()
    """Entities it mentions, resolved to their ids (merged with stored ones: aliases
    are added to the stored entity's, properties and a non-empty description
    overwrite)."""
    relations: tuple[Relation, ...] = ()
    """Relations it states; every ``chunk_ids`` item is one of ``chunk_ids``, every
    end one of ``entities``."""
    mentions: tuple[Mention, ...] = ()
    """Which chunk names which entity; every entity has at least one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """A relation found by expansion, with both ends and its provenance."""

    source: Entity
    relation: str
    target: Entity
    chunk_ids: tuple[str, ...]
    """The chunks that state it, sorted."""
    hops: int
    """Distance from the nearest seed entity to the nearer end, plus one (1: the
    relation touches a seed)."""

    @property
    def doc_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.rsplit("#", 1)[0] for c in self.chunk_ids))

    def text(self) -> str:
        """One line for a prompt: ``Separation Certificate (Document) ISSUED_BY Labour Arbitration Office (Office)``."""
        return f"{self.source.name} ({self.source.type}) {self.relation} {self.target.name} ({self.target.type})"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphStats:
    """What a collection's graph holds."""

    ontology: str
    """``name (fingerprint)`` of the ontology it is bound to."""
    documents: int
    chunks: int
    entities: Mapping[str, int]
    """Entities per type."""
    relations: Mapping[str, int]
    """Relations per type."""


@runtime_checkable
class GraphStore(Protocol):
    """A graph database holding one knowledge graph per collection.

    All methods are coroutines that finish what they started before a cancellation
    passes on (engine calls run to the end on their worker thread or transaction).
    Failures of the engine are `GraphStoreError`; asking for a collection with no
    graph is `GraphNotFoundError`.
    """

    location: str
    """Where the store is (a directory, or the server's URL without credentials), for messages."""

    async def bind(self, collection: str, ontology: Ontology) -> None:
        """Bind ``collection``'s graph to ``ontology``, creating the graph (tables,
        indexes, constraints derived from the ontology) the first time.

        Raises:
            OntologyMismatchError: the graph is bound to another ontology (by
                fingerprint); both are named.
        """
        ...

    async def ontology(self, collection: str) -> Ontology | None:
        """The ontology ``collection``'s graph is bound to; None if it has no graph."""
        ...

    async def graphs(self) -> list[str]:
        """The collections that have a graph, sorted."""
        ...

    async def documents(self, collection: str) -> dict[str, str]:
        """Document id → content hash of every document written to the graph."""
        ...

    async def write_document(self, collection: str, graph: DocumentGraph) -> None:
        """Replace what ``graph.doc_id`` contributes (see the module docstring).
        Idempotent: writing the same `DocumentGraph` twice leaves one copy of each fact.

        Raises:
            GraphNotFoundError: the collection has no graph (`bind` first).
            OntologyViolationError: an entity type, relation type or a relation's
                end types that the bound ontology does not allow; nothing was written.
        """
        ...

    async def delete_document(self, collection: str, doc_id: str) -> bool:
        """Remove what the document contributed; False if it had written nothing."""
        ...

    async def document_graph(self, collection: str, doc_id: str) -> DocumentGraph | None:
        """What ``doc_id`` contributes now, read back from the graph: its content hash,
        its chunk ids, the entities its chunks mention (as stored: their aliases,
        description and properties may have come from other documents too), the
        relations carrying its chunk ids (``chunk_ids`` cut to its own) and its
        mentions. ``write_document(g)`` then ``document_graph`` gives ``g`` back up to
        order (when no other document added to its entities). None if the document
        has written nothing.

        Raises:
            GraphNotFoundError: the collection has no graph.
        """
        ...

    async def entities(self, collection: str, ids: Sequence[str]) -> list[Entity]:
        """The stored entities with these ids (unknown ids are left out)."""
        ...

    async def find_entities(self, collection: str, names: Sequence[str], *, limit: int = 50) -> list[Entity]:
        """Entities whose normalised name or an alias equals the normalised form of one
        of ``names`` (any type), at most ``limit``."""
        ...

    async def neighbors(
        self, collection: str, seeds: Sequence[str], *, hops: int = 2, fanout: int = 20, limit: int = 100
    ) -> list[Fact]:
        """The relations within ``hops`` of the seed entity ids, either direction:
        from each entity at most ``fanout`` relations per hop, at most ``limit``
        facts, nearer first (ties by relation type, then names, so the order is
        the same on every store and run)."""
        ...

    async def mentions(self, collection: str, entity_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Entity id → the chunk ids that mention it (sorted)."""
        ...

    async def stats(self, collection: str) -> GraphStats:
        """Counts per type.

        Raises:
            GraphNotFoundError: no graph for the collection.
        """
        ...

    async def drop(self, collection: str) -> bool:
        """Remove the collection's graph and its ontology binding; False if none."""
        ...

    async def aclose(self) -> None: ...
