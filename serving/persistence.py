"""Where threads live: the LangGraph checkpointer and the thread records.

SQLite in the data directory by default (``<data_dir>/threads.sqlite``, WAL mode);
PostgreSQL when ``threads.postgres_dsn`` is set. Either way a thread survives a restart,
and the checkpointer and the thread store share one way in: on SQLite one connection
and one writer (`serving.threads.SqliteWriter`; the module docstring of
`serving.threads` says why two connections broke under load), on PostgreSQL one pool.
At start, threads a crashed server left ``busy`` are made ``idle`` again.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

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

from serving.threads import PostgresThreadStore, SqliteThreadStore, SqliteWriter, ThreadStore

__all__ = ["ThreadSettings", "ThreadStores", "open_thread_stores"]

log = logging.getLogger(__name__)


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
    """The open checkpointer and thread store; close both with `aclose`."""

    checkpointer: BaseCheckpointSaver[Any]
    threads: ThreadStore
    backend: str
    """``sqlite`` or ``postgres``."""
    recovered: int = 0
    """Threads found ``busy`` at start (left by a server that stopped mid-run), now ``idle``."""
    _close: Callable[[], Awaitable[None]]

    async def aclose(self) -> None:
        await self.threads.close()
        await self._close()


class _SqliteSaver(SqliteSaver):
    """The library's SQLite checkpointer on the thread store's connection, each call
    one unit on the shared `SqliteWriter`'s worker: a write is transactional (with the
    other units of its batch), run to its end even when the run that asked for it is
    cancelled; a read is one hop, however many statements it takes. (The library's
    `AsyncSqliteSaver` makes one event-loop round trip per statement, and a write
    cancelled between its ``execute`` and its ``commit`` would leave its rows in an
    open transaction.)"""

    def __init__(self, writer: SqliteWriter) -> None:
        super().__init__(writer.connection)
        self._writer = writer

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        # The library's takes its own lock and commits after each write; here every
        # call is already one unit on the one worker, inside the writer's transaction.
        cursor = self.conn.cursor()
        try:
            yield cursor
        finally:
            cursor.close()

    async def asetup(self) -> None:
        """Create the tables if needed (once, at open)."""
        await self._writer.read("checkpoint setup", lambda _db: self.setup())

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._writer.read("checkpoint get", lambda _db: self.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - the library's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        # Pages of a few checkpoints, each read in one unit: the worker is never held
        # while the caller consumes them (a store call awaited in this loop must not
        # wait behind it), and a long history is never read all at once.
        remaining = limit
        while remaining is None or remaining > 0:
            size = _LIST_PAGE if remaining is None else min(_LIST_PAGE, remaining)
            cursor = before

            def page(_db: Any, cursor: RunnableConfig | None = cursor, size: int = size) -> list[CheckpointTuple]:
                return list(self.list(config, filter=filter, before=cursor, limit=size))

            items = await self._writer.read("checkpoint list", page)
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
        return await self._writer.write("checkpoint put", lambda _db: self.put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._writer.write("checkpoint writes", lambda _db: self.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._writer.write("checkpoint delete", lambda _db: self.delete_thread(thread_id))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        return await self._writer.read(
            "checkpoint history", lambda _db: self.get_delta_channel_history(config=config, channels=channels)
        )


_LIST_PAGE = 16
"""Checkpoints read per unit by `_SqliteSaver.alist`."""


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
        except BaseException:
            await writer.close()
            raise
        stores = ThreadStores(checkpointer=saver, threads=threads, backend="sqlite", _close=writer.close)
    try:
        stores.recovered = await stores.threads.recover()
    except BaseException:
        await stores.aclose()
        raise
    if stores.recovered:
        log.warning("%d thread(s) were left busy by a server that stopped mid-run: now idle", stores.recovered)
    return stores


async def _open_postgres(settings: ThreadSettings) -> ThreadStores:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: PLC0415 - optional backend
    from psycopg import AsyncConnection  # noqa: PLC0415
    from psycopg.rows import dict_row  # noqa: PLC0415
    from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

    assert settings.postgres_dsn is not None
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    # Tables and migrations first, on a connection of their own: a migration may take
    # longer than the statement timeout the pool sets.
    async with await AsyncConnection.connect(settings.postgres_dsn, **kwargs) as connection:
        await AsyncPostgresSaver(connection).setup()  # type: ignore[arg-type]
    statement_timeout_ms = round(settings.statement_timeout_s * 1000)

    async def configure(connection: Any) -> None:
        await connection.execute(f"SET statement_timeout = {statement_timeout_ms}")

    pool = AsyncConnectionPool(
        settings.postgres_dsn,
        min_size=min(4, settings.pool_size),
        max_size=settings.pool_size,
        kwargs=kwargs,
        configure=configure,
        # A connection the server dropped (restart, pg_terminate_backend, idle timeout)
        # is replaced when taken, instead of failing the call that took it.
        check=AsyncConnectionPool.check_connection,
        timeout=settings.timeout_s,
        open=False,
    )
    await pool.open(wait=True, timeout=10)
    try:
        checkpointer = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        threads = await PostgresThreadStore.open(pool, timeout_s=settings.timeout_s)
    except BaseException:
        await pool.close()
        raise
    return ThreadStores(checkpointer=checkpointer, threads=threads, backend="postgres", _close=pool.close)
