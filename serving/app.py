"""The FastAPI application factory.

``create_app(settings)`` builds nothing at import time: the lifespan loads the model
registry and the graphs once, keeps them on ``app.state``, and closes the connection
pools on shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.vllm_metrics import LoadScraper, load_score
from serving.errors import UnexpectedErrors, install_error_handlers
from serving.observability import RequestIdMiddleware, ServingMetrics
from serving.audit import AuditLog, load_key
from serving.guardrails import Guardrails
from serving.limits import BodySizeLimit, RunSlots
from serving.shared.keys import open_authenticator
from serving.shared.ratelimit import open_rate_limiter
from serving.deps import require_key
from serving.langgraph_api.router import open_router as langgraph_open_router
from serving.langgraph_api.assistants import router as langgraph_assistants_router
from serving.langgraph_api.router import router as langgraph_router
from serving.langgraph_api.service import LangGraphService
from serving.langgraph_api.store import StoreService
from serving.langgraph_api.store import router as store_router
from serving.models_admin import open_models_reloader
from serving.routing import RoutingConfigError, SemanticRouter, packaged_embedder
from serving.models_admin import router as models_admin_router
from serving.knowledge_api.router import router as knowledge_router
from serving.openai.router import router as openai_router
from serving.openai.service import ChatCompletionService
from serving.persistence import open_thread_stores
from serving.playground import playground_router
from serving.runs import RunChecks, RunHook, RunHost, RunRegistry
from serving.shared.runs import RunBoard
from serving.platform import Platform
from serving.settings import ConfigError, ServerSettings, Settings
from serving.tracing import Tracing, TracingMiddleware, open_tracing
from serving.sse import Drain

__all__ = ["create_app"]

log = logging.getLogger(__name__)


async def _semantic_router(settings: Settings, platform: Platform) -> SemanticRouter | None:
    """The routes of ``model: "auto"``, checked against the graphs and aliases and with
    their examples embedded; None when no route is configured.

    Raises:
        ConfigError: a route names an unknown graph or alias.
    """
    if not settings.routing.routes:
        return None
    router = SemanticRouter(settings.routing, packaged_embedder())
    try:
        router.check(platform.graphs.ids(), platform.gateway.registry.aliases)
        await router.prepare()
    except RoutingConfigError as exc:
        await router.embedder.aclose()
        raise ConfigError("routing: " + "; ".join(exc.problems)) from None
    return router

# Local origins `serve --dev` also allows, so a locally run browser app (the Agent
# Chat UI on :3000) works out of the box.
_LOCAL_ORIGINS = r"http://(?:localhost|127\.0\.0\.1|\[::1\])(?::[0-9]{1,5})?"
_CORS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Response headers a browser script may read: the request id, where a run lives,
# when to retry, which backend and route served the answer.
_CORS_EXPOSED = (
    "x-request-id", "content-location", "location", "retry-after", "x-switchyard-backend", "x-switchyard-route",
)

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _public_reason(reason: str) -> str:
    """A probe's reason without the backend's address (``/readyz`` is open to all;
    the log keeps the full reason)."""
    def replace(match: re.Match[str]) -> str:
        url = match.group(0)
        return "the backend" + url[len(url.rstrip(":,.;)")) :]  # keep the sentence's punctuation

    return _URL.sub(replace, reason)


_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
_PROBES = frozenset({"/healthz", "/readyz"})


def _host_name(value: str) -> str:
    """A ``Host`` header's name or address without its port (``[::1]:8000`` -> ``::1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class DevHostCheck:
    """In ``dev`` (no keys), refuse a request whose ``Host`` is not a loopback name or
    address (400, naming it): a web page whose name its owner re-points at 127.0.0.1
    (DNS rebinding) is then same-origin with this server and could drive the API, but
    its requests carry its own name as ``Host``.

    With ``allow_remote_dev`` the configured ``host`` is allowed too, and when that is
    a wildcard (``0.0.0.0``, ``::``) any IP address: a rebinding page always sends a
    name; a client that typed the address is on the server's own origin.
    """

    def __init__(self, app: ASGIApp, server: ServerSettings) -> None:
        self.app = app
        self.remote = server.allow_remote_dev
        configured = _host_name(server.host)
        self.any_address = self.remote and configured in _WILDCARD_HOSTS
        self.configured = configured if self.remote and configured not in _WILDCARD_HOSTS else None

    def allowed(self, host: str) -> bool:
        name = _host_name(host).rstrip(".")
        address = _ip(name)
        if name == "localhost" or name.endswith(".localhost") or (address is not None and address.is_loopback):
            return True
        if self.configured is not None and name == self.configured.rstrip("."):
            return True
        return self.any_address and address is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The probes hold nothing: an orchestrator probes by the pod's address.
        if scope["type"] not in ("http", "websocket") or scope.get("path") in _PROBES:
            await self.app(scope, receive, send)
            return
        hosts = [value for name, value in scope["headers"] if name.lower() == b"host"]
        # No Host at all is not a browser (every browser sends one).
        host = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if not hosts or (host is not None and self.allowed(host)):
            await self.app(scope, receive, send)
            return
        shown = host if host is not None else ", ".join(h.decode("latin-1") for h in hosts)
        allowed = "localhost, 127.0.0.0/8 or [::1]"
        if self.configured is not None:
            allowed += f", or {self.configured}"
        elif self.any_address:
            allowed += ", or an IP address"
        message = (
            f"Host {shown!r} is not served in dev mode (no API keys): use {allowed}; "
            "a page under another name could drive this server (DNS rebinding)"
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        path = scope.get("path", "")
        if path == "/v1" or path.startswith("/v1/"):
            error = {"message": message, "type": "invalid_request_error", "param": "host", "code": "invalid_host"}
            body = json.dumps({"error": error}).encode()
        else:
            body = json.dumps({"detail": message}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the streaming path.

    Once the platform is loaded, its long-lived objects (modules, compiled graphs,
    pools) are frozen out of the collector's scans, and the youngest generation is
    collected every 10,000 allocations instead of 700: a streamed run allocates
    thousands of short-lived objects (message chunks, callback events), nearly all
    freed by reference counting. Measured on the `chat` graph at 50 streams: time in
    the collector fell from about 1 s to 0.13 s per 300 runs (docs/performance.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def _cors_origin_regex(server: ServerSettings) -> str | None:
    """The configured origin pattern, plus the local origins in ``dev``."""
    patterns = [p for p in (server.cors_origin_regex, _LOCAL_ORIGINS if server.dev else None) if p]
    return "|".join(f"(?:{p})" for p in patterns) or None


def cors_options(server: ServerSettings) -> dict[str, Any] | None:
    """The CORS middleware's options from the settings (``None``: CORS is off).

    Request headers are not restricted for an allowed origin: the SDKs send their own
    (the openai client's ``x-stainless-*``), and the key, not the header list, is
    what authorises a call.
    """
    origin_regex = _cors_origin_regex(server)
    if not (server.cors_origins or origin_regex):
        return None
    return {
        "allow_origins": server.cors_origins,
        "allow_origin_regex": origin_regex,
        "allow_credentials": server.cors_allow_credentials,
        "allow_methods": _CORS_METHODS,
        "allow_headers": ["*"],
        "expose_headers": _CORS_EXPOSED,
    }


def cors_refusal_headers(server: ServerSettings) -> Callable[[str], list[tuple[str, str]]] | None:
    """For the connection limits' refusals (serving/http.py): the CORS headers the
    middleware would give an actual request from an origin, none for an origin it
    does not allow (``None``: CORS is off)."""
    options = cors_options(server)
    if options is None:
        return None
    policy = CORSMiddleware(app=_no_app, **options)

    def headers(origin: str) -> list[tuple[str, str]]:
        if not policy.is_allowed_origin(origin):
            return []
        echoed = not policy.allow_all_origins or policy.allow_credentials
        return [
            *((name, value) for name, value in policy.simple_headers.items() if name != "Access-Control-Allow-Origin"),
            ("Access-Control-Allow-Origin", origin if echoed else "*"),
            *([("Vary", "Origin")] if echoed else []),
        ]

    return headers


async def _no_app(scope: Any, receive: Any, send: Any) -> None:  # only its origin checks are used
    raise RuntimeError("not an application")


def create_app(settings: Settings, *, platform: Platform | None = None, run_hook: RunHook | None = None) -> FastAPI:
    """Build the app.

    Args:
        settings: the loaded settings.
        platform: an already-built platform (tests); default: built in the lifespan.
        run_hook: awaited at each await point of every run's set-up and tear-down
            (tests inject cancellations there; see `serving.runs.STAGES`).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.drain.bind(asyncio.get_running_loop())
        built = platform or Platform.build(settings)
        metrics = ServingMetrics()
        app.state.platform = built
        app.state.metrics = metrics
        # Hits per knowledge search (the rag and graphrag graphs, the search tool, the
        # collections API), told by the knowledge layer's hooks (it cannot import us).
        if built.knowledge is not None:
            built.knowledge.on_search = metrics.observe_retrieval
        if built.graph is not None:
            built.graph.on_search = metrics.observe_retrieval
        app.state.rate_limiter = open_rate_limiter(settings.state.redis_url, metrics)
        key = load_key(settings.audit.key_file, data_dir=settings.data_dir) if settings.audit.key_file else None
        audit = app.state.audit = AuditLog(
            settings.audit_path,
            key=key,
            anchor_every=settings.audit.anchor_every,
            on_head=lambda seq, _hash: metrics.audit_head.set(seq),
        )
        slots = RunSlots(server_max=settings.server.max_concurrent_runs)
        guardrails = Guardrails(settings.guardrails)
        checks = RunChecks(built.gateway, built.graphs, guardrails)
        app.state.authenticator = await open_authenticator(settings, enabled=not settings.server.dev)
        stores = await open_thread_stores(settings.threads, settings.data_dir)
        app.state.thread_stores = stores
        app.state.store_service = StoreService(stores.store)
        server = settings.server
        # Replicas: run records shared through PostgreSQL (serving/shared/runs.py).
        board = await RunBoard.open(
            settings.shared_dsn, settings.state, replay_bytes=server.replay_max_bytes, metrics=metrics
        ) if settings.shared_dsn else None
        runs = RunRegistry(
            replay_bytes=server.replay_max_bytes, finished_replay_bytes=server.replay_total_bytes, board=board
        )
        host = app.state.run_host = RunHost(
            threads=stores.threads, slots=slots, metrics=metrics, audit=audit, guardrails=guardrails, tracing=tracing,
            runs=runs, hook=run_hook,
        )
        semantic_router = app.state.semantic_router = await _semantic_router(settings, built)
        app.state.chat_service = ChatCompletionService(
            built.gateway, built.graphs, host, checks, store=stores.store, router=semantic_router
        )
        app.state.langgraph_service = LangGraphService(
            built.graphs.with_checkpointer(stores.checkpointer), stores.threads, stores.checkpointer, host, checks,
            max_history_bytes=server.history_max_bytes, store=stores.store,
        )
        if board is not None:
            await board.start(runs, on_reaped=app.state.langgraph_service.reaped_thread)
        reloader = app.state.models_reloader = await open_models_reloader(built)
        gateway = built.gateway
        scrape = gateway.registry.scrape
        # vLLM backends' /metrics: load for `balance: least_loaded`, and our own metrics.
        # The backends are read through the gateway at each round: a reload applies.
        scraper = LoadScraper(
            lambda: gateway.registry.backends.values(), interval_s=scrape.interval_s, timeout_s=scrape.timeout_s
        )
        gateway.set_load_source(lambda backend_id: None if (load := scraper.load(backend_id)) is None else load_score(load))
        metrics.watch_gateway(gateway, lambda: reloader.reloads, scraper)
        await scraper.start()
        reloader.start()
        _tune_gc()
        log.info(
            "serving graphs %s and model aliases %s",
            ", ".join(built.graphs.ids()),
            ", ".join(built.gateway.registry.aliases),
        )
        try:
            yield
        finally:
            await reloader.aclose()
            await app.state.authenticator.aclose()
            await app.state.rate_limiter.aclose()
            await scraper.aclose()
            if semantic_router is not None:
                await semantic_router.aclose()
                await semantic_router.embedder.aclose()
            await app.state.langgraph_service.aclose()  # background runs end before their stores close
            if board is not None:
                await board.aclose()  # their ends written, this replica's row removed
            audit.close()
            await stores.aclose()
            await built.aclose()
            tracing.shutdown()  # exports the spans still buffered

    # With keys on, the API description is not public unless configured: the schema
    # needs a key like any route, and the HTML pages (which cannot send one) are off.
    public_docs = settings.server.dev or settings.server.public_api_docs
    app = FastAPI(
        title="Switchyard",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json" if public_docs else None,
        docs_url="/docs" if public_docs else None,
        redoc_url="/redoc" if public_docs else None,
    )
    app.state.drain = Drain()  # begun by the server on SIGTERM (serving/cli.py)
    # LangGraph API bodies labelled text/plain read as JSON (serving/langgraph_api/bodies.py).
    app.state.proxy_text_bodies = settings.server.proxy_text_bodies
    app.add_middleware(BodySizeLimit, max_bytes=settings.server.max_body_bytes)
    tracing = open_tracing(settings.tracing)
    if isinstance(tracing, Tracing):
        app.add_middleware(TracingMiddleware, tracing=tracing)  # inside the request id's
    # Inside CORS and the request id's, so even a 500 (a bug) has both headers.
    app.add_middleware(UnexpectedErrors)
    cors = cors_options(settings.server)
    if cors is not None:
        # Outside the body limit and every route, so a preflight (which carries no key) is
        # answered here, before authentication and rate limits, and a 401, 413 or 429
        # carries the CORS headers the browser needs to show it; inside the request id's,
        # so a preflight has an id too. The connection limits' 431 and 408 are sent
        # before any middleware: serving/http.py adds the same headers (`cors_refusal_headers`).
        app.add_middleware(CORSMiddleware, **cors)
    if settings.server.dev:
        # Outside CORS: a rebinding page is same-origin, so CORS would not stop it.
        app.add_middleware(DevHostCheck, server=settings.server)
    app.add_middleware(RequestIdMiddleware)  # added last: outermost, so even a 413 has an id
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(knowledge_router)
    app.include_router(langgraph_router)
    app.include_router(langgraph_assistants_router)
    app.include_router(langgraph_open_router)
    app.include_router(store_router)
    app.include_router(models_admin_router)
    # The chat playground page (no key: it holds no data); `/` opens it in dev mode.
    app.include_router(playground_router(redirect_root=settings.server.dev))

    if not public_docs:

        @app.get("/openapi.json", include_in_schema=False, dependencies=[require_key])
        async def openapi() -> JSONResponse:
            """The OpenAPI schema, for callers with a key."""
            return JSONResponse(app.openapi())

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """The process is alive (it may not be ready)."""
        return {"status": "ok"}

    logged_reasons: dict[str, str] = {}

    @app.get(
        "/readyz",
        tags=["ops"],
        responses={503: {"description": "Not ready: each backend's and the thread store's reason"}},
    )
    async def readyz() -> JSONResponse:
        """200 once every model alias the graphs call has a backend (a target or a
        fallback) that answers its health check; else 503. Either way each backend's
        state is listed (ok, still loading, refused...)."""
        built: Platform = app.state.platform
        aliases = built.graph_aliases()
        results = await built.gateway.probe(sorted({b for ids in aliases.values() for b in ids}))
        # Open to anyone: each reason without URLs or addresses; the details go to the log.
        backends = {r.backend_id: _public_reason(r.public_reason) for r in results}
        ready_ids = {r.backend_id for r in results if r.ready}
        # Ready when every alias the graphs call has a backend that answers (a target or a fallback).
        ready = all(ready_ids.intersection(ids) for ids in aliases.values())
        for result in results:
            if not result.ready and logged_reasons.get(result.backend_id) != result.reason:
                log.warning("not ready: backend %s: %s", result.backend_id, result.reason)
            logged_reasons[result.backend_id] = result.reason  # logged once per change
        stores = app.state.thread_stores
        try:
            await asyncio.wait_for(stores.threads.ping(), settings.gateway.probe_timeout_s)
            store = "ok"
        except Exception as exc:  # boundary: report why the store is not ready
            log.warning("not ready: thread store %s: %s: %s", stores.backend, exc.__class__.__name__, exc)
            store, ready = f"{stores.backend} does not answer: {exc.__class__.__name__}", False
        return JSONResponse(
            {"status": "ready" if ready else "not ready", "backends": backends, "threads": store},
            status_code=200 if ready else 503,
        )

    @app.get(
        "/metrics",
        tags=["ops"],
        dependencies=[require_key],
        response_class=Response,
        responses={
            200: {"description": "Prometheus text format", "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
            401: {"description": "Missing or invalid API key"},
        },
    )
    async def metrics() -> Response:
        """Prometheus metrics of this server."""
        return Response(generate_latest(app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
