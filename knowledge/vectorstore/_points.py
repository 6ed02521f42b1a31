"""What both Qdrant implementations store, and how they read it back: point ids, the
payloads of chunks and registry entries, hits.

The two stores (`knowledge.vectorstore.edge` and `knowledge.vectorstore.qdrant`) speak
different client APIs but keep the same points, so a collection can be copied from
one to the other point for point (`VectorStore.export_document` /
`import_document`), and a search returns the same hits from either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from knowledge.errors import KnowledgeError
from knowledge.models import Chunk, Document, SearchHit
from knowledge.vectorstore.base import REGISTRY_SUFFIX, StoredDocument, valid_collection_name

__all__ = [
    "INDEXED",
    "KIND",
    "SwitchLock",
    "REGISTRY_SUFFIX",
    "WRITE_BATCH",
    "bool_token",
    "bool_tokens",
    "check_vectors",
    "chunk_payload",
    "chunk_point_id",
    "doc_point_id",
    "entry_payload",
    "fetch_size",
    "hit",
    "search_live",
    "still_excluded",
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


def bool_tokens(metadata: Mapping[str, Any]) -> list[str]:
    """The `bool_token` of every boolean in ``metadata``: a top-level value, or an item
    of a top-level list (a filter on a list field matches any of its items)."""
    tokens = []
    for key, value in metadata.items():
        items = value if isinstance(value, list) else [value]
        tokens.extend(bool_token(key, item) for item in {item for item in items if isinstance(item, bool)})
    return sorted(tokens)


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


Found = Sequence[tuple[Mapping[str, Any], float, "Sequence[float] | None"]]
"""A query's points: payload, score, dense vector (if asked for)."""
Pair = tuple[str, str]
"""A (doc id, version) pair."""

WINDOWS = (1, 4, 16, 64)
"""How much wider each query of a search looks than the first (`fetch_size`): four
queries at most."""


async def search_live(
    query: Callable[[frozenset[Pair], int], Awaitable[tuple[Found, Mapping[str, str], frozenset[Pair]]]],
    *,
    k: int,
    query_unit: Sequence[float] | None,
) -> list[SearchHit]:
    """The best ``k`` live chunks, however many chunks of other versions lie nearer.

    ``query(excluded, widen)`` runs the store's query under the collection's
    `SwitchLock` (reading): it lets in again the ``excluded`` (doc id, version) pairs
    that are live now (a document switched back), leaves out the chunks of the others,
    looks ``widen`` times `fetch_size` deep, reads the live version of each document
    it found, and returns the points, those versions and the pairs it left out.

    Hits come best first; equal scores by document id, then chunk position.

    Chunks of a version that is not live (a document being replaced, a write that
    crashed: a thousand of them can lie nearer than any live chunk) take places in a
    query's window. When they do and fewer than ``k`` live chunks are left, the query
    runs again without those versions and wider. Another process writing to a shared
    Qdrant server can also switch a document between a query and its registry read
    (this process's own switches wait for the read): a document that lost every chunk
    it had in the window is looked for again too.
    """
    excluded: frozenset[Pair] = frozenset()
    hits: list[SearchHit] = []
    for widen in WINDOWS:
        found, live, excluded = await query(excluded, widen)
        hits = []
        kept: set[str] = set()
        dropped: set[Pair] = set()
        # Equal scores (frequent in reciprocal-rank fusion) in a fixed order: the engine
        # orders ties differently from one process to the next, and an answer, an eval
        # run or a re-run of it must not change with that.
        ordered = sorted(found, key=lambda f: (-f[1], str(f[0].get("doc_id")), int(f[0].get("index") or 0)))
        for payload, score, dense in ordered:
            doc_id, version = str(payload.get("doc_id")), str(payload.get("version"))
            if live.get(doc_id) != version:
                dropped.add((doc_id, version))
                continue
            kept.add(doc_id)
            if len(hits) < k:
                hits.append(hit(payload, score, dense, query_unit))
        lost = any(doc_id in live and doc_id not in kept for doc_id, _ in dropped)
        if not dropped or (len(hits) >= k and not lost):
            break
        excluded = excluded | dropped
    return hits


def still_excluded(excluded: frozenset[Pair], live: Mapping[str, str]) -> frozenset[Pair]:
    """The ``excluded`` pairs whose version is not live (``live``: doc id to version)."""
    return frozenset((doc_id, version) for doc_id, version in excluded if live.get(doc_id) != version)


def metadata_path(key: str) -> str:
    """The payload path of one top-level metadata field. The key is quoted, so it names
    one field whatever it holds (dots, brackets, spaces, an empty name); `SearchFilter`
    refused the two characters a quoted key cannot hold."""
    return f'metadata."{key}"'


class SwitchLock:
    """Searches share it; switching a document's version (its registry point, then the
    delete of its other versions' chunks) takes it alone. So a search's query and its
    registry read see the same versions of every document this process writes (other
    processes writing to a shared Qdrant server are covered by `search_live`'s second
    look).

    Writers come first: a search that arrives while a switch waits lets it go. A
    switch is two engine calls, so readers wait a millisecond or so. The bookkeeping
    on the way out awaits nothing, so a cancelled search or write never leaves it held.
    """

    def __init__(self) -> None:
        self._readers = 0
        self._switches = 0
        """Switches waiting or running."""
        self._one_switch = asyncio.Lock()
        self._no_switch = asyncio.Event()
        self._no_switch.set()
        self._no_readers = asyncio.Event()
        self._no_readers.set()

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        while self._switches:
            await self._no_switch.wait()
        self._readers += 1
        self._no_readers.clear()
        try:
            yield
        finally:
            self._readers -= 1
            if self._readers == 0:
                self._no_readers.set()

    @contextlib.asynccontextmanager
    async def switching(self) -> AsyncIterator[None]:
        self._switches += 1
        self._no_switch.clear()
        try:
            async with self._one_switch:
                while self._readers:
                    await self._no_readers.wait()
                yield
        finally:
            self._switches -= 1
            if self._switches == 0:
                self._no_switch.set()
