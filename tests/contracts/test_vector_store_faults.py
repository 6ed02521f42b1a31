"""Faults every vector store must survive the same way: many readers racing a
writer, a write cancelled part-way (a client that disconnects), a process killed
mid-write, searches while a large write is in progress, and (Qdrant Edge only, the
one that optimises) closing during a background optimisation. Run on Qdrant Edge and
qdrant-client's local mode, each test in a fresh directory, with the hand-made
vectors of `test_vector_store`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from knowledge.models import Document
from knowledge.vectorstore.base import VectorStore
from knowledge.vectorstore.edge import EdgeStore
from tests.contracts.test_vector_store import (
    C,
    IMPLEMENTATIONS,
    REPO,
    _answers,
    _open,
    _write_some,
    assert_same_answers,
    axis,
    kind,
    make_doc,
    put,
    ready,
    search,
    sp,
    store,
    vec,
)

__all__ = ["kind", "store"]  # fixtures shared with the contract

pytestmark = [pytest.mark.integration]


async def test_readers_racing_a_writer_never_see_a_document_missing(store: VectorStore) -> None:
    """Twenty times the contract's race: 600 replacements against four readers. A search
    that fetches chunks and then reads the registry in two steps can find the chunks
    of the version just replaced and the registry entry of the next one, and so
    nothing at all of a document that was there all along."""
    await ready(store)
    version_a, version_b = make_doc("flip", "A"), make_doc("flip", "B")
    vectors_a = [(vec((0, 1.0), (i + 1, 0.1)), sp((1, 1.0))) for i in range(4)]
    vectors_b = [(vec((0, 1.0), (i + 4, 0.2)), sp((1, 1.0))) for i in range(3)]
    whole = ({f"A #{i}" for i in range(4)}, {f"B #{i}" for i in range(3)})
    await put(store, version_a, vectors_a)

    async def writer() -> None:
        for round_ in range(600):
            await put(store, version_b if round_ % 2 == 0 else version_a, vectors_b if round_ % 2 == 0 else vectors_a)

    seen: list[frozenset[str]] = []

    async def reader() -> None:
        while not writing.done():
            hits = await search(store, dense=axis(0), mode="dense", k=20)
            seen.append(frozenset(h.text for h in hits))
            await asyncio.sleep(0)

    async with asyncio.timeout(300):
        writing = asyncio.create_task(writer())
        await asyncio.gather(writing, *(reader() for _ in range(4)))
    wrong = [sorted(texts) for texts in seen if texts not in whole]
    assert not wrong, f"{len(wrong)} of {len(seen)} searches saw neither whole version: {wrong[:5]}"


async def test_a_cancelled_write_leaves_the_old_version_and_no_orphans(store: VectorStore) -> None:
    await ready(store)
    old = make_doc("d", "old")
    await put(store, old, [(axis(0), sp((1, 1.0)))] * 3)
    vectors = [(vec((0, 1.0), (1, i / 20_000)), sp((1, 1.0))) for i in range(20_000)]
    writing = asyncio.create_task(put(store, make_doc("d", "new"), vectors))
    async with asyncio.timeout(120):
        # Cancel once some of the new version's chunks are written.
        while (await store.collections())[0].chunks <= 3 and not writing.done():
            await asyncio.sleep(0.002)
    assert not writing.done(), "the write finished before it could be cancelled: write more chunks"
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    # A batch that was already running on a worker thread when the write was
    # cancelled must not land after the roll-back and stay behind.
    await asyncio.sleep(2)
    assert (await store.document(C, "d")).version == old.hash  # type: ignore[union-attr]
    assert sorted(h.text for h in await search(store, dense=axis(0), k=50)) == ["old #0", "old #1", "old #2"]
    assert [(c.documents, c.chunks) for c in await store.collections()] == [(1, 3)]
    # The store still takes writes of that document.
    await put(store, make_doc("d", "after"), [(axis(0), sp((1, 1.0)))] * 2)
    assert [(c.documents, c.chunks) for c in await store.collections()] == [(1, 2)]


_KILLED_WRITER = """
import asyncio, os, signal, sys
from pathlib import Path
from tests.contracts.test_vector_store import C, _open, make_doc, put, sp, vec

# Both stores run every engine call through asyncio.to_thread: the process kills
# itself (SIGKILL, no clean-up of any kind) as it starts the 8th call, so a few
# batches of the new version are written and most are not.
real_to_thread, calls = asyncio.to_thread, 0

async def to_thread_then_die(fn, *args, **kwargs):
    global calls
    calls += 1
    if calls == 8:
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return await real_to_thread(fn, *args, **kwargs)

async def main() -> None:
    store = _open(sys.argv[1], Path(sys.argv[2]))
    # Closer to the query than anything live, so a search has to look past them.
    vectors = [(vec((0, 1.0), (2, i / 1e7)), sp((1, 1.0))) for i in range(5_000)]
    asyncio.to_thread = to_thread_then_die
    await put(store, make_doc("d", "new"), vectors)
    print("written", flush=True)

asyncio.run(main())
"""


async def _killed_mid_write(kind: str, tmp_path: Path) -> Document:
    """A store holding ``d`` (3 chunks, returned) and ``other`` (1), then a process
    killed while it wrote a new 5,000-chunk version of ``d``."""
    store = _open(kind, tmp_path)
    await ready(store)
    old = make_doc("d", "old")
    await put(store, old, [(vec((0, 1.0), (1, 0.5)), sp((1, 1.0)))] * 3, tenant="t")
    await put(store, make_doc("other"), [(vec((0, 1.0), (1, 0.6)), sp((1, 1.0)))])
    await store.aclose()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_WRITER, kind, str(tmp_path), cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        output, _ = await child.communicate()
    assert child.returncode == -signal.SIGKILL and output.strip().endswith(b"killing"), output
    return old


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
async def test_a_process_killed_mid_write_reopens_with_the_old_version(kind: str, tmp_path: Path) -> None:
    old = await _killed_mid_write(kind, tmp_path)
    # The directory's lock died with the process; the old version is live.
    store = _open(kind, tmp_path)
    try:
        assert (await store.document(C, "d")).version == old.hash  # type: ignore[union-attr]
        assert (await store.document(C, "other")) is not None
        export = await store.export_document(C, "d")
        assert export is not None and sorted(c.payload["text"] for c in export.chunks) == ["old #0", "old #1", "old #2"]
        orphans = (await store.collections())[0].chunks - 4
        assert orphans > 0, "the kill came before any chunk of the new version was written"
        # What the killed write left is invisible, and the next write of the document
        # removes it.
        await put(store, make_doc("d", "again"), [(axis(0), sp((1, 1.0)))] * 2)
        assert [(c.documents, c.chunks) for c in await store.collections()] == [(2, 3)]
        assert sorted(h.text for h in await search(store, dense=axis(0), k=10)) == ["again #0", "again #1", "text of other #0"]
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
async def test_chunks_a_killed_write_left_do_not_hide_live_ones(kind: str, tmp_path: Path) -> None:
    """The killed write's chunks (about a thousand) are nearer to the query than any
    live chunk; a search must still give the best k live chunks, not fewer."""
    await _killed_mid_write(kind, tmp_path)
    store = _open(kind, tmp_path)
    try:
        for mode in ("dense", "sparse", "hybrid"):
            for k in (4, 100):
                hits = await search(store, dense=axis(0), sparse=sp((1, 1.0)), mode=mode, k=k)  # type: ignore[arg-type]
                assert sorted(h.text for h in hits) == ["old #0", "old #1", "old #2", "text of other #0"], (mode, k)
    finally:
        await store.aclose()


async def test_closing_during_a_background_optimisation_loses_nothing(tmp_path: Path) -> None:
    """Only Qdrant Edge optimises (local mode has nothing to build): its quiet-time job
    starts by itself after enough writes; closing the store while the child process
    works on a copy of the shard must keep every write and leave a directory that
    opens cleanly."""
    store = EdgeStore(path=tmp_path / "vectors", optimize_min_points=50, optimize_delay_s=0.2)
    await ready(store)
    await _write_some(store, 40)
    collection_dir = tmp_path / "vectors" / C
    async with asyncio.timeout(60):
        while not any(".building-" in p.name for p in collection_dir.iterdir()):
            await asyncio.sleep(0.01)
    # The optimiser is at work on its copy: a write now, then close.
    await put(store, make_doc("during"), [(axis(2), sp((3, 1.0)))])
    expected = await store.documents(C)
    answers = await _answers(store)
    await store.aclose()

    store = EdgeStore(path=tmp_path / "vectors")
    try:
        assert await store.documents(C) == expected
        assert "during" in expected
        assert [c.name for c in await store.collections()] == [C]
        assert_same_answers(await _answers(store), answers)
        assert isinstance(await store.optimize(C, force=True), bool)  # the leftovers do not get in the way
        assert_same_answers(await _answers(store), answers)
    finally:
        await store.aclose()


async def test_a_large_write_in_progress_does_not_hide_live_chunks(store: VectorStore) -> None:
    """While a 2,000-chunk version of a document is being written, its chunks (nearer
    to the query than anything live, invisible until the switch) are in the store:
    searches meanwhile must still give k live chunks."""
    await ready(store)
    await put(store, make_doc("d", "old"), [(vec((0, 1.0), (1, 0.5)), sp((1, 1.0)))] * 3)
    await put(store, make_doc("other"), [(vec((0, 1.0), (1, 0.6)), sp((1, 1.0)))])
    vectors = [(vec((0, 1.0), (2, i / 1e7)), sp((1, 1.0))) for i in range(2_000)]
    short: list[tuple[str, int]] = []
    searches = 0
    async with asyncio.timeout(300):
        writing = asyncio.create_task(put(store, make_doc("d", "new"), vectors))
        while not writing.done():
            for mode in ("dense", "sparse", "hybrid"):
                hits = await search(store, dense=axis(0), sparse=sp((1, 1.0)), mode=mode, k=4)  # type: ignore[arg-type]
                searches += 1
                if len(hits) != 4:
                    short.append((mode, len(hits)))
            await asyncio.sleep(0)
        await writing
    assert searches >= 3
    assert not short, f"{len(short)} of {searches} searches gave fewer than k=4 hits: {short[:5]}"
