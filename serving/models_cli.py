"""``switchyard models``: promote a backend to an alias behind the eval gate, roll it back,
list an alias's history (`serving.promotion`).

When a server is registered and alive for the data directory (``<data_dir>/run/server.json``)
the commands call its ``/admin/models/{alias}/...`` routes, so the server applies the change
at once and stays the only writer of the audit log; the API key comes from ``--api-key`` or
``SWITCHYARD_API_KEY`` (a ``--dev`` server needs none). With no server running they do the
same in this process (the platform, a run host, the audit log) and the next server start
reads ``promotions.json``.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
import typer

from eval.report import render_gate_html
from gateway import Backend, UnknownModelError, load_registry
from gateway.local import start_backend, stop_backend
from gateway.registry import LocalLaunch
from gateway.promotions import PromotionsFileError
from serving.audit import AuditLog, load_key
from serving.errors import ServingError
from serving.eval_runner import backends_of, cli_host
from serving.platform import Platform
from serving.promotion import GateRefusedError, Promoter, file_commit, serving_evaluate
from serving.shared.promotions import close_promotion_store, open_promotion_store
from serving.settings import Settings

__all__ = ["models_app"]

models_app = typer.Typer(help="Promote a model backend to an alias behind the eval gate; roll back; history.", no_args_is_help=True)

AliasArg = Annotated[str, typer.Argument(help="A model alias of the registry (models.yaml).")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", envvar="SWITCHYARD_API_KEY", help="An admin tenant's key for the running server."),
]


# ------------------------------------------------------------------ the two ways


def _client(url: str, api_key: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # A promotion takes as long as its evaluation: no read timeout.
    return httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(None, connect=10))


def _call(url: str, api_key: str | None, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    try:
        with _client(url, api_key) as client:
            response = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise ServingError(503, f"the server at {url} did not answer: {exc}") from None
    try:
        payload = response.json()
    except ValueError:
        payload = {"detail": response.text[:500]}
    refusal = response.status_code == 422 and isinstance(payload, dict) and "promoted" in payload
    if response.status_code >= 400 and not refusal:
        detail = payload.get("detail") if isinstance(payload, dict) else None
        raise ServingError(response.status_code, f"the server at {url} answered {response.status_code}: {detail or payload}")
    return response.status_code, payload


@asynccontextmanager
async def _local_promoter(settings: Settings, *, evaluating: tuple[str, str] | None = None) -> AsyncIterator[Promoter]:
    """A promoter in this process: no server is running for the data directory.

    Args:
        evaluating: (alias, candidate backend) of a promotion: the managed local backends
            they and the judge (``eval.judge``) use are started if they are not running,
            and stopped afterwards (as ``serve`` and ``eval run`` do).
    """
    store = open_promotion_store(settings)
    platform = Platform.build(settings)
    started: list[Backend] = []
    try:
        try:
            platform.gateway.reload(store.apply(platform.gateway.registry))
        except PromotionsFileError as exc:
            # E.g. a promoted backend was removed from the models file: a server would not
            # start; a rollback here is the way out, so go on with the models file alone.
            typer.secho(f"warning: {exc}; the models file's targets are used", fg=typer.colors.YELLOW, err=True)
        registry = platform.gateway.registry
        if evaluating is not None and evaluating[0] in registry.aliases:
            alias, candidate = evaluating
            managed = registry.managed_backends(iter([alias]))
            if candidate in registry.backends and isinstance(registry.backends[candidate].launch, LocalLaunch):
                managed.append(registry.backends[candidate])
            judge = settings.eval.judge
            if judge is not None:
                try:
                    managed += [b for b in backends_of(platform.gateway, judge) if isinstance(b.launch, LocalLaunch)]
                except UnknownModelError:
                    pass  # the promotion refuses it (503, naming the judge) when it builds the judge
            for backend in {b.id: b for b in managed}.values():
                status = await asyncio.to_thread(start_backend, backend, settings.data_dir, llama_server=settings.gateway.llama_server)
                typer.echo(status.describe(), err=True)
                if status.started_here:
                    started.append(backend)
        key = load_key(settings.audit.key_file, data_dir=settings.data_dir) if settings.audit.key_file else None
        audit = AuditLog(settings.audit_path, key=key, anchor_every=settings.audit.anchor_every)
        try:
            async with cli_host(settings) as host:
                yield Promoter(
                    settings=settings,
                    gateway=platform.gateway,
                    graph_models={graph.graph_id: graph.spec.model for graph in platform.graphs},
                    evaluate=serving_evaluate(platform, host),
                    commit=file_commit(settings.gateway.models_file, store, platform.gateway),
                    audit=audit,
                    store=store,
                    render_html=render_gate_html,
                )
        finally:
            try:
                audit.close()
            except OSError as exc:  # whatever was promoted stays promoted: say so, do not fail
                typer.secho(f"error: the audit log {settings.audit_path} could not be closed: {exc}", fg=typer.colors.RED, err=True)
    finally:
        close_promotion_store(store)
        await platform.aclose()
        for backend in started:
            typer.echo(f"stopping local backend {backend.id}", err=True)
            stop_backend(backend, settings.data_dir)


def _run_locally(work: Any) -> Any:
    """``asyncio.run(work)``; a data directory that cannot be read or written (read-only,
    full) ends the command with a line naming it, never a traceback."""
    try:
        return asyncio.run(work)
    except OSError as exc:
        raise ServingError(
            503, f"a file could not be read or written ({exc.filename or ''}: {exc.strerror or exc}); nothing changed"
        ) from None


def _by() -> str:
    try:
        return f"cli {getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


# ------------------------------------------------------------------ output


def _targets(targets: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{t['backend']} {t['weight']}" for t in targets) or "-"


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_outcome(outcome: dict[str, Any]) -> None:
    for suite in outcome.get("suites", []):
        verdict = "pass" if suite["passed"] else "FAIL"
        reused = " (stored baseline reused)" if suite["baseline_reused"] else ""
        typer.echo(f"suite {suite['suite']}: {verdict}{reused}")
        for m in suite["metrics"]:
            typer.echo(
                f"  {m['metric']:<20} baseline {_number(m['baseline'])}  candidate {_number(m['candidate'])}  "
                f"{m['verdict']}: {m['reason']}"
            )
    for report in outcome.get("reports", []):
        typer.echo(f"report: {report}")


def _print_history(alias: str, entries: Sequence[dict[str, Any]]) -> None:
    if not entries:
        typer.echo(f"alias {alias}: no promotion yet")
        return
    for e in entries:
        what = f"promote {e['backend']}" + (f" at {e['weight']}%" if e.get("weight") else "") if e["action"] == "promote" else f"rollback of #{e['rolls_back']}"
        typer.echo(f"#{e['seq']}  {e['at']}  {what}  by {e['by']}: [{_targets(e['from_targets'])}] -> [{_targets(e['to_targets'])}]")
        for report in e.get("reports", []):
            typer.echo(f"     report: {report}")


# ------------------------------------------------------------------ commands


@models_app.command("promote")
def promote(
    ctx: typer.Context,
    alias: AliasArg,
    backend: Annotated[str, typer.Argument(help="The candidate: a backend id of the registry.")],
    weight: Annotated[
        int | None,
        typer.Option("--weight", min=1, max=100, help="Canary: the candidate's share in % (the current primary keeps the rest)."),
    ] = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Evaluate BACKEND on ALIAS's eval suites against its current target; switch the alias
    only if every suite passes the gate (exit 1 when refused: nothing changed)."""
    env = ctx.obj
    url = env.server_url()
    if url is not None:
        status, outcome = _call(url, api_key, "POST", f"/admin/models/{alias}/promote", {"backend": backend, "weight": weight})
        refused = status == 422
        message = outcome.get("detail", "")
    else:

        async def local() -> tuple[bool, dict[str, Any], str]:
            async with _local_promoter(env.settings, evaluating=(alias, backend)) as promoter:
                try:
                    done = await promoter.promote(alias, backend, weight=weight, by=_by())
                except GateRefusedError as exc:
                    return True, exc.outcome.to_json(), str(exc)
                return False, done.to_json(), ""

        refused, outcome, message = _run_locally(local())
    _print_outcome(outcome)
    if refused:
        typer.secho(message, fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    entry = outcome["entry"]
    typer.echo(f"alias {alias} promoted (#{entry['seq']}): [{_targets(entry['from_targets'])}] -> [{_targets(entry['to_targets'])}]")


@models_app.command("rollback")
def rollback(ctx: typer.Context, alias: AliasArg, api_key: ApiKeyOption = None) -> None:
    """Return ALIAS to its targets before its last promotion, at once (no evaluation)."""
    env = ctx.obj
    url = env.server_url()
    if url is not None:
        _, answer = _call(url, api_key, "POST", f"/admin/models/{alias}/rollback")
        entry = answer["entry"]
    else:

        async def local() -> dict[str, Any]:
            async with _local_promoter(env.settings) as promoter:
                return (await promoter.rollback(alias, by=_by())).model_dump(mode="json")

        entry = _run_locally(local())
    typer.echo(
        f"alias {alias} rolled back (#{entry['seq']}, undoing #{entry['rolls_back']}): "
        f"[{_targets(entry['from_targets'])}] -> [{_targets(entry['to_targets'])}]"
    )


@models_app.command("history")
def history(
    ctx: typer.Context,
    alias: AliasArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the history as JSON.")] = False,
    api_key: ApiKeyOption = None,
) -> None:
    """ALIAS's promotions and rollbacks, oldest first."""
    env = ctx.obj
    url = env.server_url()
    if url is not None:
        _, answer = _call(url, api_key, "GET", f"/admin/models/{alias}/history")
    else:
        # Reading needs no platform: the history (file or shared database), and the
        # registry for an unknown alias.
        settings = env.settings
        store = open_promotion_store(settings)
        try:
            promotions = store.alias(alias)
        finally:
            close_promotion_store(store)
        entries = promotions.history
        if not entries:
            registry = load_registry(settings.gateway.models_file)
            if alias not in registry.aliases:
                raise ServingError(404, f"unknown model alias {alias!r}; aliases: {', '.join(sorted(registry.aliases))}")
        answer = {
            "alias": alias,
            "promoted": promotions.targets is not None,
            "entries": [e.model_dump(mode="json", exclude={"previous_override"}) for e in entries],
        }
    if as_json:
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
        return
    _print_history(alias, answer["entries"])
