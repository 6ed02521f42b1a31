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
    tenant     TEXT NOT NULL,
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
    tenant: str
    """The tenant that owns it; other tenants do not see it (404)."""
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
        existing = await self._get_any(thread_id)
        if existing is not None:
            return (existing if existing.tenant == tenant else None), False
        now = _now()
        record = ThreadRecord(
            thread_id=thread_id,
            tenant=tenant,
            graph_id=graph_id,
            status="idle",
            metadata=dict(metadata or {}),
            created_at=now,
            updated_at=now,
        )
        await self._db.execute(
            "INSERT INTO switchyard_threads VALUES (?, ?, ?, ?, ?, ?, ?)",
            (thread_id, tenant, graph_id, record.status, json.dumps(record.metadata), now, now),
        )
        await self._db.commit()
        return record, True

    async def _get_any(self, thread_id: str) -> ThreadRecord | None:
        async with self._db.execute(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = ?", (thread_id,)) as cursor:
            row = await cursor.fetchone()
        return _record(row) if row else None

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        """The thread, if it exists and belongs to ``tenant``."""
        record = await self._get_any(thread_id)
        return record if record is not None and record.tenant == tenant else None

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
        record = await self._get_any(thread_id)
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
        tenant: str,
        metadata: Mapping[str, Any] | None = None,
        status: ThreadStatus | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The tenant's threads whose metadata contains every given key/value, newest
        first."""
        clauses, params = ["tenant = ?"], [tenant]
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        for key, value in (metadata or {}).items():
            clauses.append("json_extract(metadata, ?) = json_extract(?, '$')")
            params.extend([f'$."{key}"', json.dumps(value)])
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads "
            f"WHERE {' AND '.join(clauses)} ORDER BY created_at DESC LIMIT ? OFFSET ?"
        )
        async with self._db.execute(query, (*params, limit, offset)) as cursor:
            rows = await cursor.fetchall()
        return [_record(row) for row in rows]


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
