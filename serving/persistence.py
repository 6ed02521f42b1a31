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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
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


class _SqliteSaver(AsyncSqliteSaver):
    """`AsyncSqliteSaver` on the thread store's connection, whose writes are units of
    the shared `SqliteWriter`: one transaction each, run to its end even when the run
    that asked for it is cancelled (the library's own ``execute`` then ``commit`` would
    leave the transaction open)."""

    def __init__(self, writer: SqliteWriter) -> None:
        super().__init__(writer.connection)
        self.lock = writer.lock  # type: ignore[assignment] # its reads and writes queue with the store's
        self._writer = writer

    async def setup(self) -> None:
        # The library takes the lock before looking at `is_setup`, on every call:
        # a second wait for the one writer lock per checkpoint read. Set up once,
        # at open, it need not.
        if not self.is_setup:
            await super().setup()

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> RunnableConfig:
        put = super().aput
        return await self._writer.write("checkpoint put", lambda: put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        put_writes = super().aput_writes
        await self._writer.write("checkpoint writes", lambda: put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        delete = super().adelete_thread
        await self._writer.write("checkpoint delete", lambda: delete(thread_id))


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
            await saver.setup()
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
