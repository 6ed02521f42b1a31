"""Checking extracted or curated items against a collection's ontology, and resolving
them into the entities and relations of one document (`DocumentGraphBuilder`).

Both the model's answers (`knowledge.extraction.extractor`) and curated JSON Lines
(`knowledge.extraction.curated`) go through the same checks, so an item either
passes the ontology or is dropped with one reason from `INVALID_REASONS`:

- ``unknown_entity_type``: an entity whose type the ontology does not declare;
- ``unknown_relation_type``: a relation whose type it does not declare;
- ``relation_not_allowed``: a relation whose ends' types the relation type does not
  connect (for every type the end names could have);
- ``unknown_entity``: a relation end that is not among the entities (of the chunk,
  for extraction; of the import or the graph, for curated facts);
- ``empty_name``: an entity name, alias or relation end that is empty once
  normalised (`normalise_name`);
- ``name_too_long``: a name or alias longer than `MAX_NAME_CHARS`;
- ``bad_property``: a property (or ``aliases``, ``description``) of the wrong kind;
- ``bad_name``: a name, alias, relation end, description or string property that
  holds a control character (C0 other than tab, line feed and carriage return,
  DEL, C1): such text is an artefact (a NUL, a terminal escape), never a name,
  and shown back it could rewrite a terminal. Tabs and line breaks inside a name
  or alias become single spaces (a name is one line);
- ``unknown_document``: a curated item whose ``source`` is not a document of the
  collection;
- ``bad_json``: a model answer or a line that is not a JSON object;
- ``missing_field``: a required field is absent (``type``, ``name``, ``from``,
  ``to``, ``source``, ``kind``), or ``kind`` is neither ``entity`` nor ``relation``.

Invalid items are counted and reported, never written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from knowledge.graphstore.base import DocumentGraph, Entity, Mention, PropertyValue, Relation, entity_id
from knowledge.ontology import Ontology, normalise_name
from knowledge.ontology.schema import MAX_NAME_CHARS

__all__ = [
    "INVALID_REASONS",
    "MAX_DESCRIPTION_CHARS",
    "DocumentGraphBuilder",
    "EntityItem",
    "InvalidReason",
    "Problem",
    "RelationItem",
    "check_entity",
    "check_relation",
    "resolve_ends",
]

InvalidReason = Literal[
    "unknown_entity_type",
    "unknown_relation_type",
    "relation_not_allowed",
    "unknown_entity",
    "empty_name",
    "name_too_long",
    "bad_property",
    "bad_name",
    "unknown_document",
    "bad_json",
    "missing_field",
]
"""Why an item was dropped (see the module docstring)."""

INVALID_REASONS: Final[tuple[InvalidReason, ...]] = (
    "unknown_entity_type",
    "unknown_relation_type",
    "relation_not_allowed",
    "unknown_entity",
    "empty_name",
    "name_too_long",
    "bad_property",
    "bad_name",
    "unknown_document",
    "bad_json",
    "missing_field",
)

MAX_DESCRIPTION_CHARS: Final = 1000
"""Longest entity description kept (longer ones are cut, not refused: a description
is shown, never matched)."""

MAX_ALIASES: Final = 20
"""Most aliases one item may declare."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """An item that was dropped, or a chunk whose extraction failed."""

    where: str
    """``line 3`` (curated import) or ``chunk doc.md#2`` (extraction)."""
    reason: str
    """One of `INVALID_REASONS` for a dropped item; ``timeout`` or ``model_error`` for
    a chunk whose model call failed."""
    detail: str
    """What was wrong, naming the field or value."""

    def json(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True, slots=True, kw_only=True)
class EntityItem:
    """An entity that passed the ontology, not yet resolved to an id."""

    type: str
    name: str
    """As written (stripped of surrounding whitespace)."""
    aliases: tuple[str, ...] = ()
    description: str = ""
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    where: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        """The normalised name and aliases."""
        return tuple(dict.fromkeys(normalise_name(n) for n in (self.name, *self.aliases)))


@dataclass(frozen=True, slots=True, kw_only=True)
class RelationItem:
    """A relation whose type passed the ontology; its ends are still names."""

    type: str
    source: str
    """The name of the source entity, as written."""
    target: str
    where: str = ""


def _problem(where: str, reason: InvalidReason, detail: str) -> Problem:
    return Problem(where=where, reason=reason, detail=detail)


# C0 controls but tab, line feed and carriage return; DEL; C1.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_LINE_BREAKS = re.compile(r"[ ]*[\t\r\n][\t\r\n ]*")


def _control(text: str, field_name: str, where: str) -> Problem | None:
    """The `Problem` of text holding a control character (see ``bad_name``)."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    return _problem(where, "bad_name", f"{field_name} holds a control character (U+{ord(found.group()):04X})")


def _name(value: object, field_name: str, where: str) -> str | Problem:
    if value is None:
        return _problem(where, "missing_field", f"{field_name} is missing")
    if not isinstance(value, str):
        return _problem(where, "bad_property", f"{field_name} must be a string, got {type(value).__name__}")
    control = _control(value, field_name, where)
    if control is not None:
        return control
    # A line break inside a name (a model copying a wrapped line) is a space.
    name = _LINE_BREAKS.sub(" ", value).strip()
    if not normalise_name(name):
        return _problem(where, "empty_name", f"{field_name} is empty")
    if len(name) > MAX_NAME_CHARS:
        return _problem(where, "name_too_long", f"{field_name} is longer than {MAX_NAME_CHARS} characters")
    return name


def check_entity(raw: Mapping[str, object], ontology: Ontology, *, where: str) -> EntityItem | Problem:
    """``raw`` (``{"type", "name", "aliases"?, "description"?, "properties"?}``) as an
    `EntityItem`, or the `Problem` that drops it. Fields the ontology does not know are
    ignored; properties the entity type does not declare are dropped silently (the
    extraction schema has none; a curated file may carry more than the ontology)."""
    entity_type = raw.get("type")
    if entity_type is None:
        return _problem(where, "missing_field", "type is missing")
    if not isinstance(entity_type, str) or entity_type not in ontology.entity_types:
        known = ", ".join(sorted(ontology.entity_types))
        return _problem(where, "unknown_entity_type", f"entity type {entity_type!r} is not in the ontology (entity types: {known})")
    name = _name(raw.get("name"), "name", where)
    if isinstance(name, Problem):
        return name
    aliases_raw = raw.get("aliases") or []
    if not isinstance(aliases_raw, list):
        return _problem(where, "bad_property", f"aliases must be a list of strings, got {type(aliases_raw).__name__}")
    if len(aliases_raw) > MAX_ALIASES:
        return _problem(where, "bad_property", f"more than {MAX_ALIASES} aliases")
    aliases: list[str] = []
    for index, value in enumerate(aliases_raw):
        alias = _name(value, f"aliases[{index}]", where)
        if isinstance(alias, Problem):
            return alias
        aliases.append(alias)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        return _problem(where, "bad_property", f"description must be a string, got {type(description).__name__}")
    control = _control(description, "description", where)
    if control is not None:
        return control
    properties_raw = raw.get("properties") or {}
    if not isinstance(properties_raw, dict):
        return _problem(where, "bad_property", f"properties must be an object, got {type(properties_raw).__name__}")
    try:
        properties = ontology.check_properties(entity_type, properties_raw)
    except ValueError as exc:
        return _problem(where, "bad_property", str(exc))
    for key, value in properties.items():
        control = _control(value, f"property {key!r}", where) if isinstance(value, str) else None
        if control is not None:
            return control
    own = normalise_name(name)
    kept = tuple(dict.fromkeys(a for a in aliases if normalise_name(a) != own))
    return EntityItem(
        type=entity_type,
        name=name,
        aliases=kept,
        description=description.strip()[:MAX_DESCRIPTION_CHARS],
        properties=properties,
        where=where,
    )


def check_relation(raw: Mapping[str, object], ontology: Ontology, *, where: str) -> RelationItem | Problem:
    """``raw`` (``{"type", "from", "to"}``) as a `RelationItem` whose type the ontology
    declares, or the `Problem` that drops it. Its ends are checked by `resolve_ends`."""
    relation_type = raw.get("type")
    if relation_type is None:
        return _problem(where, "missing_field", "type is missing")
    if not isinstance(relation_type, str) or relation_type not in ontology.relation_types:
        known = ", ".join(sorted(ontology.relation_types)) or "none"
        return _problem(
            where, "unknown_relation_type", f"relation type {relation_type!r} is not in the ontology (relation types: {known})"
        )
    source = _name(raw.get("from"), "from", where)
    if isinstance(source, Problem):
        return source
    target = _name(raw.get("to"), "to", where)
    if isinstance(target, Problem):
        return target
    return RelationItem(type=relation_type, source=source, target=target, where=where)


def resolve_ends(
    relation: RelationItem, candidates: Sequence[EntityItem], ontology: Ontology
) -> tuple[EntityItem, EntityItem] | Problem:
    """The entities ``relation`` connects: among ``candidates``, one whose normalised
    name or alias is the source's, one the target's, of types the relation type
    allows. When a name fits entities of several types, the first allowed pair in
    ``candidates`` order wins.

    Returns:
        The two entities, or a `Problem`: ``unknown_entity`` (an end names none of the
        candidates), ``relation_not_allowed`` (no pair of their types is allowed).
    """
    source_key, target_key = normalise_name(relation.source), normalise_name(relation.target)
    sources = [c for c in candidates if source_key in c.keys]
    targets = [c for c in candidates if target_key in c.keys]
    for end, found in ((relation.source, sources), (relation.target, targets)):
        if not found:
            return _problem(relation.where, "unknown_entity", f"{relation.type} end {end!r} is not among the entities")
    for source in sources:
        for target in targets:
            if ontology.allows(relation.type, source.type, target.type):
                return source, target
    rel = ontology.relation_types[relation.type]
    given = f"{'/'.join(dict.fromkeys(s.type for s in sources))} -> {'/'.join(dict.fromkeys(t.type for t in targets))}"
    return _problem(
        relation.where,
        "relation_not_allowed",
        f"{relation.type} connects {'/'.join(rel.source_types)} -> {'/'.join(rel.target_types)}, "
        f"not {given} ({relation.source!r} -> {relation.target!r})",
    )


@dataclass(slots=True)
class _Cluster:
    """One entity being assembled from items that name it the same way."""

    type: str
    id: str
    name: str
    names: list[str]
    description: str
    properties: dict[str, PropertyValue]
    chunk_ids: set[str]
    parent: int
    stored: bool = False
    """Its id is a stored entity's (the graph already holds it)."""

    def keys(self) -> set[str]:
        return {normalise_name(n) for n in self.names}


class DocumentGraphBuilder:
    """Assembles one document's `DocumentGraph` from checked items (entity resolution).

    Within the document, items of the same type whose normalised names or aliases
    meet are one entity (its first name is the canonical one, the others become
    aliases, a later non-empty description or property overwrites). Across
    documents, an entity of the same type that the graph already holds under one of
    those keys (the ``stored`` entities, from `GraphStore.find_entities`) gives its id
    and canonical name, so the store merges into it; otherwise the id is
    `entity_id` of the type and the first name. When an item joins entities, a
    stored one's id and name win over a new one's (the graph must not split what
    it holds in two); of two stored ones, the one the document named first.
    """

    def __init__(
        self, *, doc_id: str, content_hash: str, chunk_ids: Sequence[str], stored: Iterable[Entity] = ()
    ) -> None:
        """Args:
            doc_id: the document.
            content_hash: what `DocumentGraph.content_hash` records.
            chunk_ids: every chunk of the document.
            stored: entities the graph already holds that items may resolve to.
        """
        self.doc_id = doc_id
        self.content_hash = content_hash
        self.chunk_ids = tuple(chunk_ids)
        self._stored: dict[tuple[str, str], Entity] = {}
        for entity in stored:
            for key in entity.keys:
                self._stored.setdefault((entity.type, key), entity)
        self._clusters: list[_Cluster] = []
        self._by_key: dict[tuple[str, str], int] = {}
        self._relations: dict[tuple[str, int, int], set[str]] = {}

    def _root(self, index: int) -> int:
        while self._clusters[index].parent != index:
            self._clusters[index].parent = self._clusters[self._clusters[index].parent].parent
            index = self._clusters[index].parent
        return index

    def add_entity(self, item: EntityItem, chunk_ids: Sequence[str], *, known: Entity | None = None) -> int:
        """Add ``item``, mentioned by ``chunk_ids``; returns its handle for
        `add_relation`. ``known``: the stored entity it is (its id is kept as is)."""
        keys = item.keys
        found = sorted({self._root(self._by_key[(item.type, k)]) for k in keys if (item.type, k) in self._by_key})
        stored = known or next((self._stored[(item.type, k)] for k in keys if (item.type, k) in self._stored), None)
        if stored is not None and not any(self._clusters[i].id == stored.id for i in found):
            # The item names a stored entity no cluster is yet: it takes part as one,
            # so that joining it to a new cluster keeps the stored id.
            found.append(self._new_cluster(stored.type, stored.id, stored.name, [stored.name, *stored.aliases], stored=True))
        if not found:
            found.append(self._new_cluster(item.type, entity_id(item.type, item.name), item.name, [item.name]))
        # The first stored cluster, else the first: its id and canonical name stay.
        index = next((i for i in found if self._clusters[i].stored), found[0])
        cluster = self._clusters[index]
        for other in found:
            if other != index:
                self._merge(index, other)
        cluster.names.extend(n for n in (item.name, *item.aliases) if normalise_name(n) not in cluster.keys())
        if item.description:
            cluster.description = item.description
        cluster.properties.update(item.properties)
        cluster.chunk_ids.update(self._own(chunk_ids))
        for key in cluster.keys():
            self._by_key[(item.type, key)] = index
        return index

    def _new_cluster(self, entity_type: str, cluster_id: str, name: str, names: list[str], *, stored: bool = False) -> int:
        self._clusters.append(
            _Cluster(
                type=entity_type, id=cluster_id, name=name, names=names, description="", properties={},
                chunk_ids=set(), parent=len(self._clusters), stored=stored,
            )
        )
        return len(self._clusters) - 1

    def _merge(self, keep: int, other: int) -> None:
        into, gone = self._clusters[keep], self._clusters[other]
        gone.parent = keep
        into.names.extend(n for n in gone.names if normalise_name(n) not in into.keys())
        into.description = into.description or gone.description
        into.properties = {**gone.properties, **into.properties}
        into.chunk_ids |= gone.chunk_ids

    def _own(self, chunk_ids: Iterable[str]) -> set[str]:
        ids = set(chunk_ids)
        foreign = ids - set(self.chunk_ids)
        if foreign:
            raise ValueError(f"chunks {sorted(foreign)[:3]} are not chunks of document {self.doc_id!r}")
        return ids

    def add_relation(self, relation_type: str, source: int, target: int, chunk_ids: Sequence[str]) -> None:
        """Add a relation between two handles of `add_entity`, stated by ``chunk_ids``
        (at least one); both ends count as mentioned by them."""
        ids = self._own(chunk_ids)
        if not ids:
            raise ValueError("a relation needs at least one chunk")
        for end in (source, target):
            self._clusters[self._root(end)].chunk_ids.update(ids)
        self._relations.setdefault((relation_type, source, target), set()).update(ids)

    def __len__(self) -> int:
        return sum(1 for i in range(len(self._clusters)) if self._root(i) == i)

    def build(self) -> DocumentGraph:
        """The document's graph (entities sorted by id, relations by type and ends)."""
        entities: list[Entity] = []
        mentions: list[Mention] = []
        for index, cluster in enumerate(self._clusters):
            if self._root(index) != index:
                continue
            canonical = normalise_name(cluster.name)
            aliases = tuple(dict.fromkeys(n for n in cluster.names if normalise_name(n) != canonical))
            entities.append(
                Entity(
                    id=cluster.id, type=cluster.type, name=cluster.name, aliases=aliases,
                    description=cluster.description, properties=dict(cluster.properties),
                )
            )
            mentions.extend(Mention(chunk_id=c, entity_id=cluster.id) for c in sorted(cluster.chunk_ids))
        merged: dict[tuple[str, str, str], set[str]] = {}
        for (relation_type, source, target), chunk_ids in self._relations.items():
            key = (relation_type, self._clusters[self._root(source)].id, self._clusters[self._root(target)].id)
            merged.setdefault(key, set()).update(chunk_ids)
        relations = [
            Relation(type=t, source=s, target=d, chunk_ids=tuple(sorted(c))) for (t, s, d), c in sorted(merged.items())
        ]
        return DocumentGraph(
            doc_id=self.doc_id,
            content_hash=self.content_hash,
            chunk_ids=self.chunk_ids,
            entities=tuple(sorted(entities, key=lambda e: e.id)),
            relations=tuple(relations),
            mentions=tuple(sorted(mentions, key=lambda m: (m.chunk_id, m.entity_id))),
        )
