"""`VectorStore` on Qdrant Edge (``qdrant-edge-py``): Qdrant's engine inside this
process, the embedded default.

Layout of the store's directory (``<data_dir>/vectors``)::

    .lock                     held (flock) by the process that has the store open
    <name>/collection.json    what the collection holds (embedder, dimensions) and
                              which shard directory is live
    <name>/shard-000001/      the live Edge shard: segments and a write-ahead log

One shard per collection holds both kinds of points: a chunk point per chunk (named
vectors ``dense``, cosine, and ``sparse``, with Qdrant's IDF modifier; the chunk's
text and provenance as payload) and a vector-less registry point per document (its
live version), told apart by the payload field ``kind``. Keyword indexes on
``kind``, ``doc_id``, ``version``, ``tags``, ``tenant`` and ``bools``.

**Writes** follow the same protocol as `knowledge.vectorstore.qdrant`: upsert the new
version's chunks, switch the document's registry point (one point: atomic), delete
the other versions' chunks. Searches keep only chunks of the registry's version, so a
reader sees a document's old version or its new one, never a mix; a failed upsert
deletes what it wrote. Every update goes to the shard's write-ahead log before it is
applied, so a process killed mid-ingest reopens with every acknowledged update; the
chunks of a document whose switch never happened are invisible, and the next write
of that document removes them. The segments are flushed to disk after the quiet time
that follows writes (and by `optimize`), which makes the updates survive the machine
too.

**Optimisation.** New points land in an appendable segment that is searched by brute
force; `optimize` builds HNSW and sparse indexes. qdrant-edge-py's ``optimize()``
holds the GIL until it is done (seconds to minutes), so it never runs in this
process: the shard is flushed and copied (writers wait for the copy, readers do
not), a child process optimises the copy (`_optimize.py`, at a lower CPU priority),
the documents written meanwhile are copied over from the live shard, and the
optimised shard replaces the live one in one assignment. Searches already running
finish on the old shard, which is closed and removed when the last one is done. It
runs by itself `optimize_delay_s` after the last write once `optimize_min_points`
points were written or deleted since the last optimisation (otherwise that quiet
time only flushes); the CLI runs it at the end of an ingestion.

qdrant-edge-py releases the GIL while it searches and writes, so its calls run on
worker threads, several at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from knowledge.embeddings.sparse import SparseVector
from knowledge.errors import KnowledgeError, StoreLockedError, UnknownCollectionError, VectorStoreError
from knowledge.models import Chunk, Document, SearchHit
from knowledge.vectorstore._points import (
    INDEXED,
    KIND,
    SwitchLock,
    WRITE_BATCH,
    bool_token,
    bool_tokens,
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

__all__ = ["EdgeStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_META = "collection.json"
_FORMAT = 1
_CHUNK = "chunk"
_DOC = "doc"
_EDGE_INDEXED = (*INDEXED, "kind", "bools")
_OPTIMIZER = Path(__file__).with_name("_optimize.py")
_MAX_WAIT = 6
"""A collection written to without a pause is flushed or optimised at the latest this
many quiet times after its first write since the last run."""
_SCROLL = 512


def _is(key: str, value: Any) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchValue(value))


_CHUNKS = _is("kind", _CHUNK)
_DOCS = _is("kind", _DOC)


@dataclass(eq=False)
class _Shard:
    """An open shard and the searches and writes using it."""

    shard: qe.EdgeShard
    path: Path
    users: int = 0
    retired: bool = False


@dataclass(eq=False)
class _Collection:
    name: str
    dir: Path
    embedder: str
    dimensions: int
    live: _Shard
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    switch_lock: SwitchLock = field(default_factory=SwitchLock)
    optimize_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: int = 0
    """Points written or deleted since the last optimisation."""
    dirty: set[str] | None = None
    """Documents written while an optimisation works on a copy (None: none running)."""
    timer: asyncio.TimerHandle | None = None
    unsettled_since: float | None = None
    """Loop time of the first write since the quiet-time job last started."""
    background: asyncio.Task[None] | None = None


class EdgeStore:
    """Collections in Qdrant Edge shards under ``path``.

    Args:
        path: the store's directory (created if missing).
        optimize_min_points: points written or deleted since the last optimisation
            that start one by themselves (`optimize` without ``force``).
        optimize_delay_s: quiet time after the last write before that happens; None:
            never by itself, only when `optimize` is called.

    Raises:
        StoreLockedError: another `EdgeStore` (in any process) has ``path`` open.
    """

    def __init__(self, path: Path, *, optimize_min_points: int = 5000, optimize_delay_s: float | None = 5.0) -> None:
        self.location = str(path)
        self._root = path
        self._min_points = optimize_min_points
        self._delay = optimize_delay_s
        path.mkdir(parents=True, exist_ok=True)
        self._lock_file: Any = open(path / ".lock", "a+")  # noqa: SIM115 - held until aclose
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreLockedError(str(path)) from None
        self._collections: dict[str, _Collection] = {}
        self._loading: dict[str, asyncio.Future[_Collection]] = {}
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._children: set[asyncio.subprocess.Process] = set()
        try:
            self._clean_up()
        except BaseException:
            self._lock_file.close()
            raise

    def _clean_up(self) -> None:
        """Remove what an earlier process left half done: a collection it was creating,
        the copy an optimisation was working on, the shard an optimisation replaced."""
        for entry in self._root.iterdir():
            if entry.name.startswith(".creating-"):
                shutil.rmtree(entry, ignore_errors=True)
            elif (entry / _META).is_file():
                try:
                    live = _read_meta(entry)["shard"]
                except (KnowledgeError, OSError, ValueError, KeyError) as exc:
                    # One unreadable collection must not keep the others from serving.
                    log.error("vector store: %s is unreadable (%s); that collection is left alone", entry / _META, exc)
                    continue
                for shard_dir in entry.iterdir():
                    if shard_dir.is_dir() and shard_dir.name != live:
                        shutil.rmtree(shard_dir, ignore_errors=True)

    # ---- engine calls --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _using(self, collection: _Collection) -> AsyncIterator[qe.EdgeShard]:
        """The collection's live shard, kept open until the caller is done with it
        even if an optimisation replaces it meanwhile."""
        handle = collection.live
        handle.users += 1
        try:
            yield handle.shard
        finally:
            handle.users -= 1
            if handle.retired and handle.users == 0:
                # Shielded: a caller cancelled now (a client gone) must not leave the
                # replaced shard open.
                await asyncio.shield(asyncio.to_thread(_discard, handle))

    async def _run(self, collection: _Collection, fn: Callable[[qe.EdgeShard], T]) -> T:
        async with self._using(collection) as shard:
            return await _engine(collection.name, lambda: fn(shard))

    # ---- collections -----------------------------------------------------------------

    def _meta_path(self, name: str) -> Path:
        return self._root / name / _META

    async def has_collection(self, name: str) -> bool:
        return self._meta_path(valid_collection_name(name)).is_file()

    def _names(self) -> list[str]:
        names = []
        for meta in self._root.glob(f"*/{_META}"):
            try:
                names.append(valid_collection_name(meta.parent.name))
            except KnowledgeError:
                continue  # a collection being created (.creating-...), or not ours
        return sorted(names)

    async def _open(self, name: str) -> _Collection:
        """The collection, its shard loaded on first use.

        Raises:
            UnknownCollectionError: there is none of that name.
        """
        valid_collection_name(name)
        if self._closed:
            raise KnowledgeError("the vector store is closed")
        found = self._collections.get(name)
        if found is not None:
            return found
        loading = self._loading.get(name)
        if loading is None:
            if not self._meta_path(name).is_file():
                raise UnknownCollectionError(name, self._names())
            # A task of its own: a caller cancelled mid-load (a request timing out)
            # must not drop a loaded shard that still holds its write-ahead log.
            loading = asyncio.ensure_future(self._load(name))
            self._loading[name] = loading
            loading.add_done_callback(lambda _: self._loading.pop(name, None))
        return await asyncio.shield(loading)

    async def _load(self, name: str) -> _Collection:
        try:
            meta = _read_meta(self._root / name)
        except (OSError, ValueError, KeyError) as exc:
            raise VectorStoreError(f"collection {name!r}: {self._meta_path(name)} is unreadable: {exc}") from exc
        shard_path = self._root / name / meta["shard"]
        shard = await _engine(name, lambda: qe.EdgeShard.load(str(shard_path)))
        collection = _Collection(
            name=name,
            dir=self._root / name,
            embedder=str(meta["embedder"]),
            dimensions=int(meta["dimensions"]),
            live=_Shard(shard=shard, path=shard_path),
            # Written at every flush; a collection from before that counter counts whole.
            pending=int(meta["pending"]) if "pending" in meta else await self._run_on(name, shard, _chunk_count),
        )
        if self._closed:
            await asyncio.to_thread(shard.close)
            raise KnowledgeError("the vector store is closed")
        self._collections[name] = collection
        return collection

    async def _run_on(self, name: str, shard: qe.EdgeShard, fn: Callable[[qe.EdgeShard], T]) -> T:
        return await _engine(name, lambda: fn(shard))

    async def ensure_collection(self, name: str, *, dimensions: int, embedder: str) -> None:
        valid_collection_name(name)
        async with self._open_lock:
            if not self._meta_path(name).is_file():
                await _engine(name, lambda: self._create(name, dimensions=dimensions, embedder=embedder))
                return
        collection = await self._open(name)
        if collection.embedder != embedder or collection.dimensions != dimensions:
            raise KnowledgeError(
                f"collection {name!r} holds vectors of {collection.embedder!r} ({collection.dimensions} dimensions); "
                f"the configured embedder is {embedder!r} ({dimensions}): re-ingest into a new collection, or "
                "configure the embedder it was built with"
            )

    def _create(self, name: str, *, dimensions: int, embedder: str) -> None:
        """Build the collection in a hidden directory and rename it into place, so a
        crash leaves either nothing or a whole collection."""
        building = self._root / f".creating-{name}-{uuid.uuid4().hex[:8]}"
        shard_name = "shard-000001"
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=dimensions, distance=qe.Distance.Cosine)},
            sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        )
        try:
            shard = qe.EdgeShard.create(str(building / shard_name), config)
            try:
                for field_name in _EDGE_INDEXED:
                    shard.update(qe.UpdateOperation.create_field_index(field_name, qe.PayloadSchemaType.Keyword))
                shard.flush()
            finally:
                shard.close()
            _write_meta(building, {"kind": KIND, "format": _FORMAT, "embedder": embedder, "dimensions": dimensions, "shard": shard_name, "pending": 0})
            os.rename(building, self._root / name)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise

    async def collections(self) -> list[CollectionInfo]:
        out = []
        for name in self._names():
            try:
                collection = await self._open(name)
            except VectorStoreError as exc:
                log.error("vector store: collection %r is not listed: %s", name, exc)
                continue
            documents, chunks = await self._run(
                collection, lambda s: (s.count(qe.CountRequest(filter=qe.Filter(must=[_DOCS]))), s.count(qe.CountRequest(filter=qe.Filter(must=[_CHUNKS]))))
            )
            out.append(
                CollectionInfo(
                    name=name, documents=documents, chunks=chunks, embedder=collection.embedder, dimensions=collection.dimensions
                )
            )
        return out

    # ---- documents -------------------------------------------------------------------

    async def documents(self, name: str) -> dict[str, StoredDocument]:
        collection = await self._open(name)

        def scroll(shard: qe.EdgeShard) -> dict[str, StoredDocument]:
            found: dict[str, StoredDocument] = {}
            offset = None
            while True:
                records, offset = shard.scroll(
                    qe.ScrollRequest(offset=offset, limit=_SCROLL, filter=qe.Filter(must=[_DOCS]), with_payload=True, with_vector=False)
                )
                for record in records:
                    entry = stored(record.payload or {})
                    found[entry.doc_id] = entry
                if offset is None:
                    return found

        return await self._run(collection, scroll)

    async def document(self, name: str, doc_id: str) -> StoredDocument | None:
        collection = await self._open(name)
        return await self._run(collection, lambda s: _entry(s, doc_id))

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
        collection = await self._open(name)
        check_vectors(chunks, dense, sparse)
        entry = StoredDocument(
            doc_id=document.id, version=document.hash, chunks=len(chunks), source=document.source, title=document.title, owner=tenant
        )
        payloads = [chunk_payload(document, chunk, tenant=tenant) for chunk in chunks]
        await self._write(collection, entry, payloads, dense, sparse)

    async def import_document(self, name: str, export: DocumentExport) -> None:
        collection = await self._open(name)
        chunks = export.chunks
        await self._write(collection, export.entry, [c.payload for c in chunks], [c.dense for c in chunks], [c.sparse for c in chunks])

    async def _write(
        self,
        collection: _Collection,
        entry: StoredDocument,
        payloads: Sequence[Mapping[str, Any]],
        dense: Sequence[Sequence[float]],
        sparse: Sequence[SparseVector],
    ) -> None:
        points = [
            qe.Point(
                id=chunk_point_id(entry.doc_id, entry.version, int(payload["index"])),
                vector={"dense": [float(v) for v in vector], "sparse": qe.SparseVector(indices=list(sv[0]), values=list(sv[1]))},
                payload=_chunk_point_payload(payload),
            )
            for payload, vector, sv in zip(payloads, dense, sparse, strict=True)
        ]
        version = _is("version", entry.version)
        document = _is("doc_id", entry.doc_id)
        async with collection.write_lock:
            if collection.dirty is not None:
                collection.dirty.add(entry.doc_id)
            try:
                for start in range(0, len(points), WRITE_BATCH):
                    batch = points[start : start + WRITE_BATCH]
                    await self._run(collection, lambda s, b=batch: s.update(qe.UpdateOperation.upsert_points(b)))  # type: ignore[misc]
            except BaseException:
                # Nothing of the new version may stay behind; the old one is still live.
                # Unless it is the same version (the same content written again from
                # another source or by another owner): its chunks were overwritten in
                # place and are the live ones.
                rollback = qe.Filter(must=[_CHUNKS, document, version])

                def roll_back(shard: qe.EdgeShard) -> None:
                    live = _entry(shard, entry.doc_id)
                    if live is None or live.version != entry.version:
                        shard.update(qe.UpdateOperation.delete_points_by_filter(rollback))

                await asyncio.shield(self._run(collection, roll_back))
                raise
            registry = qe.Point(id=doc_point_id(entry.doc_id), vector={}, payload={**entry_payload(entry), "kind": _DOC})
            # Other versions' chunks, and this version's past its new end (a rewrite
            # chunked into fewer pieces).
            beyond = qe.FieldCondition(key="index", range=qe.RangeFloat(gte=float(len(points))))
            stale = qe.Filter(must=[_CHUNKS, document, qe.Filter(should=[qe.Filter(must_not=[version]), beyond])])

            def switch(shard: qe.EdgeShard) -> None:
                shard.update(qe.UpdateOperation.upsert_points([registry]))
                # The new version is live; the chunks of any other version go.
                shard.update(qe.UpdateOperation.delete_points_by_filter(stale))

            async with collection.switch_lock.switching():
                await self._run(collection, switch)
            collection.pending += len(points)
        self._written(collection)

    async def delete_document(self, name: str, doc_id: str) -> bool:
        collection = await self._open(name)

        def delete(shard: qe.EdgeShard) -> bool:
            existed = _entry(shard, doc_id) is not None
            # The registry point goes first: from then on readers ignore the chunks.
            shard.update(qe.UpdateOperation.delete_points([doc_point_id(doc_id)]))
            shard.update(qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[_CHUNKS, _is("doc_id", doc_id)])))
            return existed

        async with collection.write_lock:
            if collection.dirty is not None:
                collection.dirty.add(doc_id)
            async with collection.switch_lock.switching():
                existed = await self._run(collection, delete)
            collection.pending += 1
        self._written(collection)
        return existed

    async def export_document(self, name: str, doc_id: str) -> DocumentExport | None:
        collection = await self._open(name)
        return await self._run(collection, lambda s: _export(s, doc_id))

    async def export_documents(self, name: str) -> AsyncIterator[DocumentExport]:
        # Each document's chunks are one indexed filter away here.
        for doc_id in sorted(await self.documents(name)):
            export = await self.export_document(name, doc_id)
            if export is not None:
                yield export

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
        collection = await self._open(name)
        if sparse is not None and not sparse[0]:
            sparse = None  # the query has no indexable terms (only stop words)
        if mode == "sparse" and sparse is None:
            return []
        if mode == "hybrid" and sparse is None:
            mode = "dense"
        if mode in ("dense", "hybrid") and dense is None:
            raise KnowledgeError(f"a {mode} search needs the query's dense vector")
        dense_query = qe.Query.Nearest([float(v) for v in dense], using="dense") if dense is not None else None
        sparse_query = qe.Query.Nearest(qe.SparseVector(indices=list(sparse[0]), values=list(sparse[1])), using="sparse") if sparse else None

        def request(excluded: frozenset[tuple[str, str]], widen: int) -> qe.QueryRequest:
            query_filter = _filter(where, excluded)
            common: dict[str, Any] = {
                "limit": fetch_size(k) * widen,
                "filter": query_filter,
                "with_payload": True,
                "with_vector": ["dense"] if dense is not None else False,
            }
            if mode == "dense":
                return qe.QueryRequest(query=dense_query, **common)
            if mode == "sparse":
                return qe.QueryRequest(query=sparse_query, **common)
            prefetches = [
                qe.Prefetch(limit=candidates * widen, query=dense_query, filter=query_filter),
                qe.Prefetch(limit=candidates * widen, query=sparse_query, filter=query_filter),
            ]
            return qe.QueryRequest(query=qe.Fusion.Rrf(k=2), prefetches=prefetches, **common)

        def run(shard: qe.EdgeShard, excluded: frozenset[tuple[str, str]], widen: int) -> Any:
            if excluded:
                excluded = still_excluded(excluded, _live_versions(shard, {doc_id for doc_id, _ in excluded}))
            points = shard.query(request(excluded, widen))
            live = _live_versions(shard, {p.payload["doc_id"] for p in points if p.payload})
            found = [(p.payload or {}, p.score, p.vector.get("dense") if isinstance(p.vector, dict) else None) for p in points]
            return found, live, excluded

        async def query(excluded: frozenset[tuple[str, str]], widen: int) -> Any:
            async with collection.switch_lock.reading():
                return await self._run(collection, lambda s: run(s, excluded, widen))

        return await search_live(query, k=k, query_unit=unit(dense) if dense is not None else None)

    # ---- optimisation ------------------------------------------------------------------

    def _written(self, collection: _Collection) -> None:
        """After a write: (re)start the quiet-time timer that flushes or optimises.

        A steady trickle of writes does not postpone it for ever: once the first write
        since the last run is `_MAX_WAIT` quiet times old, the timer is left to fire."""
        if self._delay is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        if collection.unsettled_since is None:
            collection.unsettled_since = loop.time()
        if collection.timer is not None:
            if loop.time() - collection.unsettled_since >= self._delay * _MAX_WAIT:
                return
            collection.timer.cancel()
        collection.timer = loop.call_later(self._delay, self._start_background, collection)

    def _start_background(self, collection: _Collection) -> None:
        collection.timer = None
        if self._closed:
            return
        if collection.background is not None and not collection.background.done():
            self._written(collection)  # try again after the running one
            return
        collection.unsettled_since = None
        collection.background = asyncio.get_running_loop().create_task(self._maintain(collection))

    async def _maintain(self, collection: _Collection) -> None:
        """The quiet-time job: optimise if enough was written, else flush. Writes that
        arrive meanwhile start their own quiet time, so optimisations never run back to
        back under a steady load."""
        try:
            if collection.pending >= self._min_points:
                await self._optimize(collection, force=False)
            else:
                await self._flush(collection)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A background job has no caller to tell: log it; the live shard is
            # untouched and searches go on unoptimised.
            log.exception("maintaining collection %r failed", collection.name)

    async def _flush(self, collection: _Collection) -> None:
        """Write the shard's segments to disk, and the count of chunks written since the
        last optimisation to ``collection.json``. Every acknowledged update is in the
        write-ahead log already, which survives the process; a flush also makes it
        survive the machine (the log is not synced on every write)."""
        async with collection.write_lock:
            await self._run(collection, lambda s: s.flush())
            await asyncio.to_thread(_update_meta, collection.dir, {"pending": collection.pending})

    async def optimize(self, name: str, *, force: bool = False) -> bool:
        collection = await self._open(name)
        return await self._optimize(collection, force=force)

    async def _optimize(self, collection: _Collection, *, force: bool) -> bool:
        async with collection.optimize_lock:
            # Checked under the lock: one that just finished may have done it.
            if not force and collection.pending < self._min_points:
                await self._flush(collection)
                return False
            name = collection.name
            old = collection.live
            generation = int(old.path.name.rsplit("-", 1)[1]) + 1
            target = collection.dir / f"shard-{generation:06d}"
            # A name of its own: an optimiser orphaned by a killed server cannot write
            # into the copy of the next one.
            building = collection.dir / f"shard-{generation:06d}.building-{uuid.uuid4().hex[:8]}"
            try:
                # 1. A consistent copy: writers wait for it, readers do not.
                async with collection.write_lock:
                    await self._run(collection, lambda s: s.flush())
                    await asyncio.to_thread(shutil.copytree, old.path, building)
                    pending_at_copy = collection.pending
                    collection.dirty = set()
                # 2. The child process optimises the copy (and syncs it to disk).
                report = await self._run_optimizer(building)
                await asyncio.to_thread(os.rename, building, target)
                await asyncio.to_thread(_sync_directory, collection.dir)
                fresh = await _engine(name, lambda: qe.EdgeShard.load(str(target)))
            except BaseException as exc:
                collection.dirty = None
                await asyncio.shield(asyncio.to_thread(_remove, building, target))
                if isinstance(exc, (OSError, ValueError)):
                    raise VectorStoreError(f"optimising collection {name!r} failed: {exc}") from exc
                raise
            # 3. Documents written meanwhile are copied over, then the swap.
            try:
                async with collection.write_lock:
                    dirty, collection.dirty = collection.dirty or set(), None
                    async with self._using(collection) as shard:
                        await _engine(name, lambda: _copy_documents(shard, fresh, dirty))
                    await asyncio.to_thread(fresh.flush)
                    pending = max(0, collection.pending - pending_at_copy)
                    _update_meta(collection.dir, {"shard": target.name, "pending": pending})
                    collection.live = _Shard(shard=fresh, path=target)
                    collection.pending = pending
            except BaseException:
                if collection.live.shard is not fresh:
                    await asyncio.to_thread(fresh.close)
                    await asyncio.to_thread(shutil.rmtree, target, True)
                raise
            old.retired = True
            if old.users == 0:
                await asyncio.to_thread(_discard, old)
            log.info(
                "optimised collection %r: %s points in %s segments, %.1fs in the optimiser, %d documents copied after",
                name, report.get("points"), report.get("segments"), report.get("seconds", 0.0), len(dirty),
            )
            return True  # a new shard: vacuumed, merged, and indexed where large enough

    async def _run_optimizer(self, path: Path) -> dict[str, Any]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(_OPTIMIZER), str(path), str(os.getpid()),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        self._children.add(child)
        try:
            out, err = await child.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await asyncio.shield(child.wait())
            raise
        finally:
            self._children.discard(child)
        if child.returncode != 0:
            raise VectorStoreError(
                f"optimising {path.parent.name!r} failed (exit {child.returncode}): {err.decode(errors='replace')[-500:]}"
            )
        try:
            return dict(json.loads(out.decode().strip().splitlines()[-1]))
        except (ValueError, IndexError) as exc:
            raise VectorStoreError(f"optimising {path.parent.name!r}: the optimiser printed no result ({exc})") from exc

    # ---- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for collection in self._collections.values():
            if collection.timer is not None:
                collection.timer.cancel()
            task = collection.background
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for child in list(self._children):
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        """Close every shard and release the directory (also from synchronous code)."""
        self._closed = True
        for collection in self._collections.values():
            with contextlib.suppress(Exception):
                collection.live.shard.close()
        self._collections.clear()
        if not self._lock_file.closed:
            self._lock_file.close()


# ---- helpers ---------------------------------------------------------------------------


async def _engine(name: str, fn: Callable[[], T]) -> T:
    """Run an engine call on a worker thread; its errors become `VectorStoreError`.

    A thread cannot be stopped: when the caller is cancelled, this waits for the call
    to finish before passing the cancellation on, so what runs next (a write's
    roll-back, the release of the collection's write lock) never overlaps it."""
    running = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        while not running.done():
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        raise
    except KnowledgeError:
        raise
    except Exception as exc:  # the engine raises bare Exception with its message
        raise VectorStoreError(f"collection {name!r}: {exc}") from exc


def _discard(handle: _Shard) -> None:
    handle.shard.close()
    shutil.rmtree(handle.path, ignore_errors=True)


def _read_meta(directory: Path) -> dict[str, Any]:
    meta = json.loads((directory / _META).read_text())
    if meta.get("kind") != KIND or meta.get("format") != _FORMAT:
        raise KnowledgeError(f"{directory / _META}: not a Switchyard collection of format {_FORMAT}")
    return dict(meta)


def _update_meta(directory: Path, changes: Mapping[str, Any]) -> None:
    _write_meta(directory, {**_read_meta(directory), **changes})


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _write_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    """Replace ``collection.json`` atomically (write, fsync, rename)."""
    temporary = directory / f".{_META}.{uuid.uuid4().hex[:8]}"
    with open(temporary, "w") as out:
        json.dump(meta, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, directory / _META)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _chunk_point_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The stored payload of a chunk point: ``kind`` and the ``bools`` tokens added."""
    return {**payload, "kind": _CHUNK, "bools": bool_tokens(payload.get("metadata") or {})}


def _chunk_count(shard: qe.EdgeShard) -> int:
    return shard.count(qe.CountRequest(filter=qe.Filter(must=[_CHUNKS])))


def _entry(shard: qe.EdgeShard, doc_id: str) -> StoredDocument | None:
    records = shard.retrieve([doc_point_id(doc_id)], with_payload=True, with_vector=False)
    found = [stored(r.payload) for r in records if r.payload and r.payload.get("doc_id") == doc_id]
    return found[0] if found else None


def _export(shard: qe.EdgeShard, doc_id: str) -> DocumentExport | None:
    entry = _entry(shard, doc_id)
    if entry is None:
        return None
    live = qe.Filter(must=[_CHUNKS, _is("doc_id", doc_id), _is("version", entry.version)])
    chunks: list[StoredChunk] = []
    offset = None
    while True:
        records, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=_SCROLL, filter=live, with_payload=True, with_vector=True))
        for record in records:
            vectors = record.vector if isinstance(record.vector, dict) else {}
            sparse_vector = vectors.get("sparse")
            payload = {k: v for k, v in (record.payload or {}).items() if k not in ("kind", "bools")}
            chunks.append(
                StoredChunk(
                    payload=payload,
                    dense=list(vectors.get("dense") or []),  # type: ignore[arg-type]
                    sparse=(list(sparse_vector.indices), list(sparse_vector.values)) if sparse_vector else ([], []),  # type: ignore[union-attr]
                )
            )
        if offset is None:
            break
    chunks.sort(key=lambda c: int(c.payload["index"]))
    return DocumentExport(entry=entry, chunks=chunks)


def _copy_documents(source: qe.EdgeShard, target: qe.EdgeShard, doc_ids: set[str]) -> None:
    """Make each document's points in ``target`` what they are in ``source``: its
    registry point and every chunk point (all versions, as they are)."""
    for doc_id in doc_ids:
        of_document = qe.Filter(must=[_is("doc_id", doc_id)])
        target.update(qe.UpdateOperation.delete_points_by_filter(of_document))
        offset = None
        while True:
            records, offset = source.scroll(
                qe.ScrollRequest(offset=offset, limit=WRITE_BATCH, filter=of_document, with_payload=True, with_vector=True)
            )
            points = [qe.Point(id=r.id, vector=r.vector or {}, payload=r.payload) for r in records]
            if points:
                target.update(qe.UpdateOperation.upsert_points(points))
            if offset is None:
                break


def _live_versions(shard: qe.EdgeShard, doc_ids: set[str]) -> dict[str, str]:
    registry = shard.retrieve([doc_point_id(d) for d in doc_ids], with_payload=["doc_id", "version"], with_vector=False)
    return {r.payload["doc_id"]: r.payload["version"] for r in registry if r.payload}


def _filter(where: SearchFilter | None, excluded: frozenset[tuple[str, str]] = frozenset()) -> qe.Filter | None:
    """``where`` as a Qdrant filter, without the chunks of the ``excluded``
    (doc id, version) pairs."""
    must_not: list[Any] = [qe.Filter(must=[_is("doc_id", d), _is("version", v)]) for d, v in sorted(excluded)]
    if where is None:
        return qe.Filter(must_not=must_not) if must_not else None
    must: list[Any] = []
    if where.doc_ids:
        must.append(qe.FieldCondition(key="doc_id", match=qe.MatchAny(list(where.doc_ids))))
    if where.tags:
        must.append(qe.FieldCondition(key="tags", match=qe.MatchAny(list(where.tags))))
    if where.tenant is not None:
        must.append(_is("tenant", where.tenant))
    for key, value in where.metadata.items():
        must.append(_metadata_condition(key, value))
    if not must and not must_not:
        return None
    return qe.Filter(must=must or None, must_not=must_not or None)


def _metadata_condition(key: str, value: MetadataValue) -> qe.FieldCondition:
    if isinstance(value, bool):
        return _is("bools", bool_token(key, value))
    if isinstance(value, float):
        return qe.FieldCondition(key=metadata_path(key), range=qe.RangeFloat(gte=value, lte=value))
    return _is(metadata_path(key), value)
