"""What only the Qdrant Edge store does: a process killed mid-ingest (the write-ahead
log), optimisation in a child process swapped in under readers and writers, what a
killed optimisation leaves behind, and migrating a collection from local mode.

The behaviour every store shares is in tests/contracts/test_vector_store.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knowledge import Document, KnowledgeBase, KnowledgeError, KnowledgeSettings, StoreLockedError
from knowledge.cli import _items
from knowledge.embeddings.local import LocalEmbedder
from knowledge.models import Chunk
from knowledge.vectorstore.edge import EdgeStore
from knowledge.vectorstore.qdrant import QdrantStore

from tests.knowledge.conftest import CORPUS, stored_chunks

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DIMENSIONS = 64


def _vectors(seed: int, count: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)] for _ in range(count)]


async def _write(store: EdgeStore, doc_id: str, text: str, chunks: int, *, seed: int) -> Document:
    document = Document(id=doc_id, text=text)
    await store.write_document(
        "c",
        document,
        [Chunk(doc_id=doc_id, index=i, text=f"{text} {i}") for i in range(chunks)],
        _vectors(seed, chunks),
        [([i + 1, seed % 1000 + 2000], [1.0, 1.0]) for i in range(chunks)],
    )
    return document


_CRASHING_WRITER = """
import asyncio, sys, random, time
from pathlib import Path
import qdrant_edge as qe
from knowledge.models import Chunk, Document
from knowledge.vectorstore.edge import EdgeStore
from knowledge.vectorstore._points import chunk_payload, chunk_point_id
from knowledge.vectorstore import edge

def vectors(seed, n):
    rng = random.Random(seed)
    return [[rng.gauss(0, 1) for _ in range(64)] for _ in range(n)]

async def main():
    store = EdgeStore(Path(sys.argv[1]), optimize_delay_s=None)
    await store.ensure_collection("c", dimensions=64, embedder="fake")
    for i in range(10):
        doc = Document(id=f"doc-{i}", text=f"first {i}")
        await store.write_document("c", doc, [Chunk(doc_id=doc.id, index=j, text="x") for j in range(30)],
                                   vectors(i, 30), [([j + 1], [1.0]) for j in range(30)])
    # The new version of doc-3: its chunks are upserted, then the process dies before
    # the registry switches (as if killed between the two steps).
    new = Document(id="doc-3", text="second 3")
    collection = await store._open("c")
    points = [qe.Point(id=chunk_point_id(new.id, new.hash, j),
                       vector={"dense": v, "sparse": qe.SparseVector(indices=[j + 1], values=[1.0])},
                       payload=edge._chunk_point_payload(chunk_payload(new, Chunk(doc_id=new.id, index=j, text="y"), tenant=None)))
              for j, v in enumerate(vectors(99, 40))]
    await store._run(collection, lambda s: s.update(qe.UpdateOperation.upsert_points(points)))
    print("half-written", new.hash, flush=True)
    time.sleep(60)

asyncio.run(main())
"""


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = data_dir.parent / "switchyard.yaml"
    config.write_text(json.dumps({"data_dir": str(data_dir)}))
    return subprocess.run(
        [sys.executable, "-m", "serving.cli", "--config", str(config), *args],
        capture_output=True, text=True, env=_child_env(), cwd=ROOT, timeout=300, check=False,
    )


async def test_a_process_killed_mid_ingest_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Nothing was flushed: the reopened store has every acknowledged write from the
    write-ahead log, the half-written version is invisible, and the next write of that
    document removes its chunks."""
    path = tmp_path / "vectors"
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=_child_env(), cwd=ROOT
    )
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("half-written"), line
        half_version = line.split()[1]
        with pytest.raises(StoreLockedError):
            EdgeStore(path)  # still held by the writer
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    store = EdgeStore(path, optimize_delay_s=None)
    try:
        documents = await store.documents("c")
        assert sorted(documents) == [f"doc-{i}" for i in range(10)]
        assert documents["doc-3"].version == Document(id="doc-3", text="first 3").hash
        hits = await store.search("c", dense=_vectors(99, 1)[0], sparse=([1], [1.0]), mode="hybrid", k=50, candidates=100)
        assert hits and all(h.doc_id != "doc-3" or h.text == "x" for h in hits)  # never the half-written version
        orphans = [p for p in stored_chunks(store, "c") if p.payload["version"] == half_version]
        assert len(orphans) == 40  # still on disk, invisible
        await _write(store, "doc-3", "third 3", 5, seed=7)
        left = [p for p in stored_chunks(store, "c") if p.payload["doc_id"] == "doc-3"]
        assert len(left) == 5 and {p.payload["version"] for p in left} == {Document(id="doc-3", text="third 3").hash}
        [info] = await store.collections()
        assert (info.documents, info.chunks) == (10, 9 * 30 + 5)
    finally:
        await store.aclose()


async def test_optimisation_swaps_in_a_new_shard_under_readers_and_writers(tmp_path: Path) -> None:
    """Writes made while the child process optimises the copy are copied over before
    the swap; searches run throughout without an error or a mixed document; the old
    shard's directory is removed."""
    store = EdgeStore(tmp_path / "vectors", optimize_min_points=100, optimize_delay_s=None)
    try:
        await store.ensure_collection("c", dimensions=DIMENSIONS, embedder="fake")
        for i in range(60):
            await _write(store, f"doc-{i}", f"first {i}", 20, seed=i)
        query = _vectors(12345, 1)[0]
        before = await store.search("c", dense=query, sparse=None, mode="dense", k=10, candidates=40)
        errors: list[BaseException] = []
        searches = 0
        stop = asyncio.Event()

        async def reader() -> None:
            nonlocal searches
            while not stop.is_set():
                try:
                    hits = await store.search("c", dense=query, sparse=([3], [1.0]), mode="hybrid", k=10, candidates=40)
                    assert len(hits) == 10
                    searches += 1
                except BaseException as exc:  # noqa: BLE001 - collected and asserted on below
                    errors.append(exc)
                await asyncio.sleep(0.002)

        readers = [asyncio.create_task(reader()) for _ in range(3)]
        collection = store._collections["c"]  # noqa: SLF001
        old_shard = collection.live.path
        optimizing = asyncio.create_task(store.optimize("c", force=True))
        while collection.dirty is None:  # the copy is taken; the child is optimising it
            await asyncio.sleep(0.001)
        assert not optimizing.done()
        changed = await _write(store, "doc-5", "changed 5", 7, seed=500)
        added = await _write(store, "doc-new", "new", 4, seed=501)
        assert await store.delete_document("c", "doc-9")
        assert collection.dirty == {"doc-5", "doc-new", "doc-9"}  # still the copy's turn
        await optimizing
        stop.set()
        await asyncio.gather(*readers)
        assert errors == [] and searches > 0
        assert collection.live.path != old_shard and not old_shard.exists()
        meta = json.loads((tmp_path / "vectors" / "c" / "collection.json").read_text())
        assert meta["shard"] == collection.live.path.name
        documents = await store.documents("c")
        assert documents["doc-5"].version == changed.hash and documents["doc-new"].version == added.hash
        assert "doc-9" not in documents and len(documents) == 60
        points = stored_chunks(store, "c")
        assert len([p for p in points if p.payload["doc_id"] == "doc-5"]) == 7
        assert not [p for p in points if p.payload["doc_id"] == "doc-9"]
        # Dense scores have no ties (the sparse term is in one chunk of every document).
        after = await store.search("c", dense=query, sparse=None, mode="dense", k=10, candidates=40)
        unchanged = {"doc-5", "doc-9"}
        assert [h.chunk_id for h in after if h.doc_id not in unchanged][:5] == [
            h.chunk_id for h in before if h.doc_id not in unchanged
        ][:5]
    finally:
        await store.aclose()
    reopened = EdgeStore(tmp_path / "vectors")
    try:
        assert len(await reopened.documents("c")) == 60
    finally:
        await reopened.aclose()


async def test_optimisation_starts_by_itself_after_a_quiet_time(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "vectors", optimize_min_points=50, optimize_delay_s=0.2)
    try:
        await store.ensure_collection("c", dimensions=DIMENSIONS, embedder="fake")
        await _write(store, "small", "small", 10, seed=1)  # under the threshold: only a flush
        await asyncio.sleep(0.5)
        collection = store._collections["c"]  # noqa: SLF001
        assert collection.background is not None and collection.background.done()
        assert collection.live.path.name == "shard-000001" and collection.pending == 10
        for i in range(5):
            await _write(store, f"doc-{i}", f"text {i}", 20, seed=i)
        deadline = time.monotonic() + 60
        while collection.live.path.name == "shard-000001" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert collection.live.path.name == "shard-000002" and collection.pending == 0
        assert len(await store.documents("c")) == 6
    finally:
        await store.aclose()


_CRASHING_OPTIMISER = """
import asyncio, random, sys
from pathlib import Path
from knowledge.models import Chunk, Document
from knowledge.vectorstore.edge import EdgeStore

async def main():
    store = EdgeStore(Path(sys.argv[1]), optimize_delay_s=None)
    await store.ensure_collection("c", dimensions=64, embedder="fake")
    rng = random.Random(0)
    for i in range(40):
        doc = Document(id=f"doc-{i}", text=f"text {i}")
        await store.write_document("c", doc, [Chunk(doc_id=doc.id, index=j, text="x") for j in range(25)],
                                   [[rng.gauss(0, 1) for _ in range(64)] for _ in range(25)], [([j + 1], [1.0]) for j in range(25)])
    print("written", flush=True)
    await store.optimize("c", force=True)

asyncio.run(main())
"""


async def test_a_killed_optimisation_leaves_the_live_shard_and_is_cleaned_up(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_OPTIMISER, str(path)],
        stdout=subprocess.PIPE, text=True, env=_child_env(), cwd=ROOT, start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "written"
        deadline = time.monotonic() + 30
        while not list((path / "c").glob("*.building-*")) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert list((path / "c").glob("*.building-*")), "the optimisation never copied the shard"
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the server and its optimiser child
        child.wait()
    store = EdgeStore(path)
    try:
        assert sorted(p.name for p in (path / "c").iterdir()) == ["collection.json", "shard-000001"]
        assert len(await store.documents("c")) == 40
        [info] = await store.collections()
        assert info.chunks == 40 * 25
    finally:
        await store.aclose()


async def test_leftovers_of_a_crashed_creation_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    (path / ".creating-c-1234abcd" / "shard-000001").mkdir(parents=True)
    store = EdgeStore(path)
    try:
        assert not (path / ".creating-c-1234abcd").exists()
        assert await store.collections() == []
        await store.ensure_collection("c", dimensions=4, embedder="fake")
        assert [c.name for c in await store.collections()] == ["c"]
    finally:
        await store.aclose()


async def test_migrate_copies_a_local_mode_collection_without_embedding_again(
    tmp_path: Path, embedder: LocalEmbedder
) -> None:
    """The real CLI: a collection an earlier version stored in <data_dir>/qdrant is copied
    into the Edge store; searches answer the same; a second run copies nothing."""
    data_dir = tmp_path / "data"
    legacy = KnowledgeBase(QdrantStore(path=data_dir / "qdrant"), embedder, KnowledgeSettings())
    await legacy.ingest("corpus", _items([CORPUS]), tenant="acme")
    question = "When does the Saltmarsh ferry leave?"
    expected = [h.chunk_id for h in await legacy.search("corpus", question, k=5)]
    await legacy.store.aclose()
    migrated = _cli(data_dir, "knowledge", "migrate", "--collection", "corpus", "--json")
    assert migrated.returncode == 0, migrated.stderr
    report = json.loads(migrated.stdout)
    assert (report["copied"], report["skipped"], report["documents"]) == (25, 0, 25) and report["chunks"] > 25
    found = _cli(data_dir, "search", question, "--collection", "corpus", "-k", "5", "--json")
    assert found.returncode == 0, found.stderr
    assert [h["chunk_id"] for h in json.loads(found.stdout)["results"]] == expected
    again = _cli(data_dir, "knowledge", "migrate", "--collection", "corpus", "--json")
    assert again.returncode == 0 and (json.loads(again.stdout)["copied"], json.loads(again.stdout)["skipped"]) == (0, 25)
    store = EdgeStore(data_dir / "vectors")
    try:
        assert {d.owner for d in (await store.documents("corpus")).values()} == {"acme"}
    finally:
        await store.aclose()
    unknown = _cli(data_dir, "knowledge", "migrate", "--collection", "nope")
    assert unknown.returncode == 1 and "unknown collection 'nope'" in unknown.stderr and "corpus" in unknown.stderr


async def test_migrate_refuses_a_collection_of_another_embedder(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    legacy = QdrantStore(path=data_dir / "qdrant")
    await legacy.ensure_collection("old", dimensions=384, embedder="all-MiniLM-L6-v2")
    await legacy.aclose()
    refused = _cli(data_dir, "knowledge", "migrate", "--collection", "old")
    assert refused.returncode == 1
    assert "all-MiniLM-L6-v2" in refused.stderr and "re-ingest" in refused.stderr
    assert not (data_dir / "vectors" / "old").exists()
    missing = _cli(data_dir, "knowledge", "migrate", "--collection", "old", "--from", str(tmp_path / "none"))
    assert missing.returncode == 1 and "no earlier vector store" in missing.stderr


async def test_an_optimisation_asked_for_while_one_runs_is_not_done_twice(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "vectors", optimize_min_points=50, optimize_delay_s=None)
    try:
        await store.ensure_collection("c", dimensions=DIMENSIONS, embedder="fake")
        for i in range(5):
            await _write(store, f"doc-{i}", f"text {i}", 20, seed=i)
        first, second = await asyncio.gather(store.optimize("c"), store.optimize("c"))
        assert (first, second) == (True, False)
        assert store._collections["c"].live.path.name == "shard-000002"  # noqa: SLF001
        meta = json.loads((tmp_path / "vectors" / "c" / "collection.json").read_text())
        assert meta["pending"] == 0 and meta["shard"] == "shard-000002"
    finally:
        await store.aclose()
    reopened = EdgeStore(tmp_path / "vectors", optimize_min_points=50, optimize_delay_s=None)
    try:
        assert await reopened.optimize("c") is False  # nothing written since: no second copy
    finally:
        await reopened.aclose()


async def test_an_unreadable_collection_does_not_keep_the_others_from_serving(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    store = EdgeStore(path)
    await store.ensure_collection("good", dimensions=4, embedder="fake")
    await store.ensure_collection("bad", dimensions=4, embedder="fake")
    await store.aclose()
    (path / "bad" / "collection.json").write_text("{not json")
    (path / ".creating-x-0000").mkdir()
    (path / ".creating-x-0000" / "collection.json").write_text("{}")
    store = EdgeStore(path)
    try:
        assert await store.has_collection("good")
        with pytest.raises(KnowledgeError, match="bad"):
            await store.documents("bad")
        assert [c.name for c in await store.collections()] == ["good"]  # the bad one is logged, not listed
    finally:
        await store.aclose()
