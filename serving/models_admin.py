"""Hot reload of the model registry, and the operator routes over the gateway.

The server reloads ``gateway.models_file`` when the file changes (its identity,
inode, size, modification and change times, is checked every
``gateway.reload_check_s``), on SIGHUP, and on ``POST /admin/models/reload``. A
valid registry replaces the running one in one assignment (`ModelGateway.reload`);
runs in flight finish on the backend they started on. An invalid file, or one that
drops an alias a graph or the embedder uses, is refused: the error is logged (and
is the route's 400), the running registry stays, and the watcher does not retry
the same file until it changes again.

Promotions (`serving.promotion`, ``switchyard models promote``) live in
``<data_dir>/gateway/promotions.json``, not in the models file: every reload is the models
file with the promoted aliases' targets replaced, the watcher watches both files, and a
promotions file that names a backend the models file no longer has is refused like any
invalid registry. The routes ``POST /admin/models/{alias}/promote``, ``.../rollback`` and
``GET /admin/models/{alias}/history`` drive them. When replicas share state, the
promotions live in PostgreSQL instead (`serving.shared.promotions`): the reloader reads its
version number every ``state.reload_s`` and reloads when it moved, so a promotion through
one replica is served by every replica within that interval.

The key routes (``POST /admin/keys``, ``GET /admin/keys``, ``DELETE /admin/keys/{id}``)
create, list and revoke API keys in the app's key store (the keys file, or the shared
database): the operator side of ``switchyard keys``, audited (``key_created``,
``key_revoked``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from eval.report import render_gate_html
from gateway import ModelGateway, RegistryError, load_registry
from gateway.promotions import (
    AliasPromotions,
    HistoryEntry,
    NothingToRollBackError,
    PromotionConflictError,
    PromotionError,
    PromotionStore,
    PromotionsFile,
    PromotionStoreError,
    promotions_path,
)
from serving.deps import PrincipalDep, require_key
from serving.errors import ServingError
from serving.platform import Platform
from serving.shared.promotions import PostgresPromotionStore, open_promotion_store
from serving.promotion import (
    Check,
    GateRefusedError,
    Promoter,
    PromotionUnavailableError,
    UnknownAliasError,
    serving_evaluate,
)

__all__ = ["ModelsReloader", "open_models_reloader", "router"]

log = logging.getLogger(__name__)


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


async def open_models_reloader(platform: Platform) -> ModelsReloader:
    """The app's reloader, its promotions in force (close it with ``aclose``).

    Raises:
        RegistryError: the promotions name what the models file lacks (the server does
            not start; ``switchyard models rollback`` is the way out).
        PromotionStoreError: the shared database cannot be reached.
    """
    store = await asyncio.to_thread(open_promotion_store, platform.settings)
    reloader = ModelsReloader(platform, store=store)
    try:
        await reloader.prepare()
    except BaseException:
        await reloader.aclose()
        raise
    return reloader


class ModelsReloader:
    """Reloads the gateway's registry from the models file and the promotions; see the
    module docstring."""

    def __init__(self, platform: Platform, *, store: PromotionStore | None = None) -> None:
        """Args:
        platform: the served platform (its gateway is reloaded).
        store: the promotions (default ``promotions.json`` in the data directory);
            a `PostgresPromotionStore` is polled every ``state.reload_s``.
        """
        self._platform = platform
        self._gateway: ModelGateway = platform.gateway
        self._path = Path(platform.settings.gateway.models_file)
        self.store = store or PromotionStore(promotions_path(platform.settings.data_dir))
        self._shared = isinstance(self.store, PostgresPromotionStore)
        self._check_s = platform.settings.gateway.reload_check_s
        if self._shared:
            self._check_s = min(self._check_s, platform.settings.state.reload_s)
        self._seen: tuple[Any, Any] = (_identity(self._path), None)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._signal_installed = False
        self._store_down = False
        self.promotions: Mapping[str, AliasPromotions] = {}
        """The promotions in force (as last read with the registry)."""
        self.reloads: Counter[str] = Counter()
        """Reload attempts by outcome (``ok``, ``refused``)."""

    async def prepare(self) -> None:
        """Put the promotions in force before the first request (the platform was built
        from the models file alone). Invalid promotions stop the start, as an invalid
        models file does (`switchyard models rollback`, which works with no server
        running, is the way out when a promoted backend was removed)."""
        models = _identity(self._path)
        stamp, promotions = await asyncio.to_thread(self._read_promotions)
        self._seen = (models, stamp)
        if promotions.aliases:
            self._gateway.reload(self.store.apply(self._gateway.registry, source=promotions.aliases), required=self.required())
            log.info("promotions in %s applied", self.store.location)
        self.promotions = promotions.aliases

    def _promotions_stamp(self) -> Any:
        """What says the promotions changed: the file's identity, or the shared version."""
        if isinstance(self.store, PostgresPromotionStore):
            return self.store.version()
        return _identity(self.store.path)

    def _read_promotions(self) -> tuple[Any, PromotionsFile]:
        """(stamp, content), the stamp read first: a change in between is seen again."""
        if isinstance(self.store, PostgresPromotionStore):
            return self.store.snapshot()
        return _identity(self.store.path), self.store.load()

    async def _identities(self) -> tuple[Any, Any]:
        stamp = await asyncio.to_thread(self._promotions_stamp) if self._shared else self._promotions_stamp()
        return _identity(self._path), stamp

    def required(self) -> dict[str, str]:
        """Aliases the platform's graphs and embedder call, with who calls them."""
        users = {graph.spec.model: f"graph {graph.graph_id!r}" for graph in self._platform.graphs}
        for name, route in self._platform.settings.routing.routes.items():
            if route.alias:
                users.setdefault(route.alias, f"route {name!r}")
        embedder = self._platform.settings.knowledge.embedder
        alias = getattr(embedder, "alias", None)
        if getattr(embedder, "kind", None) == "openai" and alias:
            users.setdefault(alias, "the knowledge embedder")
        return users

    async def reload(self, reason: str) -> dict[str, Any]:
        """Load the file and swap it in.

        Returns:
            What is served now: each alias's targets and fallbacks.

        Raises:
            RegistryError: the file is invalid or drops a required alias (nothing changed).
        """
        async with self._lock:
            models = _identity(self._path)
            # The shared store is a database read (a worker thread); the file is a few KB
            # of JSON and pydantic validation: not worth a thread.
            stamp, promotions = (
                await asyncio.to_thread(self._read_promotions) if self._shared else self._read_promotions()
            )
            self._seen = (models, stamp)
            try:
                registry = self.store.apply(load_registry(self._path), source=promotions.aliases)
                self._gateway.reload(registry, required=self.required())
            except RegistryError as exc:
                self.reloads["refused"] += 1
                log.error("model registry reload (%s) refused, the running registry stays: %s", reason, exc)
                raise
            self.promotions = promotions.aliases
            self.reloads["ok"] += 1
            log.info("model registry reloaded from %s (%s)", self._path, reason)
            return describe(self._gateway, self.promotions)

    async def commit(self, write: Callable[[Check], HistoryEntry]) -> HistoryEntry:
        """Write a change of the promotions file and put it in force at once (a
        `serving.promotion.Commit`): the new registry is built from the models file and
        the new promotions before the write (an invalid one writes nothing), and swapped in
        after it.

        Raises:
            RegistryError: the models file is invalid, or the change names what it lacks.
            PromotionError: the store refused the change (nothing to roll back, a conflict).
        """
        async with self._lock:
            base = load_registry(self._path)
            built: list[Any] = []

            def check(aliases: Any) -> None:
                registry = self.store.apply(base, source=aliases)
                missing = sorted(set(self.required()) - set(registry.aliases))
                if missing:
                    raise RegistryError(str(self._path), [f"aliases.{name}: missing" for name in missing])
                built.append((registry, aliases))

            def write_and_stamp() -> tuple[HistoryEntry, Any]:
                entry = write(check)
                # The version this write made (not one read after it: another replica's
                # change in between would then never be loaded here).
                if isinstance(self.store, PostgresPromotionStore):
                    return entry, self.store.written_version()
                return entry, _identity(self.store.path)

            entry, stamp = await asyncio.to_thread(write_and_stamp)
            registry, aliases = built[-1]
            self._gateway.reload(registry, required=self.required())
            self.promotions = aliases
            self._seen = (_identity(self._path), stamp)
            self.reloads["ok"] += 1
            return entry

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            try:
                changed = await self._identities() != self._seen
                if changed:
                    await self.reload("the models file or the promotions changed")
            except RegistryError:
                pass  # refused: logged by reload, the running registry stays
            except PromotionStoreError as exc:
                self._outage(exc)
                continue
            self._recovered()

    def _outage(self, exc: PromotionStoreError) -> None:
        if not self._store_down:
            self._store_down = True
            log.error("%s; the running registry stays until it answers", exc)

    def _recovered(self) -> None:
        if self._store_down:
            self._store_down = False
            log.warning("%s answers again", self.store.location)

    def _on_sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self._reload_quietly("SIGHUP"))
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    async def _reload_quietly(self, reason: str) -> None:
        try:
            await self.reload(reason)
        except (RegistryError, PromotionStoreError) as exc:
            log.error("model registry reload (%s) failed: %s", reason, exc)

    def start(self) -> None:
        """Watch the file, and reload on SIGHUP when this is the main thread's loop."""
        self._signalled: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._watch())
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            self._signal_installed = True
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (an in-process test app)
            log.debug("SIGHUP reload not installed: the event loop is not the main thread's")

    async def aclose(self) -> None:
        if self._signal_installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal_installed = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if isinstance(self.store, PostgresPromotionStore):
            await asyncio.to_thread(self.store.close)


def describe(gateway: ModelGateway, promotions: Mapping[str, AliasPromotions] | None = None) -> dict[str, Any]:
    """The served registry and each backend's breaker, for operators; a promoted alias
    says so (``promoted``: its last promotion's seq, backend, when and by whom), from
    ``promotions``, the promotions in force (`ModelsReloader.promotions`)."""
    registry = gateway.registry
    states = gateway.breakers.states()
    promoted = {name: p for name, p in (promotions or {}).items() if p.targets is not None}
    return {
        "aliases": {
            name: {
                "targets": [{"backend": t.backend, "weight": t.weight} for t in alias.targets],
                "fallbacks": list(alias.fallbacks),
                "sticky": alias.sticky,
                "balance": alias.balance,
                **({"promoted": _promoted(promoted[name])} if name in promoted else {}),
            }
            for name, alias in registry.aliases.items()
        },
        "backends": {
            backend_id: {"kind": backend.kind, "model": backend.model, "breaker": states.get(backend_id, "closed")}
            for backend_id, backend in registry.backends.items()
        },
    }


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[require_key])


def _admin(principal: Any) -> None:
    if not principal.settings.admin:
        raise ServingError(403, f"tenant {principal.tenant!r} may not use the admin routes (set admin: true on the tenant)")


_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid API key"},
    403: {"description": "The tenant is not an admin (admin: true)"},
}


@router.post(
    "/models/reload",
    responses={400: {"description": "The registry file is invalid; the running one stays"}, **_AUTH_ERRORS},
)
async def reload_models(request: Request, principal: PrincipalDep) -> dict[str, Any]:
    """Reload the model registry file now; answers what is served afterwards."""
    _admin(principal)
    reloader: ModelsReloader = request.app.state.models_reloader
    try:
        served = await reloader.reload(f"POST /admin/models/reload by tenant {principal.tenant}")
    except RegistryError as exc:
        raise ServingError(400, str(exc)) from None
    except PromotionStoreError as exc:
        raise ServingError(503, str(exc)) from None
    return {"reloaded": True, **served}


@router.get("/models", responses=_AUTH_ERRORS)
async def models_state(request: Request, principal: PrincipalDep) -> dict[str, Any]:
    """The served aliases and each backend's circuit breaker."""
    _admin(principal)
    return describe(request.app.state.platform.gateway, request.app.state.models_reloader.promotions)


def _promoted(promotions: AliasPromotions) -> dict[str, Any]:
    last = promotions.open_promotions()
    entry = last[-1] if last else None
    return {
        "targets": [{"backend": t.backend, "weight": t.weight} for t in promotions.targets or ()],
        "seq": entry.seq if entry else None,
        "backend": entry.backend if entry else None,
        "at": entry.at.isoformat() if entry else None,
        "by": entry.by if entry else None,
    }


# ------------------------------------------------------------------ promotion routes


class PromoteRequest(BaseModel):
    """``POST /admin/models/{alias}/promote``."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(min_length=1)
    """The candidate: a backend id of the model registry."""
    weight: int | None = Field(default=None, ge=1, le=100)
    """A canary: the candidate gets this share (%) and the current primary the rest.
    Unset: the candidate takes all the traffic."""


class TargetOut(BaseModel):
    backend: str
    weight: int


class SuiteGateOut(BaseModel):
    """One suite's gate."""

    suite: str
    dataset_hash: str
    passed: bool
    exit_code: int
    """0 pass, 1 a metric regressed, 2 could not evaluate."""
    baseline_run: str
    candidate_run: str
    baseline_reused: bool
    """The baseline was a stored run of the baseline backend on the same dataset."""
    baseline_rerun: str | None = None
    """A stored baseline run set aside because the gate could not compare it (exit 2);
    the baseline then ran again."""
    reports: list[str]
    metrics: list[dict[str, Any]]
    """Each gated metric: baseline, candidate, delta, interval, verdict, reason."""


class HistoryEntryOut(BaseModel):
    """One promotion or rollback."""

    seq: int
    at: str
    by: str
    action: Literal["promote", "rollback"]
    from_targets: list[TargetOut]
    to_targets: list[TargetOut]
    backend: str | None = None
    weight: int | None = None
    rolls_back: int | None = None
    verdict: str | None = None
    scores: dict[str, Any] = {}
    reports: list[str] = []
    runs: dict[str, dict[str, str]] = {}


class PromotionOut(BaseModel):
    """A promotion's outcome (200: switched; 422: refused, same fields plus ``detail``)."""

    alias: str
    backend: str
    weight: int | None
    promoted: bool
    entry: HistoryEntryOut | None
    suites: list[SuiteGateOut]
    reports: list[str]
    targets: list[TargetOut] = []
    """The alias's targets now."""


class PromotionRefusedOut(BaseModel):
    """422: the eval gate refused the candidate (``detail`` and the outcome's fields,
    ``promoted: false``), or the request body is invalid (``detail`` alone, naming the field)."""

    detail: str
    alias: str | None = None
    backend: str | None = None
    weight: int | None = None
    promoted: bool | None = None
    entry: HistoryEntryOut | None = None
    suites: list[SuiteGateOut] | None = None
    reports: list[str] | None = None
    targets: list[TargetOut] | None = None


class RollbackOut(BaseModel):
    alias: str
    entry: HistoryEntryOut
    targets: list[TargetOut]
    """The alias's targets now."""


class HistoryOut(BaseModel):
    alias: str
    promoted: bool
    """Whether promoted targets are in force (else the models file's)."""
    entries: list[HistoryEntryOut]


def _entry_out(entry: HistoryEntry) -> HistoryEntryOut:
    return HistoryEntryOut.model_validate(entry.model_dump(mode="json", exclude={"previous_override"}))


def _targets_now(request: Request, alias: str) -> list[TargetOut]:
    aliases = request.app.state.platform.gateway.registry.aliases
    return [TargetOut(backend=t.backend, weight=t.weight) for t in aliases[alias].targets] if alias in aliases else []


def _promoter(request: Request) -> Promoter:
    """The app's promoter, made on first use from what the lifespan built."""
    state = request.app.state
    promoter: Promoter | None = getattr(state, "promoter", None)
    if promoter is None:
        platform: Platform = state.platform
        reloader: ModelsReloader = state.models_reloader
        promoter = state.promoter = Promoter(
            settings=platform.settings,
            gateway=platform.gateway,
            graph_models={graph.graph_id: graph.spec.model for graph in platform.graphs},
            evaluate=serving_evaluate(platform, state.run_host),
            commit=reloader.commit,
            audit=state.audit,
            store=reloader.store,
            render_html=render_gate_html,
        )
    return promoter


def _by(principal: Any) -> str:
    return f"tenant {principal.tenant}"


def _refused(exc: PromotionError | RegistryError | OSError) -> ServingError:
    """The promotion errors as HTTP: 404 unknown alias, 409 a conflict or nothing to roll
    back, 503 what cannot run or be written now (an unreachable backend, a read-only or
    full data directory: nothing changed), 400 the rest (a bad request, an invalid registry)."""
    if isinstance(exc, UnknownAliasError):
        return ServingError(404, str(exc))
    if isinstance(exc, (PromotionConflictError, NothingToRollBackError)):
        return ServingError(409, str(exc))
    if isinstance(exc, (PromotionUnavailableError, PromotionStoreError)):
        return ServingError(503, str(exc))
    if isinstance(exc, OSError):
        # Not expected (the store and the promoter name theirs), but never a 500.
        return ServingError(503, f"a file could not be read or written ({exc.filename or ''}: {exc.strerror or exc}); nothing changed")
    return ServingError(400, str(exc))


_PROMOTE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "An unknown backend, a bad weight, no suite for the alias, or an invalid registry"},
    404: {"description": "No such alias"},
    409: {"description": "Another promotion of the alias is running, or the alias changed meanwhile (e.g. rolled back during the evaluation)"},
    503: {"description": "The evaluation could not run (an unreachable candidate or baseline), or a file cannot be read or written (nothing changed)"},
    422: {
        "model": PromotionRefusedOut,
        "description": "The eval gate refused the candidate, nothing changed (the verdicts and `detail`); or an invalid body",
    },
    **_AUTH_ERRORS,
}


@router.post("/models/{alias}/promote", response_model=PromotionOut, responses=_PROMOTE_ERRORS)
async def promote_model(alias: str, body: PromoteRequest, request: Request, principal: PrincipalDep) -> Any:
    """Evaluate ``backend`` on the alias's eval suites against its current primary target,
    and switch the alias to it (or to a canary ``weight``) only if every suite passes the
    gate. Takes as long as the evaluation."""
    _admin(principal)
    promoter = _promoter(request)
    try:
        outcome = await promoter.promote(alias, body.backend, weight=body.weight, by=_by(principal))
    except GateRefusedError as exc:
        refused = PromotionOut.model_validate({**exc.outcome.to_json(), "targets": _targets_now(request, alias)})
        return JSONResponse({"detail": str(exc), **refused.model_dump(mode="json")}, status_code=422)
    except (PromotionError, RegistryError, OSError) as exc:
        raise _refused(exc) from None
    return PromotionOut.model_validate({**outcome.to_json(), "targets": _targets_now(request, alias)})


@router.post(
    "/models/{alias}/rollback",
    response_model=RollbackOut,
    responses={
        404: {"description": "No such alias"},
        409: {"description": "Nothing to roll back"},
        400: {"description": "The models file is invalid or lacks the backends to return to"},
        503: {"description": "promotions.json cannot be written (nothing changed)"},
        **_AUTH_ERRORS,
    },
)
async def rollback_model(alias: str, request: Request, principal: PrincipalDep) -> RollbackOut:
    """Return the alias to the targets before its last promotion, at once (no evaluation);
    a promotion of the alias that is evaluating does not hold it up (that promotion is
    refused with 409 when it tries to commit)."""
    _admin(principal)
    try:
        entry = await _promoter(request).rollback(alias, by=_by(principal))
    except (PromotionError, RegistryError, OSError) as exc:
        raise _refused(exc) from None
    return RollbackOut(alias=alias, entry=_entry_out(entry), targets=_targets_now(request, alias))


@router.get(
    "/models/{alias}/history",
    response_model=HistoryOut,
    responses={404: {"description": "No such alias"}, 400: {"description": "The promotions file is invalid"}, **_AUTH_ERRORS},
)
async def model_history(alias: str, request: Request, principal: PrincipalDep) -> HistoryOut:
    """The alias's promotions and rollbacks, oldest first."""
    _admin(principal)
    promoter = _promoter(request)
    try:
        entries = await asyncio.to_thread(promoter.history, alias)
        promoted = (await asyncio.to_thread(promoter.store.alias, alias)).targets is not None
    except (PromotionError, RegistryError, OSError) as exc:
        raise _refused(exc) from None
    return HistoryOut(alias=alias, promoted=promoted, entries=[_entry_out(e) for e in entries])


# ------------------------------------------------------------------ key routes


class KeyCreateRequest(BaseModel):
    """``POST /admin/keys``."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1)
    """A tenant of ``auth.tenants``."""


class KeyOut(BaseModel):
    """A stored key (never the key itself, nor its hash)."""

    id: str
    tenant: str
    created_at: str
    source: Literal["settings", "store"]
    """``settings``: ``auth.keys`` (revoked by editing the settings); ``store``: the keys
    file or the shared key store (``DELETE /admin/keys/{id}``)."""


class KeyCreatedOut(KeyOut):
    """201: the new key, shown this once."""

    key: str


class KeysOut(BaseModel):
    keys: list[KeyOut]
    store: str
    """Where keys made at run time live (the keys file, or the shared database)."""


class DetailOut(BaseModel):
    """An error: ``{"detail": message}`` (the message names what was wrong)."""

    detail: str


_KEY_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": DetailOut, "description": "An invalid body (names the field)"},
    503: {"model": DetailOut, "description": "The key store cannot be reached or written (nothing changed)"},
    **_AUTH_ERRORS,
}


@router.post(
    "/keys",
    status_code=201,
    response_model=KeyCreatedOut,
    responses={400: {"model": DetailOut, "description": "Unknown tenant (the configured ones are named)"}, **_KEY_ERRORS},
)
async def create_api_key(body: KeyCreateRequest, request: Request, principal: PrincipalDep) -> KeyCreatedOut:
    """Create a key for ``tenant``; the answer is the only time the key is shown. Every
    replica accepts it at once."""
    _admin(principal)
    store = request.app.state.authenticator.key_store
    key, record = await asyncio.to_thread(store.create, body.tenant)
    _audit(request, "key_created", key=record.id, tenant=record.tenant, by=_by(principal))
    log.info("key %s for tenant %s created by %s", record.id, record.tenant, _by(principal))
    return KeyCreatedOut(id=record.id, tenant=record.tenant, created_at=record.created_at, source="store", key=key)


@router.get("/keys", response_model=KeysOut, responses=_KEY_ERRORS)
async def list_api_keys(request: Request, principal: PrincipalDep) -> KeysOut:
    """Every key's id, tenant and creation time (never the keys or their hashes)."""
    _admin(principal)
    authenticator = request.app.state.authenticator
    stored = await asyncio.to_thread(authenticator.key_store.list)
    configured = authenticator.config_key_ids()
    keys = [
        KeyOut(id=r.id, tenant=r.tenant, created_at=r.created_at, source="settings")
        for r in request.app.state.platform.settings.auth.keys
    ]
    keys += [KeyOut(id=r.id, tenant=r.tenant, created_at=r.created_at, source="store") for r in stored if r.id not in configured]
    return KeysOut(keys=keys, store=authenticator.key_store.where)


@router.delete(
    "/keys/{key_id}",
    response_model=KeyOut,
    responses={
        404: {"model": DetailOut, "description": "No such key"},
        409: {"model": DetailOut, "description": "The key is in the settings (auth.keys): remove it there"},
        **_KEY_ERRORS,
    },
)
async def revoke_api_key(key_id: str, request: Request, principal: PrincipalDep) -> KeyOut:
    """Revoke a key: every replica refuses it (401) within its reload interval."""
    _admin(principal)
    authenticator = request.app.state.authenticator
    if key_id in authenticator.config_key_ids():
        raise ServingError(409, f"key {key_id} is in the settings (auth.keys): remove it there and restart the server")
    record = await asyncio.to_thread(authenticator.key_store.revoke, key_id)
    await authenticator.sync()  # refused here at once; on the other replicas within their reload interval
    _audit(request, "key_revoked", key=record.id, tenant=record.tenant, by=_by(principal))
    log.info("key %s of tenant %s revoked by %s", record.id, record.tenant, _by(principal))
    return KeyOut(id=record.id, tenant=record.tenant, created_at=record.created_at, source="store")


def _audit(request: Request, kind: str, **fields: Any) -> None:
    """An audit record of an admin action; a log that cannot be written does not undo it
    (logged as an error)."""
    try:
        request.app.state.audit.append(kind, **fields)
    except Exception:  # boundary: the audit log's failure is reported, the change stands
        log.exception("audit record %s could not be written", kind)
