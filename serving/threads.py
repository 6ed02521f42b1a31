"""Threads: the conversations the LangGraph-compatible API keeps.

A thread's *state* lives in the LangGraph checkpointer; its *record* (owner, graph,
metadata, status, times) lives in a `ThreadStore` beside it, in the same database, so
listing and searching threads needs no scan of checkpoints. Two stores: SQLite in the
data directory (the default) and PostgreSQL (when a DSN is configured); one contract
suite (``tests/contracts/test_thread_store.py``, faults and concurrency in
``test_thread_store_faults.py``) runs on both.

Why SQLite is used through one connection and one writer (issue 10):

- The store and the checkpointer had a connection each, used by many coroutines at
  once, with Python's implicit transactions (a ``BEGIN`` before the first write, ended
  only by a later ``commit()``). A write cancelled between its ``execute`` and its
  ``commit`` (a client gone, a run cancelled; aiosqlite runs a queued statement anyway)
  kept the file's write lock. The other connection's writes then failed: after the busy
  timeout, or at once when a coroutine had already read inside that connection's open
  transaction (SQLite does not let such a reader wait for the lock). Nothing rolled a
  failed write back, so its transaction stayed open; the next read pinned a WAL
  snapshot in it, and after the other connection's next commit that snapshot was
  stale: from then on every write failed at once with "database is locked"
  (``SQLITE_BUSY_SNAPSHOT``, no busy wait) and every read was stale, until a restart.
  Without cancellations the same load passed; a busy timeout running out (another
  process writing) starts the same chain. ``test_thread_store_faults.py`` reproduces
  each step.
- Now the store and the checkpointer share one ``sqlite3`` connection in autocommit mode
  (``isolation_level=None``: the driver never opens a transaction we did not), owned by
  one worker thread (`SqliteWriter`), so the process has one writer. Each call is a
  unit, a plain function run whole on that thread; a write unit is ``BEGIN
  IMMEDIATE``, statements, ``COMMIT``, or ``ROLLBACK`` on any error. A cancelled caller
  cannot stop a unit halfway (it either happened or failed as a whole, with no
  transaction left open), and a unit rolls back a transaction it finds open, so even a
  failed ``ROLLBACK`` cannot outlive one call. The library's checkpointer runs the same
  way (``serving/persistence.py``: its synchronous methods, each one unit on the
  worker), and its own ``commit()`` ends ours.
- One unit is one hop from the event loop to the worker and back. It used to be one
  hop per statement (aiosqlite), with an asyncio lock held across the hops: at 50
  concurrent runs each hop waited for a turn of the busy event loop, so the lock was
  held far longer than the SQL took, and every run queued for it (issue 10's
  measurements in ``docs/performance.md``).
- ``BEGIN IMMEDIATE`` takes the write lock before reading, so a writer never upgrades a
  stale snapshot; the busy timeout only matters for other processes (the CLI, a
  backup). ``ping`` runs the same unit, so a writer stuck behind another process, or a
  worker thread that stopped answering, shows in ``/readyz``.

PostgreSQL needs less: the pool's connections are in autocommit mode (every statement
its own transaction, rolled back by the server if it fails), a server-side
``statement_timeout`` ends statements stuck on a lock, and every call here has a
client-side timeout too. Calls run on worker threads through psycopg's synchronous pool
(`PostgresWorkers`); a call that meets a connection the server dropped (a restart,
``pg_terminate_backend``) is retried once after the pool checks its idle connections,
which is safe because every call here and in the checkpointer is idempotent (upserts,
merges, reads). Checking each connection as it was taken cost a round trip per call.

On both, a storage failure is a `ThreadStoreError` for that call only (the next call
starts afresh), and a write whose caller is cancelled still completes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

__all__ = [
    "PostgresThreadStore",
    "PostgresWorkers",
    "SqliteThreadStore",
    "SqliteWriter",
    "SortOrder",
    "ThreadRecord",
    "ThreadSortBy",
    "ThreadStatus",
    "ThreadStore",
    "ThreadStoreError",
    "ThreadStoreTimeoutError",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
"""``idle``: ready for a run; ``busy``: a run is in progress; ``interrupted``: a run
stopped at an interrupt and waits for ``command: {resume: ...}``; ``error``: the last
run failed."""

ThreadSortBy = Literal["thread_id", "status", "created_at", "updated_at"]
"""The columns threads can be ordered by."""

SortOrder = Literal["asc", "desc"]

_SORT_COLUMNS: dict[str, str] = {name: name for name in ("thread_id", "status", "created_at", "updated_at")}
_SORT_ORDERS: dict[str, str] = {"asc": "ASC", "desc": "DESC"}

_INT64_MAX = 2**63 - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS switchyard_threads (
    thread_id  TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    graph_id   TEXT,
    status     TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
"""


class ThreadStoreError(Exception):
    """A thread store call failed: the database refused, failed or did not answer.

    The store stays usable: the next call starts afresh.

    Attributes:
        operation: the call that failed (``create``, ``update``, ``checkpoint put``...).
    """

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        super().__init__(f"thread store {operation} failed: {reason}")


class ThreadStoreTimeoutError(ThreadStoreError):
    """A thread store call did not finish within its timeout (a wedged writer, a
    stalled database); a write may still complete after the caller got this."""


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(slots=True, kw_only=True)
class ThreadRecord:
    """One thread's record (its state is in the checkpointer)."""

    thread_id: str
    tenant: str
    """The tenant that owns it; other tenants do not see it (404)."""
    graph_id: str | None
    status: ThreadStatus
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: str
    updated_at: str


class ThreadStore(Protocol):
    """Where thread records live.

    Every method raises `ThreadStoreError` (`ThreadStoreTimeoutError` past the store's
    timeout) when the database fails, and the next call works again; writes complete
    even if their caller is cancelled. Metadata must be JSON without NaN, infinity,
    NUL characters or lone surrogates (``ValueError``).
    """

    async def create(
        self,
        *,
        tenant: str,
        thread_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        graph_id: str | None = None,
    ) -> tuple[ThreadRecord | None, bool]:
        """Create a thread for ``tenant``, or find the existing one with that id.

        Returns:
            The record and whether it was created now; the record is None when the id
            belongs to another tenant.
        """
        ...

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        """The thread, if it exists and belongs to ``tenant``."""
        ...

    async def update(
        self,
        thread_id: str,
        *,
        status: ThreadStatus | None = None,
        graph_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Set the status and/or graph of a thread, merge ``metadata`` into its own
        (top-level keys replaced), and set its ``updated_at``: one write."""
        ...

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into a thread's metadata (top-level keys replaced)."""
        ...

    async def delete(self, thread_id: str) -> None:
        """Delete a thread's record (its checkpoints are the checkpointer's)."""
        ...

    async def search(
        self,
        *,
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        ids: Sequence[str] | None = None,
        sort_by: ThreadSortBy = "created_at",
        sort_order: SortOrder = "desc",
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The tenant's threads whose metadata has every given key with an equal value
        (any key works: quotes, dots, ``$``), among ``ids`` if given (an empty list finds
        none), ordered by ``sort_by`` then ``thread_id`` (so pages never repeat or skip
        a thread), newest first by default. Limits and offsets past what the database
        can count are bounded, not errors.

        Raises:
            ValueError: ``sort_by`` or ``sort_order`` is not one of the allowed values.
        """
        ...

    async def recover(self) -> int:
        """Mark threads left ``busy`` by a server that stopped without ending its runs
        ``idle``; called once at start, before any run.

        On PostgreSQL with replicas sharing it (the run board's ``switchyard_runs`` in
        the same database), a thread with an active run on the board stays ``busy``:
        that run may be going on another replica; the board ends the runs of dead
        replicas (and of this replica's predecessor under the same id) and sets their
        threads' statuses itself (`serving.shared.runs`). A board in another database
        (``state.postgres_dsn`` not the threads' database) is not seen here.

        Returns:
            How many threads were recovered.
        """
        ...

    async def ping(self) -> None:
        """Raise if the database does not answer (readiness); goes the way writes go,
        so a stuck writer shows."""
        ...

    async def close(self) -> None:
        """Wait for writes still running (callers gone), then release the store."""
        ...


# --- shared plumbing ------------------------------------------------------------------


def _bounded(value: int) -> int:
    """A LIMIT or OFFSET both databases accept (64-bit, not negative)."""
    return max(0, min(int(value), _INT64_MAX))


def _check_text(value: str, what: str) -> None:
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} contains a lone surrogate") from None


def _check_json(value: Any, what: str) -> None:
    # What SQLite's and PostgreSQL's JSON both accept, so a value one store keeps
    # cannot break later searches (SQLite 3.40 reads NaN as malformed JSON, jsonb
    # refuses \u0000 and lone surrogates).
    if isinstance(value, str):
        _check_text(value, what)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{what} has a key that is not a string: {key!r}")
            _check_text(key, f"{what} key")
            _check_json(item, f"{what}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_json(item, what)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ValueError(f"{what} is not JSON: {type(value).__name__}")


def _dumps(values: Mapping[str, Any], what: str = "metadata") -> str:
    _check_json(values, what)
    return json.dumps(dict(values))


def _check_ids(*values: str | None) -> None:
    for value in values:
        if value is not None:
            _check_text(value, "id")


def _storable(*values: Any) -> bool:
    """Whether a store could hold these ids or values (if not, no thread has them)."""
    try:
        for value in values:
            _check_json(value, "value")
    except ValueError:
        return False
    return True


def _order_by(sort_by: str, sort_order: str, collate: str = "") -> str:
    """An ``ORDER BY`` clause built only from the whitelists (never from request text),
    with ``thread_id`` last so equal keys keep one order from page to page; ``collate``
    (PostgreSQL's ``COLLATE "C"``) makes text compare by bytes, as SQLite does.

    Raises:
        ValueError: naming the field whose value is not allowed.
    """
    column, direction = _SORT_COLUMNS.get(sort_by), _SORT_ORDERS.get(sort_order)
    if column is None:
        raise ValueError(f"sort_by must be one of {', '.join(_SORT_COLUMNS)}, not {sort_by!r}")
    if direction is None:
        raise ValueError(f"sort_order must be asc or desc, not {sort_order!r}")
    if column == "thread_id":
        return f"ORDER BY thread_id{collate} {direction}"
    return f"ORDER BY {column}{collate} {direction}, thread_id{collate} {direction}"


def _wanted_ids(ids: Sequence[str] | None) -> list[str] | None:
    """The ids a search may find (None: any); ids no store can hold are dropped."""
    if ids is None:
        return None
    return [value for value in dict.fromkeys(ids) if isinstance(value, str) and _storable(value)]


class _Calls:
    """Awaits a store's calls, which run on worker threads: each bounded by a timeout,
    driver errors raised as `ThreadStoreError`. A worker hands a call's outcome back
    with `resolve`, in one turn of the event loop; a caller that is cancelled or times
    out does not stop its call, which runs on to its end (a failure is then logged)."""

    def __init__(
        self,
        timeout_s: float,
        errors: tuple[type[BaseException], ...],
        timeouts: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Args:
        timeout_s: the longest one call may take.
        errors: the driver's errors, raised as `ThreadStoreError`.
        timeouts: those among them that mean "no answer in time" (a statement or pool
            timeout), raised as `ThreadStoreTimeoutError`.
        """
        self.timeout_s = timeout_s
        self._errors = errors
        self._timeouts = timeouts

    def deadline(self) -> float:
        """`time.monotonic` past which a call submitted now must not start: its caller
        has been told it timed out."""
        return time.monotonic() + self.timeout_s

    async def settle(self, operation: str, future: asyncio.Future[T]) -> T:
        """The outcome of a call submitted to a worker, which will `resolve` ``future``."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            raise ThreadStoreTimeoutError(operation, f"no answer within {self.timeout_s:g} s") from None
        except ThreadStoreError:
            raise
        except self._errors as exc:
            kind = ThreadStoreTimeoutError if isinstance(exc, self._timeouts) else ThreadStoreError
            raise kind(operation, f"{type(exc).__name__}: {exc}") from exc


def _resolve(operation: str, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """On the event loop: a call's outcome to its caller, or to the log if it left."""
    if future.done():  # cancelled, or timed out
        if not ok:
            log.warning("thread store %s failed after its caller left: %s", operation, value)
    elif ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _expired(operation: str) -> ThreadStoreTimeoutError:
    return ThreadStoreTimeoutError(operation, "still queued at its timeout: not run")


# --- SQLite -----------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Unit:
    """One call queued for the SQLite worker."""

    operation: str
    work: Callable[[sqlite3.Connection], Any]
    write: bool
    deadline: float
    """`time.monotonic` past which it is not started (its caller has timed out)."""
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


_MAX_BATCH = 64
"""Units one SQLite transaction may take from the queue (group commit)."""


class SqliteWriter:
    """The one connection to a SQLite thread database, owned by one worker thread that
    runs every unit of work on it, store and checkpointer alike (see the module
    docstring for why).

    A unit is a plain function of the connection that runs whole on the worker: one
    hop from the event loop and back per call, whatever its number of statements. The
    worker runs units one at a time, so there is one writer and no lock, and it takes
    every unit queued meanwhile as one batch (group commit): the batch's writes share
    one ``BEGIN IMMEDIATE`` ... ``COMMIT``, each inside a savepoint, so a unit that
    fails is rolled back alone and is an error for its caller only. Results go back
    once the batch has committed. A unit whose caller is cancelled still runs to its
    end; one still queued when its caller's timeout ran out is dropped, never run late.
    """

    def __init__(self, connection: sqlite3.Connection, *, timeout_s: float) -> None:
        """Args:
        connection: a ``sqlite3`` connection opened with ``isolation_level=None`` and
            ``check_same_thread=False``; from now on only the worker uses it.
        timeout_s: the longest one call may take, queueing for the worker included.
        """
        self.connection = connection
        self._calls = _Calls(timeout_s, (sqlite3.Error,))
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, name="switchyard-sqlite", daemon=True)
        self._worker.start()

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0, timeout_s: float = 10.0) -> SqliteWriter:
        """Open (creating it if needed) the database at ``path``: WAL, autocommit.

        Args:
            busy_timeout_s: how long a statement waits for another process's lock.
            timeout_s: the longest one call may take.
        """
        path.parent.mkdir(parents=True, exist_ok=True)

        def connect() -> sqlite3.Connection:
            connection = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                # WAL with synchronous=NORMAL: a commit survives the process crashing;
                # only a power loss can take the last commits back. FULL would fsync on
                # every checkpoint, several times per run.
                connection.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                connection.close()
                raise
            return connection

        return cls(await asyncio.to_thread(connect), timeout_s=timeout_s)

    async def drain(self) -> None:
        """Wait (up to the timeout) for units whose callers left: the worker runs units
        in order, so once a unit queued now has run, they all have."""
        with contextlib.suppress(ThreadStoreError):
            await self.read("drain", lambda _db: None)

    async def close(self) -> None:
        """Wait for running units, then stop the worker, which closes the connection."""
        await self.drain()
        self._queue.put(None)
        await asyncio.to_thread(self._worker.join)

    async def read(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` on the worker (it may share a batch's transaction,
        and sees what the units queued before it wrote)."""
        return await self._run(operation, work, write=False)

    async def write(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` on the worker in a transaction, to its end.

        Raises:
            ThreadStoreError: it failed and was rolled back.
            ThreadStoreTimeoutError: no result within the timeout (if it had started by
                then, it may still commit; if not, it never runs).
        """
        return await self._run(operation, work, write=True)

    async def _run(self, operation: str, work: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Unit(operation, work, write, self._calls.deadline(), loop, future))
        return await self._calls.settle(operation, future)

    # --- on the worker thread -------------------------------------------------------

    def _serve(self) -> None:
        try:
            while (unit := self._queue.get()) is not None:
                batch = [unit]
                while len(batch) < _MAX_BATCH:
                    try:
                        unit = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if unit is None:
                        self._queue.put(None)  # stop after this batch
                        break
                    batch.append(unit)
                try:
                    outcomes = self._execute(batch)
                except BaseException as exc:  # a bug here must not leave callers waiting
                    log.exception("thread store: a batch of %d call(s) failed", len(batch))
                    self._abort([], [], exc)
                    outcomes = [(False, exc)] * len(batch)
                for loop in {unit.loop for unit in batch}:
                    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                        loop.call_soon_threadsafe(_deliver, batch, outcomes)
        finally:
            self.connection.close()

    def _execute(self, batch: list[_Unit]) -> list[tuple[bool, Any]]:
        """Run a batch; each unit's outcome is ``(True, result)`` or ``(False, error)``."""
        db = self.connection
        now = time.monotonic()
        outcomes: list[tuple[bool, Any]] = [
            (False, _expired(unit.operation))
            if now > unit.deadline
            else (True, None)
            for unit in batch
        ]
        live = [i for i, unit in enumerate(batch) if outcomes[i][0]]
        writes = sum(batch[i].write for i in live)
        began: BaseException | None = None
        if writes:
            try:
                if db.in_transaction:  # only a failed ROLLBACK can leave one: end it first
                    log.warning("thread store: rolling back a transaction left open")
                    db.rollback()
                db.execute("BEGIN IMMEDIATE")
            except Exception as exc:  # the write lock (another process), the disk
                began = exc
        in_batch: list[int] = []  # units whose outcome stands or falls with the open transaction
        for i in live:
            unit = batch[i]
            if unit.write and began is not None:
                outcomes[i] = (False, began)
                continue
            savepoint = unit.write and writes > 1
            inside = db.in_transaction
            try:
                if savepoint:
                    db.execute("SAVEPOINT unit")
                result = unit.work(db)
                if savepoint:
                    db.execute("RELEASE unit")
                outcomes[i] = (True, result)
                if unit.write or in_batch:  # a read that may have seen the batch's writes
                    in_batch.append(i)
                continue
            except Exception as exc:
                outcomes[i] = (False, exc)
                error: BaseException = exc
            if inside and not db.in_transaction:
                pass  # its error ended the transaction (SQLite rolls back on some errors)
            elif not unit.write:
                continue  # a failed read changed nothing
            elif savepoint:
                try:
                    db.execute("ROLLBACK TO unit")
                    db.execute("RELEASE unit")
                    continue
                except Exception as undo:
                    error = undo
            # The transaction is gone or must go: the batch's earlier writes with it, and
            # its later writes begin anew.
            self._abort(outcomes, in_batch, error)
            in_batch = []
            writes = sum(batch[j].write for j in live if j > i)
            began = self._begin() if writes else None
        if db.in_transaction:
            try:
                db.commit()
            except Exception as exc:
                self._abort(outcomes, in_batch, exc)
        return outcomes

    def _begin(self) -> BaseException | None:
        """Begin a new transaction for the rest of a batch; the error if it fails."""
        try:
            self.connection.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            return exc
        return None

    def _abort(self, outcomes: list[tuple[bool, Any]], in_batch: list[int], error: BaseException) -> None:
        """Roll the open transaction back (if any): the units it held fail with ``error``."""
        if self.connection.in_transaction:
            try:
                self.connection.rollback()
            except Exception as exc:  # the next unit's BEGIN finds it open and retries
                log.warning("thread store: rollback failed: %r", exc)
        for i in in_batch:
            if outcomes[i][0]:
                outcomes[i] = (False, error)


def _deliver(batch: list[_Unit], outcomes: list[tuple[bool, Any]]) -> None:
    """On the event loop: hand each unit its outcome."""
    loop = asyncio.get_running_loop()
    for unit, (ok, value) in zip(batch, outcomes, strict=True):
        if unit.loop is loop:
            _resolve(unit.operation, unit.future, ok, value)


_SELECT_ONE = "SELECT {columns} FROM switchyard_threads WHERE thread_id = ?"


def _select(db: sqlite3.Connection, query: str, params: tuple[Any, ...]) -> list[ThreadRecord]:
    return [_record(row) for row in db.execute(query, params).fetchall()]


def _merged_metadata(db: sqlite3.Connection, thread_id: str, values: Mapping[str, Any]) -> str | None:
    """The thread's metadata with ``values`` merged in, as JSON (None: no such thread)."""
    row = db.execute("SELECT metadata FROM switchyard_threads WHERE thread_id = ?", (thread_id,)).fetchone()
    return None if row is None else json.dumps({**json.loads(row[0]), **values})


class SqliteThreadStore:
    """Thread records in SQLite, on the connection and worker the checkpointer uses."""

    def __init__(self, writer: SqliteWriter) -> None:
        self._writer = writer

    @classmethod
    async def open(cls, writer: SqliteWriter) -> SqliteThreadStore:
        """Create the table if needed."""
        await writer.write("open", lambda db: db.execute(_SCHEMA))
        return cls(writer)

    async def close(self) -> None:
        """The connection belongs to the writer, which the caller closes."""
        await self._writer.drain()

    async def ping(self) -> None:
        await self._writer.write("ping", lambda db: db.execute("SELECT 1").fetchone())

    async def create(
        self,
        *,
        tenant: str,
        thread_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        graph_id: str | None = None,
    ) -> tuple[ThreadRecord | None, bool]:
        """Create a thread for ``tenant``, or find the existing one with that id.

        Returns:
            The record and whether it was created now. The record is None when the id
            exists but belongs to another tenant (callers answer as if it were taken,
            without revealing the owner).
        """
        thread_id = thread_id or str(uuid.uuid4())
        _check_ids(thread_id, tenant, graph_id)
        encoded = _dumps(metadata or {})
        now = _now()

        def unit(db: sqlite3.Connection) -> tuple[ThreadRecord, bool]:
            created = db.execute(
                "INSERT INTO switchyard_threads VALUES (?, ?, ?, 'idle', ?, ?, ?) ON CONFLICT(thread_id) DO NOTHING",
                (thread_id, tenant, graph_id, encoded, now, now),
            ).rowcount
            return _select(db, _SELECT_ONE.format(columns=_COLUMNS), (thread_id,))[0], created == 1

        record, created = await self._writer.write("create", unit)
        return (record if record.tenant == tenant else None), created

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        """The thread, if it exists and belongs to ``tenant``."""
        if not _storable(thread_id):
            return None
        rows = await self._writer.read("get", lambda db: _select(db, _SELECT_ONE.format(columns=_COLUMNS), (thread_id,)))
        return rows[0] if rows and rows[0].tenant == tenant else None

    async def update(
        self,
        thread_id: str,
        *,
        status: ThreadStatus | None = None,
        graph_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Set the status and/or graph of a thread, merge ``metadata`` into its own, and
        set its ``updated_at``, in one transaction."""
        _check_ids(graph_id)
        if metadata:
            _check_json(metadata, "metadata")
        if not _storable(thread_id):
            return

        def unit(db: sqlite3.Connection) -> None:
            merged: str | None = None
            if metadata:
                merged = _merged_metadata(db, thread_id, metadata)
                if merged is None:
                    return
            db.execute(
                "UPDATE switchyard_threads SET status = COALESCE(?, status), graph_id = COALESCE(?, graph_id),"
                " metadata = COALESCE(?, metadata), updated_at = ? WHERE thread_id = ?",
                (status, graph_id, merged, _now(), thread_id),
            )

        await self._writer.write("update", unit)

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into a thread's metadata (read and written in one transaction,
        so concurrent merges keep each other's keys)."""
        _check_json(values, "metadata")
        if not _storable(thread_id):
            return

        def unit(db: sqlite3.Connection) -> None:
            merged = _merged_metadata(db, thread_id, values)
            if merged is not None:
                db.execute(
                    "UPDATE switchyard_threads SET metadata = ?, updated_at = ? WHERE thread_id = ?",
                    (merged, _now(), thread_id),
                )

        await self._writer.write("set_metadata", unit)

    async def delete(self, thread_id: str) -> None:
        """Delete a thread's record."""
        if not _storable(thread_id):
            return
        await self._writer.write(
            "delete", lambda db: db.execute("DELETE FROM switchyard_threads WHERE thread_id = ?", (thread_id,))
        )

    async def recover(self) -> int:
        """Mark threads left ``busy`` ``idle`` (see `ThreadStore.recover`)."""
        return await self._writer.write(
            "recover",
            lambda db: db.execute(
                "UPDATE switchyard_threads SET status = 'idle', updated_at = ? WHERE status = 'busy'", (_now(),)
            ).rowcount,
        )

    async def search(
        self,
        *,
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        ids: Sequence[str] | None = None,
        sort_by: ThreadSortBy = "created_at",
        sort_order: SortOrder = "desc",
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The tenant's threads whose metadata has every given key with an equal value
        (see `ThreadStore.search` for ``ids`` and the order).

        Keys are matched as text through ``json_each`` (a JSON path cannot spell every
        key); values by JSON type and value as in PostgreSQL's ``@>`` for scalars (``1``
        equals ``1.0``, ``true`` does not equal ``1``); objects and arrays must be equal
        as written (PostgreSQL's ``@>`` also matches a nested subset).
        """
        order = _order_by(sort_by, sort_order)
        wanted = _wanted_ids(ids)
        if not _storable(tenant, dict(metadata or {})) or wanted == []:
            return []  # no thread can have it
        clauses, params = ["tenant = ?"], [tenant]
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        if wanted is not None:  # one parameter, however many ids
            clauses.append("thread_id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(wanted))
        for key, value in (metadata or {}).items():
            condition, values = _sqlite_match(value)
            clauses.append(
                "EXISTS (SELECT 1 FROM json_each(switchyard_threads.metadata) AS m"
                f" WHERE m.key = ? AND {condition})"
            )
            params.extend([key, *values])
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads "
            f"WHERE {' AND '.join(clauses)} {order} LIMIT ? OFFSET ?"
        )
        bounds = (*params, _bounded(limit), _bounded(offset))
        return await self._writer.read("search", lambda db: _select(db, query, bounds))


def _sqlite_match(value: Any) -> tuple[str, list[Any]]:
    """The condition on ``json_each``'s ``m.type``/``m.value`` for one filter value."""
    if value is None:
        return "m.type = 'null'", []
    if isinstance(value, bool):
        return f"m.type = '{'true' if value else 'false'}'", []
    if isinstance(value, (int, float)):
        # Past 64 bits SQLite keeps a number as a REAL; so must the parameter.
        number = value if isinstance(value, float) or -_INT64_MAX - 1 <= value <= _INT64_MAX else float(value)
        return "m.type IN ('integer', 'real') AND m.value = ?", [number]
    if isinstance(value, str):
        return "m.type = 'text' AND m.value = ?", [value]
    kind = "object" if isinstance(value, Mapping) else "array"
    return "m.type = ? AND m.value = json(?)", [kind, json.dumps(value)]


_COLUMNS = "thread_id, tenant, graph_id, status, metadata, created_at, updated_at"


def _record(row: Any) -> ThreadRecord:
    return ThreadRecord(
        thread_id=row[0],
        tenant=row[1],
        graph_id=row[2],
        status=row[3],
        metadata=json.loads(row[4]),
        created_at=row[5],
        updated_at=row[6],
    )


# --- PostgreSQL -------------------------------------------------------------------------

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS switchyard_threads (
    thread_id  TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    graph_id   TEXT,
    status     TEXT NOT NULL,
    metadata   JSONB NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
"""


_PG_SCHEMA_LOCK = 0x5357_5448_5244_53
"""``pg_advisory_xact_lock`` key held while ``switchyard_threads`` is created."""
_PG_RECOVER = "UPDATE switchyard_threads SET status = 'idle', updated_at = %s WHERE status = 'busy'"
_PG_NO_ACTIVE_RUN = """ AND NOT EXISTS (SELECT 1 FROM switchyard_runs r
    WHERE r.thread_id = switchyard_threads.thread_id AND r.status IN ('pending', 'running'))"""
"""A busy thread with an active run on the board (`serving.shared.runs`) is left as it
is: the run is going on another replica, or its replica died and a sweeper ends it and
sets the thread's status, or it was this replica's predecessor's (same id) and the
board ends it at start. A replica inserts a run's row before it marks the thread busy
and marks the thread before it ends the row, so a thread seen busy here has its row
visible to the same statement."""


class PostgresWorkers:
    """A PostgreSQL pool (psycopg's synchronous one) and the worker threads that use it,
    shared by the thread store and the checkpointer.

    Each call is a plain function that takes a connection from the pool, runs whole on
    a worker thread and hands its outcome back to the event loop once. (Through the
    asynchronous driver every statement was several turns of the event loop, and at 50
    concurrent runs that loop was the bottleneck: issue 10 in ``docs/performance.md``.)
    A call whose caller is cancelled still runs to its end; one still queued when its
    caller's timeout ran out is dropped, never run late.
    """

    def __init__(self, pool: Any, *, workers: int, timeout_s: float) -> None:
        """Args:
        pool: an open ``psycopg_pool.ConnectionPool`` in autocommit mode, which checks
            connections as it hands them out; closed by `close`.
        workers: threads (one connection each at most: the pool's size).
        timeout_s: the longest one call may take, waiting for a connection included.
        """
        import psycopg  # noqa: PLC0415 - optional backend, like the pool itself
        from psycopg_pool import PoolTimeout  # noqa: PLC0415

        self.pool = pool
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="switchyard-pg")
        self._calls = _Calls(timeout_s, (psycopg.Error, PoolTimeout), (psycopg.errors.QueryCanceled, PoolTimeout))
        self._retry = (psycopg.OperationalError,)
        self._no_retry = (psycopg.errors.QueryCanceled, PoolTimeout)
        self._running: set[concurrent.futures.Future[None]] = set()

    async def run(self, operation: str, work: Callable[[], T]) -> T:
        """``work()`` on a worker thread; driver errors raised as `ThreadStoreError`.

        Every call here is idempotent (upserts, merges, reads), so one that fails on a
        connection the server dropped (a restart, a failover, ``pg_terminate_backend``)
        is run once more, after the pool has checked its idle connections. Connections
        are not checked each time they are taken: that was a round trip per call.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        deadline = self._calls.deadline()

        def call() -> None:
            try:
                if time.monotonic() > deadline:
                    raise _expired(operation)
                try:
                    outcome: tuple[bool, Any] = (True, work())
                except self._retry as exc:
                    if isinstance(exc, self._no_retry) or time.monotonic() > deadline:
                        raise
                    log.warning("thread store %s: %s; checking the pool's connections and retrying once", operation, exc)
                    self.pool.check()
                    outcome = (True, work())
            except Exception as exc:
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(_resolve, operation, future, *outcome)

        submitted = self._executor.submit(call)
        self._running.add(submitted)
        submitted.add_done_callback(self._running.discard)
        return await self._calls.settle(operation, future)

    async def close(self) -> None:
        """Wait (up to the timeout) for running calls, then close the pool and stop the
        workers."""
        if running := set(self._running):
            await asyncio.to_thread(concurrent.futures.wait, running, self._calls.timeout_s)
        try:
            await asyncio.to_thread(self.pool.close)
        finally:
            self._executor.shutdown(wait=False)


class PostgresThreadStore:
    """Thread records in PostgreSQL, on the pool and workers the checkpointer uses."""

    def __init__(self, workers: PostgresWorkers) -> None:
        self._workers = workers
        self._pool = workers.pool

    @classmethod
    async def open(cls, workers: PostgresWorkers) -> PostgresThreadStore:
        """Create the table if needed."""
        store = cls(workers)
        await workers.run("open", store._create_schema)
        return store

    async def close(self) -> None:
        """The pool belongs to the workers, which the caller closes."""

    async def ping(self) -> None:
        await self._workers.run("ping", lambda: self._execute("SELECT 1", ()))

    def _create_schema(self) -> None:
        # Under a lock: two replicas creating the table at once fail on the catalog's
        # unique index (CREATE TABLE IF NOT EXISTS does not guard against that).
        with self._pool.connection() as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_SCHEMA_LOCK,))
            connection.execute(_PG_SCHEMA)

    def _execute(self, query: str, params: tuple[Any, ...]) -> int:
        with self._pool.connection() as connection:
            return int(connection.execute(query, params).rowcount)

    def _fetch(self, query: str, params: tuple[Any, ...]) -> list[ThreadRecord]:
        with self._pool.connection() as connection:
            rows = connection.execute(query, params).fetchall()
        return [_pg_record(row) for row in rows]

    async def create(
        self,
        *,
        tenant: str,
        thread_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        graph_id: str | None = None,
    ) -> tuple[ThreadRecord | None, bool]:
        thread_id = thread_id or str(uuid.uuid4())
        _check_ids(thread_id, tenant, graph_id)
        encoded = _dumps(metadata or {})
        now = _now()

        def unit() -> tuple[ThreadRecord, bool]:
            for _ in range(2):  # the existing thread may be deleted between the two statements
                inserted = self._fetch(
                    "INSERT INTO switchyard_threads VALUES (%s, %s, %s, 'idle', %s, %s, %s)"
                    f" ON CONFLICT DO NOTHING RETURNING {_COLUMNS}",
                    (thread_id, tenant, graph_id, encoded, now, now),
                )
                if inserted:
                    return inserted[0], True
                existing = self._fetch(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = %s", (thread_id,))
                if existing:
                    return existing[0], False
            raise ThreadStoreError("create", f"thread {thread_id!r} was deleted while it was being created")

        record, created = await self._workers.run("create", unit)
        return (record if record.tenant == tenant else None), created

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        if not _storable(thread_id):
            return None
        rows = await self._workers.run(
            "get", lambda: self._fetch(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = %s", (thread_id,))
        )
        return rows[0] if rows and rows[0].tenant == tenant else None

    async def update(
        self,
        thread_id: str,
        *,
        status: ThreadStatus | None = None,
        graph_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        _check_ids(graph_id)
        if metadata:
            _check_json(metadata, "metadata")
        if not _storable(thread_id):
            return
        merge = _dumps(metadata) if metadata else None
        await self._workers.run(
            "update",
            lambda: self._execute(
                "UPDATE switchyard_threads SET status = COALESCE(%s, status), graph_id = COALESCE(%s, graph_id),"
                " metadata = metadata || COALESCE(%s::jsonb, '{}'::jsonb), updated_at = %s WHERE thread_id = %s",
                (status, graph_id, merge, _now(), thread_id),
            ),
        )

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        encoded = _dumps(values)
        if not _storable(thread_id):
            return
        await self._workers.run(
            "set_metadata",
            lambda: self._execute(
                "UPDATE switchyard_threads SET metadata = metadata || %s::jsonb, updated_at = %s WHERE thread_id = %s",
                (encoded, _now(), thread_id),
            ),
        )

    async def delete(self, thread_id: str) -> None:
        if not _storable(thread_id):
            return
        await self._workers.run("delete", lambda: self._execute("DELETE FROM switchyard_threads WHERE thread_id = %s", (thread_id,)))

    async def recover(self) -> int:
        """Mark threads left ``busy`` ``idle``, except those with an active run on the
        replicas' run board (see `ThreadStore.recover`)."""
        return await self._workers.run("recover", self._recover)

    def _recover(self) -> int:
        with self._pool.connection() as connection:
            # The board's table is created by the first replica's board, after this.
            board = connection.execute("SELECT to_regclass('switchyard_runs') IS NOT NULL AS board").fetchone()
            if not (board["board"] if isinstance(board, dict) else board[0]):  # type: ignore[index]
                return int(connection.execute(_PG_RECOVER, (_now(),)).rowcount)
            return int(connection.execute(_PG_RECOVER + _PG_NO_ACTIVE_RUN, (_now(),)).rowcount)

    async def search(
        self,
        *,
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        ids: Sequence[str] | None = None,
        sort_by: ThreadSortBy = "created_at",
        sort_order: SortOrder = "desc",
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        order = _order_by(sort_by, sort_order, ' COLLATE "C"')
        wanted = _wanted_ids(ids)
        if not _storable(tenant, dict(metadata or {})) or wanted == []:
            return []  # no thread can have it
        clauses, params = ["tenant = %s"], [tenant]
        if status is not None:
            clauses.append("status = %s")
            params.append(status)
        if wanted is not None:
            clauses.append("thread_id = ANY(%s::text[])")
            params.append(wanted)
        if metadata:
            clauses.append("metadata @> %s::jsonb")
            params.append(_dumps(metadata, "metadata filter"))
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads WHERE {' AND '.join(clauses)} "
            f"{order} LIMIT %s OFFSET %s"
        )
        bounds = (*params, _bounded(limit), _bounded(offset))
        return await self._workers.run("search", lambda: self._fetch(query, bounds))


def _pg_record(row: Any) -> ThreadRecord:
    values = list(row.values()) if isinstance(row, dict) else list(row)
    metadata = values[4] if isinstance(values[4], dict) else json.loads(values[4])
    return ThreadRecord(
        thread_id=values[0],
        tenant=values[1],
        graph_id=values[2],
        status=values[3],
        metadata=metadata,
        created_at=values[5],
        updated_at=values[6],
    )
