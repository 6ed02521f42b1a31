"""`VectorStore` on a Qdrant server through qdrant-client, or on qdrant-client's local
mode (a directory) with the same code.

A server (``knowledge.qdrant_url``) is the production store. Local mode was the
embedded default before `knowledge.vectorstore.edge`; it stays for two jobs: it reads
collections stored by earlier versions (``switchyard knowledge migrate``), and it runs
this code in tests on machines where no Qdrant server can be installed.

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
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import AsyncQdrantClient, QdrantClient, models

from knowledge.embeddings.sparse import SparseVector
from knowledge.errors import KnowledgeError, StoreLockedError, UnknownCollectionError, VectorStoreError
from knowledge.models import Chunk, Document, SearchHit
from knowledge.vectorstore._points import (
    INDEXED,
    KIND,
    REGISTRY_SUFFIX,
    WRITE_BATCH,
    SwitchLock,
    check_vectors,
    chunk_payload,
    chunk_point_id,
    doc_point_id,
    entry_payload,
    fetch_size,
    metadata_path,
    search_live,
    still_excluded,
    stored,
    unit,
    valid_collection_name,
)
from knowledge.vectorstore.base import (
    CollectionInfo,
    DocumentExport,
    MetadataValue,
    SearchFilter,
    SearchMode,
    StoredChunk,
    StoredDocument,
)

__all__ = ["QdrantStore", "valid_collection_name"]

T = TypeVar("T")


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
        self._switch_locks: dict[str, SwitchLock] = {}
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
        """One qdrant-client call; what it raises becomes `VectorStoreError` (the
        client raises ValueError, HTTP and connection errors of its own)."""
        try:
            return await self._client_call(method, *args, **kwargs)
        except KnowledgeError:
            raise
        except Exception as exc:  # boundary: the client's errors, named
            raise VectorStoreError(f"{method} on {self.location}: {exc}") from exc

    async def _client_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
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

    def _switch_lock(self, name: str) -> SwitchLock:
        # Only names of existing collections get here (checked first), so the dict is
        # bounded by the collections.
        return self._switch_locks.setdefault(name, SwitchLock())

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
            if not await self._call("collection_exists", name + REGISTRY_SUFFIX):
                await self._call("create_collection", name + REGISTRY_SUFFIX, vectors_config={})
            return
        await self._call(
            "create_collection",
            name,
            vectors_config={"dense": models.VectorParams(size=dimensions, distance=models.Distance.COSINE)},
            sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
            metadata={"kind": KIND, "embedder": embedder, "dimensions": dimensions},
        )
        for field_name in INDEXED:
            await self._call("create_payload_index", name, field_name, field_schema=models.PayloadSchemaType.KEYWORD)
        await self._call("create_collection", name + REGISTRY_SUFFIX, vectors_config={})

    async def collections(self) -> list[CollectionInfo]:
        listed = await self._call("get_collections")
        out = []
        for described in listed.collections:
            name = described.name
            if name.endswith(REGISTRY_SUFFIX):
                continue
            info = await self._call("get_collection", name)
            meta = info.config.metadata or {}
            if meta.get("kind") != KIND:
                continue  # not ours
            documents = (await self._call("count", name + REGISTRY_SUFFIX, exact=True)).count
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
                "scroll", name + REGISTRY_SUFFIX, limit=512, offset=offset, with_payload=True, with_vectors=False
            )
            for record in records:
                entry = stored(record.payload or {})
                found[entry.doc_id] = entry
            if offset is None:
                return found

    async def document(self, name: str, doc_id: str) -> StoredDocument | None:
        await self._require(name)
        return await self._entry(name, doc_id)

    async def _entry(self, name: str, doc_id: str) -> StoredDocument | None:
        records = await self._call("retrieve", name + REGISTRY_SUFFIX, ids=[doc_point_id(doc_id)], with_payload=True)
        found = [stored(r.payload) for r in records if r.payload and r.payload.get("doc_id") == doc_id]
        return found[0] if found else None

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
        check_vectors(chunks, dense, sparse)
        entry = StoredDocument(
            doc_id=document.id,
            version=document.hash,
            chunks=len(chunks),
            source=document.source,
            title=document.title,
            owner=tenant,
        )
        payloads = [chunk_payload(document, chunk, tenant=tenant) for chunk in chunks]
        await self._write(name, entry, payloads, dense, sparse)

    async def import_document(self, name: str, export: DocumentExport) -> None:
        await self._require(name)
        chunks = export.chunks
        await self._write(
            name, export.entry, [c.payload for c in chunks], [c.dense for c in chunks], [c.sparse for c in chunks]
        )

    async def _write(
        self,
        name: str,
        entry: StoredDocument,
        payloads: Sequence[Mapping[str, Any]],
        dense: Sequence[Sequence[float]],
        sparse: Sequence[SparseVector],
    ) -> None:
        """Make ``payloads`` the live chunks of ``entry``'s document: upsert them, switch
        the registry entry, delete the other versions' chunks."""
        points = [
            models.PointStruct(
                id=chunk_point_id(entry.doc_id, entry.version, int(payload["index"])),
                vector={
                    "dense": list(vector),
                    "sparse": models.SparseVector(indices=list(sparse_vector[0]), values=list(sparse_vector[1])),
                },
                payload=dict(payload),
            )
            for payload, vector, sparse_vector in zip(payloads, dense, sparse, strict=True)
        ]
        try:
            for start in range(0, len(points), WRITE_BATCH):
                await self._call("upsert", name, points[start : start + WRITE_BATCH], wait=True)
        except BaseException:
            # Nothing of the new version may stay behind; the old one is still live.
            await asyncio.shield(self._roll_back(name, entry))
            raise
        registry_point = models.PointStruct(id=doc_point_id(entry.doc_id), vector={}, payload=entry_payload(entry))
        # Other versions' chunks, and this version's past its new end (a rewrite
        # chunked into fewer pieces).
        beyond = models.FieldCondition(key="index", range=models.Range(gte=len(points)))
        stale = models.Filter(
            must=[
                _match("doc_id", entry.doc_id),
                models.Filter(should=[models.Filter(must_not=[_match("version", entry.version)]), beyond]),
            ]
        )
        async with self._switch_lock(name).switching():
            await self._call("upsert", name + REGISTRY_SUFFIX, [registry_point], wait=True)
            # The new version is live; the chunks of any other version go.
            await self._call("delete", name, points_selector=models.FilterSelector(filter=stale), wait=True)

    async def _roll_back(self, name: str, entry: StoredDocument) -> None:
        live = await self._entry(name, entry.doc_id)
        if live is not None and live.version == entry.version:
            return  # the same content written again: its chunks are the live ones, overwritten in place
        await self._delete_version(name, entry.doc_id, entry.version)

    async def _delete_version(self, name: str, doc_id: str, version: str) -> None:
        selector = models.FilterSelector(filter=models.Filter(must=[_match("doc_id", doc_id), _match("version", version)]))
        await self._call("delete", name, points_selector=selector, wait=True)

    async def delete_document(self, name: str, doc_id: str) -> bool:
        await self._require(name)
        existing = await self._call("retrieve", name + REGISTRY_SUFFIX, ids=[doc_point_id(doc_id)], with_payload=False)
        selector = models.FilterSelector(filter=models.Filter(must=[_match("doc_id", doc_id)]))
        async with self._switch_lock(name).switching():
            # The registry entry goes first: from then on readers ignore the chunks.
            await self._call(
                "delete", name + REGISTRY_SUFFIX, points_selector=models.PointIdsList(points=[doc_point_id(doc_id)]), wait=True
            )
            await self._call("delete", name, points_selector=selector, wait=True)
        return bool(existing)

    async def export_document(self, name: str, doc_id: str) -> DocumentExport | None:
        await self._require(name)
        entry = await self._entry(name, doc_id)
        if entry is None:
            return None
        live = models.Filter(must=[_match("doc_id", doc_id), _match("version", entry.version)])
        chunks: list[StoredChunk] = []
        offset = None
        while True:
            records, offset = await self._call(
                "scroll", name, scroll_filter=live, limit=WRITE_BATCH, offset=offset, with_payload=True, with_vectors=True
            )
            chunks.extend(_stored_chunk(record) for record in records)
            if offset is None:
                break
        chunks.sort(key=lambda c: int(c.payload["index"]))
        return DocumentExport(entry=entry, chunks=chunks)

    async def export_documents(self, name: str) -> AsyncIterator[DocumentExport]:
        """One scroll over the chunks' ids and versions, then each document's live chunks
        by id: local mode evaluates a filter over every point, so a filtered scroll per
        document would cost documents x chunks."""
        entries = await self.documents(name)
        ids: dict[str, list[str]] = {}
        offset = None
        while True:
            records, offset = await self._call(
                "scroll", name, limit=2048, offset=offset, with_payload=["doc_id", "version"], with_vectors=False
            )
            for record in records:
                payload = record.payload or {}
                entry = entries.get(payload.get("doc_id", ""))
                if entry is not None and payload.get("version") == entry.version:
                    ids.setdefault(entry.doc_id, []).append(str(record.id))
            if offset is None:
                break
        for doc_id in sorted(ids):
            records = await self._call("retrieve", name, ids=ids[doc_id], with_payload=True, with_vectors=True)
            chunks = sorted((_stored_chunk(r) for r in records), key=lambda c: int(c.payload["index"]))
            yield DocumentExport(entry=entries[doc_id], chunks=chunks)

    async def optimize(self, name: str, *, force: bool = False) -> bool:
        """A Qdrant server optimises its segments by itself, and local mode has no
        indexes to build: nothing to do."""
        await self._require(name)
        return False

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

        async def query(excluded: frozenset[tuple[str, str]], widen: int) -> Any:
            async with self._switch_lock(name).reading():
                if excluded:
                    excluded = still_excluded(excluded, await self._live_versions(name, {d for d, _ in excluded}))
                query_filter = _filter(where, excluded)
                common: dict[str, Any] = {
                    "query_filter": query_filter,
                    "limit": fetch_size(k) * widen,
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
                    sparse_query = models.SparseVector(indices=sparse[0], values=sparse[1])
                    prefetch = [
                        models.Prefetch(query=list(dense), using="dense", limit=candidates * widen, filter=query_filter),
                        models.Prefetch(query=sparse_query, using="sparse", limit=candidates * widen, filter=query_filter),
                    ]
                    response = await self._call(
                        "query_points", name, prefetch=prefetch, query=models.FusionQuery(fusion=models.Fusion.RRF), **common
                    )
                points = response.points
                live = await self._live_versions(name, {p.payload["doc_id"] for p in points if p.payload})
            found = [(p.payload or {}, p.score, p.vector.get("dense") if isinstance(p.vector, dict) else None) for p in points]
            return found, live, excluded

        return await search_live(query, k=k, query_unit=unit(dense) if dense is not None else None)

    async def _live_versions(self, name: str, doc_ids: set[str]) -> dict[str, str]:
        if not doc_ids:
            return {}
        records = await self._call(
            "retrieve", name + REGISTRY_SUFFIX, ids=[doc_point_id(d) for d in doc_ids], with_payload=["doc_id", "version"]
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


def _stored_chunk(record: models.Record) -> StoredChunk:
    vectors = record.vector if isinstance(record.vector, dict) else {}
    sparse_vector = vectors.get("sparse")
    return StoredChunk(
        payload=dict(record.payload or {}),
        dense=list(vectors.get("dense") or []),  # type: ignore[arg-type]
        sparse=(list(sparse_vector.indices), list(sparse_vector.values)) if sparse_vector else ([], []),  # type: ignore[union-attr]
    )


def _locked(lock: threading.Lock, fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        with lock:
            return fn()

    return run


def _filter(where: SearchFilter | None, excluded: frozenset[tuple[str, str]] = frozenset()) -> models.Filter | None:
    """``where`` as a Qdrant filter, without the chunks of the ``excluded``
    (doc id, version) pairs."""
    must_not: list[models.Condition] = [
        models.Filter(must=[_match("doc_id", d), _match("version", v)]) for d, v in sorted(excluded)
    ]
    if where is None:
        return models.Filter(must_not=must_not) if must_not else None
    must: list[models.Condition] = []
    if where.doc_ids:
        must.append(models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(where.doc_ids))))
    if where.tags:
        must.append(models.FieldCondition(key="tags", match=models.MatchAny(any=list(where.tags))))
    if where.tenant is not None:
        must.append(_match("tenant", where.tenant))
    for key, value in where.metadata.items():
        must.append(_metadata_condition(key, value))
    if not must and not must_not:
        return None
    return models.Filter(must=must or None, must_not=must_not or None)


def _metadata_condition(key: str, value: MetadataValue) -> models.FieldCondition:
    # Qdrant matches strings, booleans and integers exactly (`MatchValue` takes no
    # float); a float matches as the one-point range.
    path = metadata_path(key)
    if isinstance(value, float):
        return models.FieldCondition(key=path, range=models.Range(gte=value, lte=value))
    return _match(path, value)
