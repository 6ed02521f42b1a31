"""The `VectorStore` port: collections of chunks with dense and sparse vectors, a
registry of the documents they hold, and searches."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from knowledge.embeddings.sparse import SparseVector
from knowledge.errors import InvalidCollectionNameError, InvalidFilterError
from knowledge.models import Chunk, Document, SearchHit

__all__ = [
    "CollectionInfo",
    "DocumentExport",
    "MetadataValue",
    "SearchFilter",
    "SearchMode",
    "StoredChunk",
    "StoredDocument",
    "VectorStore",
    "check_metadata_filter",
    "check_text_filter",
    "valid_collection_name",
]

SearchMode = Literal["hybrid", "dense", "sparse"]

MetadataValue = str | bool | int | float
"""What a metadata filter compares a field with."""

_INT64 = (-(2**63), 2**63 - 1)

REGISTRY_SUFFIX = "__docs"
"""The registry's collection on a Qdrant server (``<name>__docs``); a name ending so is
not a valid knowledge collection."""


def valid_collection_name(name: str) -> str:
    """``name``, or `InvalidCollectionNameError`: 1 to 64 ASCII letters, digits, ``_``
    and ``-``, not ending in ``__docs``."""
    if not (1 <= len(name) <= 64) or not all(c.isascii() and (c.isalnum() or c in "_-") for c in name) or name.endswith(
        REGISTRY_SUFFIX
    ):
        raise InvalidCollectionNameError(name)
    return name


def check_metadata_filter(metadata: Mapping[object, object]) -> dict[str, MetadataValue]:
    """``metadata`` as a filter every store applies the same way, or the first field
    that cannot be.

    A key names one top-level field of a document's metadata, taken literally (a dot
    is part of the name, not a path), and may be any text without ``"`` or ``\\``
    (Qdrant's field-path syntax quotes keys and cannot escape those two). A value is a
    string, a boolean, a 64-bit integer (Qdrant's integer) or a finite number.
    Strings must be valid Unicode (no lone surrogates, which no wire encoding carries).

    Raises:
        InvalidFilterError: naming the field and what is wrong with it.
    """
    checked: dict[str, MetadataValue] = {}
    for key, value in metadata.items():
        name = f"metadata[{key!r}]"
        if not isinstance(key, str):
            raise InvalidFilterError(name, "a key must be a string")
        if '"' in key or "\\" in key:
            raise InvalidFilterError(name, "a key may not contain a double quote (\") or a backslash (\\)")
        if not _is_text(key):
            raise InvalidFilterError(name, "the key is not valid Unicode text")
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            if not _INT64[0] <= value <= _INT64[1]:
                raise InvalidFilterError(name, "an integer must fit in 64 bits (signed)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidFilterError(name, "a number must be finite")
        elif isinstance(value, str):
            if not _is_text(value):
                raise InvalidFilterError(name, "the value is not valid Unicode text")
        else:
            raise InvalidFilterError(name, f"a value must be a string, boolean or number, not {type(value).__name__}")
        checked[key] = value
    return checked


def check_text_filter(field: str, values: Sequence[object]) -> None:
    """Every one of ``values`` (the document ids or tags a filter lists) is a string of
    valid Unicode.

    Raises:
        InvalidFilterError: naming the first one that is not, e.g. ``tags[2]``.
    """
    for index, value in enumerate(values):
        if not isinstance(value, str) or not _is_text(value):
            raise InvalidFilterError(f"{field}[{index}]", "must be a string of valid Unicode text")


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    owner: str | None = None
    """The tenant that wrote the live version; None: the operator (the CLI on the data
    directory, or a server with no tenants)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredChunk:
    """One chunk as a store keeps it, for copying a document between stores."""

    payload: Mapping[str, Any]
    """The chunk point's payload (text, ids, version, tags, owner, metadata)."""
    dense: Sequence[float]
    sparse: SparseVector


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentExport:
    """A document's live version with its chunks and their vectors."""

    entry: StoredDocument
    chunks: Sequence[StoredChunk]
    """In chunk order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchFilter:
    """Restricts a search; every given field must match."""

    doc_ids: Sequence[str] = ()
    """Any of these documents."""
    tags: Sequence[str] = ()
    """Chunks of documents with any of these tags."""
    tenant: str | None = None
    """Documents uploaded by this tenant."""
    metadata: Mapping[str, MetadataValue] = field(default_factory=dict)
    """Document metadata fields that must equal these values (see
    `check_metadata_filter` for the keys and values accepted). Strings, booleans and
    integers match exactly, of the same type; a float matches by numeric value, so
    ``2.0`` also matches a stored ``2``.

    Raises `InvalidFilterError` on construction for a key or value outside those rules."""

    def __post_init__(self) -> None:
        check_text_filter("doc_ids", self.doc_ids)
        check_text_filter("tags", self.tags)
        check_metadata_filter(self.metadata)


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

    async def document(self, name: str, doc_id: str) -> StoredDocument | None:
        """One document's entry, or None."""
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

    async def optimize(self, name: str, *, force: bool = False) -> bool:
        """Build the indexes of what was written since the last optimisation, when
        enough was (always with ``force``); True if the collection's segments changed.
        Searches go on meanwhile and see the same documents. A Qdrant server
        optimises by itself and local mode has no indexes: they return False."""
        ...

    async def export_document(self, name: str, doc_id: str) -> DocumentExport | None:
        """The document's live version with its chunks and vectors, or None."""
        ...

    def export_documents(self, name: str) -> AsyncIterator[DocumentExport]:
        """Every document's live version with its chunks and vectors, one at a time
        (the whole collection, read in one pass where the store needs it)."""
        ...

    async def import_document(self, name: str, export: DocumentExport) -> None:
        """Make an exported document live here with the same version, owner and chunk
        ids, replacing any other version as `write_document` does."""
        ...

    async def aclose(self) -> None: ...
