"""Threads: the conversations the LangGraph-compatible API keeps.

A thread's *state* lives in the LangGraph checkpointer (``data/threads.sqlite`` by
default); its *record* (which graph, metadata, status, times) lives here, in the same
SQLite file, so listing and searching threads needs no scan of checkpoints.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiosqlite

__all__ = ["ThreadRecord", "ThreadStatus", "ThreadStore"]

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
"""``idle``: ready for a run; ``busy``: a run is in progress; ``interrupted``: a run
stopped at an interrupt and waits for ``command: {resume: ...}``; ``error``: the last
run failed."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS switchyard_threads (
    thread_id  TEXT PRIMARY KEY,
    graph_id   TEXT,
    status     TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
"""


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(slots=True, kw_only=True)
class ThreadRecord:
    """One thread's record (its state is in the checkpointer)."""

    thread_id: str
    graph_id: str | None
    status: ThreadStatus
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: str
    updated_at: str


class ThreadStore:
    """Thread records in SQLite (aiosqlite: the blocking driver runs in its own thread)."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._db = connection

    @classmethod
    async def open(cls, path: Path) -> ThreadStore:
        """Open (and create if needed) the store at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = await aiosqlite.connect(path)
        await connection.execute("PRAGMA journal_mode=WAL")
        await connection.execute(_SCHEMA)
        await connection.commit()
        return cls(connection)

    async def close(self) -> None:
        await self._db.close()

    async def create(
        self, *, thread_id: str | None = None, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None
    ) -> tuple[ThreadRecord, bool]:
        """Create a thread, or return the existing one with that id.

        Returns:
            The record and whether it was created now.
        """
        thread_id = thread_id or str(uuid.uuid4())
        existing = await self.get(thread_id)
        if existing is not None:
            return existing, False
        now = _now()
        record = ThreadRecord(
            thread_id=thread_id, graph_id=graph_id, status="idle", metadata=dict(metadata or {}), created_at=now, updated_at=now
        )
        await self._db.execute(
            "INSERT INTO switchyard_threads VALUES (?, ?, ?, ?, ?, ?)",
            (thread_id, graph_id, record.status, json.dumps(record.metadata), now, now),
        )
        await self._db.commit()
        return record, True

    async def get(self, thread_id: str) -> ThreadRecord | None:
        async with self._db.execute(
            "SELECT thread_id, graph_id, status, metadata, created_at, updated_at FROM switchyard_threads WHERE thread_id = ?",
            (thread_id,),
        ) as cursor:
            row = await cursor.fetchone()
        return _record(row) if row else None

    async def update(
        self, thread_id: str, *, status: ThreadStatus | None = None, graph_id: str | None = None
    ) -> None:
        """Set the status and/or graph of a thread, and its ``updated_at``."""
        await self._db.execute(
            "UPDATE switchyard_threads SET status = COALESCE(?, status), graph_id = COALESCE(?, graph_id),"
            " updated_at = ? WHERE thread_id = ?",
            (status, graph_id, _now(), thread_id),
        )
        await self._db.commit()

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into a thread's metadata."""
        record = await self.get(thread_id)
        if record is None:
            return
        await self._db.execute(
            "UPDATE switchyard_threads SET metadata = ?, updated_at = ? WHERE thread_id = ?",
            (json.dumps({**record.metadata, **values}), _now(), thread_id),
        )
        await self._db.commit()

    async def delete(self, thread_id: str) -> None:
        await self._db.execute("DELETE FROM switchyard_threads WHERE thread_id = ?", (thread_id,))
        await self._db.commit()

    async def search(
        self,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """Threads whose metadata contains every given key/value, newest first."""
        clauses, params = [], []
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        for key, value in (metadata or {}).items():
            clauses.append("json_extract(metadata, ?) = json_extract(?, '$')")
            params.extend([f'$."{key}"', json.dumps(value)])
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        query = (
            "SELECT thread_id, graph_id, status, metadata, created_at, updated_at FROM switchyard_threads "
            f"{where} ORDER BY created_at DESC LIMIT ? OFFSET ?"
        )
        async with self._db.execute(query, (*params, limit, offset)) as cursor:
            rows = await cursor.fetchall()
        return [_record(row) for row in rows]


def _record(row: Any) -> ThreadRecord:
    return ThreadRecord(
        thread_id=row[0], graph_id=row[1], status=row[2], metadata=json.loads(row[3]), created_at=row[4], updated_at=row[5]
    )
