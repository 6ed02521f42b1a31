"""Graph stores: the `GraphStore` port and its implementations (`LadybugStore`, the
embedded default; `Neo4jStore`, a Neo4j server over Bolt)."""

from knowledge.graphstore.base import (
    DocumentGraph,
    Entity,
    Fact,
    GraphStats,
    GraphStore,
    Mention,
    PropertyValue,
    Relation,
    entity_id,
)
from knowledge.graphstore.ladybug import LadybugStore

__all__ = [
    "DocumentGraph",
    "Entity",
    "Fact",
    "GraphStats",
    "GraphStore",
    "LadybugStore",
    "Mention",
    "PropertyValue",
    "Relation",
    "entity_id",
]
