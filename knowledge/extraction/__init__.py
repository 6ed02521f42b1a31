"""Extraction of a knowledge graph from documents: the model's answers and curated
facts, checked against the collection's ontology and resolved into entities with
stable ids."""

from knowledge.extraction.curated import CuratedEntity, CuratedFacts, CuratedRelation, parse_curated
from knowledge.extraction.extractor import ChunkExtraction, Extractor, extraction_messages, extraction_schema, parse_answer
from knowledge.extraction.validate import (
    INVALID_REASONS,
    DocumentGraphBuilder,
    EntityItem,
    InvalidReason,
    Problem,
    RelationItem,
    check_entity,
    check_relation,
    resolve_ends,
)

__all__ = [
    "INVALID_REASONS",
    "ChunkExtraction",
    "CuratedEntity",
    "CuratedFacts",
    "CuratedRelation",
    "DocumentGraphBuilder",
    "EntityItem",
    "Extractor",
    "InvalidReason",
    "Problem",
    "RelationItem",
    "check_entity",
    "check_relation",
    "extraction_messages",
    "extraction_schema",
    "parse_answer",
    "parse_curated",
    "resolve_ends",
]
