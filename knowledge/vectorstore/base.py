"""The `VectorStore` port: collections of chunks with dense and sparse vectors, a
registry of the documents they hold, and searches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from knowledge.embeddings.sparse import SparseVector
from knowledge.models import Chunk, Document, SearchHit

__all__ = ["CollectionInfo", "SearchFilter", "SearchMode", "StoredDocument", "VectorStore"]

SearchMode = Literal["hybrid", "dense", "sparse"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectionInfo:
    name: str
    documents: int
    chunks: int
    embedder: str
    dimensions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredDocument:
    """A document's entry in a collection's registry: the version readers see."""

    doc_id: str
    version: str
    """The content hash of the live chunks."""
    chunks: int
    source: str = ""
    title: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchFilter:
    """Restricts a search; every given field must match."""

    doc_ids: Sequence[str] = ()
    """Any of these documents."""
    tags: Sequence[str] = ()
    """Chunks of documents with any of these tags."""
    tenant: str | None = None
    """Documents uploaded by this tenant."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Exact matches on document metadata fields."""


class VectorStore(Protocol):
    """Where chunks and their vectors live.

    A document's chunks are replaced as a whole: readers see either its previous
    version or its new one, never a mix, and a write that fails leaves the previous
    version in place with no orphan chunks.
    """

    async def ensure_collection(self, name: str, *, dimensions: int, embedder: str) -> None:
        """Create the collection if it does not exist; check it matches the embedder if
        it does (`KnowledgeError` otherwise)."""
        ...

    async def collections(self) -> list[CollectionInfo]: ...

    async def has_collection(self, name: str) -> bool: ...

    async def documents(self, name: str) -> dict[str, StoredDocument]:
        """The collection's documents by id."""
        ...

    async def write_document(
        self,
        name: str,
        document: Document,
        chunks: Sequence[Chunk],
        dense: Sequence[Sequence[float]],
        sparse: Sequence[SparseVector],
        *,
        tenant: str | None = None,
    ) -> None:
        """Make ``chunks`` the document's live version, replacing any other."""
        ...

    async def delete_document(self, name: str, doc_id: str) -> bool:
        """Remove a document; False if it was not there."""
        ...

    async def search(
        self,
        name: str,
        *,
        dense: Sequence[float] | None,
        sparse: SparseVector | None,
        mode: SearchMode,
        k: int,
        candidates: int,
        where: SearchFilter | None = None,
    ) -> list[SearchHit]:
        """The best ``k`` live chunks. ``dense`` is needed for ``dense`` and ``hybrid``
        (and gives every hit its ``relevance``), ``sparse`` for ``sparse`` and ``hybrid``."""
        ...

    async def aclose(self) -> None: ...
