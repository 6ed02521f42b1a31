"""Knowledge: ingestion, chunking, embeddings, the vector store and the knowledge graph.

Sits on ``gateway`` (an embedding backend can be a model alias, extraction a chat
alias); ``tools`` and ``graphs`` build on it. `open_knowledge` builds a
`KnowledgeBase` from settings, `open_knowledge_graph` a `KnowledgeGraph` over it.
"""

from knowledge.errors import (
    CollectionNotAllowedError,
    DocumentOwnershipError,
    DocumentParseError,
    EmbeddingError,
    GraphNotFoundError,
    GraphStoreError,
    InvalidCollectionNameError,
    InvalidDocumentIdError,
    InvalidFilterError,
    KnowledgeError,
    OntologyError,
    OntologyMismatchError,
    OntologyViolationError,
    StoreLockedError,
    UnknownCollectionError,
    VectorStoreError,
)
from knowledge.graphstore import Entity, Fact, GraphStats, GraphStore
from knowledge.knowledge_base import KnowledgeBase, build_embedder, open_knowledge
from knowledge.knowledge_graph import (
    FactSource,
    GraphReport,
    GraphRetrieval,
    KnowledgeGraph,
    LinkedEntity,
    NeighborsResult,
    OntologyRequiredError,
    RankedFact,
    entities_collection,
    open_graph_store,
    open_knowledge_graph,
)
from knowledge.models import Chunk, Document, IngestReport, SearchHit, check_document_id
from knowledge.ontology import Ontology, load_ontology, parse_ontology
from knowledge.settings import GraphSettings, KnowledgeSettings
from knowledge.vectorstore.base import (
    CollectionInfo,
    MetadataValue,
    SearchFilter,
    SearchMode,
    StoredDocument,
    VectorStore,
    check_metadata_filter,
    check_text_filter,
)

__all__ = [
    "Chunk",
    "Entity",
    "Fact",
    "FactSource",
    "GraphNotFoundError",
    "GraphReport",
    "GraphRetrieval",
    "GraphSettings",
    "GraphStats",
    "GraphStore",
    "GraphStoreError",
    "KnowledgeGraph",
    "LinkedEntity",
    "NeighborsResult",
    "Ontology",
    "OntologyError",
    "OntologyMismatchError",
    "OntologyRequiredError",
    "OntologyViolationError",
    "RankedFact",
    "entities_collection",
    "load_ontology",
    "open_graph_store",
    "open_knowledge_graph",
    "parse_ontology",
    "CollectionInfo",
    "CollectionNotAllowedError",
    "Document",
    "DocumentOwnershipError",
    "DocumentParseError",
    "EmbeddingError",
    "IngestReport",
    "InvalidCollectionNameError",
    "InvalidDocumentIdError",
    "InvalidFilterError",
    "KnowledgeBase",
    "KnowledgeError",
    "KnowledgeSettings",
    "MetadataValue",
    "SearchFilter",
    "SearchHit",
    "SearchMode",
    "StoreLockedError",
    "StoredDocument",
    "UnknownCollectionError",
    "VectorStoreError",
    "VectorStore",
    "build_embedder",
    "check_document_id",
    "check_metadata_filter",
    "check_text_filter",
    "open_knowledge",
]
