"""``switchyard eval gate``: gate a candidate run against a baseline run.

Mounted by ``serving/cli.py`` as ``eval``. Pure: reads two run files (``eval.runs``) and a
thresholds file, needs no model and no server. Exit 0 pass, 1 regression, 2 could not
evaluate (a run file or the thresholds unreadable or invalid, runs of different datasets,
no case in common, a gated metric no paired case has).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.gate import DEFAULT_THRESHOLDS, Thresholds, ThresholdsError, compare, render_markdown
from eval.runs import RunFile, RunFileError, load_run

__all__ = ["eval_app", "gate"]

eval_app = typer.Typer(help="Evaluate models: gate a candidate run against a baseline.", no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    baseline: Annotated[Path, typer.Option("--baseline", help="The baseline's run file (JSON).")],
    candidate: Annotated[Path, typer.Option("--candidate", help="The candidate's run file (JSON).")],
    thresholds: Annotated[
        Path, typer.Option("--thresholds", help="Floors and largest drops per metric (YAML).")
    ] = DEFAULT_THRESHOLDS,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the decision as JSON here.")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown report here.")] = None,
) -> None:
    """Compare two runs case by case; exit 0 pass, 1 regression, 2 could not evaluate."""
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
    except OSError as exc:
        raise _fail(f"cannot write the report: {exc.filename or ''}: {exc.strerror or exc}") from None
    raise typer.Exit(result.exit_code)
