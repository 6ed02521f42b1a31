"""`VectorStore` on Qdrant: local mode (a directory, the embedded default) or a server,
with the same code.

Each knowledge collection is two Qdrant collections:

- ``<name>``: one point per chunk, with a named dense vector (``dense``, cosine) and a
  named sparse vector (``sparse``, IDF applied by Qdrant), and the chunk's text,
  document id, document version (content hash), tags and tenant as payload (keyword
  indexes on a server; local mode scans).
- ``<name>__docs``: the registry, one vector-less point per document holding the
  version that readers see.

Writing a new version of a document: upsert its chunks under ids derived from the new
version, then switch the registry entry (one point: atomic), then delete the chunks
of other versions. Searches keep only hits whose version is the registry's, so a
reader sees the old version or the new one, never a mix; if the chunk upsert fails,
the new chunks are deleted and the old version stays live. A crash between the steps
leaves invisible chunks that the next write of that document removes.

Qdrant's local mode allows one process per directory (a second one gets
`StoreLockedError`) and is not thread-safe: its calls run one at a time on a worker
thread, so its brute-force scans never block the event loop. A server uses
``AsyncQdrantClient``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import uuid
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import AsyncQdrantClient, QdrantClient, models

from knowledge.embeddings.sparse import SparseVector
from knowledge.errors import InvalidCollectionNameError, KnowledgeError, StoreLockedError, UnknownCollectionError
from knowledge.models import Chunk, Document, SearchHit
from knowledge.vectorstore.base import CollectionInfo, MetadataValue, SearchFilter, SearchMode, StoredDocument

__all__ = ["QdrantStore", "valid_collection_name"]

T = TypeVar("T")

_NAMESPACE = uuid.UUID("6f1d8c52-58f4-4f4e-9a57-2b7f3e0c9d11")
_REGISTRY_SUFFIX = "__docs"
_KIND = "switchyard-chunks"
_INDEXED = ("doc_id", "version", "tags", "tenant")
_WRITE_BATCH = 256


def valid_collection_name(name: str) -> str:
    """``name``, or `InvalidCollectionNameError`."""
    if not (1 <= len(name) <= 64) or not all(c.isascii() and (c.isalnum() or c in "_-") for c in name) or name.endswith(
        _REGISTRY_SUFFIX
    ):
        raise InvalidCollectionNameError(name)
    return name


def _chunk_point_id(doc_id: str, version: str, index: int) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{doc_id}\x00{version}\x00{index}"))


def _doc_point_id(doc_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, doc_id))


def _match(key: str, value: Any) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


class QdrantStore:
    """Chunks and documents in Qdrant.

    Args:
        path: local mode's directory (used when ``url`` is None).
        url: a Qdrant server.
        api_key: the server's key.

    Raises:
        StoreLockedError: local mode's directory is open in another process.
    """

    def __init__(self, *, path: Path | None = None, url: str | None = None, api_key: str | None = None) -> None:
        self._local: QdrantClient | None = None
        self._remote: AsyncQdrantClient | None = None
        self._lock = threading.Lock()
        self.location = url or str(path)
        if url:
            self._remote = AsyncQdrantClient(url=url, api_key=api_key)
        else:
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            try:
                self._local = QdrantClient(path=str(path))
            except RuntimeError as exc:
                if "already accessed" in str(exc):
                    raise StoreLockedError(str(path)) from None
                raise

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._remote is not None:
            return await getattr(self._remote, method)(*args, **kwargs)
        local = self._local
        if local is None:
            raise KnowledgeError("the vector store is closed")

        def run() -> Any:
            with self._lock, warnings.catch_warnings():
                # Local mode warns that payload indexes do nothing there; the same code
                # creates real indexes on a server.
                warnings.filterwarnings("ignore", message="Payload indexes have no effect")
                return getattr(local, method)(*args, **kwargs)

        return await asyncio.to_thread(run)

    # ---- collections -----------------------------------------------------------------

    async def has_collection(self, name: str) -> bool:
        return bool(await self._call("collection_exists", valid_collection_name(name)))

    async def _require(self, name: str) -> None:
        if not await self.has_collection(name):
            raise UnknownCollectionError(name, [c.name for c in await self.collections()])

    async def ensure_collection(self, name: str, *, dimensions: int, embedder: str) -> None:
        name = valid_collection_name(name)
        if await self._call("collection_exists", name):
            info = await self._call("get_collection", name)
            meta = info.config.metadata or {}
            if meta.get("embedder") != embedder or meta.get("dimensions") != dimensions:
                raise KnowledgeError(
                    f"collection {name!r} holds vectors of {meta.get('embedder')!r} ({meta.get('dimensions')} "
                    f"dimensions); the configured embedder is {embedder!r} ({dimensions}): re-ingest into a new "
                    "collection, or configure the embedder it was built with"
                )
            if not await self._call("collection_exists", name + _REGISTRY_SUFFIX):
                await self._call("create_collection", name + _REGISTRY_SUFFIX, vectors_config={})
            return
        await self._call(
            "create_collection",
            name,
            vectors_config={"dense": models.VectorParams(size=dimensions, distance=models.Distance.COSINE)},
            sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
            metadata={"kind": _KIND, "embedder": embedder, "dimensions": dimensions},
        )
        for field_name in _INDEXED:
            await self._call("create_payload_index", name, field_name, field_schema=models.PayloadSchemaType.KEYWORD)
        await self._call("create_collection", name + _REGISTRY_SUFFIX, vectors_config={})

    async def collections(self) -> list[CollectionInfo]:
        listed = await self._call("get_collections")
        out = []
        for described in listed.collections:
            name = described.name
            if name.endswith(_REGISTRY_SUFFIX):
                continue
            info = await self._call("get_collection", name)
            meta = info.config.metadata or {}
            if meta.get("kind") != _KIND:
                continue  # not ours
            documents = (await self._call("count", name + _REGISTRY_SUFFIX, exact=True)).count
            chunks = (await self._call("count", name, exact=True)).count
            out.append(
                CollectionInfo(
                    name=name,
                    documents=documents,
                    chunks=chunks,
                    embedder=str(meta.get("embedder")),
                    dimensions=int(meta.get("dimensions", 0)),
                )
            )
        return sorted(out, key=lambda c: c.name)

    # ---- documents -------------------------------------------------------------------

    async def documents(self, name: str) -> dict[str, StoredDocument]:
        await self._require(name)
        found: dict[str, StoredDocument] = {}
        offset = None
        while True:
            records, offset = await self._call(
                "scroll", name + _REGISTRY_SUFFIX, limit=512, offset=offset, with_payload=True, with_vectors=False
            )
            for record in records:
                stored = _stored(record.payload or {})
                found[stored.doc_id] = stored
            if offset is None:
                return found

    async def document(self, name: str, doc_id: str) -> StoredDocument | None:
        await self._require(name)
        records = await self._call("retrieve", name + _REGISTRY_SUFFIX, ids=[_doc_point_id(doc_id)], with_payload=True)
        stored = [_stored(r.payload) for r in records if r.payload and r.payload.get("doc_id") == doc_id]
        return stored[0] if stored else None

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
        await self._require(name)
        if not (len(chunks) == len(dense) == len(sparse)):
            raise KnowledgeError(f"{len(chunks)} chunks but {len(dense)} dense and {len(sparse)} sparse vectors")
        version = document.hash
        tags = [str(t) for t in document.metadata.get("tags", [])] if isinstance(document.metadata.get("tags"), list) else []
        points = [
            models.PointStruct(
                id=_chunk_point_id(document.id, version, chunk.index),
                vector={
                    "dense": list(vector),
                    "sparse": models.SparseVector(indices=sparse_vector[0], values=sparse_vector[1]),
                },
                payload={
                    "doc_id": document.id,
                    "chunk_id": chunk.chunk_id,
                    "index": chunk.index,
                    "text": chunk.text,
                    "heading": chunk.heading,
                    "title": document.title,
                    "source": document.source,
                    "version": version,
                    "tags": tags,
                    "tenant": tenant,
                    "metadata": document.metadata,
                },
            )
            for chunk, vector, sparse_vector in zip(chunks, dense, sparse, strict=True)
        ]
        try:
            for start in range(0, len(points), _WRITE_BATCH):
                await self._call("upsert", name, points[start : start + _WRITE_BATCH], wait=True)
        except BaseException:
            # Nothing of the new version may stay behind; the old one is still live.
            await asyncio.shield(self._delete_version(name, document.id, version))
            raise
        entry = models.PointStruct(
            id=_doc_point_id(document.id),
            vector={},
            payload={
                "doc_id": document.id,
                "version": version,
                "chunks": len(chunks),
                "source": document.source,
                "title": document.title,
                "tenant": tenant,
                "updated_at": datetime.now(UTC).isoformat(),
            },
        )
        await self._call("upsert", name + _REGISTRY_SUFFIX, [entry], wait=True)
        # The new version is live; the chunks of any other version go.
        stale = models.Filter(must=[_match("doc_id", document.id)], must_not=[_match("version", version)])
        await self._call("delete", name, points_selector=models.FilterSelector(filter=stale), wait=True)

    async def _delete_version(self, name: str, doc_id: str, version: str) -> None:
        selector = models.FilterSelector(filter=models.Filter(must=[_match("doc_id", doc_id), _match("version", version)]))
        await self._call("delete", name, points_selector=selector, wait=True)

    async def delete_document(self, name: str, doc_id: str) -> bool:
        await self._require(name)
        existing = await self._call("retrieve", name + _REGISTRY_SUFFIX, ids=[_doc_point_id(doc_id)], with_payload=False)
        # The registry entry goes first: from then on readers ignore the chunks.
        await self._call("delete", name + _REGISTRY_SUFFIX, points_selector=models.PointIdsList(points=[_doc_point_id(doc_id)]), wait=True)
        selector = models.FilterSelector(filter=models.Filter(must=[_match("doc_id", doc_id)]))
        await self._call("delete", name, points_selector=selector, wait=True)
        return bool(existing)

    # ---- search ------------------------------------------------------------------------

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
        await self._require(name)
        if sparse is not None and not sparse[0]:
            sparse = None  # the query has no indexable terms (only stop words)
        if mode == "sparse" and sparse is None:
            return []
        if mode == "hybrid" and sparse is None:
            mode = "dense"
        if mode in ("dense", "hybrid") and dense is None:
            raise KnowledgeError(f"a {mode} search needs the query's dense vector")
        query_filter = _filter(where)
        fetch = max(k * 2, k + 5)  # room for chunks of versions being replaced
        common: dict[str, Any] = {
            "query_filter": query_filter,
            "limit": fetch,
            "with_payload": True,
            "with_vectors": ["dense"] if dense is not None else False,
        }
        if mode == "dense":
            response = await self._call("query_points", name, query=list(dense or []), using="dense", **common)
        elif mode == "sparse":
            assert sparse is not None
            query = models.SparseVector(indices=sparse[0], values=sparse[1])
            response = await self._call("query_points", name, query=query, using="sparse", **common)
        else:
            assert sparse is not None and dense is not None
            prefetch = [
                models.Prefetch(query=list(dense), using="dense", limit=candidates),
                models.Prefetch(query=models.SparseVector(indices=sparse[0], values=sparse[1]), using="sparse", limit=candidates),
            ]
            response = await self._call(
                "query_points", name, prefetch=prefetch, query=models.FusionQuery(fusion=models.Fusion.RRF), **common
            )
        points = response.points
        live = await self._live_versions(name, {p.payload["doc_id"] for p in points if p.payload})
        unit = _unit(dense) if dense is not None else None
        hits = []
        for point in points:
            payload = point.payload or {}
            if live.get(payload.get("doc_id")) != payload.get("version"):
                continue
            relevance = None
            if unit is not None and isinstance(point.vector, dict) and "dense" in point.vector:
                stored = point.vector["dense"]
                relevance = sum(a * b for a, b in zip(unit, _unit(stored), strict=False))  # type: ignore[arg-type]
            hits.append(
                SearchHit(
                    doc_id=payload["doc_id"],
                    chunk_id=payload["chunk_id"],
                    score=float(point.score),
                    text=payload.get("text", ""),
                    source=payload.get("source", ""),
                    title=payload.get("title"),
                    heading=payload.get("heading", ""),
                    relevance=relevance,
                    metadata=payload.get("metadata") or {},
                )
            )
            if len(hits) == k:
                break
        return hits

    async def _live_versions(self, name: str, doc_ids: set[str]) -> dict[str, str]:
        if not doc_ids:
            return {}
        records = await self._call(
            "retrieve", name + _REGISTRY_SUFFIX, ids=[_doc_point_id(d) for d in doc_ids], with_payload=["doc_id", "version"]
        )
        return {r.payload["doc_id"]: r.payload["version"] for r in records if r.payload}

    async def aclose(self) -> None:
        if self._remote is not None:
            await self._remote.close()
            self._remote = None
        if self._local is not None:
            local, self._local = self._local, None
            await asyncio.to_thread(_locked(self._lock, local.close))


    def close_now(self) -> None:
        """Close local mode from synchronous code (releases the directory's lock)."""
        if self._local is not None:
            local, self._local = self._local, None
            with self._lock:
                local.close()


def _stored(payload: dict[str, Any]) -> StoredDocument:
    return StoredDocument(
        doc_id=payload["doc_id"],
        version=payload["version"],
        chunks=int(payload.get("chunks", 0)),
        source=payload.get("source", ""),
        title=payload.get("title"),
        owner=payload.get("tenant"),
    )


def _locked(lock: threading.Lock, fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        with lock:
            return fn()

    return run


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _filter(where: SearchFilter | None) -> models.Filter | None:
    if where is None:
        return None
    must: list[models.Condition] = []
    if where.doc_ids:
        must.append(models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(where.doc_ids))))
    if where.tags:
        must.append(models.FieldCondition(key="tags", match=models.MatchAny(any=list(where.tags))))
    if where.tenant is not None:
        must.append(_match("tenant", where.tenant))
    for key, value in where.metadata.items():
        must.append(_metadata_condition(key, value))
    return models.Filter(must=must) if must else None


def _metadata_condition(key: str, value: MetadataValue) -> models.FieldCondition:
    # The key is quoted, so it names one top-level field whatever it holds (dots,
    # brackets, spaces, an empty name); `SearchFilter` refused the two characters a
    # quoted key cannot hold. Qdrant matches strings, booleans and integers exactly
    # (`MatchValue` takes no float); a float matches as the one-point range.
    path = f'metadata."{key}"'
    if isinstance(value, float):
        return models.FieldCondition(key=path, range=models.Range(gte=value, lte=value))
    return _match(path, value)
