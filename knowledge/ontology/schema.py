"""The ontology: which entity and relation types a collection's knowledge graph may hold.

A YAML file users write (the format is a contract)::

    name: city-services
    entity_types:
      Office: {description: A place where citizens are served., properties: {address: string}}
      Document: {description: A certificate a procedure asks for.}
    relation_types:
      ISSUED_BY: {from: [Document], to: [Office], description: Who issues the document.}

loaded into a frozen `Ontology` whose validators check every reference (a relation's
``from``/``to`` must name declared entity types) and every name (labels the graph
stores can hold without quoting). The ontology decides the JSON schema extraction
asks the model for (`Ontology.extraction_schema`) and what `Ontology.check_entity` /
`Ontology.check_relation` let into the graph.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "RESERVED_NAMES",
    "EntityType",
    "Ontology",
    "PropertyKind",
    "RelationType",
    "normalise_name",
]

PropertyKind = Literal["string", "integer", "number", "boolean"]
"""What a property may hold. Values are checked (and ints/floats coerced) on the way in."""

RESERVED_NAMES = frozenset({"Chunk", "Entity", "MENTIONS", "Document_", "Ontology_", "RELATED"})
"""Labels the graph stores use themselves; an ontology may not declare them."""

_RESERVED_FOLDED = frozenset(name.casefold() for name in RESERVED_NAMES)
_TYPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_PROPERTY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_BUILTIN_PROPERTIES = frozenset({"id", "name", "aliases", "keys", "description", "type", "collection", "chunk_ids", "doc_ids"})

MAX_NAME_CHARS = 200
"""Longest entity name or alias kept (longer ones are refused, not cut)."""


def normalise_name(name: str) -> str:
    """The form names are compared in: NFKC, case-folded, inner whitespace collapsed,
    surrounding punctuation and quotes dropped. ``"  The  Labour Office." `` and
    ``"the labour office"`` are the same name."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = " ".join(text.split())
    return text.strip(" .,;:!?\"'`()[]{}«»“”‘’")


class EntityType(BaseModel):
    """One kind of node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field(default="", max_length=1000)
    """What this type is; shown to the extraction model."""
    properties: dict[str, PropertyKind] = Field(default_factory=dict)
    """Optional typed properties (name → kind); anything else on an item is dropped."""

    @field_validator("properties")
    @classmethod
    def _property_names(cls, value: dict[str, PropertyKind]) -> dict[str, PropertyKind]:
        for name in value:
            if not _PROPERTY_NAME.match(name):
                raise ValueError(f"property name {name!r} must match {_PROPERTY_NAME.pattern}")
            if name in _BUILTIN_PROPERTIES:
                raise ValueError(f"property name {name!r} is reserved (built in: {', '.join(sorted(_BUILTIN_PROPERTIES))})")
        return value


class RelationType(BaseModel):
    """One kind of edge, with the entity types it may connect."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source_types: tuple[str, ...] = Field(alias="from", min_length=1)
    """Entity types the relation may start at (``from:`` in YAML)."""
    target_types: tuple[str, ...] = Field(alias="to", min_length=1)
    """Entity types it may end at (``to:`` in YAML)."""
    description: str = Field(default="", max_length=1000)

    @field_validator("source_types", "target_types", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("source_types", "target_types")
    @classmethod
    def _no_repeats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"entity types listed twice: {', '.join(repeated)}")
        return value


class Ontology(BaseModel):
    """A collection's schema: entity types and the relation types between them.

    Frozen: a collection's graph is bound to one ontology (by `fingerprint`); a change
    is a new ontology, refused for that collection.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The ontology's name, shown when two ontologies are compared."""
    entity_types: dict[str, EntityType] = Field(min_length=1)
    relation_types: dict[str, RelationType] = Field(default_factory=dict)

    @field_validator("entity_types", "relation_types")
    @classmethod
    def _type_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not _TYPE_NAME.match(name):
                raise ValueError(f"type name {name!r} must match {_TYPE_NAME.pattern}")
            if name.casefold() in _RESERVED_FOLDED:
                # LadybugDB's table names ignore case: "chunk" is the Chunk table.
                raise ValueError(
                    f"type name {name!r} is reserved, in any case (used by the graph stores: {', '.join(sorted(RESERVED_NAMES))})"
                )
        return value

    @model_validator(mode="after")
    def _references(self) -> Ontology:
        clash = sorted(set(self.entity_types) & set(self.relation_types))
        if clash:
            raise ValueError(f"names used for both an entity type and a relation type: {', '.join(clash)}")
        folded: dict[str, str] = {}
        for name in [*self.entity_types, *self.relation_types]:
            other = folded.setdefault(name.casefold(), name)
            if other != name:
                # Neo4j labels are case-sensitive, LadybugDB table names are not.
                raise ValueError(f"type names {other!r} and {name!r} differ only in case")
        known = ", ".join(sorted(self.entity_types))
        for rel_name, rel in self.relation_types.items():
            for side, types in (("from", rel.source_types), ("to", rel.target_types)):
                for type_name in types:
                    if type_name not in self.entity_types:
                        raise ValueError(
                            f"relation_types.{rel_name}.{side}: unknown entity type {type_name!r} (entity types: {known})"
                        )
        return self

    @property
    def fingerprint(self) -> str:
        """A hash of the ontology's content (not of its file's layout or comments):
        what a collection's graph is bound to."""
        canonical = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``name (fingerprint)``, as errors name an ontology."""
        return f"{self.name!r} ({self.fingerprint})"

    def allows(self, relation: str, source_type: str, target_type: str) -> bool:
        rel = self.relation_types.get(relation)
        return rel is not None and source_type in rel.source_types and target_type in rel.target_types

    def check_properties(self, entity_type: str, properties: Mapping[str, object]) -> dict[str, str | int | float | bool]:
        """The properties ``entity_type`` declares, with values of the declared kind
        (an int for a ``number`` becomes a float; numeric strings are not converted).

        Raises:
            ValueError: a declared property holds a value of another kind, naming it.
        """
        declared = self.entity_types[entity_type].properties
        kept: dict[str, str | int | float | bool] = {}
        for key, value in properties.items():
            kind = declared.get(key)
            if kind is None or value is None:
                continue
            if kind == "string" and isinstance(value, str) and len(value) <= 2000:
                kept[key] = value
            elif kind == "integer" and isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63:
                kept[key] = value
            elif kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
                kept[key] = float(value)
            elif kind == "boolean" and isinstance(value, bool):
                kept[key] = value
            else:
                raise ValueError(f"property {key!r} of {entity_type} must be a {kind}, got {type(value).__name__}")
        return kept

    def extraction_schema(self, *, max_entities: int = 12, max_relations: int = 12, max_name_chars: int = 80) -> dict[str, Any]:
        """The JSON schema the extraction model's answer must follow: entity and
        relation types as enums, bounded names and list lengths (so a small model
        cannot run on forever inside a string or a list)."""
        entity_types = sorted(self.entity_types)
        name = {"type": "string", "minLength": 1, "maxLength": max_name_chars}
        entity: dict[str, Any] = {
            "type": "object",
            "properties": {
                "name": name,
                "type": {"type": "string", "enum": entity_types},
                "aliases": {"type": "array", "items": name, "maxItems": 3},
            },
            "required": ["name", "type"],
            "additionalProperties": False,
        }
        schema: dict[str, Any] = {
            "title": f"{self.name} extraction",
            "type": "object",
            "properties": {"entities": {"type": "array", "items": entity, "maxItems": max_entities}},
            "required": ["entities"],
            "additionalProperties": False,
        }
        if self.relation_types:
            schema["properties"]["relations"] = {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string", "enum": sorted(self.relation_types)},
                        "from": name,
                        "to": name,
                    },
                    "required": ["type", "from", "to"],
                    "additionalProperties": False,
                },
                "maxItems": max_relations,
            }
            schema["required"].append("relations")
        return schema
