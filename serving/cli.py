"""The ``switchyard`` command: the CLI's composition root.

Sub-commands live next to the package they drive (``gateway/cli.py``: ``backend``;
``graphs/cli.py``: ``graphs``, ``ask``; ``knowledge/cli.py``: ``ingest``, ``search``, ``knowledge``;
``eval/cli.py``: ``eval``) and get their settings and clients from the
`CliEnv` object put in the Typer context here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn

from eval.cli import EvalSession, EvalSetupError, eval_app
from gateway import Backend, GatewayError, GatewaySettings, ModelGateway, load_registry
from gateway.cli import backend_app
from gateway.local import start_backend, stop_backend
from gateway.registry import LocalLaunch, ModelRegistry
from graphs import GraphError, GraphRegistry, GraphSpec, UnknownGraphError
from graphs.cli import ask, graphs_app
from knowledge import KnowledgeBase, KnowledgeError, StoreLockedError, open_knowledge
from knowledge.knowledge_base import legacy_store_path
from knowledge.cli import ingest, knowledge_app, search
from knowledge.graph_cli import graph_app, ontology_app
from knowledge.knowledge_graph import KnowledgeGraph, open_knowledge_graph
from knowledge.settings import KnowledgeSettings
from tools import ToolError, ToolRegistry
from serving.app import cors_refusal_headers, create_app
from serving.audit import load_key, parse_anchor, verify
from serving.auth import FileKeyStore, KeyStore
from serving.shared.keys import open_key_store
from serving.shared.promotions import close_promotion_store, open_promotion_store
from serving.shared.runs import default_replica_id
from serving.errors import ServingError
from serving.eval_runner import backends_of, build_judge, cli_host, open_runner, resolve_model, sla_for
from serving.http import ConnectionLimits, limited_protocol
from serving.models_cli import models_app
from serving.observability import configure_logging
from serving.platform import Platform
from serving.settings import ConfigError, Settings, load_settings
from serving.sse import Drain

__all__ = ["CliEnv", "app", "main"]

log = logging.getLogger(__name__)


class CliEnv:
    """Settings (loaded on first use) and factories for the sub-commands."""

    def __init__(self, config: Path | None, **overrides: Any) -> None:
        self.config = config
        """The settings file given on the command line, if any."""
        self._overrides = overrides
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config, **self._overrides)
        return self._settings

    def eval_thresholds(self) -> Path:
        return self.settings.eval.thresholds

    def gateway_settings(self) -> GatewaySettings:
        return self.settings.gateway

    def data_dir(self) -> Path:
        return self.settings.data_dir

    def graph_specs(self) -> Mapping[str, GraphSpec]:
        return self.settings.graphs

    @asynccontextmanager
    async def open_knowledge(self) -> AsyncIterator[KnowledgeBase]:
        settings = self.settings
        gateway = None
        if settings.knowledge.embedder.kind == "openai":  # only then is the model registry needed
            gateway = ModelGateway(load_registry(settings.gateway.models_file), probe_timeout_s=settings.gateway.probe_timeout_s)
        try:
            knowledge = open_knowledge(settings.knowledge, settings.data_dir, gateway)
            try:
                # The graph is opened with it so that a document replaced or deleted
                # here takes its graph facts along (`KnowledgeBase.on_removed`).
                graph = open_knowledge_graph(settings.knowledge, settings.data_dir, knowledge, gateway)
            except BaseException:
                await knowledge.aclose()
                raise
            try:
                yield knowledge
            finally:
                await graph.aclose()
                await knowledge.aclose()
        finally:
            if gateway is not None:
                await gateway.aclose()

    def legacy_store_path(self) -> Path:
        return legacy_store_path(self.settings.knowledge, self.settings.data_dir)

    def knowledge_settings(self) -> KnowledgeSettings:
        return self.settings.knowledge

    @asynccontextmanager
    async def open_knowledge_graph(self, *, extraction: bool = True) -> AsyncIterator[KnowledgeGraph | str]:
        """The knowledge base and its graph, opened here with the model gateway (aliases
        as promoted); with ``extraction``, the managed local backend of the extraction
        alias is started if it is not running, and stopped on exit. When a server holds
        the stores: its URL."""
        settings = self.settings
        registry = self.promoted_registry()
        gateway = ModelGateway(registry, probe_timeout_s=settings.gateway.probe_timeout_s)
        started: list[Backend] = []
        try:
            opened: KnowledgeGraph | None = None
            try:
                knowledge = await asyncio.to_thread(open_knowledge, settings.knowledge, settings.data_dir, gateway)
                try:
                    opened = await asyncio.to_thread(open_knowledge_graph, settings.knowledge, settings.data_dir, knowledge, gateway)
                except BaseException:
                    await knowledge.aclose()
                    raise
            except StoreLockedError as exc:
                locked = exc
            if opened is None:
                url = self.server_url()
                if url is None:
                    raise KnowledgeError(
                        f"{locked}; no Switchyard server is registered for this data directory to go through: stop the "
                        "process that holds it, or start `switchyard serve`"
                    )
                yield url
                return
            try:
                if extraction:
                    alias = settings.knowledge.graph.extraction.alias
                    for backend in registry.candidates(alias):
                        if isinstance(backend.launch, LocalLaunch):
                            status = await asyncio.to_thread(
                                start_backend, backend, settings.data_dir, llama_server=settings.gateway.llama_server
                            )
                            typer.echo(status.describe(), err=True)
                            if status.started_here:
                                started.append(backend)
                yield opened
            finally:
                await opened.aclose()
                await knowledge.aclose()
        finally:
            await gateway.aclose()
            for backend in started:
                typer.echo(f"stopping local backend {backend.id}", err=True)
                await asyncio.to_thread(stop_backend, backend, settings.data_dir)

    def promoted_registry(self) -> ModelRegistry:
        """The models file's registry with the aliases as promoted: ``promotions.json`` in
        the data directory, or the replicas' shared promotions when state is shared
        (``settings.shared_dsn``; `serving.shared.promotions`), as the server serves them.

        Raises:
            PromotionStoreError: the shared database cannot be reached.
            PromotionsFileError: the promotions are invalid for this registry.
        """
        settings = self.settings
        registry = load_registry(settings.gateway.models_file)
        store = open_promotion_store(settings)
        try:
            return store.apply(registry)
        finally:
            close_promotion_store(store)

    def server_url(self) -> str | None:
        """The server registered in ``<data_dir>/run/server.json``, if it is alive."""
        try:
            record = json.loads((self.settings.data_dir / "run" / "server.json").read_text())
            os.kill(int(record["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return str(record["url"])

    @asynccontextmanager
    async def open_graphs(self, only: str | None = None) -> AsyncIterator[GraphRegistry]:
        settings = self.settings
        if only is not None:
            if only not in settings.graphs:
                raise UnknownGraphError(only, list(settings.graphs))
            settings = settings.model_copy(update={"graphs": {only: settings.graphs[only]}})
        # A running server may hold the knowledge store: graphs that do not need it
        # still run here.
        platform = Platform.build(settings, knowledge_optional=True)
        try:
            yield platform.graphs
        finally:
            await platform.aclose()

    @asynccontextmanager
    async def open_eval(
        self, model: str, *, graph: str, judge: str | None, user_collections: bool = False
    ) -> AsyncIterator[EvalSession]:
        """``switchyard eval run``'s runner (`serving.eval_runner`) for ``model`` on graph
        ``graph``, and its judge (``judge``, else ``eval.judge``). Managed local backends
        the model or the judge use are started if they are not running, and stopped on
        exit (as ``serve`` does). A server holding the data directory is no obstacle: the
        eval keeps its own knowledge store (`serving.eval_runner`). Aliases are taken
        as promoted (``gateway.promotions``).

        ``user_collections``: the cases ask the data directory's own collections, so its
        store is opened (read only by the eval); a server holding it is then an error.

        Raises:
            UnknownModelError: ``model`` or the judge is neither an alias nor a backend id.
            UnknownGraphError: ``graph`` is not configured.
            EvalSetupError: no backend of ``model`` answers its health probe; the user's
                store is held by a server.
        """
        settings = self.settings
        judge = judge or settings.eval.judge
        # Not Platform.build: the eval opens no user store (a server may hold it) and
        # builds only the graph it runs (serving.eval_runner); aliases as promoted.
        registry = self.promoted_registry()
        gateway = ModelGateway(registry, probe_timeout_s=settings.gateway.probe_timeout_s)
        knowledge = None
        if user_collections:
            try:
                knowledge = await asyncio.to_thread(open_knowledge, settings.knowledge, settings.data_dir, gateway)
            except StoreLockedError as exc:
                await gateway.aclose()
                url = self.server_url()
                raise EvalSetupError(
                    f"{exc}{f' (the server at {url})' if url else ''}: these cases ask your own collections, "
                    "which only that process can read. Stop it, or give the cases a suite with a corpus "
                    "(ingested into the eval's own store), or use a Qdrant server (knowledge.qdrant_url)"
                ) from None
        platform = Platform(
            settings=settings,
            gateway=gateway,
            knowledge=knowledge,
            tools=ToolRegistry.builtin(settings.tools),
            graphs=GraphRegistry({}),
        )
        started: list[Backend] = []
        try:
            alias, pinned = resolve_model(platform.gateway, model)
            backends = [pinned] if pinned is not None else platform.gateway.registry.candidates(alias)
            judged = backends_of(platform.gateway, judge) if judge else []
            for backend in dict.fromkeys([*backends, *judged]):
                if isinstance(backend.launch, LocalLaunch):
                    status = await asyncio.to_thread(
                        start_backend, backend, settings.data_dir, llama_server=settings.gateway.llama_server
                    )
                    typer.echo(status.describe(), err=True)
                    if status.started_here:
                        started.append(backend)
            async with (
                cli_host(settings) as host,
                open_runner(platform, host, model, seed=settings.eval.seed, user_collections=user_collections) as runner,
            ):
                runner.graph(graph)  # an unknown or broken graph fails here, not once per case
                health = await runner.gateway.probe([b.id for b in backends])
                if not any(h.ready for h in health):
                    raise EvalSetupError(
                        f"model {model!r} is unreachable: " + "; ".join(f"{h.backend_id}: {h.reason}" for h in health)
                    )
                yield EvalSession(
                    runner=runner,
                    sla=sla_for(platform, model, graph=graph),
                    judge=build_judge(settings, platform.gateway, judge) if judge else None,
                    runs_dir=settings.eval_runs_dir / "runs",
                    seed=settings.eval.seed,
                )
        finally:
            await platform.aclose()
            for backend in started:
                typer.echo(f"stopping local backend {backend.id}", err=True)
                stop_backend(backend, settings.data_dir)


app = typer.Typer(
    name="switchyard",
    help="Switchyard: LangGraph agents and RAG over self-hosted OpenAI-compatible models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="Settings YAML (default: $SWITCHYARD_CONFIG or config/switchyard.yaml)."),
]


@app.callback()
def root(ctx: typer.Context, config: ConfigOption = None) -> None:
    ctx.obj = CliEnv(config)


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Interface to bind (default: server.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: server.port).")] = None,
    config: ConfigOption = None,
    dev: Annotated[bool, typer.Option("--dev", help="Local single-user mode (no API keys; loopback only).")] = False,
    allow_remote_dev: Annotated[
        bool,
        typer.Option("--allow-remote-dev", help="Let --dev listen on a non-loopback --host: anyone who reaches it has no key to show."),
    ] = False,
) -> None:
    """Serve the API; starts the local model backend first if an alias needs it."""
    server: dict[str, Any] = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    if dev:
        server["dev"] = True
    if allow_remote_dev:
        server["allow_remote_dev"] = True
    settings = CliEnv(config or ctx.obj.config, **({"server": server} if server else {})).settings
    remote_dev = settings.server.dev and not _is_loopback(settings.server.host)
    if remote_dev and not settings.server.allow_remote_dev:
        raise ServingError(
            400,
            f"--dev turns API keys off; it listens only on loopback, not on {settings.server.host!r}. "
            "Drop --dev (and create keys: switchyard keys create), or add --allow-remote-dev if every "
            "client that can reach this address may use every graph and model",
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.shared_dsn and settings.state.replica_id is None:
        # Stable across restarts on this data directory (serving.shared.runs: a
        # restarted server ends its killed predecessor's runs at once).
        state = settings.state.model_copy(update={"replica_id": default_replica_id(settings.data_dir)})
        settings = settings.model_copy(update={"state": state})
    (settings.data_dir / "logs").mkdir(exist_ok=True)
    configure_logging(settings.log_level, str(settings.data_dir / "logs" / "switchyard.log"), fmt=settings.log_format)
    if remote_dev:
        warning = (
            f"WARNING: --dev on {settings.server.host}: API keys are OFF and the server is reachable beyond this "
            "machine; anyone who can connect may use every graph, model, thread and collection"
        )
        typer.secho(warning, fg=typer.colors.RED, bold=True, err=True)
        log.warning(warning)
    platform = Platform.build(settings)
    registration = _register_server(settings)
    # uvicorn drains on SIGTERM, then re-raises the signal with the handler it found
    # installed. Make that handler an exception, so the `finally` below still stops
    # the backend this command started (also when the signal comes during start-up).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = []
    try:
        for backend in platform.gateway.registry.managed_backends():
            typer.echo(f"starting local backend {backend.id} at {backend.root_url} ...")
            status = start_backend(backend, settings.data_dir, llama_server=settings.gateway.llama_server)
            typer.echo(status.describe())
            if status.started_here:
                started.append(backend)
            elif status.pid is None:
                typer.secho(
                    f"warning: {backend.root_url} was started outside {settings.data_dir}: this server will not "
                    "stop it, and fails if its owner does. Give each server its own "
                    "SWITCHYARD_LOCAL_BACKEND_PORT to run them independently.",
                    fg=typer.colors.YELLOW,
                    err=True,
                )
        typer.echo(f"Switchyard on http://{settings.server.host}:{settings.server.port} (data in {settings.data_dir})")
        api = create_app(settings, platform=platform)
        config = uvicorn.Config(
            api,
            host=settings.server.host,
            port=settings.server.port,
            # httptools with header size/count limits and request timeouts (serving/http.py).
            http=limited_protocol(
                ConnectionLimits(
                    max_header_bytes=settings.server.max_header_bytes,
                    max_headers=settings.server.max_headers,
                    header_timeout_s=settings.server.header_timeout_s,
                    body_timeout_s=settings.server.body_timeout_s,
                    cors_headers=cors_refusal_headers(settings.server),
                )
            ),
            log_config=None,
            access_log=False,
            # Streams get shutdown_grace_s (serving/sse.py); uvicorn waits a little longer.
            timeout_graceful_shutdown=int(settings.server.shutdown_grace_s) + 5,
        )
        _DrainingServer(config, api.state.drain).run()
    finally:
        registration.unlink(missing_ok=True)
        for backend in started:
            typer.echo(f"stopping local backend {backend.id}")
            stop_backend(backend, settings.data_dir)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback interface (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def _register_server(settings: Settings) -> Path:
    """Say which server holds this data directory (CLI commands that need its
    embedded stores go through it); removed when the server stops."""
    run = settings.data_dir / "run"
    run.mkdir(parents=True, exist_ok=True)
    path = run / "server.json"
    host = settings.server.host if settings.server.host not in ("0.0.0.0", "::") else "127.0.0.1"
    path.write_text(json.dumps({"url": f"http://{host}:{settings.server.port}", "pid": os.getpid()}))
    return path


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, telling open streams when it starts draining (SIGTERM/SIGINT)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._drain.begin()
        super().handle_exit(sig, frame)


def _exit_on_sigterm(signum: int, _: object) -> None:
    raise SystemExit(128 + signum)


keys_app = typer.Typer(
    help="API keys (stored as hashes: in the keys file, or in the shared database when state is shared).",
    no_args_is_help=True,
)


@contextlib.contextmanager
def _key_store(settings: Settings) -> Iterator[KeyStore]:
    """The keys file, or the shared key store (PostgreSQL) when ``settings.shared_dsn`` is set."""
    if settings.shared_dsn is None:
        # The settings' keys' ids are never drawn for a new key (they would share its bucket).
        yield FileKeyStore(
            settings.keys_file, settings.auth.tenants, reserved=frozenset(r.id for r in settings.auth.keys)
        )
        return
    store = open_key_store(settings)
    try:
        yield store
    finally:
        store.close()


@keys_app.command("create")
def create_api_key(
    ctx: typer.Context, tenant: Annotated[str, typer.Option(help="A tenant from the auth.tenants settings.")]
) -> None:
    """Create a key for a tenant; prints it once (only its hash is stored)."""
    settings = ctx.obj.settings
    with _key_store(settings) as store:
        key, record = store.create(tenant)
    typer.echo(key)
    typer.secho(f"key {record.id} for tenant {tenant} stored in {store.where}", err=True)


@keys_app.command("list")
def list_api_keys(ctx: typer.Context) -> None:
    """Key ids and tenants (never the keys)."""
    settings = ctx.obj.settings
    with _key_store(settings) as store:
        stored = store.list()
    for record in [*settings.auth.keys, *stored]:
        typer.echo(f"{record.id}\t{record.tenant}\t{record.created_at}")


@keys_app.command("revoke")
def revoke_api_key(ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="The key's id (`keys list`).")]) -> None:
    """Remove a key from the keys file (or the shared key store); a running server refuses
    it within ``auth.keys_reload_s`` (``state.reload_s`` when shared), no restart needed."""
    settings = ctx.obj.settings
    if any(record.id == key_id for record in settings.auth.keys):
        raise ServingError(400, f"key {key_id} is in the settings (auth.keys): remove it there and restart the server")
    with _key_store(settings) as store:
        record = store.revoke(key_id)
    typer.echo(f"revoked key {record.id} of tenant {record.tenant} (removed from {store.where})")


audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)


@audit_app.command("verify")
def verify_audit(
    file: Annotated[Path, typer.Argument(help="An audit log (JSON Lines).")],
    key_file: Annotated[
        Path | None, typer.Option(help="The log's HMAC key (audit.key_file): every record must carry a MAC under it.")
    ] = None,
    anchor: Annotated[
        list[str] | None,
        typer.Option(help="SEQ:HASH of a head the server logged ('audit head'); repeatable. Catches a rewritten log."),
    ] = None,
) -> None:
    """Check the chain; name the first missing, altered or misplaced record (exit 1)."""
    if not file.is_file():
        typer.secho(f"error: {file} not found", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    try:
        key = load_key(key_file) if key_file is not None else None
        anchors = [parse_anchor(text) for text in anchor or []]
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    report = verify(file, key=key, anchors=anchors)
    for note in report.notes:
        typer.echo(f"note: {note}")
    if report.ok:
        signed = ", every record's MAC checked" if key is not None else ""
        typer.echo(f"ok: {report.records} records, chain intact{signed}")
        return
    typer.secho(f"TAMPERED: {report.problem} ({report.records} records verified before it)", fg=typer.colors.RED)
    raise typer.Exit(1)


app.add_typer(audit_app, name="audit")
app.add_typer(keys_app, name="keys")
app.add_typer(backend_app, name="backend")
app.add_typer(graphs_app, name="graphs")
app.add_typer(eval_app, name="eval")
app.add_typer(models_app, name="models")
app.add_typer(knowledge_app, name="knowledge")
app.add_typer(ontology_app, name="ontology")
app.add_typer(graph_app, name="graph")
app.command("ask")(ask)
app.command("ingest")(ingest)
app.command("search")(search)


def main() -> None:
    """Console-script entry point.

    The current directory goes on ``sys.path`` (as with ``python -m``), so a graph
    registered as ``my_graphs.summarize:make_graph`` imports from the project directory.
    Configuration, registry and graph errors end the command with one line naming the
    problem, never a traceback.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app()
    except (ConfigError, GatewayError, GraphError, KnowledgeError, ServingError, ToolError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
