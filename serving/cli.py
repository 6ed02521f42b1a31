"""The ``switchyard`` command: the CLI's composition root.

Sub-commands live next to the package they drive (``gateway/cli.py``: ``backend``;
``graphs/cli.py``: ``graphs``, ``ask``) and get their settings and clients from the
`CliEnv` object put in the Typer context here.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn

from gateway import GatewayError, GatewaySettings, load_registry
from gateway.cli import backend_app
from gateway.local import start_backend, stop_backend
from graphs import GraphError, GraphRegistry, GraphSpec
from graphs.cli import ask, graphs_app
from serving.app import create_app
from serving.observability import configure_logging
from serving.platform import Platform
from serving.settings import ConfigError, Settings, load_settings

__all__ = ["CliEnv", "app", "main"]


class CliEnv:
    """Settings (loaded on first use) and factories for the sub-commands."""

    def __init__(self, config: Path | None, **overrides: Any) -> None:
        self._config = config
        self._overrides = overrides
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self._config, **self._overrides)
        return self._settings

    def gateway_settings(self) -> GatewaySettings:
        return self.settings.gateway

    def data_dir(self) -> Path:
        return self.settings.data_dir

    def graph_specs(self) -> Mapping[str, GraphSpec]:
        return self.settings.graphs

    @asynccontextmanager
    async def open_graphs(self) -> AsyncIterator[GraphRegistry]:
        platform = Platform.build(self.settings)
        try:
            yield platform.graphs
        finally:
            await platform.aclose()


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
    dev: Annotated[bool, typer.Option("--dev", help="Local single-user mode.")] = False,
) -> None:
    """Serve the API; starts the local model backend first if an alias needs it."""
    server: dict[str, Any] = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    if dev:
        server["dev"] = True
    env = CliEnv(config or ctx.obj._config, **({"server": server} if server else {}))
    try:
        settings = env.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        (settings.data_dir / "logs").mkdir(exist_ok=True)
        configure_logging(settings.log_level, str(settings.data_dir / "logs" / "switchyard.log"))
        registry = load_registry(settings.gateway.models_file)
        started = []
        for backend in registry.managed_backends():
            typer.echo(f"starting local backend {backend.id} at {backend.root_url} ...")
            status = start_backend(backend, settings.data_dir, llama_server=settings.gateway.llama_server)
            typer.echo(status.describe())
            if status.started_here:
                started.append(backend)
    except (ConfigError, GatewayError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    try:
        try:
            application = create_app(settings, platform=Platform.build(settings))
        except (GatewayError, GraphError) as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1) from None
        typer.echo(f"Switchyard on http://{settings.server.host}:{settings.server.port} (data in {settings.data_dir})")
        # uvicorn drains on SIGTERM, then re-raises the signal with the handler it found
        # installed. Make that handler an exception, so the `finally` below still stops
        # the backend this command started.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        uvicorn.run(
            application,
            host=settings.server.host,
            port=settings.server.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=30,
        )
    finally:
        for backend in started:
            typer.echo(f"stopping local backend {backend.id}")
            stop_backend(backend, settings.data_dir)


def _exit_on_sigterm(signum: int, _: object) -> None:
    raise SystemExit(128 + signum)


app.add_typer(backend_app, name="backend")
app.add_typer(graphs_app, name="graphs")
app.command("ask")(ask)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
