"""Ontologies: the entity and relation types a collection's knowledge graph may hold."""

from knowledge.ontology.loader import load_ontology, parse_ontology
from knowledge.ontology.schema import RESERVED_NAMES, EntityType, Ontology, PropertyKind, RelationType, normalise_name

__all__ = [
    "RESERVED_NAMES",
    "EntityType",
    "Ontology",
    "PropertyKind",
    "RelationType",
    "load_ontology",
    "normalise_name",
    "parse_ontology",
]
