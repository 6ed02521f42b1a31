"""The thread store and its checkpointer under concurrency, cancellation and storage
faults, on SQLite and a real PostgreSQL (issue 10).

Each failure is injected for real: another connection holding SQLite's write lock or a
PostgreSQL row lock, backends terminated with ``pg_terminate_backend``, tasks cancelled
in the middle of a transaction, a writer process killed with SIGKILL. The rule checked
every time: a fault is an error for the call it hit, and the next call works.

Run as ``python -m tests.contracts.test_thread_store_faults write-forever DIR`` this
module is the writer process the kill test starts.
"""

from __future__ import annotations

import asyncio
import operator
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from serving.persistence import ThreadSettings, open_thread_stores
from serving.threads import SqliteWriter, ThreadStoreError, ThreadStoreTimeoutError

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


class _State(TypedDict):
    steps: Annotated[list[str], operator.add]


def _graph(checkpointer: Any) -> Any:
    """Two nodes, so a run writes several checkpoints and can be cut between them."""

    async def first(state: _State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"steps": ["a"]}

    async def second(state: _State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"steps": ["b"]}

    builder = StateGraph(_State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=checkpointer)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _settings(kind: str, request: pytest.FixtureRequest, **values: Any) -> ThreadSettings:
    if kind == "postgres":
        values["postgres_dsn"] = request.getfixturevalue("postgres_dsn")
    return ThreadSettings(**values)


@pytest.fixture(params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _sqlite_file(tmp_path: Path) -> Path:
    return tmp_path / "threads.sqlite"


def _write_lock_is_free(path: Path) -> bool:
    """Whether another connection gets the write lock within a second (call it in a
    thread: a write holding the lock needs the event loop to finish): no transaction
    was left open (a write still running, e.g. a cancelled run's last checkpoint, ends
    well before that)."""
    other = sqlite3.connect(path, timeout=1, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


# --- many concurrent writers, some cancelled --------------------------------------------


async def test_concurrent_threads_and_runs_with_cancellations(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """200 clients create a thread, mark it busy, merge metadata, run a graph on it and
    mark it idle, all at once; a quarter are cancelled at a random moment. Afterwards:
    no error but the cancellations, every thread readable and consistent with the calls
    that were made, a fresh sequential client works, and (after a restart) threads
    cancelled mid-run are recovered."""
    settings = _settings(kind, request)
    stores = await open_thread_stores(settings, tmp_path)
    threads, graph = stores.threads, _graph(stores.checkpointer)
    rng = random.Random(10)
    called: dict[str, list[str]] = {}

    async def client(index: int) -> None:
        thread_id = f"t-{index}"
        steps = called[thread_id] = []
        steps.append("create")
        await threads.create(tenant="a", thread_id=thread_id, metadata={"index": index})
        steps.append("busy")
        await threads.update(thread_id, status="busy", graph_id="g")
        steps.append("metadata")
        await threads.set_metadata(thread_id, {"graph_id": "g", f"k{index % 3}": index})
        if index % 7 == 0:
            await threads.search(tenant="a", metadata={"graph_id": "g"}, limit=5)
        steps.append("run")
        await graph.ainvoke({"steps": []}, _config(thread_id))
        steps.append("idle")
        await threads.update(thread_id, status="idle")
        steps.append("done")

    loop = asyncio.get_running_loop()
    tasks = []
    for index in range(200):
        task = asyncio.create_task(client(index))
        if rng.random() < 0.25:
            loop.call_later(rng.uniform(0, 0.3), task.cancel)
        tasks.append(task)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    assert errors == []
    cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
    assert 0 < cancelled < 200

    # A fresh sequential client works at once.
    record, created = await threads.create(tenant="a", thread_id="fresh", metadata={"k": "v"})
    assert created and record is not None
    await threads.update("fresh", status="busy")
    await threads.set_metadata("fresh", {"more": 1})
    assert (await graph.ainvoke({"steps": []}, _config("fresh")))["steps"] == ["a", "b"]
    await threads.update("fresh", status="idle")
    stored = await threads.get("fresh", tenant="a")
    assert stored is not None and stored.status == "idle" and stored.metadata == {"k": "v", "more": 1}
    await stores.aclose()  # waits for the writes of cancelled clients
    if kind == "sqlite":
        path = _sqlite_file(tmp_path)
        assert await asyncio.to_thread(_write_lock_is_free, path)
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    # Restart on the same data: every record consistent with the calls made.
    stores = await open_thread_stores(settings, tmp_path)
    try:
        threads, graph = stores.threads, _graph(stores.checkpointer)
        left_busy = 0
        for thread_id, steps in called.items():
            index = int(thread_id.split("-")[1])
            record = await threads.get(thread_id, tenant="a")
            assert record is not None, thread_id  # a write that began completes
            assert record.status == "idle"
            assert record.metadata["index"] == index
            if "busy" in steps:
                assert record.graph_id == "g"
            if "metadata" in steps:
                assert record.metadata == {"index": index, "graph_id": "g", f"k{index % 3}": index}
            if "busy" in steps and "idle" not in steps:
                left_busy += 1
            state = await graph.aget_state(_config(thread_id))
            done = state.values.get("steps", [])
            assert done in ([], ["a"], ["a", "b"]), (thread_id, done)
            if "idle" in steps:
                assert done == ["a", "b"]
                history = [snapshot async for snapshot in graph.aget_state_history(_config(thread_id))]
                assert [len(h.values.get("steps", [])) for h in history][:3] == [2, 1, 0]
        assert stores.recovered == left_busy
        assert len(await threads.search(tenant="a", limit=1000)) == len(called) + 1
    finally:
        await stores.aclose()


# --- cancellation in the middle of a transaction (SQLite, deterministic) ------------------


class _InsideTransaction:
    """Stops the SQLite worker inside the next write transaction it runs on
    ``connection``, at the first statement after ``BEGIN IMMEDIATE`` (a trace callback,
    installed once: it runs on the worker thread), until `cancel` has cancelled the
    caller; so the caller is cancelled between the write's statements and its commit,
    every time."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self._armed = False
        self._inside = threading.Event()
        self._resume = threading.Event()
        connection.set_trace_callback(self._trace)

    def _trace(self, statement: str) -> None:
        if self._armed and self._connection.in_transaction and not statement.startswith("BEGIN"):
            self._armed = False
            self._inside.set()
            self._resume.wait(5)

    async def cancel(self, coroutine: Any) -> None:
        """Start ``coroutine``, cancel it once its transaction is open, then let the
        worker go on."""
        self._inside.clear()
        self._resume.clear()
        self._armed = True
        task = asyncio.ensure_future(coroutine)
        try:
            assert await asyncio.to_thread(self._inside.wait, 5), "no write transaction began"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            self._armed = False
            self._resume.set()


async def test_sqlite_writes_cancelled_mid_transaction_complete(tmp_path: Path) -> None:
    """Before: a store write cancelled between its ``execute`` and ``commit`` kept the
    write lock, so the checkpointer's next write failed ("database is locked") and its
    connection stayed broken; a checkpointer write cancelled the same way did the same
    to the store. Now the write completes, no transaction stays open, and every later
    call works."""
    stores = await open_thread_stores(ThreadSettings(), tmp_path)
    try:
        threads, checkpointer = stores.threads, stores.checkpointer
        connection = checkpointer.conn  # type: ignore[attr-defined] # the one shared connection
        inside = _InsideTransaction(connection)
        graph = _graph(checkpointer)
        record, _ = await threads.create(tenant="a", metadata={"k": 1})
        assert record is not None

        await inside.cancel(threads.update(record.thread_id, status="busy"))
        stored = await threads.get(record.thread_id, tenant="a")
        assert stored is not None and stored.status == "busy"
        await inside.cancel(threads.set_metadata(record.thread_id, {"m": 2}))
        await inside.cancel(threads.create(tenant="a", thread_id="cancelled-create"))
        assert await threads.get("cancelled-create", tenant="a") is not None
        await inside.cancel(graph.ainvoke({"steps": []}, _config("run")))
        await inside.cancel(checkpointer.adelete_thread("nothing"))
        await threads.ping()
        assert await asyncio.to_thread(_write_lock_is_free, _sqlite_file(tmp_path))

        assert (await graph.ainvoke({"steps": []}, _config("after")))["steps"] == ["a", "b"]
        await threads.update(record.thread_id, status="idle")
        stored = await threads.get(record.thread_id, tenant="a")
        assert stored is not None and stored.status == "idle" and stored.metadata == {"k": 1, "m": 2}
        assert not connection.in_transaction
    finally:
        await stores.aclose()


# --- the SQLite worker's batches (group commit) -----------------------------------------


async def _queued_behind_a_held_worker(writer: SqliteWriter, calls: dict[str, Any]) -> dict[str, asyncio.Future[Any]]:
    """Hold the worker in a unit, queue ``calls`` (name: (write?, work)) behind it, then
    let it go: they all reach the worker as one batch."""
    gate = threading.Event()
    held = asyncio.ensure_future(writer.read("hold", lambda _db: gate.wait(5)))
    await asyncio.sleep(0.05)
    futures = {
        name: asyncio.ensure_future((writer.write if write else writer.read)(name, work))
        for name, (write, work) in calls.items()
    }
    await asyncio.sleep(0.05)  # every call is queued
    gate.set()
    assert await held
    await asyncio.wait(futures.values())
    return futures


async def test_sqlite_batch_commits_together_and_fails_units_alone(tmp_path: Path) -> None:
    """Units queued while the worker is busy run as one transaction (one ``BEGIN``), in
    the order they were queued; a unit that fails, by a constraint or by its own error,
    is rolled back alone and is an error for its caller only."""
    writer = await SqliteWriter.open(tmp_path / "w.sqlite")
    try:
        await writer.write("schema", lambda db: db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)"))
        begins: list[str] = []
        writer.connection.set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)

        def half_then_fail(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO t VALUES ('b')")
            raise ValueError("the unit's own error")

        def insert(key: str) -> Any:
            return lambda db: db.execute("INSERT INTO t VALUES (?)", (key,)).rowcount

        keys = "SELECT group_concat(k) FROM (SELECT k FROM t ORDER BY k)"
        futures = await _queued_behind_a_held_worker(
            writer,
            {
                "a": (True, insert("a")),
                "b": (True, half_then_fail),
                "a again": (True, insert("a")),  # the primary key refuses it
                "d": (True, insert("d")),
                "read": (False, lambda db: db.execute(keys).fetchone()[0]),
            },
        )
        assert futures["a"].result() == 1 and futures["d"].result() == 1
        with pytest.raises(ValueError, match="own error"):
            futures["b"].result()
        with pytest.raises(ThreadStoreError, match="a again failed.*UNIQUE"):
            futures["a again"].result()
        assert futures["read"].result() == "a,d"  # it saw the batch's earlier writes
        assert begins == ["BEGIN IMMEDIATE"]
        with sqlite3.connect(tmp_path / "w.sqlite") as other:
            assert other.execute(keys).fetchone()[0] == "a,d"
        assert not writer.connection.in_transaction
    finally:
        await writer.close()


async def test_sqlite_unit_queued_past_its_timeout_never_runs(tmp_path: Path) -> None:
    """A caller that timed out waiting for the worker gets `ThreadStoreTimeoutError`, and
    its unit is dropped: it does not happen later behind its caller's back."""
    writer = await SqliteWriter.open(tmp_path / "w.sqlite", timeout_s=0.3)
    try:
        await writer.write("schema", lambda db: db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)"))
        gate = threading.Event()
        held = asyncio.ensure_future(writer.read("hold", lambda _db: gate.wait(5)))
        await asyncio.sleep(0.05)
        with pytest.raises(ThreadStoreTimeoutError, match="late failed"):
            await writer.write("late", lambda db: db.execute("INSERT INTO t VALUES ('late')"))
        gate.set()
        with pytest.raises(ThreadStoreTimeoutError):  # the holder overran its own timeout
            await held
        await writer.write("next", lambda db: db.execute("INSERT INTO t VALUES ('next')"))
        rows = await writer.read("rows", lambda db: db.execute("SELECT k FROM t").fetchall())
        assert rows == [("next",)]
    finally:
        await writer.close()


# --- a write refused by the database, then the next call --------------------------------


async def test_sqlite_failed_write_does_not_break_the_store(tmp_path: Path) -> None:
    """The sequence that broke the store for good: a write fails on the busy timeout
    (another connection holds the write lock), a read follows on the same connection,
    and the other connection then commits. Before, the store's implicit transaction
    stayed open with a stale snapshot: every later write failed at once with "database
    is locked" and reads missed the other connection's rows. Now the failed write is a
    `ThreadStoreError` naming the call, and everything after it works and is fresh."""
    stores = await open_thread_stores(ThreadSettings(busy_timeout_s=0.2), tmp_path)
    try:
        threads, graph = stores.threads, _graph(stores.checkpointer)
        record, _ = await threads.create(tenant="a")
        assert record is not None
        other = sqlite3.connect(_sqlite_file(tmp_path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(ThreadStoreError, match="update failed.*locked") as failed:
            await threads.update(record.thread_id, status="busy")
        assert failed.value.operation == "update"
        with pytest.raises(ThreadStoreError, match="checkpoint put failed.*locked"):
            await graph.ainvoke({"steps": []}, _config("blocked"))
        assert len(await threads.search(tenant="a")) == 1  # a read while the lock is held
        other.execute(
            "INSERT INTO switchyard_threads VALUES ('foreign', 'a', NULL, 'idle', '{}', '9999', '9999')"
        )
        other.execute("COMMIT")
        other.close()

        await threads.update(record.thread_id, status="busy")
        assert [r.thread_id for r in await threads.search(tenant="a")] == ["foreign", record.thread_id]
        created, _ = await threads.create(tenant="a", thread_id="next")
        assert created is not None
        assert (await graph.ainvoke({"steps": []}, _config("blocked")))["steps"] == ["a", "b"]
        stored = await threads.get(record.thread_id, tenant="a")
        assert stored is not None and stored.status == "busy"
    finally:
        await stores.aclose()


async def test_sqlite_ping_reports_a_wedged_writer_and_recovers(tmp_path: Path) -> None:
    """/readyz's probe: while another process holds the write lock longer than the
    store's timeout, ping fails within that timeout (it never hangs); once the lock is
    released, ping and writes work again."""
    stores = await open_thread_stores(ThreadSettings(busy_timeout_s=30, timeout_s=0.5), tmp_path)
    try:
        threads = stores.threads
        other = sqlite3.connect(_sqlite_file(tmp_path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(ThreadStoreTimeoutError, match="ping"):
            await asyncio.wait_for(threads.ping(), 5)
        assert time.monotonic() - started < 2
        with pytest.raises(ThreadStoreTimeoutError, match="create"):
            await threads.create(tenant="a")
        other.execute("ROLLBACK")
        other.close()
        # The timed-out calls finish behind the released lock; then all is usable again.
        await threads.ping()
        record, created = await threads.create(tenant="a", thread_id="after")
        assert created and record is not None
    finally:
        await stores.aclose()


async def test_postgres_lock_and_statement_timeouts_then_next_call_works(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A row locked by another session: an update waits, then fails with a timeout error
    (the client-side one, or the server's statement_timeout, whichever is shorter); ping
    still works meanwhile; once the lock goes the same update succeeds."""
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    dsn = request.getfixturevalue("postgres_dsn")
    for settings, error in (
        (ThreadSettings(postgres_dsn=dsn, timeout_s=0.5), ThreadStoreTimeoutError),
        (ThreadSettings(postgres_dsn=dsn, timeout_s=10, statement_timeout_s=0.3), ThreadStoreTimeoutError),
    ):
        stores = await open_thread_stores(settings, tmp_path)
        try:
            threads = stores.threads
            record, _ = await threads.create(tenant="a")
            assert record is not None
            async with await psycopg.AsyncConnection.connect(dsn) as other:
                await other.execute("SELECT 1 FROM switchyard_threads WHERE thread_id = %s FOR UPDATE", (record.thread_id,))
                started = time.monotonic()
                with pytest.raises(error, match="update failed"):
                    await threads.update(record.thread_id, status="busy")
                assert time.monotonic() - started < 5
                await threads.ping()
                await other.rollback()
            await threads.update(record.thread_id, status="busy")
            stored = await threads.get(record.thread_id, tenant="a")
            assert stored is not None and stored.status == "busy"
        finally:
            await stores.aclose()


async def test_postgres_ping_reports_a_stalled_database(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every pooled connection stuck behind a lock: ping fails within the store's
    timeout instead of waiting for a connection forever; then recovers."""
    import psycopg  # noqa: PLC0415

    dsn = request.getfixturevalue("postgres_dsn")
    stores = await open_thread_stores(ThreadSettings(postgres_dsn=dsn, pool_size=2, timeout_s=1), tmp_path)
    try:
        threads = stores.threads
        record, _ = await threads.create(tenant="a")
        assert record is not None
        async with await psycopg.AsyncConnection.connect(dsn) as other:
            await other.execute("LOCK TABLE switchyard_threads IN ACCESS EXCLUSIVE MODE")
            stuck = [asyncio.create_task(threads.update(record.thread_id, status="busy")) for _ in range(2)]
            deadline = time.monotonic() + 5
            while True:  # until both pooled connections wait on the lock
                cursor = await other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cursor.fetchone()
                if row is not None and row[0] == 2:
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            started = time.monotonic()
            with pytest.raises(ThreadStoreTimeoutError, match="ping"):
                await asyncio.wait_for(threads.ping(), 5)
            assert time.monotonic() - started < 3
            for task in stuck:
                with pytest.raises(ThreadStoreTimeoutError):
                    await task
            await other.rollback()
        await threads.ping()
        await threads.update(record.thread_id, status="idle")
    finally:
        await stores.aclose()


async def test_postgres_terminated_connections_are_replaced(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every backend of the pool killed (a failover, an admin's pg_terminate_backend):
    the very next calls, of the store and of the checkpointer, succeed."""
    import psycopg  # noqa: PLC0415

    dsn = request.getfixturevalue("postgres_dsn")
    stores = await open_thread_stores(ThreadSettings(postgres_dsn=dsn, pool_size=4), tmp_path)
    try:
        threads, graph = stores.threads, _graph(stores.checkpointer)
        # Warm every pooled connection.
        await asyncio.gather(*(graph.ainvoke({"steps": []}, _config(f"warm-{i}")) for i in range(8)))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            row = await cursor.fetchone()
            assert row is not None and row[0] >= 1
        for attempt in range(6):
            record, created = await threads.create(tenant="a", thread_id=f"after-{attempt}")
            assert created and record is not None
            await threads.update(record.thread_id, status="busy")
            assert (await graph.ainvoke({"steps": []}, _config(f"after-{attempt}")))["steps"] == ["a", "b"]
        await threads.ping()
    finally:
        await stores.aclose()


# --- a writer killed with SIGKILL ---------------------------------------------------------


async def _write_forever(data_dir: Path) -> None:
    """The killed process: threads created, marked busy, run, and (two in three) marked
    idle, as fast as it can; prints each thread id once its record is committed."""
    stores = await open_thread_stores(ThreadSettings(), data_dir)
    threads, graph = stores.threads, _graph(stores.checkpointer)
    index = 0
    while True:
        thread_id = f"k-{index}"
        await threads.create(tenant="a", thread_id=thread_id, metadata={"index": index})
        print(thread_id, flush=True)
        await threads.update(thread_id, status="busy", graph_id="g")
        await graph.ainvoke({"steps": []}, _config(thread_id))
        await threads.set_metadata(thread_id, {"ran": True})
        if index % 3:
            await threads.update(thread_id, status="idle")
        index += 1


async def test_sqlite_survives_a_killed_writer(tmp_path: Path) -> None:
    """kill -9 of a process writing threads and checkpoints: the file passes
    integrity_check, every thread it reported is readable with its state, threads it
    left busy are recovered to idle at the next start, and writing goes on."""
    data_dir = tmp_path / "data"
    output, errors = tmp_path / "writer.out", tmp_path / "writer.err"
    with output.open("wb") as stdout, errors.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.contracts.test_thread_store_faults", "write-forever", str(data_dir)],
            cwd=REPO,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 120
        while output.read_text().count("\n") < 40:
            assert process.poll() is None, errors.read_text()
            assert time.monotonic() < deadline, errors.read_text()
            await asyncio.sleep(0.05)
        await asyncio.sleep(random.Random(9).uniform(0, 0.05))  # somewhere in the middle of a write
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    reported = [line for line in output.read_text().split("\n") if line]  # each printed after its commit

    path = data_dir / "threads.sqlite"
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        busy = raw.execute("SELECT count(*) FROM switchyard_threads WHERE status = 'busy'").fetchone()[0]
    assert busy >= 1  # a thread of every third run, at least

    stores = await open_thread_stores(ThreadSettings(), data_dir)
    try:
        threads, graph = stores.threads, _graph(stores.checkpointer)
        assert stores.recovered == busy
        for thread_id in reported:
            record = await threads.get(thread_id, tenant="a")
            assert record is not None and record.status == "idle", thread_id
            state = await graph.aget_state(_config(thread_id))
            assert state.values.get("steps", []) in ([], ["a"], ["a", "b"])
        assert reported[-2] in {r.thread_id for r in await threads.search(tenant="a", metadata={"ran": True}, limit=10**6)}
        record, created = await threads.create(tenant="a", thread_id="after-kill")
        assert created and record is not None
        assert (await graph.ainvoke({"steps": []}, _config("after-kill")))["steps"] == ["a", "b"]
    finally:
        await stores.aclose()


if __name__ == "__main__":
    if sys.argv[1:2] == ["write-forever"]:
        asyncio.run(_write_forever(Path(sys.argv[2])))
