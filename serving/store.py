"""The store: LangGraph's own `BaseStore` implementations, on the thread stores' database.

The LangGraph Server store (``/store/*``, ``client.store.*`` in the SDKs) keeps JSON
items under namespaces, across threads. Here it is the library's ``SqliteStore``
(``langgraph-checkpoint-sqlite``) or ``PostgresStore`` (``langgraph-checkpoint-postgres``),
in the database the threads use, opened and closed with them (`serving.persistence`).

Why the SQLite store runs on the thread store's writer, not on a connection of its own:
``serving.threads`` explains how two connections to one SQLite file, each used by many
coroutines, ended in "database is locked" for good (issue 10). A third connection for
the store would bring that back; so would the library's ``AsyncSqliteStore``
(aiosqlite: a hop per statement, its own transactions). Instead the library's
*synchronous* store runs on the connection `SqliteWriter` owns, each batch of store
operations one write unit on its one worker thread, like every checkpointer and thread
store call: one writer in the process, a unit that runs whole or not at all, no
transaction left open by a cancelled caller, and the writer's timeout, errors
(`ThreadStoreError`, a 503) and readiness ping cover the store too. A store of its own
file with its own worker would be as safe; sharing keeps one queue, one place for
timeouts, and one file to back up. The library's ``BEGIN``/``COMMIT`` per batch is
replaced by the writer's transaction (`_SqliteStore._cursor`), as for the checkpointer,
and its ``INSERT OR REPLACE`` by an upsert, so an update keeps the item's ``created_at``.

On PostgreSQL the library's synchronous store takes a connection from the thread
stores' pool for each batch and runs on their worker threads (`PostgresWorkers`): the
same timeouts, the same retry of a call that met a dropped connection (every store
operation is an upsert, a delete or a read), and no lock across calls (the library's
serialises calls on one connection; each call here has its own).

Expiry (``ttl``, in minutes): PostgreSQL's reads omit expired items (the library's
``omit_expired``) and a sweep deletes them every `SWEEP_INTERVAL_S`; SQLite's store has
no such filter, so each unit there deletes the expired items before it reads or writes
(one statement on the ``expires_at`` index). Reads refresh an item's expiry unless
asked not to (``refresh_on_read``).

No semantic index is configured: `StoreBackend.semantic` is false, an ``index`` given
with an item is accepted and has no effect (as in the library without ``index``), and a
search with a ``query`` is refused by the API rather than silently run as a plain search.

Tenants: `TenantStore` is one tenant's view, a hidden first namespace label the
caller never sees nor can address (`tenant_label`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import quote

from langgraph.pregel import Pregel
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchOp,
    TTLConfig,
)
from langgraph.store.sqlite import SqliteStore

from serving.threads import PostgresWorkers, SqliteWriter

GraphT = TypeVar("GraphT", bound=Pregel[Any, Any, Any, Any])

__all__ = [
    "POSTGRES_SETUP_LOCK",
    "SWEEP_INTERVAL_S",
    "StoreBackend",
    "TenantStore",
    "tenant_graph",
    "open_postgres_store",
    "open_sqlite_store",
    "postgres_setup_lock",
    "tenant_label",
]

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 300.0
"""PostgreSQL: seconds between sweeps of expired items (reads never see them anyway)."""

_SQLITE_TTL: TTLConfig = {"refresh_on_read": True}
_POSTGRES_TTL: TTLConfig = {"refresh_on_read": True, "omit_expired": True}

_SWEEP = "DELETE FROM store WHERE expires_at IS NOT NULL AND expires_at < CURRENT_TIMESTAMP"

_REPLACE = "INSERT OR REPLACE INTO store ("
_UPSERT = (
    " ON CONFLICT(prefix, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,"
    " expires_at = excluded.expires_at, ttl_minutes = excluded.ttl_minutes"
)


class StoreBackend(BaseStore):
    """What the server needs of a store beyond `BaseStore`: asynchronous calls that
    run whole on the thread stores' workers, and a close.

    Mixed in before the library's store class, so its synchronous ``batch`` is the one
    that runs (inside `abatch`)."""

    semantic: bool = False
    """Whether a semantic (vector) index is configured: ``query`` searches need one."""

    async def aclose(self) -> None:
        """Stop background work (the connection belongs to the thread stores)."""


class _SqliteStore(StoreBackend, SqliteStore):
    """The library's SQLite store on the thread stores' connection, each batch one
    write unit of the shared `SqliteWriter`."""

    def __init__(self, writer: SqliteWriter) -> None:
        super().__init__(writer.connection, ttl=_SQLITE_TTL)
        self._writer = writer

    @contextmanager
    def _cursor(self, *, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        # The library's takes its own lock and runs BEGIN ... COMMIT; here every batch
        # is already one unit on the one worker, inside the writer's transaction.
        cursor = self.conn.cursor()
        try:
            yield cursor
        finally:
            cursor.close()

    def _prepare_batch_PUT_queries(self, put_ops: Any) -> Any:  # noqa: N802 - the library's name
        # The library's SQLite store writes with INSERT OR REPLACE, which deletes the
        # old row: an item's `created_at` would become the time of its last update.
        # An upsert keeps it, as the PostgreSQL store does.
        queries, embedding_request = super()._prepare_batch_PUT_queries(put_ops)
        kept = []
        for query, params in queries:
            if _REPLACE in query:
                query = query.replace(_REPLACE, "INSERT INTO store (").rstrip() + _UPSERT
            elif query.lstrip().startswith("INSERT"):
                raise RuntimeError(f"the library's store writes differently now; review _SqliteStore: {query}")
            kept.append((query, params))
        return kept, embedding_request

    def _unit(self, ops: list[Op]) -> list[Result]:
        try:
            self.conn.execute(_SWEEP)
            return self.batch(ops)
        except ValueError as exc:
            # The library wraps a failed GET statement in a ValueError: the database's
            # error is the writer's to report (a 503), not a bug.
            if isinstance(exc.__cause__, sqlite3.Error):
                raise exc.__cause__ from None
            raise

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        batch = list(ops)
        return await self._writer.write("store batch", lambda _db: self._unit(batch))


async def open_sqlite_store(writer: SqliteWriter) -> StoreBackend:
    """The store on the thread stores' SQLite writer, its tables created if needed.

    Built and set up on the worker (the connection is the worker's); called at open,
    before anything else uses the writer, since the library's migrations use
    ``executescript``, which commits whatever transaction is open."""

    def unit(_db: sqlite3.Connection) -> _SqliteStore:
        store = _SqliteStore(writer)
        store.setup()
        return store

    return await writer.read("store setup", unit)


def _postgres_class() -> type[StoreBackend]:
    from langgraph.store.postgres import PostgresStore  # noqa: PLC0415 - optional backend

    class _PostgresStore(StoreBackend, PostgresStore):
        """The library's PostgreSQL store on the thread stores' pool, each batch one
        call on their workers."""

        def __init__(self, workers: PostgresWorkers) -> None:
            super().__init__(workers.pool, ttl=_POSTGRES_TTL)
            # The library's lock guards one shared connection; each call here takes its
            # own from the pool, so calls need not wait for one another.
            self.lock = contextlib.nullcontext()  # type: ignore[assignment]
            self._workers = workers
            self._sweeper: asyncio.Task[None] | None = None

        async def abatch(self, ops: Iterable[Op]) -> list[Result]:
            batch = list(ops)
            return await self._workers.run("store batch", lambda: self.batch(batch))

        async def sweep(self) -> int:
            """Delete the expired items now; how many."""
            return await self._workers.run("store sweep", self.sweep_ttl)

        def start(self) -> None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="store-sweeper")

        async def _sweep_forever(self) -> None:
            while True:
                await asyncio.sleep(SWEEP_INTERVAL_S)
                try:
                    if swept := await self.sweep():
                        log.info("store: %d expired item(s) deleted", swept)
                except Exception as exc:  # boundary: a failed sweep is retried next time
                    log.warning("store: sweeping expired items failed: %s", exc)

        async def aclose(self) -> None:
            if self._sweeper is not None:
                self._sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sweeper

    return _PostgresStore


async def open_postgres_store(workers: PostgresWorkers, dsn: str) -> StoreBackend:
    """The store on the thread stores' PostgreSQL pool and workers.

    Tables and migrations first, on a connection of their own (a migration may take
    longer than the statement timeout the pool sets), as for the checkpointer."""
    from langgraph.store.postgres import PostgresStore  # noqa: PLC0415 - optional backend
    from psycopg import Connection  # noqa: PLC0415
    from psycopg.rows import dict_row  # noqa: PLC0415

    def setup() -> None:
        with (
            Connection.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as connection,
            postgres_setup_lock(connection),
        ):
            PostgresStore(connection).setup()  # type: ignore[arg-type]

    await asyncio.to_thread(setup)
    store = _postgres_class()(workers)  # type: ignore[call-arg]
    store.start()  # type: ignore[attr-defined]
    return store


POSTGRES_SETUP_LOCK = 0x5357_5345_5455_50
"""``pg_advisory_lock`` key held while the store's and the checkpointer's tables are
created or migrated."""


@contextmanager
def postgres_setup_lock(connection: Any, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold the session advisory lock `POSTGRES_SETUP_LOCK` on ``connection`` (in
    autocommit mode) while the body runs.

    The library's ``setup()`` reads its migrations table, then inserts the versions it
    ran, in separate transactions: two replicas starting together on a fresh database
    both ran migration 0 and one failed on the migrations table's primary key. Under
    the lock the second waits, then finds every migration done. A session lock (not a
    transaction's) because ``setup()`` commits several transactions; it goes with the
    connection if the process dies.

    Taken by polling ``pg_try_advisory_lock``, not by a blocking ``pg_advisory_lock``:
    the checkpointer's migrations include ``CREATE INDEX CONCURRENTLY``, which waits for
    every open transaction to end, a waiter's blocked ``SELECT pg_advisory_lock`` too,
    while that waiter waits for the lock: PostgreSQL reported a deadlock.

    Raises:
        TimeoutError: the lock was not free within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not _got_lock(connection.execute("SELECT pg_try_advisory_lock(%s) AS got", (POSTGRES_SETUP_LOCK,)).fetchone()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"another process held the database set-up lock for more than {timeout_s:g}s")
        time.sleep(0.1)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a broken connection has released it already
            connection.execute("SELECT pg_advisory_unlock(%s)", (POSTGRES_SETUP_LOCK,))


def _got_lock(row: Any) -> bool:
    return bool(row["got"] if isinstance(row, dict) else row[0])


def tenant_label(tenant: str) -> str:
    """The hidden first namespace label of ``tenant``'s items.

    Percent-encoded (``.`` too), so it is a valid label whatever the tenant's name,
    never ``*`` (a wildcard in namespace listings) nor ``langgraph`` (a reserved root),
    and two tenants never share one."""
    return "tenant:" + quote(tenant, safe="").replace(".", "%2E")


class TenantStore(BaseStore):
    """One tenant's view of a store: every namespace it is given gets the tenant's
    hidden label in front, every namespace it returns loses it. Another tenant's items
    cannot be named, searched, listed or deleted through it."""

    supports_ttl = True

    def __init__(self, store: BaseStore, tenant: str) -> None:
        self._store = store
        self._root = tenant_label(tenant)
        self.ttl_config = store.ttl_config

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        raise NotImplementedError("the server's store is asynchronous: use abatch")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        results = await self._store.abatch([self._scoped(op) for op in ops])
        return [self._unscoped(result) for result in results]

    def _scoped(self, op: Op) -> Op:
        root = self._root
        if isinstance(op, GetOp):
            return op._replace(namespace=(root, *op.namespace))
        if isinstance(op, PutOp):
            return op._replace(namespace=(root, *op.namespace))
        if isinstance(op, SearchOp):
            return op._replace(namespace_prefix=(root, *op.namespace_prefix))
        if isinstance(op, ListNamespacesOp):
            prefix: tuple[str, ...] = ()
            others = []
            for condition in op.match_conditions or ():
                if condition.match_type == "prefix":
                    prefix = tuple(condition.path)
                else:
                    others.append(condition)
            conditions = (MatchCondition(match_type="prefix", path=(root, *prefix)), *others)
            depth = None if op.max_depth is None else op.max_depth + 1
            return op._replace(match_conditions=conditions, max_depth=depth)
        raise TypeError(f"unknown store operation {type(op).__name__}")

    def _strip(self, namespace: tuple[str, ...]) -> tuple[str, ...]:
        assert namespace[:1] == (self._root,), "the store returned another tenant's namespace"
        return tuple(namespace[1:])

    def _unscoped(self, result: Result) -> Result:
        if isinstance(result, Item):
            result.namespace = self._strip(result.namespace)
            return result
        if isinstance(result, list):
            return [self._unscoped(entry) if isinstance(entry, Item) else self._strip(entry) for entry in result]  # type: ignore[return-value]
        return result


def tenant_graph(graph: GraphT, store: BaseStore | None, tenant: str) -> GraphT:
    """The compiled graph as a run of ``tenant`` uses it: its nodes' ``runtime.store``
    (LangGraph's store, as LangGraph Server hands graphs theirs) is that tenant's view
    of the server's store, the items ``/store/*`` shows the same tenant. A shallow copy
    of the compiled graph (about 15 µs); the graph is returned as is without a store."""
    if store is None:
        return graph
    return graph.copy(update={"store": TenantStore(store, tenant)})
