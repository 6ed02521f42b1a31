"""`KnowledgeBase`: the knowledge layer's facade (ingest, search, delete, list), and
`open_knowledge`, which builds it from settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from knowledge.chunking import Chunker
from knowledge.embeddings.base import Embedder
from knowledge.embeddings.sparse import SparseEncoder
from knowledge.errors import DocumentOwnershipError, DocumentParseError, KnowledgeError, UnknownCollectionError
from knowledge.ingestion.pipeline import Ingestor, Progress
from knowledge.models import Document, IngestReport, SearchHit, check_document_id
from knowledge.settings import KnowledgeSettings
from knowledge.vectorstore.base import (
    REGISTRY_SUFFIX,
    CollectionInfo,
    SearchFilter,
    SearchMode,
    VectorStore,
    valid_collection_name,
)
from knowledge.vectorstore.edge import EdgeStore
from knowledge.vectorstore.qdrant import QdrantStore

if TYPE_CHECKING:
    from gateway import ModelGateway

__all__ = [
    "KnowledgeBase",
    "RetrievalSource",
    "SearchObserver",
    "build_embedder",
    "legacy_collections",
    "legacy_store_path",
    "open_knowledge",
    "open_vector_store",
    "report_search",
]

log = logging.getLogger(__name__)

RetrievalSource = Literal["vectors", "graph"]
"""Where a search looked: the knowledge base's chunks (`KnowledgeBase.search`, any
mode) or the knowledge graph's facts (`KnowledgeGraph.retrieve`)."""

SearchObserver = Callable[[str, RetrievalSource, int], None]
"""Told of each completed search: (collection, source, number of results). Called
synchronously on the search's path, so it must be quick (a metric, not I/O)."""


def report_search(observer: SearchObserver | None, collection: str, source: RetrievalSource, hits: int) -> None:
    """Tell ``observer`` (if any) of a completed search. An observer that raises is
    logged and ignored: counting a search must never fail it."""
    if observer is None:
        return
    try:
        observer(collection, source, hits)
    except Exception:
        log.exception("the search observer failed on a %s search of %r; the search's results are returned", source, collection)


class KnowledgeBase:
    """Collections of documents, searchable by meaning (dense), by words (sparse) or
    both (hybrid, fused by reciprocal rank).

    Every document records who wrote it: a tenant, or None for the operator (the CLI
    on the data directory; a server with no tenants). A tenant may replace or delete
    only the documents it wrote; the operator, any. Writes to one collection run one
    at a time in this process, so an ownership check and the write it allows are not
    interleaved with another writer's.
    """

    def __init__(self, store: VectorStore, embedder: Embedder, settings: KnowledgeSettings) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.sparse = SparseEncoder(average_terms=settings.chunking.max_tokens * 0.75)
        self.chunker = Chunker(
            embedder.count_tokens,
            max_tokens=settings.chunking.max_tokens,
            overlap_tokens=settings.chunking.overlap_tokens,
        )
        self._ingestor = Ingestor(store, embedder, self.chunker, self.sparse, batch_chunks=max(64, settings.embedder.batch_size))
        self._writing: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.on_removed: Callable[[str, str], Awaitable[None]] | None = None
        """Called with (collection, doc_id) after a document was replaced or deleted,
        inside the collection's write lock: the knowledge graph removes the facts
        that only the old version supported (`KnowledgeGraph.delete_document`)."""
        self.on_search: SearchObserver | None = None
        """Told of every completed `search`, with its number of hits (source
        ``vectors``): the server counts hits per search and empty searches."""

    @contextlib.asynccontextmanager
    async def _lock(self, collection: str) -> AsyncIterator[None]:
        """One writer per collection at a time; the lock is dropped once nobody holds or
        waits for it (collection names come from clients: no entry may outlive them)."""
        lock, users = self._writing.setdefault(collection, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._writing[collection]

    async def ingest(
        self,
        collection: str,
        items: Iterable[Document | DocumentParseError],
        *,
        delete_missing: bool = False,
        tenant: str | None = None,
        progress: Progress | None = None,
    ) -> IngestReport:
        """Add, update or skip each document (by content hash) as ``tenant`` (None: the
        operator); see `Ingestor`. ``delete_missing`` removes only documents the same
        writer stored.

        Raises:
            DocumentOwnershipError: ``items`` name documents someone else wrote (a
                tenant may replace only its own); nothing was written.
        """
        valid_collection_name(collection)
        removed: list[str] = []

        def note(doc_id: str, outcome: str) -> None:
            if outcome in ("updated", "deleted"):
                removed.append(doc_id)
            if progress is not None:
                progress(doc_id, outcome)

        async with self._lock(collection):
            try:
                report = await self._ingestor.ingest(collection, items, delete_missing=delete_missing, tenant=tenant, progress=note)
            except BaseException:
                await self._removed(collection, removed, quiet=True)
                raise
            # The facts of a replaced version came from chunks that are gone;
            # `switchyard ingest --graph` extracts the new version again.
            await self._removed(collection, removed)
            return report

    async def search(
        self,
        collection: str,
        query: str,
        *,
        k: int | None = None,
        mode: SearchMode | None = None,
        where: SearchFilter | None = None,
    ) -> list[SearchHit]:
        """The best chunks for ``query``.

        Raises:
            KnowledgeError: an empty query.
            UnknownCollectionError: no such collection.
        """
        if not query.strip():
            raise KnowledgeError("the query is empty")
        retrieval = self.settings.retrieval
        mode = mode or retrieval.mode
        if not await self.store.has_collection(collection):
            raise UnknownCollectionError(collection, [c.name for c in await self.store.collections()])
        # The dense vector also scores every hit's relevance, whatever the mode.
        dense = await self.embedder.embed_query(query)
        sparse = self.sparse.query(query) if mode != "dense" else None
        hits = await self.store.search(
            collection,
            dense=dense,
            sparse=sparse,
            mode=mode,
            k=k or retrieval.k,
            candidates=max(retrieval.candidates, k or retrieval.k),
            where=where,
        )
        report_search(self.on_search, collection, "vectors", len(hits))
        return hits

    async def delete(self, collection: str, doc_id: str, *, tenant: str | None = None) -> bool:
        """Remove a document and its chunks, as ``tenant`` (None: the operator); False
        if it was not there.

        Raises:
            InvalidDocumentIdError: an id no store can hold.
            DocumentOwnershipError: ``tenant`` did not write it; nothing was changed.
            UnknownCollectionError: no such collection.
        """
        check_document_id(doc_id)
        valid_collection_name(collection)
        async with self._lock(collection):
            stored = await self.store.document(collection, doc_id)
            if stored is None:
                return False
            if tenant is not None and stored.owner != tenant:
                raise DocumentOwnershipError(collection, tenant, [doc_id])
            deleted = await self.store.delete_document(collection, doc_id)
            await self._removed(collection, [doc_id])
            return deleted

    async def _removed(self, collection: str, doc_ids: list[str], *, quiet: bool = False) -> None:
        """Tell the graph, for every document, even after one failed.

        Raises:
            KnowledgeError: (unless ``quiet``, when another error is on its way) naming
                the documents whose old facts could not be removed; the documents
                themselves were written.
        """
        if self.on_removed is None:
            return
        failed: list[str] = []
        for doc_id in doc_ids:
            try:
                await self.on_removed(collection, doc_id)
            except KnowledgeError as exc:
                log.error("the knowledge graph of %r kept the facts of replaced or deleted document %r: %s", collection, doc_id, exc)
                failed.append(doc_id)
        if failed and not quiet:
            shown = ", ".join(repr(d) for d in failed[:10])
            raise KnowledgeError(
                f"the documents were written, but the knowledge graph of collection {collection!r} still holds the "
                f"facts of the earlier versions of {shown}: `switchyard graph extract --collection {collection}` "
                "extracts replaced documents again and removes the facts of deleted ones"
            )

    async def collections(self) -> list[CollectionInfo]:
        return await self.store.collections()

    async def optimize(self, collection: str, *, force: bool = False) -> bool:
        """Build the collection's indexes now if enough was written since the last
        time (always with ``force``); searches go on meanwhile. See
        `VectorStore.optimize`.

        Raises:
            UnknownCollectionError: no such collection.
        """
        return await self.store.optimize(collection, force=force)

    async def aclose(self) -> None:
        await self.store.aclose()
        await self.embedder.aclose()

    def close_now(self) -> None:
        """Release the store from synchronous code (a failed start-up)."""
        closer = getattr(self.store, "close_now", None)
        if closer is not None:
            closer()


def build_embedder(settings: KnowledgeSettings, gateway: ModelGateway | None) -> Embedder:
    """The configured embedder.

    Raises:
        EmbeddingError: the model is not installed, or the backend cannot embed.
    """
    config = settings.embedder
    if config.kind == "openai":
        from knowledge.embeddings.openai import GatewayEmbedder

        if gateway is None or not config.alias:
            raise KnowledgeError("knowledge.embedder.kind 'openai' needs knowledge.embedder.alias and the model gateway")
        return GatewayEmbedder(gateway, config.alias, batch_size=config.batch_size, dimensions=config.dimensions)
    from knowledge.embeddings.local import LocalEmbedder

    return LocalEmbedder.packaged(config.model, batch_size=config.batch_size)


def open_vector_store(settings: KnowledgeSettings, data_dir: Path) -> VectorStore:
    """The configured vector store: a Qdrant server when ``qdrant_url`` is set, else
    the embedded Qdrant Edge store in ``edge.path`` (default ``<data_dir>/vectors``).

    Raises:
        StoreLockedError: the embedded store's directory is in use by another process.
    """
    if settings.qdrant_url:
        return QdrantStore(url=settings.qdrant_url, api_key=settings.qdrant_api_key)
    edge = settings.edge
    return EdgeStore(
        edge.path or data_dir / "vectors", optimize_min_points=edge.optimize_min_points, optimize_delay_s=edge.optimize_delay_s
    )


def legacy_store_path(settings: KnowledgeSettings, data_dir: Path) -> Path:
    """Where earlier versions kept the embedded store (qdrant-client's local mode)."""
    return settings.qdrant_path or data_dir / "qdrant"


def legacy_collections(path: Path) -> list[str]:
    """The collections an earlier version's local-mode store in ``path`` holds (its
    directory layout: ``collection/<name>`` and ``collection/<name>__docs``)."""
    found = path / "collection"
    if not found.is_dir():
        return []
    names = {p.name for p in found.iterdir() if p.is_dir()}
    return sorted(n for n in names if n + REGISTRY_SUFFIX in names)


def _warn_unmigrated(settings: KnowledgeSettings, data_dir: Path, store: VectorStore) -> None:
    if settings.qdrant_url or not isinstance(store, EdgeStore):
        return
    legacy = legacy_store_path(settings, data_dir)
    waiting = [name for name in legacy_collections(legacy) if not (Path(store.location) / name).is_dir()]
    if waiting:
        log.warning(
            "collections stored by an earlier version in %s are not in the vector store %s: %s; copy each with "
            "`switchyard knowledge migrate --collection NAME` (or ingest the documents again)",
            legacy, store.location, ", ".join(waiting),
        )


def open_knowledge(settings: KnowledgeSettings, data_dir: Path, gateway: ModelGateway | None = None) -> KnowledgeBase:
    """Open the vector store and the embedder.

    Raises:
        StoreLockedError: the embedded store's directory is in use by another process.
        EmbeddingError: the embedder cannot be loaded.
    """
    store = open_vector_store(settings, data_dir)
    _warn_unmigrated(settings, data_dir, store)
    try:
        embedder = build_embedder(settings, gateway)
    except BaseException:
        closer = getattr(store, "close_now", None)
        if closer is not None:
            closer()
        raise
    return KnowledgeBase(store, embedder, settings)
