"""API keys and tenants.

A key maps to a tenant; the tenant says which graphs and model aliases it may use (and,
as those layers arrive, tools and collections) and its limits. Keys are stored only as
SHA-256 hashes: in ``auth.keys`` in the settings, or in the keys file
(``<data_dir>/keys.yaml``) that ``switchyard keys create`` appends to. The key itself
is shown once, when it is created.

Clients send the key as ``Authorization: Bearer <key>`` (OpenAI clients) or
``x-api-key: <key>`` (langgraph-sdk). Auth is on unless the server runs with ``--dev``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import ServingError

__all__ = [
    "AuthSettings",
    "KeyRecord",
    "Principal",
    "TenantLimits",
    "TenantSettings",
    "create_key",
    "hash_key",
    "load_keys",
]

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


def create_key(path: Path, tenant: str, tenants: Mapping[str, TenantSettings]) -> tuple[str, KeyRecord]:
    """Make a new key for ``tenant`` and append its hash to the keys file.

    Returns:
        The key (shown once, never stored) and its record.

    Raises:
        ServingError: the tenant is not configured.
    """
    if tenant not in tenants:
        raise ServingError(400, f"unknown tenant {tenant!r}; configured: {', '.join(sorted(tenants)) or 'none'}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(
        id=secrets.token_hex(4), tenant=tenant, sha256=hash_key(key), created_at=datetime.now(UTC).isoformat()
    )
    records = load_keys(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump([r.model_dump() for r in [*records, record]], sort_keys=False))
    temporary.chmod(0o600)
    temporary.replace(path)  # atomic: a crash leaves the old file or the new one
    return key, record


class Authenticator:
    """Resolves a request's key to a `Principal`."""

    def __init__(self, settings: AuthSettings, keys_file: Path, *, enabled: bool) -> None:
        self.enabled = enabled
        self._settings = settings
        self._tenants = settings.tenants
        self._keys_file = keys_file
        self._loaded_mtime: float | None = None
        self._by_hash: dict[str, KeyRecord] = {}
        self._load()
        # --dev: one local user, bound only by the server-wide limits.
        unlimited = TenantLimits(requests_per_s=1e9, burst=10**9, max_concurrent_runs=10**9)
        self._dev = Principal(tenant=DEV_TENANT, key_id="-", settings=TenantSettings(limits=unlimited))

    def _mtime(self) -> float | None:
        try:
            return self._keys_file.stat().st_mtime
        except FileNotFoundError:
            return None

    def _load(self) -> None:
        self._loaded_mtime = self._mtime()
        by_hash = {r.sha256: r for r in [*self._settings.keys, *load_keys(self._keys_file)]}
        for record in by_hash.values():
            if record.tenant not in self._tenants:
                raise ServingError(500, f"key {record.id} names unknown tenant {record.tenant!r}")
        self._by_hash = by_hash

    def authenticate(self, authorization: str | None, api_key: str | None) -> Principal:
        """The caller, from ``Authorization: Bearer`` or ``x-api-key``.

        Raises:
            ServingError: 401 when auth is on and the key is missing or unknown.
        """
        if not self.enabled:
            return self._dev
        key = api_key
        if not key and authorization and authorization.lower().startswith("bearer "):
            key = authorization[7:].strip()
        if not key:
            raise ServingError(401, "an API key is required (Authorization: Bearer <key> or x-api-key)")
        digest = hash_key(key)
        record = self._by_hash.get(digest)
        if record is None and self._mtime() != self._loaded_mtime:
            self._load()  # `switchyard keys create` ran since: no restart needed
            record = self._by_hash.get(digest)
        if record is None:
            raise ServingError(401, "invalid API key")
        return Principal(tenant=record.tenant, key_id=record.id, settings=self._tenants[record.tenant])
