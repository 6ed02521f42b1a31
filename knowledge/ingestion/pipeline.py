"""Ingestion: documents to chunks, vectors and the store, idempotent by content hash.

An unchanged document (same id, same content hash, same source) is skipped; a changed
one gets new chunks that replace the old ones as a whole (see
`VectorStore.write_document`); with ``delete_missing``, documents of the collection
that the same writer stored and the source no longer has are removed. A document that
fails (unreadable, empty, the embedder down) is reported with its reason and the
others go on. Chunks of several small documents are embedded in one batch.

Ownership: a document records the tenant that wrote it. A tenant may replace only its
own documents; an ingestion naming a document another tenant (or the operator) wrote
is refused as a whole before anything is written. The operator (``tenant`` None) may
replace any document, and then owns it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from knowledge.chunking import Chunker
from knowledge.embeddings.base import Embedder
from knowledge.embeddings.sparse import SparseEncoder
from knowledge.errors import DocumentOwnershipError, DocumentParseError, KnowledgeError
from knowledge.models import Chunk, Document, IngestReport
from knowledge.vectorstore.base import VectorStore

__all__ = ["Ingestor", "Progress", "same_source"]

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]
"""Called once per document with its id and what happened (``added``, ``updated``,
``skipped``, ``failed``, ``deleted``)."""


@dataclass(frozen=True, slots=True)
class _Pending:
    document: Document
    chunks: list[Chunk]
    update: bool


class Ingestor:
    """Writes documents into a collection."""

    def __init__(
        self, store: VectorStore, embedder: Embedder, chunker: Chunker, sparse: SparseEncoder, *, batch_chunks: int = 64
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._chunker = chunker
        self._sparse = sparse
        self._batch_chunks = batch_chunks

    async def ingest(
        self,
        collection: str,
        items: Iterable[Document | DocumentParseError],
        *,
        delete_missing: bool = False,
        tenant: str | None = None,
        progress: Progress | None = None,
    ) -> IngestReport:
        """Ingest ``items`` (documents, or the parse errors of sources that failed) as
        ``tenant`` (None: the operator).

        Raises:
            DocumentOwnershipError: ``tenant`` is not None and ``items`` name documents
                of the collection that someone else wrote; nothing was written.
        """
        started = time.perf_counter()
        report = IngestReport(collection=collection)
        note = progress or (lambda doc_id, outcome: None)
        items = list(items)
        await self._store.ensure_collection(collection, dimensions=self._embedder.dimensions, embedder=self._embedder.name)
        existing = await self._store.documents(collection)
        if tenant is not None:
            others = {
                i.id for i in items if isinstance(i, Document) and i.id in existing and existing[i.id].owner != tenant
            }
            if others:
                raise DocumentOwnershipError(collection, tenant, sorted(others))
        seen: set[str] = set()
        failed_sources: list[str] = []
        pending: list[_Pending] = []

        def fail(source: str, reason: str, doc_id: str | None = None) -> None:
            report.failed += 1
            report.errors.append({"source": source, "reason": reason})
            log.warning("ingest %s: %s", source, reason)
            note(doc_id or source, "failed")

        for item in items:
            if isinstance(item, DocumentParseError):
                failed_sources.append(item.source)
                fail(item.source, item.reason)
                continue
            if item.id in seen:
                fail(item.source or item.id, f"document id {item.id!r} appears twice in this ingestion", item.id)
                continue
            seen.add(item.id)
            stored = existing.get(item.id)
            if stored is not None and stored.version == item.hash and stored.source == item.source:
                report.skipped += 1
                note(item.id, "skipped")
                continue
            chunks = self._chunker.split(item)
            if not chunks:
                fail(item.source or item.id, "no text to index", item.id)
                continue
            pending.append(_Pending(item, chunks, stored is not None))
            if sum(len(p.chunks) for p in pending) >= self._batch_chunks:
                await self._flush(collection, pending, report, tenant, fail, note)
                pending = []
        if pending:
            await self._flush(collection, pending, report, tenant, fail, note)

        if delete_missing:
            for doc_id, stored in existing.items():
                if stored.owner != tenant:
                    continue  # someone else's
                if doc_id in seen or any(same_source(stored.source, s) for s in failed_sources):
                    continue  # still there, or in a source that could not be read this time
                await self._store.delete_document(collection, doc_id)
                report.deleted += 1
                note(doc_id, "deleted")
        report.seconds = round(time.perf_counter() - started, 3)
        return report

    async def _flush(
        self,
        collection: str,
        pending: list[_Pending],
        report: IngestReport,
        tenant: str | None,
        fail: Callable[[str, str, str | None], None],
        note: Progress,
    ) -> None:
        texts = [chunk.text for p in pending for chunk in p.chunks]
        try:
            dense = await self._embedder.embed_documents(texts)
        except KnowledgeError as exc:
            for p in pending:
                fail(p.document.source or p.document.id, f"embedding failed: {exc}", p.document.id)
            return
        offset = 0
        for p in pending:
            vectors = dense[offset : offset + len(p.chunks)]
            offset += len(p.chunks)
            sparse = [self._sparse.document(chunk.text) for chunk in p.chunks]
            try:
                await self._store.write_document(collection, p.document, p.chunks, vectors, sparse, tenant=tenant)
            except Exception as exc:  # boundary: report the document, go on with the others
                fail(p.document.source or p.document.id, f"storing failed: {exc.__class__.__name__}: {exc}", p.document.id)
                continue
            report.chunks += len(p.chunks)
            if p.update:
                report.updated += 1
                note(p.document.id, "updated")
            else:
                report.added += 1
                note(p.document.id, "added")


def same_source(stored: str, failed: str) -> bool:
    """A stored document came from a file that failed to load this time, in whole or
    in one of its records (sources of records are ``file:line``)."""
    return bool(stored) and _file_of(stored) == _file_of(failed)


def _file_of(source: str) -> str:
    return re.sub(r":\d+$", "", source)
