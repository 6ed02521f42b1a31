"""Model promotions in PostgreSQL, shared by every replica (``settings.shared_dsn``).

The same document ``promotions.json`` holds (`gateway.promotions.PromotionsFile`: per
alias the promoted targets and the history), in one row of
``switchyard_promotions(one, version, document, updated_at)``. Every promotion and
rollback is one transaction that locks the row (``SELECT ... FOR UPDATE``), makes the
same checks the file store makes under its file lock (a stale writer, one whose alias
changed since its evaluation began, is refused with `PromotionConflictError`), writes
the new document and bumps ``version``. `PostgresPromotionStore` is a
`gateway.promotions.PromotionStore` whose lock, read and write are the database's, so
the promotion logic is the file store's, unchanged.

Each replica's `serving.models_admin.ModelsReloader` reads ``version`` every
``state.reload_s`` and reloads its registry when it moved, so a promotion through one
replica is served by all of them within that interval. The database unreachable: the
running registry stays, the failure is logged once per outage, promotions and rollbacks
answer 503 and change nothing.

The first time the table is set up (``version`` 0) and the data directory has a
``promotions.json``, it is imported (logged), so switching a single server to shared
state keeps its promotions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from gateway.promotions import PromotionsFile, PromotionsFileError, PromotionStore, PromotionStoreError, promotions_path
from serving.shared.keys import SharedConnection

if TYPE_CHECKING:
    from serving.settings import Settings

__all__ = ["PROMOTIONS_TABLE", "PostgresPromotionStore", "close_promotion_store", "open_promotion_store"]

log = logging.getLogger(__name__)

PROMOTIONS_TABLE = "switchyard_promotions"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS switchyard_promotions (
    one        BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version    BIGINT NOT NULL,
    document   JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""
_SCHEMA_LOCK = 0x5357_5052  # pg_advisory_xact_lock id: replicas starting together create the table once


class PostgresPromotionStore(PromotionStore):
    """The promotions document in PostgreSQL; see the module docstring.

    Synchronous, like the file store (the server calls it on worker threads), on one
    connection of its own (`serving.shared.keys.SharedConnection`). A database that cannot
    be reached is a `PromotionStoreError` (nothing changed).
    """

    def __init__(self, dsn: str, *, timeout_s: float = 5.0, import_file: Path | None = None) -> None:
        """Args:
        dsn: the shared database.
        timeout_s: the longest a call waits for a connection, and each statement's limit.
        import_file: a ``promotions.json`` to import if the table was never written.
        """
        super().__init__(import_file or Path("promotions.json"))
        self._import_file = import_file
        self._local = threading.local()
        self._connection_of = SharedConnection(dsn, timeout_s=timeout_s)

    @property
    def location(self) -> str:
        return f"the shared promotions (PostgreSQL table {PROMOTIONS_TABLE})"

    def _unavailable(self, exc: Exception) -> PromotionStoreError:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return PromotionStoreError(f"{self.location} cannot be reached ({type(exc).__name__}: {first_line}); nothing changed")

    def open(self) -> PostgresPromotionStore:
        """Connect, create the table, import the promotions file once.

        Raises:
            PromotionStoreError: the database cannot be reached.
            PromotionsFileError: the file to import is invalid.
        """
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self._connection_of.close()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        try:
            with self._connection_of.use() as connection:
                yield connection
        except psycopg.Error as exc:  # unreachable, timed out, or a write that failed: nothing changed
            raise self._unavailable(exc) from None

    def _setup(self) -> None:
        imported = None
        if self._import_file is not None and self._import_file.exists():
            imported = PromotionStore(self._import_file).load()  # an invalid file stops the start, as it would alone
        with self._connection() as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            connection.execute(_SCHEMA)
            connection.execute(
                "INSERT INTO switchyard_promotions (one, version, document) VALUES (TRUE, 0, %s) ON CONFLICT (one) DO NOTHING",
                (Jsonb(PromotionsFile().model_dump(mode="json")),),
            )
            row = connection.execute("SELECT version FROM switchyard_promotions WHERE one FOR UPDATE").fetchone()
            if imported is None or not imported.aliases or row["version"] != 0:
                return
            connection.execute(
                "UPDATE switchyard_promotions SET document = %s, version = version + 1, updated_at = now() WHERE one",
                (Jsonb(imported.model_dump(mode="json")),),
            )
        log.warning("imported the promotions of %d alias(es) from %s into %s (once: later changes of the file are not read)",
                    len(imported.aliases), self._import_file, self.location)

    def _document(self, row: Any) -> PromotionsFile:
        try:
            return PromotionsFile.model_validate(row["document"])
        except ValidationError as exc:
            problems = [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
            raise PromotionsFileError(self.location, problems) from None

    def load(self) -> PromotionsFile:
        """The document (inside a write: the row locked by it)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return self._document(connection.execute("SELECT document FROM switchyard_promotions WHERE one FOR UPDATE").fetchone())
        return self.snapshot()[1]

    def snapshot(self) -> tuple[int, PromotionsFile]:
        """The version and the document, read together."""
        with self._connection() as connection:
            row = connection.execute("SELECT version, document FROM switchyard_promotions WHERE one").fetchone()
        if row is None:
            return 0, PromotionsFile()
        return int(row["version"]), self._document(row)

    def version(self) -> int:
        """The version number (bumped by every promotion and rollback)."""
        with self._connection() as connection:
            row = connection.execute("SELECT version FROM switchyard_promotions WHERE one").fetchone()
        return 0 if row is None else int(row["version"])

    def written_version(self) -> int | None:
        """The version the calling thread's last write produced (None: it wrote none)."""
        return getattr(self._local, "written", None)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One transaction for a read-modify-write: `load` locks the row in it, `_write`
        updates it; any exception rolls it back (nothing changed)."""
        self._local.written = None
        with self._connection() as connection, connection.transaction():
            self._local.connection = connection
            try:
                yield
            finally:
                self._local.connection = None

    def _write(self, content: PromotionsFile) -> None:
        connection = self._local.connection
        row = connection.execute(
            "UPDATE switchyard_promotions SET document = %s, version = version + 1, updated_at = now() WHERE one "
            "RETURNING version",
            (Jsonb(content.model_dump(mode="json")),),
        ).fetchone()
        self._local.written = int(row["version"])


def open_promotion_store(settings: Settings) -> PromotionStore:
    """The promotions of ``settings``: ``<data_dir>/gateway/promotions.json``, or, when
    replicas share state (``settings.shared_dsn``), the shared database (opened; the file
    imported once). Close it with `close_promotion_store`.

    Raises:
        PromotionStoreError: the shared database cannot be reached.
        PromotionsFileError: the file to import is invalid.
    """
    path = promotions_path(settings.data_dir)
    if settings.shared_dsn is None:
        return PromotionStore(path)
    return PostgresPromotionStore(settings.shared_dsn, import_file=path).open()


def close_promotion_store(store: PromotionStore) -> None:
    """Close the shared store's connections (a file store holds none)."""
    if isinstance(store, PostgresPromotionStore):
        store.close()
