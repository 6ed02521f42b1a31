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
from knowledge.graphstore.ladybug import GraphStoreLockedError, LadybugStore
from knowledge.graphstore.neo4j import Neo4jStore

__all__ = [
    "DocumentGraph",
    "Entity",
    "Fact",
    "GraphStats",
    "GraphStore",
    "GraphStoreLockedError",
    "LadybugStore",
    "Mention",
    "Neo4jStore",
    "PropertyValue",
    "Relation",
    "entity_id",
]
