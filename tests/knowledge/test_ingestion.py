"""Ingestion and search on both real vector stores with the real packaged embedder:
idempotency, updates that never show a mix, a failure half-way through a document,
deleting missing documents, filters, Chinese, and bad input."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace
from pathlib import Path

import pytest

from knowledge import (
    Document,
    KnowledgeBase,
    KnowledgeError,
    KnowledgeSettings,
    SearchFilter,
    UnknownCollectionError,
)
from knowledge.cli import _items
from knowledge.embeddings.local import LocalEmbedder
from knowledge.errors import InvalidCollectionNameError
from knowledge.vectorstore._points import WRITE_BATCH as _WRITE_BATCH
from knowledge.vectorstore.base import VectorStore

from tests.knowledge.conftest import CORPUS, stored_chunks

pytestmark = pytest.mark.integration


def _points(store: VectorStore, collection: str) -> list[SimpleNamespace]:
    return stored_chunks(store, collection)


async def test_ingesting_twice_changes_nothing(knowledge: KnowledgeBase, store: VectorStore) -> None:
    first = await knowledge.ingest("corpus", _items([CORPUS]))
    assert (first.added, first.updated, first.skipped, first.failed) == (25, 0, 0, 0)
    points = _points(store, "corpus")
    assert len(points) == first.chunks
    second = await knowledge.ingest("corpus", _items([CORPUS]))
    assert (second.added, second.updated, second.skipped, second.chunks) == (0, 0, 25, 0)
    again = _points(store, "corpus")
    assert sorted(str(p.id) for p in again) == sorted(str(p.id) for p in points)  # no duplicates
    assert len({p.payload["chunk_id"] for p in again}) == len(again)
    [info] = await knowledge.collections()
    assert (info.name, info.documents, info.chunks, info.embedder) == ("corpus", 25, first.chunks, "use-multilingual-v3")


async def test_an_edited_document_replaces_its_old_chunks(knowledge: KnowledgeBase, store: VectorStore, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(CORPUS, source)
    await knowledge.ingest("c", _items([source]))
    before = {p.payload["version"] for p in _points(store, "c") if p.payload["doc_id"] == "08-brannock-bakery.md"}
    page = source / "08-brannock-bakery.md"
    page.write_text(page.read_text() + "\n\n## Winter menu\n\nThe bakery sells quinceberry buns every December.\n")
    report = await knowledge.ingest("c", _items([source]))
    assert (report.updated, report.skipped) == (1, 24)
    chunks = [p for p in _points(store, "c") if p.payload["doc_id"] == "08-brannock-bakery.md"]
    assert {p.payload["version"] for p in chunks}.isdisjoint(before)  # none of the old chunks is left
    hits = await knowledge.search("c", "quinceberry buns", k=1, mode="sparse")
    assert hits[0].doc_id == "08-brannock-bakery.md"


class _FailingEmbedder:
    """FAKE for failure injection: the real embedder, but every vector after the first
    ``good`` ones has the wrong size, so Qdrant refuses the write part-way through."""

    def __init__(self, real: LocalEmbedder, good: int) -> None:
        self._real, self._good = real, good
        self.name, self.count_tokens = real.name, real.count_tokens

    @property
    def dimensions(self) -> int:
        return self._real.dimensions

    async def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = await self._real.embed_documents(texts)
        return [v if i < self._good else v[:7] for i, v in enumerate(vectors)]

    async def embed_query(self, text: str) -> list[float]:
        return await self._real.embed_query(text)

    async def aclose(self) -> None:
        pass


async def test_a_failure_half_way_keeps_the_previous_version_and_leaves_no_orphans(
    store: VectorStore, embedder: LocalEmbedder
) -> None:
    settings = KnowledgeSettings()
    good = KnowledgeBase(store, embedder, settings)
    # Enough chunks for several write batches: the first batches land, a later one fails.
    long_text = "\n\n".join(f"Paragraph {i}: the Verrin lighthouse lamp number {i} burns whale-free oil." for i in range(2400))
    await good.ingest("c", [Document(id="lamps", text=long_text)])
    live = _points(store, "c")
    assert len(live) > _WRITE_BATCH + 10
    broken = KnowledgeBase(store, _FailingEmbedder(embedder, good=_WRITE_BATCH + 5), settings)  # type: ignore[arg-type]
    report = await broken.ingest("c", [Document(id="lamps", text=long_text + "\n\nA new closing paragraph.")])
    assert report.failed == 1 and "storing failed" in report.errors[0]["reason"]
    assert sorted(str(p.id) for p in _points(store, "c")) == sorted(str(p.id) for p in live)  # no orphans
    hits = await good.search("c", "lighthouse lamp number 42", k=3)
    assert hits and all(h.doc_id == "lamps" for h in hits)


async def test_delete_missing_removes_what_the_source_lost(knowledge: KnowledgeBase, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(CORPUS, source)
    await knowledge.ingest("c", _items([source]))
    (source / "02-tram-network.md").unlink()
    (source / "docs.jsonl").write_text("this file is now broken\n")  # its records must not be deleted
    report = await knowledge.ingest("c", _items([source]), delete_missing=True)
    assert report.deleted == 1 and report.failed == 1
    stored = await knowledge.store.documents("c")
    assert "02-tram-network.md" not in stored and {"faq-001", "faq-002", "faq-003"} <= set(stored)
    assert await knowledge.delete("c", "01-harbor-tides.md") is True
    assert await knowledge.delete("c", "01-harbor-tides.md") is False
    assert all(h.doc_id != "01-harbor-tides.md" for h in await knowledge.search("c", "Verrin Harbor tides", k=10))


async def test_filters_and_modes(knowledge: KnowledgeBase) -> None:
    docs = [
        Document(id="a", text="Ferries leave the north pier at dawn.", metadata={"tags": ["ferry", "north"]}),
        Document(id="b", text="Ferries leave the south pier at dusk.", metadata={"tags": ["ferry", "south"]}),
        Document(id="c", text="The museum opens at ten.", metadata={"tags": ["museum"], "lang": "en"}),
    ]
    await knowledge.ingest("f", docs, tenant="acme")
    south = await knowledge.search("f", "When do ferries leave?", where=SearchFilter(tags=["south"]))
    assert [h.doc_id for h in south] == ["b"]
    only = await knowledge.search("f", "ferries", where=SearchFilter(doc_ids=["a", "c"]))
    assert {h.doc_id for h in only} <= {"a", "c"} and only[0].doc_id == "a"
    assert [h.doc_id for h in await knowledge.search("f", "opens", where=SearchFilter(metadata={"lang": "en"}))] == ["c"]
    assert await knowledge.search("f", "ferries", where=SearchFilter(tenant="globex")) == []
    for mode in ("dense", "sparse", "hybrid"):
        hits = await knowledge.search("f", "museum opening hours", mode=mode, k=1)  # type: ignore[arg-type]
        assert hits[0].doc_id == "c" and hits[0].relevance is not None


async def test_a_chinese_question_finds_the_chinese_document(knowledge: KnowledgeBase) -> None:
    await knowledge.ingest("corpus", _items([CORPUS]))
    questions = [json.loads(line) for line in (CORPUS.parent / "corpus-questions.jsonl").read_text().splitlines()]
    chinese = [q for q in questions if q["lang"] == "zh" and q["doc"]]
    found = 0
    for question in chinese:
        hits = await knowledge.search("corpus", question["q"], k=3)
        found += hits[0].doc_id == question["doc"]
        assert question["doc"] in {h.doc_id for h in hits}, question
    assert found >= len(chinese) - 1


async def test_bad_input_is_named(knowledge: KnowledgeBase) -> None:
    with pytest.raises(UnknownCollectionError, match="unknown collection 'nope'"):
        await knowledge.search("nope", "anything")
    await knowledge.ingest("real", [Document(id="x", text="text")])
    with pytest.raises(UnknownCollectionError, match=r"collections: real"):
        await knowledge.search("nope", "anything")
    with pytest.raises(KnowledgeError, match="the query is empty"):
        await knowledge.search("real", "   ")
    with pytest.raises(InvalidCollectionNameError):
        await knowledge.ingest("bad name!", [])
