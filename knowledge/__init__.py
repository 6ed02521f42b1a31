"""Knowledge: ingestion, chunking, embeddings and the vector store.

Sits on ``gateway`` (an embedding backend can be a model alias); ``tools`` and
``graphs`` build on it. `open_knowledge` builds a `KnowledgeBase` from settings.
"""

from knowledge.errors import (
    CollectionNotAllowedError,
    DocumentOwnershipError,
    DocumentParseError,
    EmbeddingError,
    InvalidCollectionNameError,
    InvalidDocumentIdError,
    InvalidFilterError,
    KnowledgeError,
    StoreLockedError,
    UnknownCollectionError,
    VectorStoreError,
)
from knowledge.knowledge_base import KnowledgeBase, build_embedder, open_knowledge
from knowledge.models import Chunk, Document, IngestReport, SearchHit, check_document_id
from knowledge.settings import KnowledgeSettings
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
