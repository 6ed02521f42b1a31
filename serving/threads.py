"""Threads: the conversations the LangGraph-compatible API keeps.

A thread's *state* lives in the LangGraph checkpointer; its *record* (owner, graph,
metadata, status, times) lives in a `ThreadStore` beside it, in the same database, so
listing and searching threads needs no scan of checkpoints. Two stores: SQLite in the
data directory (the default) and PostgreSQL (when a DSN is configured); one contract
suite (``tests/contracts/test_thread_store.py``) runs on both.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import aiosqlite

__all__ = ["PostgresThreadStore", "SqliteThreadStore", "ThreadRecord", "ThreadStatus", "ThreadStore"]

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


class ThreadStore(Protocol):
    """Where thread records live."""

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

    async def update(self, thread_id: str, *, status: ThreadStatus | None = None, graph_id: str | None = None) -> None:
        """Set the status and/or graph of a thread, and its ``updated_at``."""
        ...

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into a thread's metadata."""
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
        """The tenant's threads whose metadata contains every given key/value, newest first."""
        ...

    async def ping(self) -> None:
        """Raise if the database does not answer (readiness)."""
        ...

    async def close(self) -> None: ...


class SqliteThreadStore:
    """Thread records in SQLite (aiosqlite: the blocking driver runs in its own thread)."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._db = connection

    @classmethod
    async def open(cls, path: Path) -> SqliteThreadStore:
        """Open (and create if needed) the store at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = await aiosqlite.connect(path)
        await connection.execute("PRAGMA journal_mode=WAL")
        await connection.execute(_SCHEMA)
        await connection.commit()
        return cls(connection)

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        async with self._db.execute("SELECT 1") as cursor:
            await cursor.fetchone()

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

    def __init__(self, pool: Any) -> None:
        """Args:
            pool: a ``psycopg_pool.AsyncConnectionPool`` in autocommit mode.
        """
        self._pool = pool

    @classmethod
    async def open(cls, pool: Any) -> PostgresThreadStore:
        async with pool.connection() as connection:
            await connection.execute(_PG_SCHEMA)
        return cls(pool)

    async def close(self) -> None:
        """The pool belongs to the caller, which closes it."""

    async def ping(self) -> None:
        async with self._pool.connection() as connection:
            await connection.execute("SELECT 1")

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[ThreadRecord]:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(query, params)
            rows = await cursor.fetchall()
        return [_pg_record(row) for row in rows]

    async def _get_any(self, thread_id: str) -> ThreadRecord | None:
        rows = await self._fetch(f"SELECT {_COLUMNS} FROM switchyard_threads WHERE thread_id = %s", (thread_id,))
        return rows[0] if rows else None

    async def create(
        self,
        *,
        tenant: str,
        thread_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        graph_id: str | None = None,
    ) -> tuple[ThreadRecord | None, bool]:
        thread_id = thread_id or str(uuid.uuid4())
        now = _now()
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "INSERT INTO switchyard_threads VALUES (%s, %s, %s, 'idle', %s, %s, %s) ON CONFLICT DO NOTHING",
                (thread_id, tenant, graph_id, json.dumps(dict(metadata or {})), now, now),
            )
            created = cursor.rowcount == 1
        record = await self._get_any(thread_id)
        assert record is not None
        return (record if record.tenant == tenant else None), created

    async def get(self, thread_id: str, *, tenant: str) -> ThreadRecord | None:
        record = await self._get_any(thread_id)
        return record if record is not None and record.tenant == tenant else None

    async def update(self, thread_id: str, *, status: ThreadStatus | None = None, graph_id: str | None = None) -> None:
        async with self._pool.connection() as connection:
            await connection.execute(
                "UPDATE switchyard_threads SET status = COALESCE(%s, status), graph_id = COALESCE(%s, graph_id),"
                " updated_at = %s WHERE thread_id = %s",
                (status, graph_id, _now(), thread_id),
            )

    async def set_metadata(self, thread_id: str, values: Mapping[str, Any]) -> None:
        async with self._pool.connection() as connection:
            await connection.execute(
                "UPDATE switchyard_threads SET metadata = metadata || %s::jsonb, updated_at = %s WHERE thread_id = %s",
                (json.dumps(dict(values)), _now(), thread_id),
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
        clauses, params = ["tenant = %s"], [tenant]
        if status is not None:
            clauses.append("status = %s")
            params.append(status)
        if metadata:
            clauses.append("metadata @> %s::jsonb")
            params.append(json.dumps(dict(metadata)))
        query = (
            f"SELECT {_COLUMNS} FROM switchyard_threads WHERE {' AND '.join(clauses)} "
            "ORDER BY created_at DESC LIMIT %s OFFSET %s"
        )
        return await self._fetch(query, (*params, limit, offset))


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
