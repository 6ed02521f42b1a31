"""API keys and tenants.

A key maps to a tenant; the tenant says which graphs and model aliases it may use (and,
as those layers arrive, tools and collections) and its limits. Keys are stored only as
SHA-256 hashes: in ``auth.keys`` in the settings, or in the keys file
(``<data_dir>/keys.yaml``) that ``switchyard keys create`` appends to and
``switchyard keys revoke`` removes from. The key itself is shown once, when it is
created.

The server watches the keys file: at most every ``auth.keys_reload_s`` (1 s by
default) a request checks the file's identity (inode, size, modification and change
times) and reloads it if it changed, so a revoked key gets 401 within that time, on
every API. A file that was replaced (renamed over), rewritten in place or removed is
picked up; a file that does not parse keeps the last good keys and logs an error.
An unknown key also triggers the check at once, so a new key works immediately.

When replicas share state (``settings.shared_dsn``), keys created at run time live in
PostgreSQL instead of the keys file (`serving.shared.keys`): every replica finds a new
key at once and refuses a revoked one within ``state.reload_s``. Either way the
`KeyStore` of the app (``app.state.key_store``) is what ``switchyard keys`` and the
``/admin/keys`` routes create, list and revoke keys in.

Clients send the key as ``Authorization: Bearer <key>`` (OpenAI clients) or
``x-api-key: <key>`` (langgraph-sdk). Auth is on unless the server runs with ``--dev``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import tempfile
import time
from contextlib import contextmanager
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import ServingError

__all__ = [
    "AuthSettings",
    "FileKeyStore",
    "KeyRecord",
    "KeyStore",
    "Principal",
    "TenantLimits",
    "TenantSettings",
    "create_key",
    "hash_key",
    "load_keys",
    "new_key",
    "revoke_key",
    "without_settings_ids",
]

log = logging.getLogger(__name__)

KEY_PREFIX = "sy-"
DEV_TENANT = "dev"


class TenantLimits(BaseModel):
    """Per-key limits of a tenant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_s: float = Field(default=10.0, gt=0)
    """Token-bucket refill rate, per key."""
    burst: int = Field(default=20, ge=1)
    """Token-bucket size: requests a key may make at once."""
    max_concurrent_runs: int = Field(default=8, ge=1)
    """Runs (chat completions, graph runs) in progress at once, per key."""


class TenantSettings(BaseModel):
    """What a tenant may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    graphs: tuple[str, ...] = ("*",)
    """Graph ids the tenant may run (``*``: all)."""
    models: tuple[str, ...] = ("*",)
    """Model aliases the tenant may call directly (``*``: all)."""
    tools: tuple[str, ...] = ("*",)
    """Tools the tenant's runs may call (enforced by the tools layer)."""
    collections: tuple[str, ...] = ("*",)
    """Knowledge collections the tenant may use (``/v1/collections`` and retrieval
    graphs; ``*``: all)."""
    blocked_terms: tuple[str, ...] = ()
    """Sensitive terms refused in this tenant's input (on top of the global list)."""
    output_redact_terms: tuple[str, ...] = ()
    """Terms redacted from this tenant's answers (on top of the global list)."""
    output_block_terms: tuple[str, ...] = ()
    """Terms that stop this tenant's answers (on top of the global list)."""
    limits: TenantLimits = TenantLimits()
    admin: bool = False
    """Whether the tenant's keys may call the operator routes (``/admin/...``: reload
    the model registry, read the gateway's state)."""

    def allows_collection(self, name: str) -> bool:
        return "*" in self.collections or name in self.collections

    def allows_graph(self, graph_id: str) -> bool:
        return "*" in self.graphs or graph_id in self.graphs

    def allows_model(self, alias: str) -> bool:
        return "*" in self.models or alias in self.models


class KeyRecord(BaseModel):
    """A stored key: its hash, never the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    """A short public id, to name the key in logs and audits."""
    tenant: str
    sha256: str
    created_at: str = ""


class AuthSettings(BaseModel):
    """The ``auth`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: dict[str, TenantSettings] = {}
    keys: tuple[KeyRecord, ...] = ()
    """Keys given in the settings (hashes); the keys file adds more."""
    keys_file: Path | None = None
    """Default: ``<data_dir>/keys.yaml``."""
    keys_reload_s: float = Field(default=1.0, gt=0, le=60)
    """How often (at most) the server checks the keys file for changes: a revoked
    key is refused (401) at the latest this long after the file changed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: the tenant and the key they used."""

    tenant: str
    key_id: str
    settings: TenantSettings


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_keys(path: Path) -> list[KeyRecord]:
    """The keys in a keys file (none if it does not exist).

    Raises:
        ServingError: the file is malformed (names the entry).
    """
    if not path.is_file():
        return []
    data = yaml.safe_load(path.read_text()) or []
    if not isinstance(data, list):
        raise ServingError(500, f"{path}: expected a list of keys")
    records = []
    for index, item in enumerate(data):
        try:
            records.append(KeyRecord.model_validate(item))
        except ValidationError as exc:
            raise ServingError(500, f"{path}[{index}]: {exc.errors()[0]['msg']}") from None
    return records


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of the keys file between CLI processes (a
    ``create`` and a ``revoke`` at once must not lose either change)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_keys(path: Path, records: list[KeyRecord]) -> None:
    """Replace the keys file atomically: a temporary file in the same directory,
    flushed to disk, then renamed over it (readers see the old file or the new one)."""
    text = yaml.safe_dump([r.model_dump() for r in records], sort_keys=False)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as temporary:
            temporary.write(text)
            temporary.flush()
            os.fsync(temporary.fileno())
        os.chmod(name, 0o600)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def new_key(tenant: str, tenants: Mapping[str, TenantSettings], *, taken: Collection[str] = ()) -> tuple[str, KeyRecord]:
    """A new random key for ``tenant`` and its record (nothing stored yet).

    Args:
        taken: key ids in use (stored keys, the settings' keys): the new id is none of them.

    Raises:
        ServingError: 400 when the tenant is not configured (naming the ones that are).
    """
    if tenant not in tenants:
        raise ServingError(400, f"unknown tenant {tenant!r}; configured: {', '.join(sorted(tenants)) or 'none'}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    # 32 bits: short enough to read in logs; a clash with an id in use is drawn again
    # (an id names one key in audits, revocations and its rate-limit bucket).
    key_id = secrets.token_hex(4)
    while key_id in taken:
        key_id = secrets.token_hex(4)
    record = KeyRecord(id=key_id, tenant=tenant, sha256=hash_key(key), created_at=datetime.now(UTC).isoformat())
    return key, record


def create_key(
    path: Path, tenant: str, tenants: Mapping[str, TenantSettings], *, reserved: Collection[str] = ()
) -> tuple[str, KeyRecord]:
    """Make a new key for ``tenant`` and append its hash to the keys file.

    Args:
        reserved: ids the new key may not have besides the file's (the settings' keys).

    Returns:
        The key (shown once, never stored) and its record.

    Raises:
        ServingError: the tenant is not configured.
    """
    with _locked(path):
        records = load_keys(path)
        key, record = new_key(tenant, tenants, taken={*reserved, *(r.id for r in records)})
        _write_keys(path, [*records, record])
    return key, record


def revoke_key(path: Path, key_id: str) -> KeyRecord:
    """Remove the key ``key_id`` from the keys file (atomically, like `create_key`).

    A running server refuses the key within ``auth.keys_reload_s``.

    Returns:
        The removed record.

    Raises:
        ServingError: 404 when no key in the file has this id.
    """
    with _locked(path):
        records = load_keys(path)
        kept = [r for r in records if r.id != key_id]
        if len(kept) == len(records):
            raise ServingError(404, f"no key {key_id!r} in {path}")
        _write_keys(path, kept)
    return next(r for r in records if r.id == key_id)


class KeyStore(Protocol):
    """Where the keys made at run time live: the keys file (`FileKeyStore`) or the
    database replicas share (`serving.shared.keys.PostgresKeyStore`). Synchronous (a CLI
    calls it as is; the server through a worker thread)."""

    where: str
    """Named in messages: the keys file's path, or the database table."""

    def create(self, tenant: str) -> tuple[str, KeyRecord]:
        """A new key for ``tenant``: the key (shown once) and its stored record.

        Raises:
            ServingError: 400 an unknown tenant; 503 the store cannot be written.
        """
        ...

    def list(self) -> list[KeyRecord]:
        """The stored keys (hashes, never keys), oldest first."""
        ...

    def revoke(self, key_id: str) -> KeyRecord:
        """Remove the key ``key_id``; returns its record.

        Raises:
            ServingError: 404 no such key; 503 the store cannot be written.
        """
        ...


@dataclass(frozen=True, slots=True)
class FileKeyStore:
    """The keys file (``<data_dir>/keys.yaml``) as a `KeyStore`."""

    path: Path
    tenants: Mapping[str, TenantSettings]
    reserved: frozenset[str] = frozenset()
    """Ids a new key may not have (the settings' keys, ``auth.keys``)."""

    @property
    def where(self) -> str:
        return str(self.path)

    def create(self, tenant: str) -> tuple[str, KeyRecord]:
        return create_key(self.path, tenant, self.tenants, reserved=self.reserved)

    def list(self) -> list[KeyRecord]:
        return load_keys(self.path)

    def revoke(self, key_id: str) -> KeyRecord:
        return revoke_key(self.path, key_id)


def without_settings_ids(records: list[KeyRecord], settings_keys: Collection[KeyRecord], where: str) -> dict[str, KeyRecord]:
    """``records`` by hash, less those with the id of another key in the settings (logged
    as errors): an id names one key in audits and one rate-limit bucket, and the
    settings' key keeps it."""
    configured = {r.id: r.sha256 for r in settings_keys}
    kept: dict[str, KeyRecord] = {}
    for record in records:
        if configured.get(record.id, record.sha256) != record.sha256:
            log.error("key %s in %s has the id of another key in auth.keys: refused", record.id, where)
            continue
        kept[record.sha256] = record
    return kept


_FileStamp = tuple[int, int, int, int] | None
"""A file's identity and version: inode, size, mtime and ctime in ns (None: absent)."""


def _stamp(path: Path) -> _FileStamp:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Authenticator:
    """Resolves a request's key to a `Principal`, following the keys file."""

    def __init__(
        self, settings: AuthSettings, keys_file: Path, *, enabled: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = enabled
        self._settings = settings
        self._tenants = settings.tenants
        self._keys_file = keys_file
        self._clock = clock
        self._interval_s = settings.keys_reload_s
        self.key_store: KeyStore = FileKeyStore(keys_file, settings.tenants, frozenset(r.id for r in settings.keys))
        """Where ``/admin/keys`` creates, lists and revokes keys."""
        self._stamp: _FileStamp = _stamp(keys_file)
        self._checked_at = clock()
        # At start a bad file is an error (the server does not start); later, the
        # last good keys stay in force.
        self._by_hash = self._read()
        # --dev: one local user, bound only by the server-wide limits.
        unlimited = TenantLimits(requests_per_s=1e9, burst=10**9, max_concurrent_runs=10**9)
        self._dev = Principal(tenant=DEV_TENANT, key_id="-", settings=TenantSettings(limits=unlimited, admin=True))

    def _read(self) -> dict[str, KeyRecord]:
        by_hash = {r.sha256: r for r in self._settings.keys}
        by_hash.update(without_settings_ids(load_keys(self._keys_file), self._settings.keys, str(self._keys_file)))
        for record in by_hash.values():
            if record.tenant not in self._tenants:
                raise ServingError(500, f"key {record.id} names unknown tenant {record.tenant!r}")
        return by_hash

    def refresh(self, *, force: bool = False) -> None:
        """Reload the keys file if it changed; checked at most every
        ``keys_reload_s`` unless ``force``. A file that does not load keeps the
        last good keys (and is logged once per change)."""
        now = self._clock()
        if not force and now - self._checked_at < self._interval_s:
            return
        self._checked_at = now
        try:
            stamp = _stamp(self._keys_file)
        except OSError as exc:  # unreadable directory: keep the keys, say so
            log.error("keys file %s cannot be checked, the last good keys stay in force: %s", self._keys_file, exc)
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            by_hash = self._read()
        except (ServingError, OSError, yaml.YAMLError) as exc:
            log.error("keys file %s not reloaded, the last good keys stay in force: %s", self._keys_file, exc)
            return
        removed = len(self._by_hash.keys() - by_hash.keys())
        added = len(by_hash.keys() - self._by_hash.keys())
        self._by_hash = by_hash
        log.info("keys file %s reloaded: %d keys (%d added, %d removed)", self._keys_file, len(by_hash), added, removed)

    def config_key_ids(self) -> set[str]:
        """Ids of the keys given in the settings (``auth.keys``): not revocable at run time."""
        return {record.id for record in self._settings.keys}

    async def start(self) -> None:
        """Nothing to start: the keys file is checked by requests (`refresh`)."""

    async def sync(self) -> bool:
        """Read the keys now (after a change made through this process)."""
        self.refresh(force=True)
        return True

    async def aclose(self) -> None:
        """Nothing to close."""

    @staticmethod
    def _presented(authorization: str | None, api_key: str | None) -> str:
        key = api_key
        if not key and authorization and authorization.lower().startswith("bearer "):
            key = authorization[7:].strip()
        if not key:
            raise ServingError(401, "an API key is required (Authorization: Bearer <key> or x-api-key)")
        return key

    def _principal(self, record: KeyRecord) -> Principal:
        return Principal(tenant=record.tenant, key_id=record.id, settings=self._tenants[record.tenant])

    async def authenticate(self, authorization: str | None, api_key: str | None) -> Principal:
        """The caller, from ``Authorization: Bearer`` or ``x-api-key``.

        Raises:
            ServingError: 401 when auth is on and the key is missing or unknown.
        """
        if not self.enabled:
            return self._dev
        digest = hash_key(self._presented(authorization, api_key))
        self.refresh()  # revocations: within keys_reload_s
        record = self._by_hash.get(digest)
        if record is None:
            self.refresh(force=True)  # `switchyard keys create` ran since: no restart, no wait
            record = self._by_hash.get(digest)
        if record is None:
            raise ServingError(401, "invalid API key")
        return self._principal(record)
