"""Knowledge fixtures: the real packaged embedder (loaded once) and a vector store in
each test's own directory, once per implementation: Qdrant Edge (the embedded
default) and qdrant-client's local mode (which runs the Qdrant-server code here)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import qdrant_edge as qe

from knowledge import KnowledgeBase, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.vectorstore.base import VectorStore
from knowledge.vectorstore.edge import EdgeStore
from knowledge.vectorstore.qdrant import QdrantStore

CORPUS = Path(__file__).resolve().parents[2] / "eval" / "datasets" / "corpus"


@pytest.fixture(scope="session")
def embedder() -> Iterator[LocalEmbedder]:
    yield LocalEmbedder.packaged("use-multilingual-v3")


@pytest.fixture(params=["edge", "qdrant-local"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    opened: VectorStore = EdgeStore(tmp_path / "vectors") if request.param == "edge" else QdrantStore(path=tmp_path / "qdrant")
    yield opened
    await opened.aclose()


@pytest.fixture
def knowledge(store: VectorStore, embedder: LocalEmbedder) -> KnowledgeBase:
    return KnowledgeBase(store, embedder, KnowledgeSettings())


def stored_chunks(store: VectorStore, collection: str) -> list[SimpleNamespace]:
    """Every chunk point the store holds for ``collection`` (``id``, ``payload``),
    including those no search would show: counting what is really stored."""
    if isinstance(store, QdrantStore):
        assert store._local is not None  # noqa: SLF001
        records, _ = store._local.scroll(collection, limit=100_000, with_payload=True)  # noqa: SLF001
    else:
        assert isinstance(store, EdgeStore)
        shard = store._collections[collection].live.shard  # noqa: SLF001
        kind = qe.FieldCondition(key="kind", match=qe.MatchValue("chunk"))
        records, _ = shard.scroll(qe.ScrollRequest(limit=100_000, filter=qe.Filter(must=[kind]), with_payload=True))
    return [SimpleNamespace(id=str(r.id), payload=r.payload) for r in records]
