"""The run board: run records that replicas share through PostgreSQL.

With ``state.postgres_dsn`` (or ``threads.postgres_dsn``) set, every replica writes
the runs it hosts to ``switchyard_runs`` and the frames of its background runs to
``switchyard_run_frames``, so that any replica can read, list, join, stream and
cancel a run that another one hosts. A run still runs in the process that started it
(its graph, its task); the board is how the others see it and reach it.

Tables (created idempotently at start, under an advisory lock):

- ``switchyard_replicas(replica_id, seen_at, started_at)``: each replica's heartbeat,
  ``seen_at = now()`` every ``state.heartbeat_s``.
- ``switchyard_runs``: one row per run (the `RunRecord` fields, the hosting
  ``replica_id``, ``background``, ``cancel_reason``, ``error``, ``ended_at``). A partial
  unique index on ``thread_id`` over the active statuses (``pending``, ``running``)
  keeps one active run per thread across replicas: inserting the row is a run's
  cross-replica admission.
- ``switchyard_run_frames(run_id, idx, frame)``: a background run's SSE frames, bounded
  per run like the in-memory buffer (``server.replay_max_bytes``, oldest dropped).

Guarantees and how they are kept:

- A run's row exists before the request that started it answers (the insert is
  awaited inside `serving.runs.RunHost.open`, with status ``running``). Later writes
  (background, frames, the end) go through one ordered writer task: a failure is logged and never
  breaks the run; frames are written before the end that follows them. A run's end (or
  delete) with nothing of its own queued before it goes ahead of other runs' queued
  frames, and the request that ran it answers once it is written (`RunBoard.end_written`,
  at most 2 s): the client's next run on the thread, through any replica, finds the
  thread free. An end (or delete)
  that fails is tried again a few times; one lost for good, or the row of an admission
  whose reply was lost after its insert committed, is ended by the owner's heartbeat
  (its active rows with no run behind them), so no row holds a thread for ever.
- Wake-ups ride on one ``LISTEN switchyard_runs`` connection (reconnecting):
  ``f:<run_id>`` new frames, ``e:<run_id>`` a run ended, ``c:<run_id>`` a cancel was
  requested. Every wait also polls each ``state.heartbeat_s``, so a lost notification
  only delays; the owner polls its own runs' ``cancel_reason`` (and finds runs ended
  under it by a sweeper) each heartbeat too.
- Leases are on the database's clock: a replica not seen for ``state.lease_s`` is
  dead; any other replica's sweeper ends its active runs (``error``, saying which
  replica stopped), appends an ``error`` frame for followers (without an id, stored
  after any index the dead host could have sent live), sets the thread's status
  as a cancelled run's would be, and counts ``switchyard_replica_runs_reaped_total``.
  ``FOR UPDATE SKIP LOCKED`` makes one sweeper win each run; a batch is ended in one
  short transaction, committed before the threads' statuses are set. The heartbeat runs
  in a task of its own on the id lock's connection (not the pool), so a slow sweep or
  poll never makes a live replica look dead.
- A replica that starts under the id of one that died ends that one's runs first
  (`RunBoard.start`, before the server takes requests); one that stops cleanly ends its
  runs as a single replica does, flushes its writes and removes its replica row.

Replica ids. ``state.replica_id`` when set (Kubernetes sets the pod's name); otherwise
``switchyard serve`` derives ``<hostname>-<hash of the resolved data directory>``
(`default_replica_id`). A data directory is held by one process at a time (the vector
and graph stores lock it), so the id is stable across restarts on the same data: a
server killed (``kill -9``, OOM) and started again ends its predecessor's runs at once
and their threads take new runs, instead of refusing them (409) until the lease expires.

Two live processes never share an id: a replica holds a session advisory lock on its
id (``pg_try_advisory_lock`` on a connection of its own) for as long as it runs. A dead
process's connection is closed by the server, which frees the lock at once; one that is
still held means another process is using the id, and this one refuses to start with
`ReplicaIdInUseError` naming ``state.replica_id`` (giving two processes one name is a
configuration error: each would end the other's runs as its own leftovers). Only the
lock decides this, not a recent heartbeat: a crashed replica restarted within the lease
has a recent row and must not be refused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from serving._tasks import RunCancelledError
from serving.errors import ServingError
from serving.shared import PG_TCP
from serving.runs.registry import CONTROL_EVENTS, event_mode

if TYPE_CHECKING:
    from serving.observability import ServingMetrics
    from serving.runs.registry import RunRecord, RunRegistry
    from serving.shared.settings import StateSettings

__all__ = [
    "ACTIVE",
    "BoardUnavailableError",
    "ReplicaIdInUseError",
    "RunBoard",
    "RunConflictError",
    "SharedRun",
    "default_replica_id",
]

log = logging.getLogger(__name__)

ACTIVE = ("pending", "running")
"""Statuses of a run that holds its thread (the partial unique index's)."""

CHANNEL = "switchyard_runs"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS switchyard_replicas (
        replica_id text PRIMARY KEY,
        seen_at timestamptz NOT NULL DEFAULT now(),
        started_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS switchyard_runs (
        run_id text PRIMARY KEY,
        thread_id text,
        tenant text NOT NULL,
        assistant_id text NOT NULL,
        status text NOT NULL,
        metadata jsonb NOT NULL DEFAULT '{}',
        multitask_strategy text NOT NULL,
        created_at text NOT NULL,
        updated_at text NOT NULL,
        replica_id text NOT NULL,
        background boolean NOT NULL DEFAULT false,
        cancel_reason text,
        error text,
        ended_at timestamptz)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS switchyard_runs_one_active ON switchyard_runs (thread_id)
        WHERE status IN ('pending', 'running') AND thread_id IS NOT NULL""",
    "CREATE INDEX IF NOT EXISTS switchyard_runs_by_thread ON switchyard_runs (thread_id, created_at)",
    """CREATE INDEX IF NOT EXISTS switchyard_runs_active_by_replica ON switchyard_runs (replica_id)
        WHERE status IN ('pending', 'running')""",
    "CREATE INDEX IF NOT EXISTS switchyard_runs_ended ON switchyard_runs (ended_at) WHERE ended_at IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS switchyard_run_frames (
        run_id text NOT NULL REFERENCES switchyard_runs (run_id) ON DELETE CASCADE,
        idx bigint NOT NULL,
        frame text NOT NULL,
        PRIMARY KEY (run_id, idx))""",
)
_FOLLOW_PAGE = 500
"""Frames a follower reads per query."""
_LOST_IDX = 1 << 62
"""``idx`` of the ``error`` frame a sweeper appends to a dead replica's background run:
after any index its host could have sent live (frames it had not yet written are not
on the board, so ``max(idx) + 1`` could repeat an id the client already saw)."""
_SWEEP_BATCH = 100
"""Runs a sweeper ends per transaction."""
_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
"""Waits between the tries of a run's end (or delete) write."""
_SCHEMA_LOCK = 0x5357_5255_4E53  # pg_advisory_xact_lock key: two replicas starting at once

_COLUMNS = (
    "run_id, thread_id, tenant, assistant_id, status, metadata, multitask_strategy, created_at, updated_at, "
    "replica_id, background, cancel_reason, error"
)
_INSERT = f"""INSERT INTO switchyard_runs ({_COLUMNS})
    VALUES (%(run_id)s, %(thread_id)s, %(tenant)s, %(assistant_id)s, %(status)s, %(metadata)s,
            %(multitask_strategy)s, %(created_at)s, %(updated_at)s, %(replica_id)s, false, NULL, NULL)
    ON CONFLICT DO NOTHING RETURNING run_id"""
_ACTIVE_ON_THREAD = f"SELECT {_COLUMNS} FROM switchyard_runs WHERE thread_id = %s AND status IN ('pending', 'running')"
_DEAD = """replica_id <> %(me)s AND NOT EXISTS (
    SELECT 1 FROM switchyard_replicas p
    WHERE p.replica_id = switchyard_runs.replica_id AND p.seen_at > now() - make_interval(secs => %(lease)s))"""


_ID_LOCK_SPACE = 0x53575249
"""First key of the two-key ``pg_advisory_lock`` a replica holds on its id (the second
is ``hashtext(replica_id)``); two-key locks never meet the one-key locks used here."""


def default_replica_id(data_dir: Path | None = None) -> str:
    """``<hostname>-<12 hex digits of the resolved data_dir's SHA-256>``: stable across
    restarts on the same data directory (which one process holds at a time), distinct
    for two servers on one host. Without ``data_dir``: ``<hostname>-<pid>``."""
    if data_dir is None:
        return f"{socket.gethostname()}-{os.getpid()}"
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return f"{socket.gethostname()}-{digest}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedRun:
    """A run as the board has it (hosted by this replica or another)."""

    run_id: str
    thread_id: str | None
    tenant: str
    assistant_id: str
    status: str
    metadata: dict[str, Any]
    multitask_strategy: str
    created_at: str
    updated_at: str
    replica_id: str
    """The replica hosting it."""
    background: bool
    """Its frames are kept on the board (it can be joined with ``.../stream``)."""
    cancel_reason: str | None
    error: str | None

    @property
    def done(self) -> bool:
        return self.status not in ACTIVE

    def json(self) -> dict[str, Any]:
        """The run as the LangGraph API answers it (as `RunRecord.json`)."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": {},
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SharedRun:
        return cls(**{name: row[name] for name in cls.__slots__})  # type: ignore[attr-defined]


class RunConflictError(ServingError):
    """The thread has an active run on the board and the strategy is ``reject``."""


class ReplicaIdInUseError(ServingError):
    """Another live process runs under this replica's id (it holds the id's lock)."""

    def __init__(self, replica_id: str) -> None:
        super().__init__(
            409,
            f"replica id {replica_id!r} is in use by another running process on the shared database: give each "
            "replica its own state.replica_id (SWITCHYARD_STATE__REPLICA_ID), or leave it unset to derive one from "
            "the host name and the data directory",
        )


class BoardUnavailableError(ServingError):
    """The shared database did not answer a request's read or admission (503)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(503, f"the shared run board (PostgreSQL) does not answer: {type(exc).__name__}; try again")


@dataclass(slots=True)
class _Op:
    kind: str
    """``background``, ``frame``, ``end``, ``delete``, ``delete_thread``."""
    run_id: str
    args: dict[str, Any]


ReapedHook = Callable[[str, str], Awaitable[None]]
"""Called with the thread id and tenant of each run a sweeper ended (sets the
thread's status)."""


class RunBoard:
    """This replica's view of the shared run records; see the module docstring.

    Open with `RunBoard.open`, then `start` once the registry (and the service that
    sets threads' statuses) exist; `aclose` at shutdown, after the runs ended.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        dsn: str,
        *,
        replica_id: str,
        heartbeat_s: float,
        lease_s: float,
        replay_bytes: int,
        retention_s: float,
        metrics: ServingMetrics | None,
    ) -> None:
        self.replica_id = replica_id
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.replay_bytes = replay_bytes
        self.retention_s = retention_s
        self._pool = pool
        self._dsn = dsn
        self._metrics = metrics
        self._ops: collections.deque[_Op] = collections.deque()
        self._urgent: collections.deque[_Op] = collections.deque()
        """Ends and deletes of runs with no other write queued: written before queued
        frames (a finished run must free its thread on the other replicas at once)."""
        self._work = asyncio.Event()
        self._stopping = False
        self._pending: dict[str, int] = {}
        """Per run, its writes still queued (`flushed` waits for none)."""
        self._flushed: dict[str, asyncio.Event] = {}
        self._wakers: dict[str, set[asyncio.Event]] = {}
        """Per run, the events of those waiting for its frames or its end."""
        self._frame_bytes: dict[str, list[tuple[int, int]]] = {}
        """Per background run hosted here and still pumping: ``(idx, size)`` of the
        frames it keeps."""
        self._held_ends: dict[str, _Op] = {}
        self._registry: RunRegistry | None = None
        self._on_reaped: ReapedHook | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
        self._writer: asyncio.Task[None] | None = None
        self._dropping = False
        self._closed = False
        self._id_lock: AsyncConnection[Any] | None = None
        """The connection holding this replica's id lock (see the module docstring)."""
        self._id_taken = False
        self._admitting: set[str] = set()
        """Runs whose admission (the row's insert) is under way here."""

    # ---- lifecycle -------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        dsn: str,
        state: StateSettings,
        *,
        replay_bytes: int = 1 << 20,
        retention_s: float = 3600.0,
        metrics: ServingMetrics | None = None,
        pool_size: int = 4,
    ) -> RunBoard:
        """Connect, create the tables if needed and register this replica.

        Raises:
            psycopg.Error: the database cannot be reached or the tables not created.
        """
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            # A statement stuck on a lock ends (the sweeper holds its rows' locks briefly).
            kwargs={
                "autocommit": True, "prepare_threshold": None, "row_factory": dict_row,
                "options": "-c statement_timeout=15000",
                "connect_timeout": 10, **PG_TCP,
            },
            timeout=10,
            # A connection the server dropped (a restart) is found before it is lent.
            check=AsyncConnectionPool.check_connection,
            open=False,
        )
        board: RunBoard | None = None
        try:
            # Inside the try: a pool that did not open in time is closed (its workers).
            await pool.open(wait=True, timeout=10)
            async with pool.connection() as connection, connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    await connection.execute(statement)  # type: ignore[arg-type]
            board = cls(
                pool, dsn, replica_id=state.replica_id or default_replica_id(), heartbeat_s=state.heartbeat_s,
                lease_s=state.lease_s, replay_bytes=replay_bytes, retention_s=retention_s, metrics=metrics,
            )
            if not await board._hold_id():
                raise ReplicaIdInUseError(board.replica_id)
            await board._beat()
            log.info("run board: this replica is %s", board.replica_id)
        except BaseException:
            if board is not None and board._id_lock is not None:
                await board._id_lock.close()
            await pool.close()
            raise
        return board

    async def _hold_id(self) -> bool:
        """Take this replica's id lock on a connection of its own (kept until `aclose`);
        False if another live process holds it."""
        connection = await AsyncConnection.connect(self._dsn, autocommit=True, connect_timeout=10, **PG_TCP)
        try:
            row = await (
                await connection.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_ID_LOCK_SPACE, self.replica_id))
            ).fetchone()
        except BaseException:
            await connection.close()
            raise
        if not (row and row[0]):
            await connection.close()
            return False
        self._id_lock = connection
        return True

    async def _keep_id(self) -> None:
        """Take the id lock again if its connection was lost (a database restart): an
        idle connection learns that only when it is used, hence the ping each beat."""
        if self._id_lock is not None and not self._id_lock.closed:
            try:
                await self._id_lock.execute("SELECT 1")
                return
            except psycopg.Error as exc:
                log.warning("run board: the connection holding replica id %s was lost: %r", self.replica_id, exc)
        if self._id_lock is not None:
            with contextlib.suppress(Exception):
                await self._id_lock.close()
            self._id_lock = None
        if await self._hold_id():
            self._id_taken = False
        elif not self._id_taken:
            self._id_taken = True  # said once; tried again each beat
            log.error("run board: lost the id lock and %s", ReplicaIdInUseError(self.replica_id))

    async def start(self, registry: RunRegistry, on_reaped: ReapedHook | None = None) -> None:
        """End the runs a process that died left under this replica's id, then begin
        writing, listening, heart-beating and sweeping.

        Args:
            registry: this replica's runs (cancel requests reach them through it).
            on_reaped: sets the status of a thread whose run a sweeper ended.
        """
        self._registry = registry
        self._on_reaped = on_reaped
        await self.sweep(own=True)
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write_loop(), name="run-board-writer")
        self._tasks = [
            loop.create_task(self._listen_loop(), name="run-board-listener"),
            loop.create_task(self._heartbeat_loop(), name="run-board-heartbeat"),
            loop.create_task(self._upkeep_loop(), name="run-board-upkeep"),
        ]

    async def aclose(self, flush_s: float = 5.0) -> None:
        """Flush the queued writes (at most ``flush_s``), remove this replica's row and
        close the connections."""
        if self._closed:
            return
        self._closed = True
        for task in [*self._tasks, *self._side]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        if self._writer is not None:
            self._stopping = True
            self._work.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), flush_s)
            except TimeoutError:
                log.warning("run board: %d write(s) not flushed at shutdown", len(self._ops) + len(self._urgent))
                self._writer.cancel()
                await asyncio.gather(self._writer, return_exceptions=True)
        try:
            async with self._pool.connection() as connection:
                await connection.execute("DELETE FROM switchyard_replicas WHERE replica_id = %s", (self.replica_id,))
        except Exception as exc:  # boundary: the lease ends it anyway
            log.warning("run board: could not remove replica %s: %r", self.replica_id, exc)
        if self._id_lock is not None:
            with contextlib.suppress(Exception):  # closing frees the lock, on the server too
                await self._id_lock.close()
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for a request's read or admission: a database failure
        is a `BoardUnavailableError` (503), never a 500."""
        try:
            async with self._pool.connection() as connection:
                yield connection
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("run board: %r", exc)
            raise BoardUnavailableError(exc) from exc

    # ---- admission (awaited in RunHost.open) -----------------------------------------

    async def admit(self, record: RunRecord, *, deadline_s: float | None) -> None:
        """Insert the run's row: its admission across replicas. A thread's active run on
        another replica is met with the run's multitask strategy: ``reject`` raises
        `RunConflictError` (409), ``interrupt`` asks its owner to cancel it and waits,
        ``enqueue`` waits for it to end; waiting past ``deadline_s`` is a 409.

        Raises:
            RunConflictError, ServingError: refused (nothing was written).
            RunCancelledError (the guard's error): the run was stopped meanwhile.
        """
        until = None if deadline_s is None else time.monotonic() + deadline_s
        row = {
            "run_id": record.run_id, "thread_id": record.thread_id, "tenant": record.tenant,
            "assistant_id": record.assistant_id, "status": "running", "metadata": Jsonb(record.metadata),
            "multitask_strategy": record.multitask_strategy, "created_at": record.created_at,
            "updated_at": _now(), "replica_id": self.replica_id,
        }
        self._admitting.add(record.run_id)
        try:
            await self._admit(record, row, until)
        except BoardUnavailableError:
            # The insert may have committed with its reply lost: the row would hold the
            # thread with no run behind it. Its end is queued (a no-op if no row).
            self._put(_Op("end", record.run_id, {
                "status": "error", "updated_at": _now(), "metadata": Jsonb(record.metadata),
                "error": "the run was not admitted: the shared run board did not answer",
            }))
            raise
        finally:
            self._admitting.discard(record.run_id)

    async def _admit(self, record: RunRecord, row: dict[str, Any], until: float | None) -> None:
        asked: set[str] = set()
        own_ended: set[str] = set()
        while True:
            if record.guard.error is not None:
                raise record.guard.error
            async with self._connection() as connection:
                inserted = await (await connection.execute(_INSERT, row)).fetchone()
                if inserted is not None:
                    return
                other_row = await (await connection.execute(_ACTIVE_ON_THREAD, (record.thread_id,))).fetchone()
            if other_row is None:
                continue  # it ended in between
            other = SharedRun.from_row(other_row)
            remaining = None if until is None else until - time.monotonic()
            if other.replica_id == self.replica_id:
                # One of ours that has ended here (local admission let this run in): its
                # end is still in the write queue, or its write failed.
                if not await self.flushed(other.run_id, 5.0 if remaining is None else max(remaining, 0)):
                    raise ServingError(409, f"thread {record.thread_id!r} is still busy with run {other.run_id}")
                if other.run_id in own_ended:
                    await self._end_stale(other.run_id)
                own_ended.add(other.run_id)
                continue
            await self._meet(record, other, remaining, asked)

    async def make_way(self, record: RunRecord, *, deadline_s: float | None) -> None:
        """Before the run takes a run slot: meet the thread's active run on another
        replica with the run's multitask strategy (as `admit` does), so a run waiting
        for one holds no slot and is not counted in flight. The insert in `admit` can
        still meet a run that started meanwhile (then it waits again).

        Raises:
            RunConflictError, ServingError: refused.
        """
        until = None if deadline_s is None else time.monotonic() + deadline_s
        asked: set[str] = set()
        while (other := await self.active_on(record.thread_id)) is not None and other.replica_id != self.replica_id:
            await self._meet(record, other, None if until is None else until - time.monotonic(), asked)

    async def _meet(self, record: RunRecord, other: SharedRun, remaining: float | None, asked: set[str]) -> None:
        """Apply the strategy to another replica's active run on the thread: refuse,
        or (cancel it and) wait until it ends."""
        if record.multitask_strategy == "reject":
            raise RunConflictError(
                409,
                f"thread {record.thread_id!r} already has a run in progress ({other.run_id}, on replica "
                f"{other.replica_id}); multitask_strategy interrupt or enqueue would wait for it",
            )
        if record.multitask_strategy == "interrupt" and other.run_id not in asked:
            asked.add(other.run_id)
            await self.request_cancel(other.run_id, "interrupted by a newer run on this thread")
        if remaining is not None and remaining <= 0 or not await self.wait_ended(
            other.run_id, remaining, guard_error=lambda: record.guard.error
        ):
            if record.guard.error is not None:
                raise record.guard.error
            raise ServingError(409, f"thread {record.thread_id!r} is still busy with run {other.run_id}")

    async def _end_stale(self, run_id: str) -> None:
        """End a row of this replica's whose run has ended here (or never ran: its
        admission failed after the insert) but whose end was not written: as the local
        record says, else ``error``."""
        local = self._registry.lookup(run_id) if self._registry is not None else None
        status = local.status if local is not None and local.done else "error"
        error = None if status != "error" else "the run ended on this replica but its end was not recorded in time"
        log.warning("run board: run %s had ended here but not on the board; now %s", run_id, status)
        async with self._connection() as connection, connection.transaction():
            await connection.execute(
                "UPDATE switchyard_runs SET status = %s, error = coalesce(error, %s), updated_at = %s, ended_at = now() "
                "WHERE run_id = %s AND replica_id = %s AND status IN ('pending', 'running')",
                (status, error, _now(), run_id, self.replica_id),
            )
            await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"e:{run_id}"))

    # ---- writes (ordered, from the writer task) --------------------------------------

    def _put(self, op: _Op) -> None:
        if self._closed and self._writer is None:
            return
        if op.kind == "frame" and len(self._ops) > 20_000:
            if not self._dropping:
                self._dropping = True
                log.error("run board: the database is not keeping up; frames of background runs are being dropped")
            return
        if op.kind in ("end", "delete") and not self._pending.get(op.run_id):
            self._urgent.append(op)  # nothing of its own before it: no order to keep
        else:
            self._ops.append(op)
        self._pending[op.run_id] = self._pending.get(op.run_id, 0) + 1
        self._work.set()

    def mark_background(self, record: RunRecord) -> None:
        """The run keeps its frames here (followers on any replica can join it). The
        caller awaits `flushed` before it answers; the run's end is written after its
        last frame (`pumped`)."""
        self._frame_bytes[record.run_id] = []
        self._put(_Op("background", record.run_id, {}))

    def pumped(self, record: RunRecord) -> None:
        """The background run's last frame has been handed over: its end may follow."""
        self._frame_bytes.pop(record.run_id, None)
        if (end := self._held_ends.pop(record.run_id, None)) is not None:
            self._put(end)

    def frame(self, record: RunRecord, index: int, frame: str) -> None:
        """A background run's frame ``index`` (``record.dropped`` is the oldest it keeps)."""
        kept = self._frame_bytes.get(record.run_id)
        if kept is None:
            return
        kept.append((index, len(frame)))
        total = sum(size for _, size in kept)
        keep_from = None
        while total > self.replay_bytes and len(kept) > 1:  # as RunRecord.append: the newest stays
            total -= kept.pop(0)[1]
            keep_from = kept[0][0]
        self._put(_Op("frame", record.run_id, {"idx": index, "frame": frame, "keep_from": keep_from}))

    def ended(self, record: RunRecord) -> None:
        """The run ended (its record is finished): its final status, metadata and end."""
        if record.thread_id is None and record.frames is None:
            self._put(_Op("delete", record.run_id, {}))  # a stateless run nobody can address any more
            return
        end = _Op("end", record.run_id, {
            "status": record.status, "updated_at": record.updated_at, "metadata": Jsonb(record.metadata),
        })
        if record.run_id in self._frame_bytes:
            # Its pump still hands over the last frames (the error event): followers
            # read every frame once they see the end, so the end is written after them.
            self._held_ends[record.run_id] = end
        else:
            self._put(end)

    def forget(self, run_id: str) -> None:
        """``DELETE .../runs/{id}`` of a finished run."""
        self._put(_Op("delete", run_id, {}))

    def forget_thread(self, thread_id: str) -> None:
        """The thread was deleted: its finished runs' rows go (an active one stays)."""
        self._put(_Op("delete_thread", thread_id, {}))

    async def end_written(self, run_id: str, timeout_s: float = 2.0) -> None:
        """Wait (at most ``timeout_s``, logged past it) until the run's end is on the
        board, unless it is held for its pump (a background run): the request's answer
        comes after, so the client's next run on the thread, through any replica, is
        not refused by a row that is only late."""
        if run_id in self._held_ends or self._closed:
            return
        if not await self.flushed(run_id, timeout_s):
            log.warning("run board: the end of run %s was not written within %.1fs; answering anyway", run_id, timeout_s)

    async def flushed(self, run_id: str, timeout_s: float | None) -> bool:
        """Wait until the run's queued writes are written (or failed); False on timeout."""
        if not self._pending.get(run_id):
            return True
        event = self._flushed.setdefault(run_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _done_op(self, run_id: str) -> None:
        left = self._pending.get(run_id, 1) - 1
        if left > 0:
            self._pending[run_id] = left
            return
        self._pending.pop(run_id, None)
        if (event := self._flushed.pop(run_id, None)) is not None:
            event.set()

    async def _write_loop(self) -> None:
        while True:
            if not self._urgent and not self._ops:
                if self._stopping:
                    return
                self._work.clear()
                await self._work.wait()
                continue
            op = self._urgent.popleft() if self._urgent else self._ops.popleft()
            batch = [op]
            if op.kind == "frame":
                # Consecutive frames (of any runs) go in one round trip.
                while len(batch) < 64 and self._ops and self._ops[0].kind == "frame":
                    batch.append(self._ops.popleft())
            try:
                await self._write_retrying(batch)
            except Exception as exc:  # boundary: a write failure never breaks the run
                log.warning("run board: %s of run %s not written: %r", op.kind, op.run_id, exc)
            finally:
                for item in batch:
                    self._done_op(item.run_id)

    async def _write_retrying(self, batch: list[_Op]) -> None:
        """`_write`, tried again a few times (a database restart) for what must not be
        lost: an end left unwritten holds the thread on every replica until the owner's
        poll finds it (`_poll_own`). Frames are tried once (a backlog must not grow)."""
        delays = () if batch[0].kind == "frame" else _RETRY_DELAYS
        for delay in delays:
            try:
                await self._write(batch)
                return
            except (psycopg.Error, PoolTimeout) as exc:
                if self._closed:
                    raise
                log.warning("run board: %s of run %s failed (%r); trying again in %.1fs", batch[0].kind,
                            batch[0].run_id, exc, delay)
                await asyncio.sleep(delay)
        await self._write(batch)

    async def _write(self, batch: list[_Op]) -> None:
        op = batch[0]
        async with self._pool.connection() as connection:
            if op.kind == "frame":
                async with connection.transaction():
                    async with connection.cursor() as cursor:
                        await cursor.executemany(
                            "INSERT INTO switchyard_run_frames (run_id, idx, frame) VALUES (%s, %s, %s) "
                            "ON CONFLICT DO NOTHING",
                            [(item.run_id, item.args["idx"], item.args["frame"]) for item in batch],
                        )
                    trims: dict[str, int] = {}
                    for item in batch:
                        if item.args["keep_from"] is not None:
                            trims[item.run_id] = item.args["keep_from"]
                    for run_id, keep_from in trims.items():
                        await connection.execute(
                            "DELETE FROM switchyard_run_frames WHERE run_id = %s AND idx < %s", (run_id, keep_from)
                        )
                    for run_id in dict.fromkeys(item.run_id for item in batch):
                        await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"f:{run_id}"))
            elif op.kind == "background":
                await connection.execute("UPDATE switchyard_runs SET background = true WHERE run_id = %s", (op.run_id,))
            elif op.kind == "end":
                async with connection.transaction():
                    # Not over a sweeper's verdict: a run ended as dead stays ended so.
                    await connection.execute(
                        "UPDATE switchyard_runs SET status = %(status)s, updated_at = %(updated_at)s, "
                        "metadata = %(metadata)s, error = coalesce(error, %(error)s), ended_at = now() "
                        "WHERE run_id = %(run_id)s AND status IN ('pending', 'running')",
                        {"error": None, **op.args, "run_id": op.run_id},
                    )
                    await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"e:{op.run_id}"))
            elif op.kind == "delete":
                async with connection.transaction():
                    await connection.execute("DELETE FROM switchyard_runs WHERE run_id = %s", (op.run_id,))
                    await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"e:{op.run_id}"))
            elif op.kind == "delete_thread":
                await connection.execute(
                    "DELETE FROM switchyard_runs WHERE thread_id = %s AND status NOT IN ('pending', 'running')",
                    (op.run_id,),
                )

    # ---- reads -----------------------------------------------------------------------

    async def get(self, run_id: str) -> SharedRun | None:
        async with self._connection() as connection:
            row = await (
                await connection.execute(f"SELECT {_COLUMNS} FROM switchyard_runs WHERE run_id = %s", (run_id,))
            ).fetchone()
        return SharedRun.from_row(row) if row is not None else None

    async def active_on(self, thread_id: str) -> SharedRun | None:
        """The thread's active run, whichever replica hosts it."""
        async with self._connection() as connection:
            row = await (await connection.execute(_ACTIVE_ON_THREAD, (thread_id,))).fetchone()
        return SharedRun.from_row(row) if row is not None else None

    async def of_thread(self, thread_id: str, tenant: str) -> list[SharedRun]:
        """The thread's runs, newest first."""
        async with self._connection() as connection:
            rows = await (
                await connection.execute(
                    f"SELECT {_COLUMNS} FROM switchyard_runs WHERE thread_id = %s AND tenant = %s "
                    "ORDER BY created_at DESC LIMIT 10000",
                    (thread_id, tenant),
                )
            ).fetchall()
        return [SharedRun.from_row(row) for row in rows]

    async def of_tenant(self, tenant: str, statuses: tuple[str, ...] = ACTIVE) -> list[SharedRun]:
        async with self._connection() as connection:
            rows = await (
                await connection.execute(
                    f"SELECT {_COLUMNS} FROM switchyard_runs WHERE tenant = %s AND status = ANY(%s) LIMIT 10000",
                    (tenant, list(statuses)),
                )
            ).fetchall()
        return [SharedRun.from_row(row) for row in rows]

    # ---- cancel, wait, follow --------------------------------------------------------

    async def request_cancel(self, run_id: str, reason: str) -> bool:
        """Ask the run's host to cancel it (the row's ``cancel_reason`` and a
        notification; the host also polls). False if it is not active."""
        async with self._connection() as connection, connection.transaction():
            row = await (
                await connection.execute(
                    "UPDATE switchyard_runs SET cancel_reason = coalesce(cancel_reason, %s) "
                    "WHERE run_id = %s AND status IN ('pending', 'running') RETURNING run_id",
                    (reason, run_id),
                )
            ).fetchone()
            if row is not None:
                await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"c:{run_id}"))
        return row is not None

    def _waker(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._wakers.setdefault(run_id, set()).add(event)
        return event

    def _unwake(self, run_id: str, event: asyncio.Event) -> None:
        events = self._wakers.get(run_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._wakers[run_id]

    async def wait_ended(
        self, run_id: str, timeout_s: float | None, *, guard_error: Callable[[], BaseException | None] | None = None
    ) -> bool:
        """Wait until the run has ended (or its row is gone); False on timeout.

        Raises:
            BaseException: what ``guard_error`` returns once it returns something (the
                waiting run was stopped).
        """
        until = None if timeout_s is None else time.monotonic() + timeout_s
        event = self._waker(run_id)
        try:
            while True:
                event.clear()
                shared = await self.get(run_id)
                if shared is None or shared.done:
                    return True
                if guard_error is not None and (error := guard_error()) is not None:
                    raise error
                left = self.heartbeat_s if until is None else min(self.heartbeat_s, until - time.monotonic())
                if left <= 0:
                    return False
                # Short slices while a guard may stop the waiter (it sets no event here).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, 0.25) if guard_error is not None else left)
        finally:
            self._unwake(run_id, event)

    async def follow(self, run_id: str, after: int = -1, events: frozenset[str] | None = None) -> AsyncIterator[str]:
        """A background run's frames after event id ``after`` from the board, then new
        ones as they are written, until the run has ended (`RunRecord.follow`'s
        contract, for a run hosted anywhere). If the database stops answering, an
        ``error`` event (no id: the client resumes from its last one) ends them. A run
        that ended other than with ``success`` and has nothing left after ``after``
        ends them with an ``error`` event saying how it ended (a client resuming
        after its host died is told, never given an empty stream)."""
        index = max(after + 1, 0)
        event = self._waker(run_id)
        sent = False
        try:
            while True:
                event.clear()
                try:
                    rows, done, ending = await self._follow_step(run_id, index)
                except BoardUnavailableError as exc:
                    # After the headers an error is an event.
                    data = orjson.dumps({"error": "BoardUnavailable", "message": f"{exc}; reconnect with Last-Event-ID"})
                    yield f"event: error\ndata: {data.decode()}\n\n"
                    return
                if rows and index < rows[0][0] < _LOST_IDX:
                    # Dropped from the bounded buffer before this follower read them
                    # (at the start, or while it fell behind): said, never a silent hole.
                    yield f": {rows[0][0] - index} earlier events are no longer kept\n\n"
                for number, kept in rows:
                    mode = event_mode(kept)
                    if events is None or mode is None or mode in events or mode in CONTROL_EVENTS:
                        sent = True
                        yield kept
                    index = number + 1
                if len(rows) == _FOLLOW_PAGE:
                    continue
                if done:
                    # Ended before these were read (frames are written before the end).
                    # A client resuming after everything the board has of a run that
                    # failed still learns how it ended, never an empty stream.
                    if not sent and ending is not None:
                        yield ending
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.heartbeat_s)
        finally:
            self._unwake(run_id, event)

    async def _follow_step(self, run_id: str, index: int) -> tuple[list[tuple[int, str]], bool, str | None]:
        """The run's frames from ``index`` (a page), whether it had ended before they
        were read, and (ended other than with success) an ``error`` event saying how."""
        async with self._connection() as connection:
            status = await (
                await connection.execute("SELECT status, error FROM switchyard_runs WHERE run_id = %s", (run_id,))
            ).fetchone()
            rows = await (
                await connection.execute(
                    "SELECT idx, frame FROM switchyard_run_frames WHERE run_id = %s AND idx >= %s ORDER BY idx LIMIT %s",
                    (run_id, index, _FOLLOW_PAGE),
                )
            ).fetchall()
        done = status is None or status["status"] not in ACTIVE
        ending = None
        if status is not None and done and status["status"] != "success":
            message = status["error"] or f"the run ended with status {status['status']}"
            data = orjson.dumps({"error": "RunEnded", "message": message, "run_id": run_id, "status": status["status"]})
            ending = f"event: error\ndata: {data.decode()}\n\n"
        return [(row["idx"], row["frame"]) for row in rows], done, ending

    # ---- listening, heartbeat, sweeping ----------------------------------------------

    def _wake(self, run_id: str) -> None:
        for event in self._wakers.get(run_id, ()):
            event.set()

    async def _listen_loop(self) -> None:
        delay = 0.2
        while True:
            try:
                connect = AsyncConnection.connect(self._dsn, autocommit=True, connect_timeout=10, **PG_TCP)
                async with await connect as connection:
                    await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    delay = 0.2
                    # Whatever was missed while not listening: wake every waiter once.
                    for run_id in list(self._wakers):
                        self._wake(run_id)
                    async for notice in connection.notifies():
                        kind, _, run_id = notice.payload.partition(":")
                        if kind == "c":
                            self._cancel_local(run_id, None)
                        else:
                            self._wake(run_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boundary: polling covers the gap; reconnect
                log.warning("run board: the LISTEN connection failed (%r); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _cancel_local(self, run_id: str, reason: str | None) -> None:
        """A cancel request for a run hosted here (from a notification or the poll)."""
        record = self._registry.lookup(run_id) if self._registry is not None else None
        if record is None or record.done:
            return
        if reason is None:
            # The notification carries no reason: read it (from a task of its own).
            task = asyncio.get_running_loop().create_task(self._cancel_from_row(run_id))
            self._side.add(task)
            task.add_done_callback(self._side.discard)
            return
        record.guard.stop(RunCancelledError(reason))

    async def _cancel_from_row(self, run_id: str) -> None:
        try:
            shared = await self.get(run_id)
        except Exception as exc:  # boundary: the heartbeat's poll finds it
            log.warning("run board: could not read the cancel of run %s: %r", run_id, exc)
            return
        if shared is not None and shared.cancel_reason is not None:
            self._cancel_local(run_id, shared.cancel_reason)

    async def _heartbeat_loop(self) -> None:
        """Only the heartbeat, in a task of its own on the id lock's connection (not the
        pool): a slow sweep, a busy pool or a long poll never delays it, so a live
        replica is never taken for dead because of its own upkeep."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._keep_id()
                await self._beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boundary: try again at the next beat
                log.warning("run board: heartbeat failed: %r", exc)

    async def _upkeep_loop(self) -> None:
        """Each heartbeat period: this replica's own rows (cancels, ends), dead
        replicas' runs, and (each minute) pruning."""
        beats = 0
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._poll_own()
                await self.sweep()
                beats += 1
                if beats % max(1, round(60 / self.heartbeat_s)) == 0:
                    await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boundary: try again at the next beat
                log.warning("run board: upkeep failed: %r", exc)

    async def _beat(self) -> None:
        statement = (
            "INSERT INTO switchyard_replicas (replica_id) VALUES (%s) "
            "ON CONFLICT (replica_id) DO UPDATE SET seen_at = now()"
        )
        if self._id_lock is not None and not self._id_lock.closed:
            await self._id_lock.execute(statement, (self.replica_id,))
            return
        async with self._pool.connection() as connection:  # the id lock is being taken again
            await connection.execute(statement, (self.replica_id,))

    async def _poll_own(self) -> None:
        """Cancels asked of this replica's runs, and its runs a sweeper ended (this
        replica was taken for dead): both stop the local run."""
        registry = self._registry
        if registry is None:
            return
        local = registry.running_ids()
        if local:
            async with self._pool.connection() as connection:
                rows = await (
                    await connection.execute(
                        "SELECT run_id, status, cancel_reason, error FROM switchyard_runs WHERE run_id = ANY(%s) "
                        "AND (cancel_reason IS NOT NULL OR status NOT IN ('pending', 'running'))",
                        (local,),
                    )
                ).fetchall()
            for row in rows:
                if row["status"] in ACTIVE:
                    self._cancel_local(row["run_id"], row["cancel_reason"])
                else:
                    self._cancel_local(row["run_id"], row["error"] or "the run was ended by another replica")
        await self._end_orphans()

    def _busy_here(self, run_id: str) -> bool:
        """The run is running here, being admitted, or has writes still queued."""
        record = self._registry.lookup(run_id) if self._registry is not None else None
        return (
            (record is not None and not record.done) or run_id in self._admitting
            or bool(self._pending.get(run_id)) or run_id in self._held_ends
        )

    async def _end_orphans(self) -> None:
        """End this replica's active rows with no run behind them: an end write that
        failed for good, an admission whose insert committed but whose reply was lost.
        Without this such a row holds its thread on every replica for ever (the owner
        is alive, so no sweeper ends it)."""
        async with self._pool.connection() as connection:
            rows = await (
                await connection.execute(
                    "SELECT run_id FROM switchyard_runs WHERE replica_id = %s AND status IN ('pending', 'running')",
                    (self.replica_id,),
                )
            ).fetchall()
        for row in rows:
            if not self._busy_here(row["run_id"]):  # checked after the read: nothing awaited since
                await self._end_stale(row["run_id"])

    async def sweep(self, *, own: bool = False) -> int:
        """End the active runs of dead replicas (``own``: this replica's leftovers from
        before a restart under the same id). Returns how many this call ended.

        Each batch is ended in one short transaction (``FOR UPDATE SKIP LOCKED``: one
        sweeper wins each run), committed before the threads' statuses are set: no
        row lock is held while a thread store answers."""
        reaped = 0
        while True:
            rows = await self._sweep_batch(own)
            for row in rows:
                log.warning("run %s: %s", row["run_id"], row["error"])
                if row["thread_id"] is not None and self._on_reaped is not None:
                    try:
                        await asyncio.wait_for(self._on_reaped(row["thread_id"], row["tenant"]), 10)
                    except Exception as exc:  # boundary: the run has ended anyway
                        log.warning("run board: could not set the status of thread %s: %r", row["thread_id"], exc)
            reaped += len(rows)
            if self._metrics is not None and rows:
                self._metrics.replica_runs_reaped.inc(len(rows))
            if len(rows) < _SWEEP_BATCH:
                return reaped

    async def _sweep_batch(self, own: bool) -> list[dict[str, Any]]:
        where = "replica_id = %(me)s" if own else _DEAD
        said = "stopped (restarted)" if own else f"stopped answering (no heartbeat for {self.lease_s:g}s)"
        async with self._pool.connection() as connection, connection.transaction():
            rows = await (
                await connection.execute(
                    "UPDATE switchyard_runs SET status = 'error', updated_at = %(now)s, ended_at = now(), "
                    "error = 'replica ' || replica_id || %(said)s "
                    "WHERE run_id IN (SELECT run_id FROM switchyard_runs "
                    f"WHERE status IN ('pending', 'running') AND {where} LIMIT %(batch)s FOR UPDATE SKIP LOCKED) "
                    "RETURNING run_id, thread_id, tenant, replica_id, background, error",
                    {
                        "me": self.replica_id, "lease": self.lease_s, "now": _now(), "batch": _SWEEP_BATCH,
                        "said": f" {said}; the run was ended; its thread keeps what it saved",
                    },
                )
            ).fetchall()
            for row in rows:
                if row["background"]:
                    # No id: a client that reconnects after it (with its last real
                    # event's id) is told again how the run ended.
                    data = orjson.dumps({"error": "ReplicaLost", "message": row["error"], "run_id": row["run_id"]}).decode()
                    await connection.execute(
                        "INSERT INTO switchyard_run_frames (run_id, idx, frame) VALUES (%s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        (row["run_id"], _LOST_IDX, f"event: error\ndata: {data}\n\n"),
                    )
                await connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"e:{row['run_id']}"))
        return rows

    async def prune(self) -> None:
        """Forget finished runs older than the retention (their frames go with them) and
        replicas gone for long."""
        async with self._pool.connection() as connection:
            await connection.execute(
                "DELETE FROM switchyard_runs WHERE ended_at < now() - make_interval(secs => %s) "
                "AND status NOT IN ('pending', 'running')",
                (self.retention_s,),
            )
            await connection.execute(
                "DELETE FROM switchyard_replicas WHERE seen_at < now() - make_interval(secs => %s) "
                "AND replica_id <> %s AND NOT EXISTS (SELECT 1 FROM switchyard_runs r "
                "WHERE r.replica_id = switchyard_replicas.replica_id AND r.status IN ('pending', 'running'))",
                (max(self.retention_s, 10 * self.lease_s), self.replica_id),
            )
