"""Where threads live: the LangGraph checkpointer and the thread records.

SQLite in the data directory by default (``<data_dir>/threads.sqlite``, WAL mode), so a
thread survives a restart of the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from serving.settings import Settings
from serving.threads import ThreadStore

__all__ = ["ThreadStores", "open_thread_stores"]


@dataclass(slots=True, kw_only=True)
class ThreadStores:
    """The open checkpointer and thread store; close both with `aclose`."""

    checkpointer: BaseCheckpointSaver[Any]
    threads: ThreadStore
    _connection: aiosqlite.Connection

    async def aclose(self) -> None:
        await self.threads.close()
        await self._connection.close()


async def open_thread_stores(settings: Settings) -> ThreadStores:
    """Open (creating if needed) the SQLite file under the data directory."""
    path = settings.data_dir / "threads.sqlite"
    threads = await ThreadStore.open(path)
    connection = await aiosqlite.connect(path)
    checkpointer = AsyncSqliteSaver(connection)
    await checkpointer.setup()
    return ThreadStores(checkpointer=checkpointer, threads=threads, _connection=connection)
