"""What both Qdrant implementations store, and how they read it back: point ids, the
payloads of chunks and registry entries, hits.

The two stores (`knowledge.vectorstore.edge` and `knowledge.vectorstore.qdrant`) speak
different client APIs but keep the same points, so a collection can be copied from
one to the other point for point (`VectorStore.export_document` /
`import_document`), and a search returns the same hits from either.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from knowledge.errors import KnowledgeError
from knowledge.models import Chunk, Document, SearchHit
from knowledge.vectorstore.base import REGISTRY_SUFFIX, MetadataValue, StoredDocument, valid_collection_name

__all__ = [
    "INDEXED",
    "KIND",
    "REGISTRY_SUFFIX",
    "WRITE_BATCH",
    "bool_token",
    "check_vectors",
    "chunk_payload",
    "chunk_point_id",
    "doc_point_id",
    "entry_payload",
    "fetch_size",
    "hit",
    "stored",
    "unit",
    "valid_collection_name",
]

NAMESPACE = uuid.UUID("6f1d8c52-58f4-4f4e-9a57-2b7f3e0c9d11")
KIND = "switchyard-chunks"
"""What a collection's metadata says it holds: other collections on a shared server
are not ours."""
INDEXED = ("doc_id", "version", "tags", "tenant")
"""Payload fields with a keyword index."""
WRITE_BATCH = 256
"""Points per upsert."""


def chunk_point_id(doc_id: str, version: str, index: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{doc_id}\x00{version}\x00{index}"))


def doc_point_id(doc_id: str) -> str:
    return str(uuid.uuid5(NAMESPACE, doc_id))


def bool_token(key: str, value: bool) -> str:
    """The keyword that stands for "metadata field ``key`` is ``value``" in a chunk's
    ``bools`` payload.

    qdrant-edge-py 0.9.0 turns a Python ``True`` in `MatchValue` into the integer 1,
    which matches no boolean; a keyword match on this token is exact on both stores."""
    return json.dumps([key, value], ensure_ascii=False)


def check_vectors(chunks: Sequence[Chunk], dense: Sequence[Sequence[float]], sparse: Sequence[object]) -> None:
    if not (len(chunks) == len(dense) == len(sparse)):
        raise KnowledgeError(f"{len(chunks)} chunks but {len(dense)} dense and {len(sparse)} sparse vectors")


def chunk_payload(document: Document, chunk: Chunk, *, tenant: str | None) -> dict[str, Any]:
    """A chunk point's payload: its text and where it comes from, the document's version,
    tags, owner and metadata."""
    raw_tags = document.metadata.get("tags")
    tags = [str(t) for t in raw_tags] if isinstance(raw_tags, list) else []
    return {
        "doc_id": document.id,
        "chunk_id": chunk.chunk_id,
        "index": chunk.index,
        "text": chunk.text,
        "heading": chunk.heading,
        "title": document.title,
        "source": document.source,
        "version": document.hash,
        "tags": tags,
        "tenant": tenant,
        "metadata": document.metadata,
    }


def entry_payload(entry: StoredDocument) -> dict[str, Any]:
    """A registry point's payload: the document's live version."""
    return {
        "doc_id": entry.doc_id,
        "version": entry.version,
        "chunks": entry.chunks,
        "source": entry.source,
        "title": entry.title,
        "tenant": entry.owner,
        "updated_at": datetime.now(UTC).isoformat(),
    }


def stored(payload: Mapping[str, Any]) -> StoredDocument:
    """The registry entry a payload holds."""
    return StoredDocument(
        doc_id=payload["doc_id"],
        version=payload["version"],
        chunks=int(payload.get("chunks", 0)),
        source=payload.get("source", ""),
        title=payload.get("title"),
        owner=payload.get("tenant"),
    )


def fetch_size(k: int) -> int:
    """Hits to ask for to keep ``k``: room for chunks of versions being replaced, which
    the registry check drops."""
    return max(k * 2, k + 5)


def unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def hit(payload: Mapping[str, Any], score: float, stored_dense: Sequence[float] | None, query_unit: Sequence[float] | None) -> SearchHit:
    """A search hit from a chunk's payload; its relevance is the cosine of the query and
    the chunk's dense vector when both are known."""
    relevance = None
    if query_unit is not None and stored_dense is not None:
        relevance = sum(a * b for a, b in zip(query_unit, unit(stored_dense), strict=False))
    return SearchHit(
        doc_id=payload["doc_id"],
        chunk_id=payload["chunk_id"],
        score=float(score),
        text=payload.get("text", ""),
        source=payload.get("source", ""),
        title=payload.get("title"),
        heading=payload.get("heading", ""),
        relevance=relevance,
        metadata=payload.get("metadata") or {},
    )


def metadata_path(key: str) -> str:
    """The payload path of one top-level metadata field. The key is quoted, so it names
    one field whatever it holds (dots, brackets, spaces, an empty name); `SearchFilter`
    refused the two characters a quoted key cannot hold."""
    return f'metadata."{key}"'


def is_float_match(value: MetadataValue) -> bool:
    """Qdrant's `MatchValue` takes no float: a float matches as the one-point range."""
    return isinstance(value, float)
