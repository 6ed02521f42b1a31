"""``switchyard eval run`` and ``switchyard eval gate``.

Mounted by ``serving/cli.py`` as ``eval``.

``run`` evaluates a model (an alias or a backend id) on a suite or a dataset file: the
composition root puts an object satisfying `EvalCliEnv` in the Typer context, whose
`EvalCliEnv.open_eval` gives a `CaseRunner` that runs the graphs through the server's
builders and run host (``serving.eval_runner``; ``eval`` never imports ``serving``).
Exit 0 when the run was written, 2 when it could not run (an unknown suite, graph, alias
or backend, an invalid dataset, an unreachable backend, every case failed).

``gate`` is pure: reads two run files (``eval.runs``) and a thresholds file, needs no
model and no server. Exit 0 pass, 1 regression, 2 could not evaluate (a run file or the
thresholds unreadable or invalid, runs of different datasets, no case in common, a gated
metric both runs have only as errors; see `eval.gate`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import UTC
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import typer

from eval.datasets import DatasetError, Suite, SuiteConfig, hash_dataset, load_dataset, load_suite
from eval.gate import DEFAULT_THRESHOLDS, Thresholds, ThresholdsError, compare, render_markdown
from eval.metrics import METRICS, LatencySla, aggregate, error_counts
from eval.run import JUDGED_METRICS, CaseJudge, run_suite
from eval.runner import CaseRunner
from eval.runs import RunFile, RunFileError, load_run, write_run
from gateway import GatewayError
from graphs import GraphError
from knowledge import KnowledgeError

__all__ = ["EvalCliEnv", "EvalSession", "EvalSetupError", "eval_app", "gate", "infer_graph", "run"]

eval_app = typer.Typer(help="Evaluate models: run a suite, gate a candidate run against a baseline.", no_args_is_help=True)

GraphId = Literal["rag", "graphrag", "agent", "chat"]


class EvalSetupError(Exception):
    """The eval cannot start (unreachable backend, unknown judge...); the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSession:
    """What `EvalCliEnv.open_eval` gives ``eval run``."""

    runner: CaseRunner
    sla: LatencySla | None
    """The alias's latency promise, if it has one."""
    judge: CaseJudge | None
    """The judge of the judged metrics, if one is configured or asked for."""
    runs_dir: Path
    """Where run files are kept (``<eval_runs_dir>/runs``)."""
    seed: int
    """The sampling seed (``eval.seed``)."""


class EvalCliEnv(Protocol):
    """What ``eval run`` needs from the composition root."""

    def open_eval(
        self, model: str, *, graph: str, judge: str | None, user_collections: bool = False
    ) -> AbstractAsyncContextManager[EvalSession]:
        """Compose a runner of ``graph`` for ``model`` (starting a managed local backend
        it needs, stopped on exit) and the judge (``judge``, else the configured one).
        ``user_collections``: the cases ask the user's own collections (a dataset with no
        corpus), not the eval's scratch store.

        Raises:
            EvalSetupError, GatewayError, GraphError, KnowledgeError: it cannot run.
        """
        ...

    def eval_thresholds(self) -> Path:
        """The thresholds file the settings name (``eval.thresholds``).

        Raises:
            Exception: the settings cannot be loaded (the message says why).
        """
        ...


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp makes the file 0600; a report or run file is read like any other (CI artifacts).
    os.fchmod(fd, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _describe(run: RunFile, path: Path) -> dict[str, Any]:
    return {
        "file": str(path),
        "suite": run.suite,
        "model": run.model,
        "backend": run.backend,
        "dataset_hash": run.dataset_hash,
        "started_at": run.started_at.isoformat(),
        "judge": run.judge,
    }


@eval_app.command("gate")
def gate(
    ctx: typer.Context,
    baseline: Annotated[Path, typer.Option("--baseline", help="The baseline's run file (JSON).")],
    candidate: Annotated[Path, typer.Option("--candidate", help="The candidate's run file (JSON).")],
    thresholds: Annotated[
        Path | None,
        typer.Option(
            "--thresholds",
            help="Floors and largest drops per metric (YAML). Default: eval.thresholds in the settings "
            "(config/switchyard.yaml), else eval/thresholds.yaml.",
        ),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the decision as JSON here.")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown report here.")] = None,
    html_out: Annotated[
        Path | None, typer.Option("--html", help="Also write the HTML report here (a chart per metric, worst cases).")
    ] = None,
) -> None:
    """Compare two runs case by case; exit 0 pass, 1 regression, 2 could not evaluate."""
    if thresholds is None:
        env = ctx.obj
        try:
            thresholds = env.eval_thresholds() if env is not None and hasattr(env, "eval_thresholds") else DEFAULT_THRESHOLDS
        except Exception as exc:  # boundary: bad settings are the command's error, not a traceback
            raise _fail(f"cannot read the settings for eval.thresholds: {exc} (or pass --thresholds)") from None
    try:
        base_run = load_run(baseline)
        cand_run = load_run(candidate)
    except RunFileError as exc:
        raise _fail(str(exc)) from None
    if base_run.dataset_hash != cand_run.dataset_hash:
        raise _fail(
            f"not the same dataset: {baseline} has dataset_hash {base_run.dataset_hash!r}, "
            f"{candidate} has {cand_run.dataset_hash!r}"
        )
    try:
        limits = Thresholds.load(thresholds)
    except ThresholdsError as exc:
        raise _fail(str(exc)) from None
    result = compare(base_run.by_case(), cand_run.by_case(), limits)
    markdown = render_markdown(result)
    typer.echo(markdown, nl=False)
    try:
        if json_out is not None:
            document = {
                **result.to_json(),
                "baseline": _describe(base_run, baseline),
                "candidate": _describe(cand_run, candidate),
                "thresholds": str(thresholds),
            }
            _write_text(json_out, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        if markdown_out is not None:
            _write_text(markdown_out, markdown)
        if html_out is not None:
            from eval.report import render_gate_html  # only when asked for

            _write_text(html_out, render_gate_html(result, base_run, cand_run))
    except OSError as exc:
        raise _fail(f"cannot write the report: {exc.filename or ''}: {exc.strerror or exc}") from None
    raise typer.Exit(result.exit_code)


# ---- eval run ------------------------------------------------------------------------------


def infer_graph(suite_cases: Suite | list[Any]) -> GraphId:
    """The graph a dataset file's cases are for, when ``--graph`` is not given: ``agent``
    if any case expects tool calls, else ``rag`` if any expects sources, no answer or
    names a collection, else ``chat``."""
    cases = suite_cases.cases if isinstance(suite_cases, Suite) else suite_cases
    if any(case.expected_tools for case in cases):
        return "agent"
    if any(case.expected_sources or case.expect_no_answer or case.collection for case in cases):
        return "rag"
    return "chat"


def _load(suite: str | None, dataset: Path | None, graph: GraphId | None, collection: str | None) -> Suite:
    """The suite to run (a dataset file wrapped as a suite without a corpus)."""
    if (suite is None) == (dataset is None):
        raise typer.BadParameter("give a SUITE (a name under eval/datasets/ or a suite directory) or --dataset FILE, not both")
    if dataset is not None:
        cases = load_dataset(dataset)
        config = SuiteConfig(name=dataset.stem or "dataset", graph=graph or infer_graph(cases), collection=collection)
        return Suite(config=config, directory=dataset.parent, cases=tuple(cases), corpus=None, hash=hash_dataset(cases))
    assert suite is not None
    loaded = load_suite(suite)
    update: dict[str, Any] = {}
    if graph is not None:
        update["graph"] = graph
    if collection is not None:
        update["collection"] = collection
    return replace(loaded, config=loaded.config.model_copy(update=update)) if update else loaded


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(name: str) -> str:
    """``name`` (a suite, alias or backend) as one path component: no separators, no
    leading or trailing dots (never ``..``); promotion files its runs the same way."""
    return _UNSAFE.sub("_", name).strip(".") or "_"


def _default_path(runs_dir: Path, run: RunFile) -> Path:
    stamp = run.started_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return runs_dir / safe_name(run.suite) / f"{safe_name(run.model)}-{stamp}.json"


def summary_table(run: RunFile) -> str:
    """The run's aggregate metrics as a plain-text table (metric, mean, cases, errors)."""
    means = aggregate(run.cases)
    errors = error_counts(run.cases)
    counted = {m: sum(c.value(m) is not None for c in run.cases) for m in means}
    order = [m for m in (*METRICS, *JUDGED_METRICS) if m in means or m in errors]
    order += sorted(set(means) - set(order))
    rows = [("metric", "mean", "cases", "errors")]
    for metric in order:
        mean = means.get(metric)
        rows.append((metric, "–" if mean is None else f"{mean:.3f}", str(counted.get(metric, 0)), str(errors.get(metric, 0))))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    timings = run.timings or {}
    ttft = (timings.get("ttft_s") or {}).get("p50")
    total = (timings.get("case_total_s") or {}).get("p50")
    lines.append("")
    lines.append(
        f"{len(run.cases)} cases, {timings.get('failed_cases', 0)} failed; run {timings.get('total_s', 0):.1f}s; "
        f"per case p50 ttft {'–' if ttft is None else f'{ttft:.2f}s'}, total {'–' if total is None else f'{total:.2f}s'}"
    )
    return "\n".join(lines) + "\n"


class _Bar:
    """A progress bar on stderr (none when stderr is not a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self._progress: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self._task = self._progress.add_task(label, total=total)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)


def _render_html(path: Path, render: Any) -> None:
    try:
        _write_text(path, render())
    except OSError as exc:
        raise _fail(f"cannot write {path}: {exc.strerror or exc}") from None


@eval_app.command("run")
def run(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="The model alias or backend id to evaluate.")],
    suite: Annotated[
        str | None, typer.Argument(help="A shipped suite (rag, agent, chat) or a suite directory.", show_default=False)
    ] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", help="A JSON Lines file of cases, instead of a SUITE.")
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="The collection the cases ask (a suite's corpus is ingested into it).")
    ] = None,
    graph: Annotated[
        str | None,
        typer.Option("--graph", help="rag, agent or chat. Default: the suite's; for --dataset, inferred from the cases."),
    ] = None,
    judge: Annotated[
        str | None, typer.Option("--judge", help="Alias (or backend id) of the judge; default: eval.judge in the settings.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the run file here.")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Also write an HTML report of the run here.")] = None,
) -> None:
    """Run a suite against a model through the server's graphs; write the run file."""
    env: EvalCliEnv = ctx.obj
    if graph is not None and graph not in ("rag", "graphrag", "agent", "chat"):
        raise _fail(f"--graph: must be rag, graphrag, agent or chat, got {graph!r}")
    try:
        loaded = _load(suite, dataset, graph, collection)  # type: ignore[arg-type]
    except typer.BadParameter as exc:
        raise _fail(str(exc)) from None
    except DatasetError as exc:
        what = "dataset" if dataset is not None else "suite"
        raise _fail(f"cannot load the {what}:\n{exc}") from None
    if loaded.graph in ("rag", "graphrag") and not any(loaded.collection_for(case) for case in loaded.cases):
        typer.secho(f"note: no collection named: the {loaded.graph} graph asks the default collection", err=True)

    async def execute() -> tuple[RunFile, Path]:
        # A suite with a corpus runs on the eval's own store (ingested there); a dataset
        # without one asks the user's collections, which exist only in the user's store.
        user_collections = loaded.corpus is None and loaded.graph != "chat"
        async with env.open_eval(model, graph=loaded.graph, judge=judge, user_collections=user_collections) as session:
            with _Bar(f"{loaded.name} on {model}", len(loaded.cases)) as bar:
                result = await run_suite(
                    loaded, session.runner, judge=session.judge, sla=session.sla, seed=session.seed, progress=bar.update
                )
            return result, session.runs_dir

    try:
        result, runs_dir = asyncio.run(execute())
    except (EvalSetupError, GatewayError, GraphError, KnowledgeError) as exc:
        raise _fail(str(exc)) from None
    stored = _default_path(runs_dir, result)
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        write_run(result, stored)
        if json_out is not None:
            write_run(result, json_out)
    except OSError as exc:
        raise _fail(f"cannot write the run file: {exc.filename or ''}: {exc.strerror or exc}") from None
    typer.echo(summary_table(result), nl=False)
    typer.echo(f"run file: {stored}")
    if json_out is not None:
        typer.echo(f"run file: {json_out}")
    if html_out is not None:
        from eval.report import render_run_html  # only when asked for

        _render_html(html_out, lambda: render_run_html(result))
        typer.echo(f"report: {html_out}")
    failed = (result.timings or {}).get("failed_cases", 0)
    if result.cases and failed == len(result.cases):
        first = next(iter((result.outputs or {}).values()), {})
        raise _fail(f"every case failed; the first: {first.get('error')}")
