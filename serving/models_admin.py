"""Hot reload of the model registry, and the operator routes over the gateway.

The server reloads ``gateway.models_file`` when the file changes (its identity,
inode, size, modification and change times, is checked every
``gateway.reload_check_s``), on SIGHUP, and on ``POST /admin/models/reload``. A
valid registry replaces the running one in one assignment (`ModelGateway.reload`);
runs in flight finish on the backend they started on. An invalid file, or one that
drops an alias a graph or the embedder uses, is refused: the error is logged (and
is the route's 400), the running registry stays, and the watcher does not retry
the same file until it changes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from gateway import ModelGateway, RegistryError, load_registry
from serving.deps import PrincipalDep, require_key
from serving.errors import ServingError
from serving.platform import Platform

__all__ = ["ModelsReloader", "router"]

log = logging.getLogger(__name__)


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class ModelsReloader:
    """Reloads the gateway's registry from its file; see the module docstring."""

    def __init__(self, platform: Platform) -> None:
        self._platform = platform
        self._gateway: ModelGateway = platform.gateway
        self._path = Path(platform.settings.gateway.models_file)
        self._check_s = platform.settings.gateway.reload_check_s
        self._seen = _identity(self._path)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._signal_installed = False
        self.reloads: Counter[str] = Counter()
        """Reload attempts by outcome (``ok``, ``refused``)."""

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
            self._seen = _identity(self._path)
            try:
                # A few KB of YAML and pydantic validation: not worth a thread.
                registry = load_registry(self._path)
                self._gateway.reload(registry, required=self.required())
            except RegistryError as exc:
                self.reloads["refused"] += 1
                log.error("model registry reload (%s) refused, the running registry stays: %s", reason, exc)
                raise
            self.reloads["ok"] += 1
            log.info("model registry reloaded from %s (%s)", self._path, reason)
            return describe(self._gateway)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            if _identity(self._path) != self._seen:
                with contextlib.suppress(RegistryError):
                    await self.reload("the file changed")

    def _on_sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self._reload_quietly("SIGHUP"))
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    async def _reload_quietly(self, reason: str) -> None:
        with contextlib.suppress(RegistryError):
            await self.reload(reason)

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


def describe(gateway: ModelGateway) -> dict[str, Any]:
    """The served registry and each backend's breaker, for operators."""
    registry = gateway.registry
    states = gateway.breakers.states()
    return {
        "aliases": {
            name: {
                "targets": [{"backend": t.backend, "weight": t.weight} for t in alias.targets],
                "fallbacks": list(alias.fallbacks),
                "sticky": alias.sticky,
                "balance": alias.balance,
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
    return {"reloaded": True, **served}


@router.get("/models", responses=_AUTH_ERRORS)
async def models_state(request: Request, principal: PrincipalDep) -> dict[str, Any]:
    """The served aliases and each backend's circuit breaker."""
    _admin(principal)
    return describe(request.app.state.platform.gateway)
