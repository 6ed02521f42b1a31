"""Where threads live: the LangGraph checkpointer and the thread records.

SQLite in the data directory by default (``<data_dir>/threads.sqlite``, WAL mode);
PostgreSQL when ``threads.postgres_dsn`` is set (one connection pool shared by the
checkpointer and the thread store). Either way a thread survives a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from pydantic import BaseModel, ConfigDict

from serving.threads import PostgresThreadStore, SqliteThreadStore, ThreadStore

__all__ = ["ThreadSettings", "ThreadStores", "open_thread_stores"]


class ThreadSettings(BaseModel):
    """The ``threads`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    postgres_dsn: str | None = None
    """``postgresql://user:pass@host:5432/db``: keep threads in PostgreSQL instead of
    ``<data_dir>/threads.sqlite`` (``SWITCHYARD_THREADS__POSTGRES_DSN``)."""
    pool_size: int = 10
    """PostgreSQL connections (checkpointer and thread store together)."""


@dataclass(slots=True, kw_only=True)
class ThreadStores:
    """The open checkpointer and thread store; close both with `aclose`."""

    checkpointer: BaseCheckpointSaver[Any]
    threads: ThreadStore
    backend: str
    """``sqlite`` or ``postgres``."""
    _close: Callable[[], Awaitable[None]]

    async def aclose(self) -> None:
        await self.threads.close()
        await self._close()


async def open_thread_stores(settings: ThreadSettings, data_dir: Any) -> ThreadStores:
    """Open (creating tables if needed) the configured database."""
    if settings.postgres_dsn:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: PLC0415 - optional backend
        from psycopg.rows import dict_row  # noqa: PLC0415
        from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

        pool = AsyncConnectionPool(
            settings.postgres_dsn,
            max_size=settings.pool_size,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        await pool.open(wait=True, timeout=10)
        checkpointer: BaseCheckpointSaver[Any] = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await checkpointer.setup()  # type: ignore[attr-defined]
        threads: ThreadStore = await PostgresThreadStore.open(pool)
        return ThreadStores(checkpointer=checkpointer, threads=threads, backend="postgres", _close=pool.close)
    path = data_dir / "threads.sqlite"
    threads = await SqliteThreadStore.open(path)
    connection = await aiosqlite.connect(path)
    # WAL (set by the thread store) with synchronous=NORMAL: a commit survives the
    # process crashing; only a power loss can take the last commits back. FULL
    # would fsync on every checkpoint, several times per run.
    await connection.execute("PRAGMA synchronous=NORMAL")
    sqlite_saver = AsyncSqliteSaver(connection)
    await sqlite_saver.setup()
    return ThreadStores(checkpointer=sqlite_saver, threads=threads, backend="sqlite", _close=connection.close)
