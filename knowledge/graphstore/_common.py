"""What both graph stores do the same way, in Python rather than in two Cypher
dialects: checking a `DocumentGraph` against the ontology, merging an entity with its
stored copy, the fan-out and order of `GraphStore.neighbors`, and the ontology's
stored form. Keeping these here is what makes the two stores answer alike."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from knowledge.graphstore.base import DocumentGraph, Entity, Fact, Mention, PropertyValue, Relation
from knowledge.ontology import Ontology

__all__ = [
    "Edge",
    "assemble_document",
    "check_document",
    "entity_from_record",
    "expand_hop",
    "fact_order",
    "merge_entity",
    "check_expansion",
    "ontology_from_text",
    "ontology_text",
    "unique",
    "with_entities",
]

MAX_HOPS = 5
"""Deepest expansion `neighbors` accepts (a bound on work, not a modelling limit)."""


def ontology_text(ontology: Ontology) -> str:
    """The ontology as stored beside a graph (JSON of its content, the form its
    fingerprint is computed from)."""
    return json.dumps(ontology.model_dump(mode="json", by_alias=True), sort_keys=True)


def ontology_from_text(text: str) -> Ontology:
    return Ontology.model_validate(json.loads(text))


def check_document(ontology: Ontology, graph: DocumentGraph) -> tuple[list[str], dict[str, dict[str, PropertyValue]]]:
    """What the ontology does not allow in ``graph`` (one line each), and each
    entity's properties checked against its type.

    Raises:
        ValueError: ``graph`` is inconsistent in itself (a relation end or a mention
            naming no entity of the graph, a chunk id not among its chunks, an
            entity id not of its type): a bug of the caller, not of the data.
    """
    reasons: list[str] = []
    properties: dict[str, dict[str, PropertyValue]] = {}
    types: dict[str, str] = {}
    chunks = set(graph.chunk_ids)
    for entity in graph.entities:
        if entity.type not in ontology.entity_types:
            reasons.append(
                f"entity {entity.name!r}: unknown entity type {entity.type!r} (entity types: {', '.join(sorted(ontology.entity_types))})"
            )
            continue
        if not entity.id.startswith(f"{entity.type}:"):
            raise ValueError(f"entity id {entity.id!r} of {entity.name!r} does not start with its type {entity.type!r} (use entity_id)")
        if types.setdefault(entity.id, entity.type) != entity.type:
            raise ValueError(f"entity id {entity.id!r} is given twice with different types")
        try:
            properties[entity.id] = ontology.check_properties(entity.type, entity.properties)
        except ValueError as exc:
            reasons.append(f"entity {entity.name!r}: {exc}")
    names = {e.id: e.name for e in graph.entities}
    for relation in graph.relations:
        for end in (relation.source, relation.target):
            if end not in names:
                raise ValueError(f"relation {relation.type} names entity {end!r}, which is not among the document's entities")
        for chunk_id in relation.chunk_ids:
            if chunk_id not in chunks:
                raise ValueError(f"relation {relation.type} cites chunk {chunk_id!r}, which is not a chunk of {graph.doc_id!r}")
        if not relation.chunk_ids:
            raise ValueError(f"relation {relation.type} between {relation.source!r} and {relation.target!r} has no chunk")
        source_type, target_type = types.get(relation.source), types.get(relation.target)
        if source_type is None or target_type is None:
            continue  # its end's unknown type is already a reason
        if relation.type not in ontology.relation_types:
            known = ", ".join(sorted(ontology.relation_types)) or "none"
            reasons.append(f"relation {relation.type!r}: unknown relation type (relation types: {known})")
        elif not ontology.allows(relation.type, source_type, target_type):
            rel = ontology.relation_types[relation.type]
            reasons.append(
                f"relation {names[relation.source]!r} {relation.type} {names[relation.target]!r}: "
                f"{relation.type} goes from {'/'.join(rel.source_types)} to {'/'.join(rel.target_types)}, "
                f"not from {source_type} to {target_type}"
            )
    for mention in graph.mentions:
        if mention.entity_id not in names:
            raise ValueError(f"mention of {mention.entity_id!r}, which is not among the document's entities")
        if mention.chunk_id not in chunks:
            raise ValueError(f"mention in chunk {mention.chunk_id!r}, which is not a chunk of {graph.doc_id!r}")
    mentioned = {m.entity_id for m in graph.mentions}
    for entity in graph.entities:
        if entity.id not in mentioned:
            raise ValueError(f"entity {entity.name!r} ({entity.id}) has no mention: every entity needs one")
    return reasons, properties


def merge_entity(stored: Entity | None, given: Entity, properties: Mapping[str, PropertyValue]) -> Entity:
    """``given`` written over ``stored``: the stored name stays canonical (the other
    spelling becomes an alias), aliases are added, the given properties and a
    non-empty description overwrite."""
    if stored is None:
        aliases = tuple(a for a in dict.fromkeys(given.aliases) if a != given.name)
        return Entity(id=given.id, type=given.type, name=given.name, aliases=aliases, description=given.description, properties=dict(properties))
    aliases = tuple(a for a in dict.fromkeys((*stored.aliases, given.name, *given.aliases)) if a != stored.name)
    return Entity(
        id=stored.id,
        type=stored.type,
        name=stored.name,
        aliases=aliases,
        description=given.description or stored.description,
        properties={**stored.properties, **properties},
    )


def entity_from_record(record: Mapping[str, Any], entity_type: str, ontology: Ontology) -> Entity:
    """An `Entity` from a node's properties (absent or null fields as defaults)."""
    declared = ontology.entity_types[entity_type].properties if entity_type in ontology.entity_types else {}
    properties: dict[str, PropertyValue] = {}
    for key in declared:
        value = record.get(key)
        if value is not None:
            properties[key] = value
    return Entity(
        id=str(record["id"]),
        type=entity_type,
        name=str(record.get("name") or ""),
        aliases=tuple(record.get("aliases") or ()),
        description=str(record.get("description") or ""),
        properties=properties,
    )


@dataclass(frozen=True, slots=True)
class Edge:
    """A stored relation as an expansion step reads it."""

    source: Entity
    type: str
    target: Entity
    chunk_ids: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.source.id, self.type, self.target.id)


def _edge_order(edge: Edge) -> tuple[str, str, str, str, str]:
    return (edge.type, edge.source.name, edge.target.name, edge.source.id, edge.target.id)


def fact_order(fact: Fact) -> tuple[int, str, str, str, str, str]:
    """Nearer first, then relation type, then the names (ids break the last ties)."""
    return (fact.hops, fact.relation, fact.source.name, fact.target.name, fact.source.id, fact.target.id)


def expand_hop(
    frontier: Iterable[str], edges: Iterable[Edge], *, hop: int, fanout: int, seen: set[tuple[str, str, str]], visited: set[str]
) -> tuple[list[Fact], list[str]]:
    """One hop of `GraphStore.neighbors`: the facts ``frontier`` adds (at most
    ``fanout`` relations of each of its entities, in `_edge_order`, not counting
    relations found at an earlier hop) and the next frontier (their other ends, not
    visited yet). ``edges`` are the stored relations touching ``frontier``; ``seen``
    and ``visited`` are updated."""
    by_entity: dict[str, list[Edge]] = {}
    fresh = {edge.key: edge for edge in edges if edge.key not in seen}
    for edge in fresh.values():
        for end in {edge.source.id, edge.target.id}:
            by_entity.setdefault(end, []).append(edge)
    facts: list[Fact] = []
    nxt: list[str] = []
    for entity in sorted(set(frontier)):
        kept = 0
        for edge in sorted(by_entity.get(entity, ()), key=_edge_order):
            if kept >= fanout:
                break
            kept += 1
            if edge.key in seen:
                continue  # taken by an entity earlier in this hop; it still counts here
            seen.add(edge.key)
            facts.append(
                Fact(source=edge.source, relation=edge.type, target=edge.target, chunk_ids=tuple(sorted(edge.chunk_ids)), hops=hop)
            )
            for end in (edge.source.id, edge.target.id):
                if end not in visited:
                    visited.add(end)
                    nxt.append(end)
    return facts, nxt


def with_entities(facts: list[Fact], entities: Mapping[str, Entity]) -> list[Fact]:
    """``facts`` with their ends replaced by the loaded entities (expansion reads
    only ids, types and names)."""
    return [
        replace(f, source=entities.get(f.source.id, f.source), target=entities.get(f.target.id, f.target)) for f in facts
    ]


def check_expansion(hops: int, fanout: int, limit: int) -> None:
    """Raises ValueError naming the first argument out of range."""
    if not 1 <= hops <= MAX_HOPS:
        raise ValueError(f"hops must be between 1 and {MAX_HOPS}, got {hops}")
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, got {fanout}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")


def chunk_order(chunk_id: str) -> tuple[str, int, str]:
    """Chunks of a document in their order (``doc#2`` before ``doc#10``)."""
    doc_id, _, index = chunk_id.rpartition("#")
    return (doc_id, int(index), "") if index.isdigit() else (chunk_id, -1, chunk_id)


def assemble_document(
    doc_id: str,
    content_hash: str | None,
    chunk_ids: Iterable[str],
    mentions: Iterable[tuple[str, str]],
    relations: Iterable[tuple[str, str, str, Sequence[str]]],
    entities: Mapping[str, Entity],
) -> DocumentGraph | None:
    """`GraphStore.document_graph` from what a store read: ``mentions`` as (chunk id,
    entity id), ``relations`` as (type, source id, target id, chunk ids) of the
    relations starting at an entity the document mentions (cut here to its chunks)."""
    chunks = sorted(set(chunk_ids), key=chunk_order)
    if content_hash is None and not chunks:
        return None
    own = set(chunks)
    pairs = sorted({(c, e) for c, e in mentions if c in own and e in entities}, key=lambda m: (chunk_order(m[0]), m[1]))
    mentioned = sorted({e for _, e in pairs})
    kept: dict[tuple[str, str, str], list[str]] = {}
    for relation_type, source, target, relation_chunks in relations:
        cited = [c for c in relation_chunks or () if c in own]
        if cited and source in entities and target in entities:
            found = kept.setdefault((relation_type, source, target), [])
            found.extend(c for c in cited if c not in found)
    return DocumentGraph(
        doc_id=doc_id,
        content_hash=content_hash or "",
        chunk_ids=tuple(chunks),
        entities=tuple(entities[e] for e in mentioned),
        relations=tuple(
            Relation(type=t, source=s, target=o, chunk_ids=tuple(sorted(c, key=chunk_order))) for (t, s, o), c in sorted(kept.items())
        ),
        mentions=tuple(Mention(chunk_id=c, entity_id=e) for c, e in pairs),
    )


def unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))
