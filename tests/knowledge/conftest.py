"""Knowledge fixtures: the real packaged embedder (loaded once) and a Qdrant local-mode
store in each test's own directory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from knowledge import KnowledgeBase, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.vectorstore.qdrant import QdrantStore

CORPUS = Path(__file__).resolve().parents[2] / "eval" / "datasets" / "corpus"


@pytest.fixture(scope="session")
def embedder() -> Iterator[LocalEmbedder]:
    yield LocalEmbedder.packaged("use-multilingual-v3")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[QdrantStore]:
    store = QdrantStore(path=tmp_path / "qdrant")
    yield store
    await store.aclose()


@pytest.fixture
def knowledge(store: QdrantStore, embedder: LocalEmbedder) -> KnowledgeBase:
    return KnowledgeBase(store, embedder, KnowledgeSettings())
