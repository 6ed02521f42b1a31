"""Where threads live: the LangGraph checkpointer and the thread records.

SQLite in the data directory by default (``<data_dir>/threads.sqlite``, WAL mode);
PostgreSQL when ``threads.postgres_dsn`` is set. Either way a thread survives a restart,
and the checkpointer and the thread store share one way in: on SQLite one connection
and one writer (`serving.threads.SqliteWriter`; the module docstring of
`serving.threads` says why two connections broke under load), on PostgreSQL one pool.
At start, threads a crashed server left ``busy`` are made ``idle`` again (on a
PostgreSQL that replicas share, not those with an active run on the run board:
`serving.threads.PostgresThreadStore.recover`). The LangGraph
store (`serving.store`) lives in the same database and goes the same way in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import BaseModel, ConfigDict, Field

from serving.store import StoreBackend, open_postgres_store, open_sqlite_store, postgres_setup_lock
from serving.threads import PostgresThreadStore, PostgresWorkers, SqliteThreadStore, SqliteWriter, ThreadStore

__all__ = ["ThreadSettings", "ThreadStores", "open_thread_stores"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ThreadSettings(BaseModel):
    """The ``threads`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    postgres_dsn: str | None = None
    """``postgresql://user:pass@host:5432/db``: keep threads in PostgreSQL instead of
    ``<data_dir>/threads.sqlite`` (``SWITCHYARD_THREADS__POSTGRES_DSN``)."""
    pool_size: int = Field(default=10, ge=1)
    """PostgreSQL connections (checkpointer and thread store together)."""
    timeout_s: float = Field(default=10.0, gt=0)
    """The longest one thread-store call (or SQLite checkpoint write) may take, waiting
    for the writer or a pooled connection included; past it the call fails with
    ``ThreadStoreTimeoutError`` and the store stays usable."""
    busy_timeout_s: float = Field(default=5.0, ge=0)
    """SQLite: how long a write waits while another process (the ``switchyard`` CLI, a
    backup) holds the database's write lock, before it fails."""
    statement_timeout_s: float = Field(default=30.0, gt=0)
    """PostgreSQL: the server-side ``statement_timeout`` of every pooled connection
    (checkpointer included), so a statement stuck on a lock ends even when its client
    has gone."""


@dataclass(slots=True, kw_only=True)
class ThreadStores:
    """The open checkpointer, thread store and store; close them with `aclose`."""

    checkpointer: BaseCheckpointSaver[Any]
    threads: ThreadStore
    store: StoreBackend
    """The LangGraph store (``/store/*``), on the same connection or pool."""
    backend: str
    """``sqlite`` or ``postgres``."""
    recovered: int = 0
    """Threads found ``busy`` at start (left by a server that stopped mid-run), now ``idle``."""
    _close: Callable[[], Awaitable[None]]

    async def aclose(self) -> None:
        await self.store.aclose()
        await self.threads.close()
        await self._close()


class _UnitSaver:
    """The asynchronous methods of one of the library's synchronous checkpointers, each
    call one unit on a worker thread (`_unit`): a write runs to its end even when the
    run that asked for it is cancelled; a read is one hop, however many statements it
    takes. (The library's asynchronous savers make event-loop round trips per
    statement and hold one lock across them: issue 10 in ``docs/performance.md``.)"""

    async def _unit(self, operation: str, work: Callable[[], T], *, write: bool) -> T:
        raise NotImplementedError

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._unit("checkpoint get", lambda: self.get_tuple(config), write=False)  # type: ignore[attr-defined]

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - the library's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        # Pages of a few checkpoints, each read in one unit: no worker or connection is
        # held while the caller consumes them (a store call awaited in this loop must
        # not wait behind it), and a long history is never read all at once.
        remaining = limit
        while remaining is None or remaining > 0:
            size = _LIST_PAGE if remaining is None else min(_LIST_PAGE, remaining)
            cursor = before

            def page(cursor: RunnableConfig | None = cursor, size: int = size) -> list[CheckpointTuple]:
                return list(self.list(config, filter=filter, before=cursor, limit=size))  # type: ignore[attr-defined]

            items = await self._unit("checkpoint list", page, write=False)
            for item in items:
                yield item
            if len(items) < size:
                return
            if remaining is not None:
                remaining -= len(items)
            before = {"configurable": {"checkpoint_id": items[-1].config["configurable"]["checkpoint_id"]}}

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> RunnableConfig:
        put = self.put  # type: ignore[attr-defined]
        return await self._unit("checkpoint put", lambda: put(config, checkpoint, metadata, new_versions), write=True)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        put_writes = self.put_writes  # type: ignore[attr-defined]
        await self._unit("checkpoint writes", lambda: put_writes(config, writes, task_id, task_path), write=True)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._unit("checkpoint delete", lambda: self.delete_thread(thread_id), write=True)  # type: ignore[attr-defined]

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of a thread (all namespaces, with their blobs and
        pending writes) to a thread that has none, in one transaction: the target has
        all of them or none."""
        copy = self.copy_thread  # type: ignore[attr-defined]
        await self._unit("checkpoint copy", lambda: copy(source_thread_id, target_thread_id), write=True)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only the latest checkpoint of each namespace of each
        thread (with its pending writes; it is left with no parent), ``delete``: every
        checkpoint. SQLite: one transaction for all the threads (`_SqliteSaver.prune`);
        PostgreSQL: the library's ``prune``, one transaction per thread. A thread whose
        graph uses a ``DeltaChannel`` is refused (``NotImplementedError``; nothing pruned)."""
        prune = self.prune  # type: ignore[attr-defined]
        await self._unit("checkpoint prune", lambda: prune(list(thread_ids), strategy=strategy), write=True)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        history = self.get_delta_channel_history  # type: ignore[attr-defined]
        return await self._unit("checkpoint history", lambda: history(config=config, channels=channels), write=False)


_LIST_PAGE = 16
"""Checkpoints read per unit by `_UnitSaver.alist`."""

_SQLITE_COPY_CHECKPOINTS = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
FROM checkpoints WHERE thread_id = ?
"""
_SQLITE_COPY_WRITES = """
INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
SELECT ?, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
FROM writes WHERE thread_id = ?
"""
_POSTGRES_COPY = (
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT %s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
    FROM checkpoints WHERE thread_id = %s""",
    """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %s, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs WHERE thread_id = %s""",
    """INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
    FROM checkpoint_writes WHERE thread_id = %s""",
)
_SQLITE_PRUNE_DELTA = """
SELECT 1 FROM checkpoints WHERE thread_id = ? AND (
    json_type(CAST(metadata AS TEXT), '$.counters_since_delta_snapshot') IS NOT NULL
    OR json_type(CAST(metadata AS TEXT), '$.delta_writes_versioned') IS NOT NULL
) LIMIT 1
"""
_SQLITE_PRUNE_KEEP_LATEST = (
    # Writes of the checkpoints that go (newer ones, saved before their checkpoint, stay).
    """DELETE FROM writes WHERE thread_id = ?1 AND checkpoint_id < (
        SELECT MAX(c.checkpoint_id) FROM checkpoints c
        WHERE c.thread_id = ?1 AND c.checkpoint_ns = writes.checkpoint_ns)""",
    """DELETE FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id < (
        SELECT MAX(c.checkpoint_id) FROM checkpoints c
        WHERE c.thread_id = ?1 AND c.checkpoint_ns = checkpoints.checkpoint_ns)""",
    """UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = ?1
    AND parent_checkpoint_id IS NOT NULL AND parent_checkpoint_id NOT IN (
        SELECT c.checkpoint_id FROM checkpoints c WHERE c.thread_id = ?1 AND c.checkpoint_ns = checkpoints.checkpoint_ns)""",
)
"""One thread's ``keep_latest`` prune on SQLite: the latest checkpoint of each
namespace stays (SQLite keeps channel values in the checkpoint row: no blobs to keep),
with its pending writes, and no parent."""
_SQLITE_PRUNE_DELETE = ("DELETE FROM checkpoints WHERE thread_id = ?1", "DELETE FROM writes WHERE thread_id = ?1")

"""A thread's checkpoint rows copied to another thread id (the tables of the installed
``langgraph-checkpoint-sqlite`` / ``-postgres``; `tests/contracts/test_checkpoint_copy.py`
runs them)."""


class _SqliteSaver(_UnitSaver, SqliteSaver):
    """The library's SQLite checkpointer on the thread store's connection, its calls
    units of the shared `SqliteWriter` (a write is transactional with the other units
    of its batch)."""

    def __init__(self, writer: SqliteWriter) -> None:
        super().__init__(writer.connection)
        self._writer = writer

    async def _unit(self, operation: str, work: Callable[[], T], *, write: bool) -> T:
        return await (self._writer.write if write else self._writer.read)(operation, lambda _db: work())

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        # The library's takes its own lock and commits after each write; here every
        # call is already one unit on the one worker, inside the writer's transaction.
        cursor = self.conn.cursor()
        try:
            yield cursor
        finally:
            cursor.close()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        # The library's savers leave copy_thread to subclasses; ours is one unit (one
        # transaction on the writer), rows copied as stored.
        with self.cursor() as cursor:
            cursor.execute(_SQLITE_COPY_CHECKPOINTS, (target_thread_id, source_thread_id))
            cursor.execute(_SQLITE_COPY_WRITES, (target_thread_id, source_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        # Not in the library's SQLite saver; one unit (one transaction) for all threads.
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy: {strategy!r}")
        with self.cursor() as cursor:
            if strategy == "keep_latest":
                delta = [t for t in thread_ids if cursor.execute(_SQLITE_PRUNE_DELTA, (t,)).fetchone()]
                if delta:
                    raise NotImplementedError(f"keep_latest can't prune threads that use a DeltaChannel: {', '.join(delta)}")
            for thread_id in thread_ids:
                for statement in _SQLITE_PRUNE_KEEP_LATEST if strategy == "keep_latest" else _SQLITE_PRUNE_DELETE:
                    cursor.execute(statement, (thread_id,))

    async def asetup(self) -> None:
        """Create the tables if needed (once, at open)."""
        await self._writer.read("checkpoint setup", lambda _db: self.setup())


def _postgres_saver(workers: PostgresWorkers) -> BaseCheckpointSaver[Any]:
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415 - optional backend

    class _PostgresSaver(_UnitSaver, PostgresSaver):
        """The library's PostgreSQL checkpointer on the thread store's pool, its calls
        run on the shared `PostgresWorkers`."""

        def __init__(self) -> None:
            super().__init__(workers.pool)
            # The library's lock guards one shared connection; each call here takes
            # its own from the pool, so calls need not wait for one another.
            self.lock = contextlib.nullcontext()  # type: ignore[assignment]

        async def _unit(self, operation: str, work: Callable[[], T], *, write: bool) -> T:
            return await workers.run(operation, work)

        def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
            # One transaction (the pool's connections are in autocommit mode otherwise).
            with self.conn.connection() as connection, connection.transaction():  # type: ignore[union-attr]
                for statement in _POSTGRES_COPY:
                    connection.execute(statement, (target_thread_id, source_thread_id))

    return _PostgresSaver()


async def open_thread_stores(settings: ThreadSettings, data_dir: Any) -> ThreadStores:
    """Open (creating tables if needed) the configured database, and recover the threads
    a crashed server left ``busy``."""
    if settings.postgres_dsn:
        stores = await _open_postgres(settings)
    else:
        writer = await SqliteWriter.open(
            data_dir / "threads.sqlite", busy_timeout_s=settings.busy_timeout_s, timeout_s=settings.timeout_s
        )
        try:
            saver = _SqliteSaver(writer)
            await saver.asetup()
            threads: ThreadStore = await SqliteThreadStore.open(writer)
            store = await open_sqlite_store(writer)
        except BaseException:
            await writer.close()
            raise
        stores = ThreadStores(checkpointer=saver, threads=threads, store=store, backend="sqlite", _close=writer.close)
    try:
        stores.recovered = await stores.threads.recover()
    except BaseException:
        await stores.aclose()
        raise
    if stores.recovered:
        log.warning("%d thread(s) were left busy by a server that stopped mid-run: now idle", stores.recovered)
    return stores


async def _open_postgres(settings: ThreadSettings) -> ThreadStores:
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415 - optional backend
    from psycopg import Connection  # noqa: PLC0415
    from psycopg.rows import dict_row  # noqa: PLC0415
    from psycopg_pool import ConnectionPool  # noqa: PLC0415

    assert settings.postgres_dsn is not None
    dsn = settings.postgres_dsn
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    statement_timeout_ms = round(settings.statement_timeout_s * 1000)

    def configure(connection: Any) -> None:
        connection.execute(f"SET statement_timeout = {statement_timeout_ms}")

    def open_pool() -> Any:
        # Tables and migrations first, on a connection of their own: a migration may
        # take longer than the statement timeout the pool sets.
        # Under the setup lock: replicas starting together on a fresh database must
        # not run the same migrations at once (`serving.store.postgres_setup_lock`).
        with Connection.connect(dsn, **kwargs) as connection, postgres_setup_lock(connection):
            PostgresSaver(connection).setup()  # type: ignore[arg-type]
        pool = ConnectionPool(
            dsn,
            min_size=min(4, settings.pool_size),
            max_size=settings.pool_size,
            kwargs=kwargs,
            configure=configure,
            # Not checked when taken (a round trip per call): a call that meets a
            # connection the server dropped is retried once (`PostgresWorkers.run`).
            timeout=settings.timeout_s,
            open=False,
        )
        try:
            pool.open(wait=True, timeout=10)
        except BaseException:
            pool.close()
            raise
        return pool

    workers = PostgresWorkers(await asyncio.to_thread(open_pool), workers=settings.pool_size, timeout_s=settings.timeout_s)
    try:
        checkpointer = _postgres_saver(workers)
        threads = await PostgresThreadStore.open(workers)
        store = await open_postgres_store(workers, dsn)
    except BaseException:
        await workers.close()
        raise
    return ThreadStores(
        checkpointer=checkpointer, threads=threads, store=store, backend="postgres", _close=workers.close
    )
