"""API keys in PostgreSQL, shared by every replica (``settings.shared_dsn``).

Tables (created idempotently by `PostgresKeyStore.setup`):

- ``switchyard_api_keys(id, tenant, sha256, created_at)``: a `serving.auth.KeyRecord` per
  row, the key's SHA-256 hash, never the key;
- ``switchyard_api_keys_version(one, version)``: one row, a change counter bumped in the
  same transaction as every create, revoke and import.

Each replica's `SharedAuthenticator` keeps the keys in memory and reads the counter every
``state.reload_s`` in a background task; when it moved, it reloads every key, so a
revoked key is refused within ``reload_s``. A key it does not know is looked up in the
database at once (a key created through another replica, or by ``switchyard keys
create``, works immediately everywhere). Keys in ``auth.keys`` (the settings) keep
working alongside.

The database unreachable: keys already loaded keep working; an unknown key gets 503
naming the key store (never 401: the key may be valid); the outage is logged once, and
its end once. Only a failed connection or query is an outage: lookups queueing for the
store's one connection are not.

Unknown keys cost a query each, before any rate limit, so their cost is bounded: the
lookups run on a worker thread of the authenticator's own (not the event loop's default
executor, which other work needs), concurrent lookups of one key share one query, at most
``_LOOKUPS_MAX`` different keys wait for a lookup at once (more get 503 "busy" without
marking an outage), and up to ``_NEGATIVE_MAX`` hashes found nowhere are remembered until
the change counter moves. The connections use TCP keepalives and a connect timeout, so a
database that vanished without closing them (a failover) is noticed in about 25 s.

The first time a store is set up (the counter never moved) and ``<data_dir>/keys.yaml``
holds keys, they are imported (logged); a table emptied later by revocations is never
refilled from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from serving.auth import (
    AuthSettings,
    Authenticator,
    KeyRecord,
    Principal,
    TenantSettings,
    hash_key,
    load_keys,
    new_key,
    without_settings_ids,
)
from serving.errors import ServingError
from serving.shared import PG_TCP

if TYPE_CHECKING:
    from serving.settings import Settings

__all__ = [
    "KEYS_TABLE",
    "ConnectionBusyError",
    "KeyStoreBusyError",
    "PostgresKeyStore",
    "SharedAuthenticator",
    "SharedConnection",
    "open_authenticator",
    "open_key_store",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

KEYS_TABLE = "switchyard_api_keys"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS switchyard_api_keys (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    sha256     TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS switchyard_api_keys_version (
    one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version BIGINT NOT NULL
);
INSERT INTO switchyard_api_keys_version (one, version) VALUES (TRUE, 0) ON CONFLICT (one) DO NOTHING;
"""
_SCHEMA_LOCK = 0x5357_4B45  # pg_advisory_xact_lock id: replicas starting together create the tables once
_BUMP = "UPDATE switchyard_api_keys_version SET version = version + 1 WHERE one RETURNING version"
_NEGATIVE_MAX = 10_000
"""Unknown key hashes remembered (until the counter moves) so that a client sending bad
keys does not cost a query each; beyond this many the oldest are forgotten."""
_CREATE_ATTEMPTS = 5
"""Random ids tried when a new key's id is already stored (one in 2^32 per stored key)."""
_LOOKUPS_MAX = 32
"""Different unknown keys waiting for a lookup at once; more get 503 (busy)."""
_TCP = PG_TCP


class ConnectionBusyError(psycopg.OperationalError):
    """The `SharedConnection` stayed in use by other calls for the whole timeout: the
    database itself may be fine (not an outage)."""


class KeyStoreBusyError(ServingError):
    """503: the key store is busy with other lookups (not an outage); try again shortly."""


class SharedConnection:
    """One PostgreSQL connection for a small shared store (keys, promotions), opened when
    first needed and again after it broke, used by one thread at a time.

    Not a pool: these stores make a query every ``reload_s`` and a few on demand, and a
    pool's background reconnection would log every attempt during an outage (the stores
    log an outage once). A connection the server dropped fails the call that meets it
    (the caller answers 503 or tries again at its next poll); the next call reconnects.
    """

    def __init__(self, dsn: str, *, timeout_s: float) -> None:
        """Args:
        dsn: the database.
        timeout_s: the longest a call waits for the connection (to be free, or made:
            ``connect_timeout``), and each statement's limit (``statement_timeout``).
            The connection uses TCP keepalives (a dead peer is found in ~25 s).
        """
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[Any] | None = None

    @contextlib.contextmanager
    def use(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection (autocommit, rows as dicts), for this thread alone.

        Raises:
            ConnectionBusyError: other calls held it for the whole timeout.
            psycopg.OperationalError: it cannot be made within the timeout.
        """
        if not self._lock.acquire(timeout=self._timeout_s):
            raise ConnectionBusyError(f"the connection was busy for more than {self._timeout_s:g} s")
        try:
            if self._connection is None or self._connection.closed or self._connection.broken:
                self._discard()
                self._connection = psycopg.connect(
                    self._dsn, autocommit=True, row_factory=dict_row,  # type: ignore[arg-type]
                    connect_timeout=max(1, round(self._timeout_s)),
                    options=f"-c statement_timeout={round(self._timeout_s * 1000)}",
                    **_TCP,
                )
            try:
                yield self._connection
            except psycopg.OperationalError:
                self._discard()
                raise
        finally:
            self._lock.release()

    def _discard(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
            self._connection = None

    def close(self) -> None:
        with self._lock:
            self._discard()


def _record(row: Mapping[str, Any]) -> KeyRecord:
    return KeyRecord(id=row["id"], tenant=row["tenant"], sha256=row["sha256"], created_at=row["created_at"])


class PostgresKeyStore:
    """The ``switchyard_api_keys`` table as a `serving.auth.KeyStore`, plus what replicas
    need to follow it (`find`, `version`, `snapshot`).

    Synchronous, on one connection of its own (`SharedConnection`; a CLI uses it as is,
    the server through worker threads). Every database failure is a `ServingError` 503
    naming the key store (nothing changed); a call waits at most ``timeout_s``.
    """

    def __init__(
        self, dsn: str, tenants: Mapping[str, TenantSettings], *, timeout_s: float = 2.0, reserved: frozenset[str] = frozenset()
    ) -> None:
        """Args:
        dsn: the shared database.
        tenants: the configured tenants (a key of another is refused at creation).
        timeout_s: the longest a call waits for the connection, and each statement's limit.
        reserved: ids a new key may not have (the settings' keys, ``auth.keys``).
        """
        self.tenants = tenants
        self.reserved = reserved
        self.where = f"the shared key store (PostgreSQL table {KEYS_TABLE})"
        self._connection_of = SharedConnection(dsn, timeout_s=timeout_s)

    def open(self, *, import_file: Path | None = None) -> None:
        """Connect, create the tables if needed, import ``import_file`` once (see the
        module docstring).

        Raises:
            ServingError: 503 the database cannot be reached; 500 ``import_file`` is malformed.
        """
        try:
            self.setup(import_file)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._connection_of.close()

    def _unavailable(self, exc: Exception) -> ServingError:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ServingError(503, f"{self.where} cannot be reached ({type(exc).__name__}: {first_line}); try again shortly")

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._connection_of.use() as connection:
                yield connection
        except ConnectionBusyError as exc:
            raise KeyStoreBusyError(503, f"{self.where} is busy ({exc}); try again shortly", retry_after_s=1) from None
        except psycopg.Error as exc:  # unreachable, timed out, or a write that failed: nothing changed
            raise self._unavailable(exc) from None

    def setup(self, import_file: Path | None = None) -> None:
        """Create the tables; import ``import_file``'s keys if the store never changed."""
        records = load_keys(import_file) if import_file is not None else []
        with self._connection() as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            connection.execute(_SCHEMA)
            version = connection.execute("SELECT version FROM switchyard_api_keys_version WHERE one FOR UPDATE").fetchone()
            if not records or version is None or version["version"] != 0:
                return
            unknown = sorted({r.tenant for r in records} - set(self.tenants))
            if unknown:
                log.warning("keys of unknown tenant(s) %s in %s not imported", ", ".join(unknown), import_file)
            kept = [r for r in records if r.tenant in self.tenants]
            for record in kept:
                connection.execute(
                    "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (record.id, record.tenant, record.sha256, record.created_at),
                )
            connection.execute(_BUMP)
        log.warning("imported %d key(s) from %s into %s (once: later changes of the file are not read)",
                    len(kept), import_file, self.where)

    def create(self, tenant: str) -> tuple[str, KeyRecord]:
        with self._connection() as connection:
            for _ in range(_CREATE_ATTEMPTS):
                key, record = new_key(tenant, self.tenants, taken=self.reserved)
                try:
                    with connection.transaction():
                        connection.execute(
                            "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES (%s, %s, %s, %s)",
                            (record.id, record.tenant, record.sha256, record.created_at),
                        )
                        connection.execute(_BUMP)
                except psycopg.errors.UniqueViolation:
                    continue  # a stored key has this (random, 32-bit) id: draw another
                return key, record
        raise ServingError(500, f"no free key id in {self.where} after {_CREATE_ATTEMPTS} random draws")

    def list(self) -> list[KeyRecord]:
        with self._connection() as connection:
            rows = connection.execute("SELECT * FROM switchyard_api_keys ORDER BY created_at, id").fetchall()
        return [_record(row) for row in rows]

    def revoke(self, key_id: str) -> KeyRecord:
        with self._connection() as connection, connection.transaction():
            row = connection.execute("DELETE FROM switchyard_api_keys WHERE id = %s RETURNING *", (key_id,)).fetchone()
            if row is None:
                raise ServingError(404, f"no key {key_id!r} in {self.where}")
            connection.execute(_BUMP)
        return _record(row)

    def find(self, sha256: str) -> KeyRecord | None:
        """The key with this hash, if stored."""
        with self._connection() as connection:
            row = connection.execute("SELECT * FROM switchyard_api_keys WHERE sha256 = %s", (sha256,)).fetchone()
        return None if row is None else _record(row)

    def version(self) -> int:
        """The change counter."""
        with self._connection() as connection:
            row = connection.execute("SELECT version FROM switchyard_api_keys_version WHERE one").fetchone()
        return int(row["version"]) if row else 0

    def snapshot(self) -> tuple[int, list[KeyRecord]]:
        """The counter and every key, read in one statement (one consistent view)."""
        with self._connection() as connection:
            rows = connection.execute(
                "SELECT v.version, k.* FROM switchyard_api_keys_version v "
                "LEFT JOIN switchyard_api_keys k ON TRUE WHERE v.one"
            ).fetchall()
        version = int(rows[0]["version"]) if rows else 0
        return version, [_record(row) for row in rows if row["id"] is not None]


class SharedAuthenticator(Authenticator):
    """An `Authenticator` over the shared key store; see the module docstring."""

    def __init__(self, settings: AuthSettings, store: PostgresKeyStore, *, reload_s: float, enabled: bool = True) -> None:
        self.store = store
        self._reload_s = reload_s
        self._version = -1
        self._shared: dict[str, KeyRecord] = {}
        self._unknown: OrderedDict[str, None] = OrderedDict()
        """Hashes found nowhere at the current version, oldest first (`_NEGATIVE_MAX`)."""
        self._lookups: dict[str, asyncio.Future[KeyRecord | None]] = {}
        """Lookups under way, by hash: a second request with the same key waits for the first's."""
        self._down = False
        self._task: asyncio.Task[None] | None = None
        # The store's calls, on a thread of their own: they wait on one connection, and a
        # flood of unknown keys must not fill the loop's default executor (asyncio.to_thread).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-keys")
        # The base class follows a keys file; here `refresh` is off and `_read` takes the
        # settings' keys alone (the shared ones are followed by `sync`), so no path is read.
        super().__init__(settings, Path("/nonexistent/keys.yaml"), enabled=enabled)
        self.key_store = store

    def _read(self) -> dict[str, KeyRecord]:
        by_hash = {r.sha256: r for r in self._settings.keys}
        for record in by_hash.values():
            if record.tenant not in self._tenants:
                raise ServingError(500, f"key {record.id} names unknown tenant {record.tenant!r}")
        return by_hash

    def refresh(self, *, force: bool = False) -> None:
        """The shared keys are followed by `start`'s task, not per request."""

    def _outage(self, exc: ServingError) -> None:
        if not self._down:
            self._down = True
            log.error("%s; keys already loaded keep working, unknown keys get 503 until it answers", exc)

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            log.warning("%s answers again", self.store.where)

    async def _call(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` on the store's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def sync(self) -> bool:
        """Reload the shared keys if the change counter moved; False if the store could
        not be read (the keys loaded before stay in force)."""
        try:
            version = await self._call(self.store.version)
            if version != self._version:
                version, records = await self._call(self.store.snapshot)
        except KeyStoreBusyError:
            return False  # the connection was in use all along: read again at the next poll
        except ServingError as exc:
            self._outage(exc)
            return False
        self._recovered()
        if version != self._version:
            unclashed = without_settings_ids(records, self._settings.keys, self.store.where)
            known = {digest: r for digest, r in unclashed.items() if r.tenant in self._tenants}
            skipped = len(unclashed) - len(known)
            if skipped:
                log.error("%d shared key(s) name tenants this replica does not have: refused", skipped)
            if self._version >= 0:
                log.info("shared keys reloaded: %d keys (%d added, %d removed)", len(known),
                         len(known.keys() - self._shared.keys()), len(self._shared.keys() - known.keys()))
            self._shared, self._version = known, version
            self._unknown.clear()
        return True

    async def start(self) -> None:
        """Load the shared keys and follow them every ``reload_s``."""
        await self.sync()
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self._reload_s)
            try:
                await self.sync()
            except Exception:  # boundary: the follower must outlive any one failure
                log.exception("shared keys not reloaded")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self._call(self.store.close)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def authenticate(self, authorization: str | None, api_key: str | None) -> Principal:
        """The caller; see the module docstring.

        Raises:
            ServingError: 401 a missing or unknown key; 503 an unknown key while the
                shared key store cannot be reached.
        """
        if not self.enabled:
            return self._dev
        digest = hash_key(self._presented(authorization, api_key))
        record = self._by_hash.get(digest) or self._shared.get(digest)
        if record is None and digest not in self._unknown:
            record = await self._look_up(digest)
        if record is None:
            raise ServingError(401, "invalid API key")
        return self._principal(record)

    async def _look_up(self, digest: str) -> KeyRecord | None:
        """The stored key with this hash (None: there is none), one query per hash at a time.

        Raises:
            ServingError: 503 the store cannot be reached, or is busy with other lookups.
        """
        unavailable = ServingError(
            503, f"{self.store.where} cannot be reached, so this key cannot be checked now; try again shortly",
            retry_after_s=self._reload_s,
        )
        if self._down:
            # The follower probes the store every reload_s; until it answers, do not
            # make each unknown key wait for a connection that will not come.
            raise unavailable
        lookup = self._lookups.get(digest)
        if lookup is None:
            if len(self._lookups) >= _LOOKUPS_MAX:
                raise KeyStoreBusyError(
                    503, f"{self.store.where} is busy checking other keys; try again shortly", retry_after_s=1
                )
            lookup = asyncio.get_running_loop().run_in_executor(self._executor, self.store.find, digest)
            self._lookups[digest] = lookup
            version = self._version
            lookup.add_done_callback(lambda done: self._looked_up(digest, version, done))
        try:
            # Shielded: a client that hangs up does not cancel the query others wait for.
            record = await asyncio.shield(lookup)
        except KeyStoreBusyError:
            raise  # the connection was in use all along: not an outage
        except ServingError as exc:
            self._outage(exc)
            raise unavailable from None
        return record if record is not None and self._usable(record) else None

    def _usable(self, record: KeyRecord) -> bool:
        """Whether a stored key found by a lookup may be used here: its tenant is
        configured, and its id is not a settings key's (logged)."""
        return record.tenant in self._tenants and bool(without_settings_ids([record], self._settings.keys, self.store.where))

    def _looked_up(self, digest: str, version: int, lookup: asyncio.Future[KeyRecord | None]) -> None:
        """Remember what a lookup found (once, whoever still waits for it)."""
        self._lookups.pop(digest, None)
        if lookup.cancelled() or lookup.exception() is not None:
            return
        self._recovered()
        record = lookup.result()
        if record is not None and self._usable(record):
            self._shared[digest] = record
        elif version == self._version:
            # Not when the keys were reloaded meanwhile: a key created since is in them.
            self._unknown[digest] = None
            while len(self._unknown) > _NEGATIVE_MAX:
                self._unknown.popitem(last=False)


def open_key_store(settings: Settings) -> PostgresKeyStore:
    """The shared key store of ``settings.shared_dsn``, open, tables created, the keys file
    imported if this is its first use (a CLI's ``switchyard keys`` when shared).

    Raises:
        ServingError: 503 the database cannot be reached.
    """
    assert settings.shared_dsn is not None
    store = PostgresKeyStore(
        settings.shared_dsn, settings.auth.tenants, reserved=frozenset(r.id for r in settings.auth.keys)
    )
    store.open(import_file=settings.keys_file)
    return store


async def open_authenticator(settings: Settings, *, enabled: bool) -> Authenticator:
    """The app's authenticator: over the shared key store when ``settings.shared_dsn`` is
    set (its keys loaded, followed every ``state.reload_s``), else over the keys file.
    Close it with ``aclose``."""
    if settings.shared_dsn is None:
        return Authenticator(settings.auth, settings.keys_file, enabled=enabled)
    store = await asyncio.to_thread(open_key_store, settings)
    try:
        authenticator = SharedAuthenticator(settings.auth, store, reload_s=settings.state.reload_s, enabled=enabled)
        await authenticator.start()
    except BaseException:
        await asyncio.to_thread(store.close)
        raise
    return authenticator
