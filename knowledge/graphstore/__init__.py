"""Graph stores: the `GraphStore` port and its implementations."""

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

__all__ = ["DocumentGraph", "Entity", "Fact", "GraphStats", "GraphStore", "Mention", "PropertyValue", "Relation", "entity_id"]
