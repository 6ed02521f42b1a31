"""``switchyard backend start|stop|status``: the local llama.cpp backend;
``switchyard backend vllm-args BACKEND``: the ``vllm serve`` command for a vLLM backend
(Switchyard never starts vLLM itself).

Mounted by ``serving/cli.py``, which puts an object satisfying `GatewayCliEnv` in the
Typer context and turns `GatewayError` into a one-line message and exit status 1.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Protocol

import typer

from gateway.errors import GatewayError
from gateway.local import start_backend, status_backend, stop_backend
from gateway.registry import Backend, LocalLaunch, VllmLaunch, load_registry, vllm_serve_command
from gateway.settings import GatewaySettings

__all__ = ["GatewayCliEnv", "backend_app", "format_command"]


class GatewayCliEnv(Protocol):
    """What these commands need from the composition root."""

    def gateway_settings(self) -> GatewaySettings: ...

    def data_dir(self) -> Path: ...


backend_app = typer.Typer(
    help="Manage the local llama.cpp model backend; print a vLLM backend's command.", no_args_is_help=True
)

BackendArg = Annotated[
    str | None, typer.Argument(help="Backend id from the model registry (default: every managed backend).")
]


def _managed(env: GatewayCliEnv, backend_id: str | None) -> list[Backend]:
    registry = load_registry(env.gateway_settings().models_file)
    if backend_id is not None:
        if backend_id not in registry.backends:
            raise GatewayError(f"unknown backend {backend_id!r}; known: {', '.join(registry.backends)}")
        backend = registry.backends[backend_id]
        if isinstance(backend.launch, VllmLaunch):
            raise GatewayError(
                f"backend {backend_id!r} is a vLLM backend: Switchyard starts only llamacpp backends and "
                f"never vLLM; run the command `switchyard backend vllm-args {backend_id}` prints"
            )
        if backend.launch is None:
            raise GatewayError(f"backend {backend_id!r} has no launch section: Switchyard does not manage it")
        return [backend]
    managed = [b for b in registry.backends.values() if isinstance(b.launch, LocalLaunch)]
    if not managed:
        raise GatewayError("the model registry has no backend that Switchyard launches")
    return managed


@backend_app.command("start")
def start(ctx: typer.Context, backend_id: BackendArg = None) -> None:
    """Start the backend (if not already answering) and wait until it is ready."""
    env: GatewayCliEnv = ctx.obj
    for backend in _managed(env, backend_id):
        typer.echo(f"starting {backend.id} at {backend.root_url} ...")
        status = start_backend(backend, env.data_dir(), llama_server=env.gateway_settings().llama_server)
        typer.echo(status.describe())


@backend_app.command("stop")
def stop(ctx: typer.Context, backend_id: BackendArg = None) -> None:
    """Stop the backend started from this data directory."""
    env: GatewayCliEnv = ctx.obj
    for backend in _managed(env, backend_id):
        stopped = stop_backend(backend, env.data_dir())
        typer.echo(f"{backend.id}: {'stopped' if stopped else 'was not running'}")


@backend_app.command("status")
def status(ctx: typer.Context, backend_id: BackendArg = None) -> None:
    """Show whether the backend runs and is ready. Exits 1 if any is not ready."""
    env: GatewayCliEnv = ctx.obj
    results = [status_backend(b, env.data_dir()) for b in _managed(env, backend_id)]
    for result in results:
        typer.echo(result.describe())
    if not all(r.healthy for r in results):
        raise typer.Exit(1)


@backend_app.command("vllm-args")
def vllm_args(
    ctx: typer.Context,
    backend_id: Annotated[str, typer.Argument(help="A vllm backend id with a launch block.")],
) -> None:
    """Print the `vllm serve` command for a vLLM backend, ready to paste into a shell."""
    env: GatewayCliEnv = ctx.obj
    registry = load_registry(env.gateway_settings().models_file)
    if backend_id not in registry.backends:
        raise GatewayError(f"unknown backend {backend_id!r}; known: {', '.join(registry.backends)}")
    typer.echo(format_command(vllm_serve_command(registry.backends[backend_id])))


def format_command(argv: list[str]) -> str:
    """Shell-quoted, the program and its positional arguments on the first line, then
    one flag with its value per line, joined by backslash-newlines."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--"):
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return " \\\n    ".join(" ".join(line) for line in lines)
