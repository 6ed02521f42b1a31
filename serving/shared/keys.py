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
its end once.

The first time a store is set up (the counter never moved) and ``<data_dir>/keys.yaml``
holds keys, they are imported (logged); a table emptied later by revocations is never
refilled from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from serving.auth import AuthSettings, Authenticator, KeyRecord, Principal, TenantSettings, hash_key, load_keys, new_key
from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.settings import Settings

__all__ = ["KEYS_TABLE", "PostgresKeyStore", "SharedAuthenticator", "SharedConnection", "open_authenticator", "open_key_store"]

log = logging.getLogger(__name__)

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
keys does not cost a query each; beyond this many the memory is cleared."""


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
        timeout_s: the longest a call waits for the connection (to be free, or made),
            and each statement's limit (``statement_timeout``).
        """
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[Any] | None = None

    @contextlib.contextmanager
    def use(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection (autocommit, rows as dicts), for this thread alone.

        Raises:
            psycopg.OperationalError: it cannot be had within the timeout.
        """
        if not self._lock.acquire(timeout=self._timeout_s):
            raise psycopg.OperationalError(f"the connection was busy for more than {self._timeout_s:g} s")
        try:
            if self._connection is None or self._connection.closed or self._connection.broken:
                self._discard()
                self._connection = psycopg.connect(
                    self._dsn, autocommit=True, row_factory=dict_row,  # type: ignore[arg-type]
                    connect_timeout=max(1, round(self._timeout_s)),
                    options=f"-c statement_timeout={round(self._timeout_s * 1000)}",
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

    def __init__(self, dsn: str, tenants: Mapping[str, TenantSettings], *, timeout_s: float = 2.0) -> None:
        self.tenants = tenants
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
        key, record = new_key(tenant, self.tenants)
        with self._connection() as connection, connection.transaction():
            connection.execute(
                "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES (%s, %s, %s, %s)",
                (record.id, record.tenant, record.sha256, record.created_at),
            )
            connection.execute(_BUMP)
        return key, record

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
        self._unknown: set[str] = set()
        self._down = False
        self._task: asyncio.Task[None] | None = None
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

    async def sync(self) -> bool:
        """Reload the shared keys if the change counter moved; False if the store could
        not be read (the keys loaded before stay in force)."""
        try:
            version = await asyncio.to_thread(self.store.version)
            if version != self._version:
                version, records = await asyncio.to_thread(self.store.snapshot)
        except ServingError as exc:
            self._outage(exc)
            return False
        self._recovered()
        if version != self._version:
            known = {r.sha256: r for r in records if r.tenant in self._tenants}
            skipped = len(records) - len(known)
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
        await asyncio.to_thread(self.store.close)

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
            unavailable = ServingError(
                503, f"{self.store.where} cannot be reached, so this key cannot be checked now; try again shortly",
                retry_after_s=self._reload_s,
            )
            if self._down:
                # The follower probes the store every reload_s; until it answers, do not
                # make each unknown key wait for a connection that will not come.
                raise unavailable
            try:
                record = await asyncio.to_thread(self.store.find, digest)
            except ServingError as exc:
                self._outage(exc)
                raise unavailable from None
            self._recovered()
            if record is not None and record.tenant in self._tenants:
                self._shared[digest] = record
            else:
                record = None
                if len(self._unknown) >= _NEGATIVE_MAX:
                    self._unknown.clear()
                self._unknown.add(digest)
        if record is None:
            raise ServingError(401, "invalid API key")
        return self._principal(record)


def open_key_store(settings: Settings) -> PostgresKeyStore:
    """The shared key store of ``settings.shared_dsn``, open, tables created, the keys file
    imported if this is its first use (a CLI's ``switchyard keys`` when shared).

    Raises:
        ServingError: 503 the database cannot be reached.
    """
    assert settings.shared_dsn is not None
    store = PostgresKeyStore(settings.shared_dsn, settings.auth.tenants)
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
