"""Retrieval beyond the vector store: graph retrieval (entity linking, k-hop expansion,
fact ranking)."""

from knowledge.retrieval.graph import (
    ENTITIES_SUFFIX,
    FactSource,
    GraphRetrieval,
    GraphRetriever,
    LinkedEntity,
    RankedFact,
    entities_collection,
    question_ngrams,
    rank_facts,
)

__all__ = [
    "ENTITIES_SUFFIX",
    "FactSource",
    "GraphRetrieval",
    "GraphRetriever",
    "LinkedEntity",
    "RankedFact",
    "entities_collection",
    "question_ngrams",
    "rank_facts",
]
