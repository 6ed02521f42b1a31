"""Copy a collection from one vector store to another, vectors and all.

Used by ``switchyard knowledge migrate`` to bring collections stored by earlier
versions (qdrant-client's local mode in ``<data_dir>/qdrant``) into the embedded
Qdrant Edge store, without embedding anything again. Works between any two
`VectorStore` implementations (a Qdrant server included), since both keep the same
points.

Each document is copied with `VectorStore.import_document`, so it switches atomically
in the target, keeping its version, owner and chunk ids. A document the target
already holds at the same version is skipped: a migration that stopped half way is
finished by running it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from knowledge.errors import KnowledgeError, UnknownCollectionError
from knowledge.vectorstore.base import VectorStore, valid_collection_name

__all__ = ["MigrationReport", "migrate_collection"]


@dataclass(slots=True, kw_only=True)
class MigrationReport:
    collection: str
    copied: int = 0
    """Documents written to the target."""
    skipped: int = 0
    """Documents the target already held at the same version."""
    chunks: int = 0
    """Chunks written to the target."""
    documents: int = 0
    """Documents the collection has in the target afterwards."""
    seconds: float = 0.0


async def migrate_collection(
    source: VectorStore,
    target: VectorStore,
    collection: str,
    *,
    embedder: str | None = None,
    dimensions: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Copy ``collection`` from ``source`` to ``target``.

    Args:
        embedder, dimensions: the embedder the target will be searched with; a
            collection built by another is refused (its vectors would not compare).
        progress: called with each document id once it is copied or skipped.

    Raises:
        UnknownCollectionError: ``source`` has no such collection.
        KnowledgeError: another embedder built it, or the target's collection was
            built by another embedder, or the counts do not agree afterwards.
    """
    valid_collection_name(collection)
    started = time.perf_counter()
    described = {c.name: c for c in await source.collections()}
    info = described.get(collection)
    if info is None:
        raise UnknownCollectionError(collection, sorted(described))
    if embedder is not None and (info.embedder != embedder or (dimensions is not None and info.dimensions != dimensions)):
        raise KnowledgeError(
            f"collection {collection!r} in {getattr(source, 'location', 'the source')} holds vectors of {info.embedder!r} "
            f"({info.dimensions} dimensions), but the configured embedder is {embedder!r} ({dimensions}): its vectors "
            "cannot be searched with it; re-ingest the documents instead (`switchyard ingest`)"
        )
    await target.ensure_collection(collection, dimensions=info.dimensions, embedder=info.embedder)
    report = MigrationReport(collection=collection)
    present = await target.documents(collection)
    wanted = await source.documents(collection)
    async for export in source.export_documents(collection):
        entry = export.entry
        held = present.get(entry.doc_id)
        if held is not None and held.version == entry.version and held.owner == entry.owner:
            report.skipped += 1
        else:
            await target.import_document(collection, export)
            report.copied += 1
            report.chunks += len(export.chunks)
        if progress is not None:
            progress(entry.doc_id)
    after = await target.documents(collection)
    missing = sorted(set(wanted) - set(after))
    if missing:
        raise KnowledgeError(f"after copying, {len(missing)} documents are missing from the target, e.g. {missing[:5]}")
    report.documents = len(after)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
