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
- Now the store and the checkpointer share one connection in autocommit mode
  (``isolation_level=None``: the driver never opens a transaction we did not), and one
  task-reentrant lock (the saver's ``lock``) so the process has one writer. Each write is
  a unit: lock, ``BEGIN IMMEDIATE``, statements, ``COMMIT``, or ``ROLLBACK`` on any
  error; the unit runs in its own task, shielded, so a cancelled caller cannot stop it
  halfway (it either happened or failed as a whole, and the lock is released with no
  transaction open). A unit also rolls back a transaction it finds open, so even a
  failed ``ROLLBACK`` cannot outlive one call. The library's saver, cancelled between
  its ``execute`` and ``commit`` on a shared connection, would leave its rows in an open
  transaction for whichever call came next to commit or silently roll back; so its
  writes run as units too (``serving/persistence.py``), and its own ``commit()`` ends
  ours. Its ``alist`` holds the lock while the caller consumes each checkpoint: a
  thread-store write awaited inside that loop would wait for its timeout.
- ``BEGIN IMMEDIATE`` takes the write lock before reading, so a writer never upgrades a
  stale snapshot; the busy timeout only matters for other processes (the CLI, a
  backup). ``ping`` runs the same unit, so a writer stuck behind another process, or a
  worker thread that stopped answering, shows in ``/readyz``.

PostgreSQL needs less: the pool's connections are in autocommit mode (every statement
its own transaction, rolled back by the server if it fails), a connection is checked
when taken from the pool (so one killed by ``pg_terminate_backend`` or a restart is
replaced instead of failing the call), a server-side ``statement_timeout`` ends
statements stuck on a lock, and every call here has a client-side timeout too.

On both, a storage failure is a `ThreadStoreError` for that call only (the next call
starts afresh), and a write whose caller is cancelled still completes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import aiosqlite

__all__ = [
    "PostgresThreadStore",
    "SqliteThreadStore",
    "SqliteWriter",
    "ThreadRecord",
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
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The tenant's threads whose metadata has every given key with an equal value,
        newest first. Any key works (quotes, dots, ``$``); limits and offsets past what the
        database can count are bounded, not errors."""
        ...

    async def recover(self) -> int:
        """Mark threads left ``busy`` by a server that stopped without ending its runs
        ``idle``; called once at start, before any run.

        With several replicas on one PostgreSQL this would also free the threads of runs
        still going on another replica: that needs a per-replica owner on each thread (a
        later issue); until then run one replica per database.

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


class _TaskLock:
    """An asyncio lock its holder task may take again.

    The checkpointer's methods take ``saver.lock`` themselves; a write unit holds it
    around them (to begin and end the transaction), so the same task must get it twice.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None
        self._depth = 0

    def locked(self) -> bool:
        return self._lock.locked()

    async def acquire(self) -> bool:
        task = asyncio.current_task()
        if task is not None and self._owner is task:
            self._depth += 1
            return True
        await self._lock.acquire()
        self._owner, self._depth = task, 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


class _Calls:
    """Runs a store's calls: each bounded by a timeout, driver errors raised as
    `ThreadStoreError`, writes run to their end even when the caller is gone."""

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
        self._running: set[asyncio.Task[Any]] = set()

    async def read(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        """A call that may be dropped halfway: nothing to undo."""
        return await self._bounded(operation, work())

    async def write(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        """A call that completes in its own task, even if the caller is cancelled or
        times out (its failure is then logged)."""
        task = asyncio.ensure_future(self._translated(operation, work()))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            return await self._bounded(operation, asyncio.shield(task))
        except BaseException:
            if not task.done():
                task.add_done_callback(lambda done: _log_orphan(operation, done))
            raise

    async def drain(self) -> None:
        """Wait (up to the timeout) for writes whose callers left."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=self.timeout_s)

    async def _bounded(self, operation: str, work: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._translated(operation, work)
        except TimeoutError:
            raise ThreadStoreTimeoutError(operation, f"no answer within {self.timeout_s:g} s") from None

    async def _translated(self, operation: str, work: Awaitable[T]) -> T:
        try:
            return await work
        except ThreadStoreError:
            raise
        except self._errors as exc:
            kind = ThreadStoreTimeoutError if isinstance(exc, self._timeouts) else ThreadStoreError
            raise kind(operation, f"{type(exc).__name__}: {exc}") from exc


def _log_orphan(operation: str, task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("thread store %s failed after its caller left: %s", operation, error)


# --- SQLite -----------------------------------------------------------------------------


class SqliteWriter:
    """The one connection to a SQLite thread database and its one writer, shared by the
    thread store and the checkpointer (see the module docstring for why)."""

    def __init__(self, connection: aiosqlite.Connection, *, timeout_s: float) -> None:
        """Args:
        connection: an aiosqlite connection opened with ``isolation_level=None``.
        timeout_s: the longest one call may take, waiting for the writer included.
        """
        self.connection = connection
        self.lock = _TaskLock()
        """Held by every unit of work on the connection; give it to the checkpointer
        as its ``lock``."""
        self._calls = _Calls(timeout_s, (sqlite3.Error,))

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0, timeout_s: float = 10.0) -> SqliteWriter:
        """Open (creating it if needed) the database at ``path``: WAL, autocommit.

        Args:
            busy_timeout_s: how long a statement waits for another process's lock.
            timeout_s: the longest one call may take.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = await aiosqlite.connect(path, timeout=busy_timeout_s, isolation_level=None)
        try:
            await connection.execute("PRAGMA journal_mode=WAL")
            # WAL with synchronous=NORMAL: a commit survives the process crashing; only
            # a power loss can take the last commits back. FULL would fsync on every
            # checkpoint, several times per run.
            await connection.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            await connection.close()
            raise
        return cls(connection, timeout_s=timeout_s)

    async def drain(self) -> None:
        """Wait (up to the timeout) for writes whose callers left."""
        await self._calls.drain()

    async def close(self) -> None:
        """Wait for running writes, then close the connection."""
        await self._calls.drain()
        await self.connection.close()

    async def read(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` under the lock (no transaction: each statement sees committed data)."""

        async def locked() -> T:
            async with self.lock:
                return await work()

        return await self._calls.read(operation, locked)

    async def write(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` as one transaction under the lock, to its end.

        Raises:
            ThreadStoreError: the transaction failed and was rolled back.
            ThreadStoreTimeoutError: no result within the timeout (it may still commit).
        """
        return await self._calls.write(operation, lambda: self._transaction(operation, work))

    async def _transaction(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._calls.timeout_s):  # never queue forever
                await self.lock.acquire()
        except TimeoutError:
            raise ThreadStoreTimeoutError(operation, "the writer stayed busy") from None
        try:
            db = self.connection
            if db.in_transaction:  # only a failed ROLLBACK can leave one: end it first
                log.warning("thread store: rolling back a transaction left open")
                await db.rollback()
            await db.execute("BEGIN IMMEDIATE")
            try:
                result = await work()
                if db.in_transaction:  # the checkpointer's own commit() may have ended it
                    await db.commit()
            except BaseException:
                if db.in_transaction:
                    await db.rollback()
                raise
            return result
        finally:
            self.lock.release()


class SqliteThreadStore:
    """Thread records in SQLite, on the connection and writer the checkpointer uses."""

    def __init__(self, writer: SqliteWriter) -> None:
        self._writer = writer
        self._db = writer.connection

    @classmethod
    async def open(cls, writer: SqliteWriter) -> SqliteThreadStore:
        """Create the table if needed."""
        await writer.write("open", lambda: writer.connection.execute(_SCHEMA))
        return cls(writer)

    async def close(self) -> None:
        """The connection belongs to the writer, which the caller closes."""
        await self._writer.drain()

    async def ping(self) -> None:
        async def probe() -> None:
            async with self._db.execute("SELECT 1") as cursor:
                await cursor.fetchone()

        await self._writer.write("ping", probe)

    async def _select(self, query: str, params: tuple[Any, ...]) -> list[ThreadRecord]:
        async with self._db.execute(query, params) as cursor:
            rows = await cursor.fetchall()
        return [_record(row) for row in rows]

    async def _changed(self, query: str, params: tuple[Any, ...]) -> int:
        async with self._db.execute(query, params) as cursor:
            return cursor.rowcount

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

        async def unit() -> tuple[ThreadRecord, bool]:
            created = await self._changed(
                "INSERT INTO switchyard_threads VALUES (?, ?, ?, 'idle', ?, ?, ?) ON CONFLICT(thread_id) DO NOTHING",
                (thread_id, tenant, graph_id, encoded, now, now),
            )
            rows = await self._select(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = ?", (thread_id,))
            return rows[0], created == 1

        record, created = await self._writer.write("create", unit)
        return (record if record.tenant == tenant else None), created

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        """The thread, if it exists and belongs to ``tenant``."""
        if not _storable(thread_id):
            return None
        rows = await self._writer.read(
            "get",
            lambda: self._select(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = ?", (thread_id,)),
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
        """Set the status and/or graph of a thread, merge ``metadata`` into its own, and
        set its ``updated_at``, in one transaction."""
        _check_ids(graph_id)
        if metadata:
            _check_json(metadata, "metadata")
        if not _storable(thread_id):
            return

        async def unit() -> None:
            merged: str | None = None
            if metadata:
                async with self._db.execute("SELECT metadata FROM switchyard_threads WHERE thread_id = ?", (thread_id,)) as cursor:
                    row = await cursor.fetchone()
                if row is None:
                    return
                merged = json.dumps({**json.loads(row[0]), **metadata})
            await self._changed(
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

        async def unit() -> None:
            async with self._db.execute("SELECT metadata FROM switchyard_threads WHERE thread_id = ?", (thread_id,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                await self._changed(
                    "UPDATE switchyard_threads SET metadata = ?, updated_at = ? WHERE thread_id = ?",
                    (json.dumps({**json.loads(row[0]), **values}), _now(), thread_id),
                )

        await self._writer.write("set_metadata", unit)

    async def delete(self, thread_id: str) -> None:
        """Delete a thread's record."""
        if not _storable(thread_id):
            return
        await self._writer.write(
            "delete", lambda: self._changed("DELETE FROM switchyard_threads WHERE thread_id = ?", (thread_id,))
        )

    async def recover(self) -> int:
        """Mark threads left ``busy`` ``idle`` (see `ThreadStore.recover`)."""
        return await self._writer.write(
            "recover",
            lambda: self._changed(
                "UPDATE switchyard_threads SET status = 'idle', updated_at = ? WHERE status = 'busy'", (_now(),)
            ),
        )

    async def search(
        self,
        *,
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The tenant's threads whose metadata has every given key with an equal value,
        newest first.

        Keys are matched as text through ``json_each`` (a JSON path cannot spell every
        key); values by JSON type and value as in PostgreSQL's ``@>`` for scalars (``1``
        equals ``1.0``, ``true`` does not equal ``1``); objects and arrays must be equal
        as written (PostgreSQL's ``@>`` also matches a nested subset).
        """
        if not _storable(tenant, dict(metadata or {})):
            return []  # no thread can have it
        clauses, params = ["tenant = ?"], [tenant]
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        for key, value in (metadata or {}).items():
            condition, values = _sqlite_match(value)
            clauses.append(
                "EXISTS (SELECT 1 FROM json_each(switchyard_threads.metadata) AS m"
                f" WHERE m.key = ? AND {condition})"
            )
            params.extend([key, *values])
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads "
            f"WHERE {' AND '.join(clauses)} ORDER BY created_at DESC LIMIT ? OFFSET ?"
        )
        return await self._writer.read(
            "search", lambda: self._select(query, (*params, _bounded(limit), _bounded(offset)))
        )


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


class PostgresThreadStore:
    """Thread records in PostgreSQL, on the pool the checkpointer uses."""

    def __init__(self, pool: Any, *, timeout_s: float = 10.0) -> None:
        """Args:
        pool: a ``psycopg_pool.AsyncConnectionPool`` in autocommit mode, which
            checks connections as it hands them out.
        timeout_s: the longest one call may take, waiting for a connection included.
        """
        import psycopg  # noqa: PLC0415 - optional backend, like the pool itself
        from psycopg_pool import PoolTimeout  # noqa: PLC0415

        self._pool = pool
        self._calls = _Calls(timeout_s, (psycopg.Error,), (psycopg.errors.QueryCanceled, PoolTimeout))

    @classmethod
    async def open(cls, pool: Any, *, timeout_s: float = 10.0) -> PostgresThreadStore:
        """Create the table if needed."""
        store = cls(pool, timeout_s=timeout_s)
        await store._calls.write("open", lambda: store._execute(_PG_SCHEMA, ()))
        return store

    async def close(self) -> None:
        """Wait for running writes; the pool belongs to the caller, which closes it."""
        await self._calls.drain()

    async def ping(self) -> None:
        await self._calls.write("ping", lambda: self._execute("SELECT 1", ()))

    async def _execute(self, query: str, params: tuple[Any, ...]) -> int:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(query, params)
            return int(cursor.rowcount)

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[ThreadRecord]:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(query, params)
            rows = await cursor.fetchall()
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

        async def unit() -> tuple[ThreadRecord, bool]:
            for _ in range(2):  # the existing thread may be deleted between the two statements
                inserted = await self._fetch(
                    "INSERT INTO switchyard_threads VALUES (%s, %s, %s, 'idle', %s, %s, %s)"
                    f" ON CONFLICT DO NOTHING RETURNING {_COLUMNS}",
                    (thread_id, tenant, graph_id, encoded, now, now),
                )
                if inserted:
                    return inserted[0], True
                existing = await self._fetch(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = %s", (thread_id,))
                if existing:
                    return existing[0], False
            raise ThreadStoreError("create", f"thread {thread_id!r} was deleted while it was being created")

        record, created = await self._calls.write("create", unit)
        return (record if record.tenant == tenant else None), created

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        if not _storable(thread_id):
            return None
        rows = await self._calls.read(
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
        await self._calls.write(
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
        await self._calls.write(
            "set_metadata",
            lambda: self._execute(
                "UPDATE switchyard_threads SET metadata = metadata || %s::jsonb, updated_at = %s WHERE thread_id = %s",
                (encoded, _now(), thread_id),
            ),
        )

    async def delete(self, thread_id: str) -> None:
        if not _storable(thread_id):
            return
        await self._calls.write("delete", lambda: self._execute("DELETE FROM switchyard_threads WHERE thread_id = %s", (thread_id,)))

    async def recover(self) -> int:
        """Mark threads left ``busy`` ``idle`` (see `ThreadStore.recover` on replicas)."""
        return await self._calls.write(
            "recover",
            lambda: self._execute(
                "UPDATE switchyard_threads SET status = 'idle', updated_at = %s WHERE status = 'busy'", (_now(),)
            ),
        )

    async def search(
        self,
        *,
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        if not _storable(tenant, dict(metadata or {})):
            return []  # no thread can have it
        clauses, params = ["tenant = %s"], [tenant]
        if status is not None:
            clauses.append("status = %s")
            params.append(status)
        if metadata:
            clauses.append("metadata @> %s::jsonb")
            params.append(_dumps(metadata, "metadata filter"))
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads WHERE {' AND '.join(clauses)} "
            "ORDER BY created_at DESC LIMIT %s OFFSET %s"
        )
        return await self._calls.read("search", lambda: self._fetch(query, (*params, _bounded(limit), _bounded(offset))))


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
