"""The run file: one evaluation run's per-case scores, as ``switchyard eval run`` writes it
and ``switchyard eval gate`` reads it.

A JSON object (``format: 1``)::

    {"format": 1, "suite": "rag", "dataset_hash": "sha256:...", "model": "default",
     "backend": "local-llamacpp", "started_at": "2026-12-02T00:00:00Z", "judge": null,
     "cases": [{"case_id": "en-harbor-neap", "values": {"mrr": 1.0}, "errors": {}}],
     "timings": {"total_s": 12.5},
     "outputs": {"en-harbor-neap": {"answer": "...", "ttft_s": 0.4, "backend": "local"}},
     "versions": {"switchyard": "0.1.0", "model": "default", "backend": "local (smollm2)"}}

``outputs`` and ``versions`` are optional: files without them (written before they
existed) still load.

``cases`` are :class:`eval.metrics.CaseScore` records, one per case id (no repeats).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from eval.metrics import CaseScore

__all__ = ["RunFile", "RunFileError", "load_run", "write_run"]


class RunFileError(ValueError):
    """A run file is missing, unreadable, not JSON or invalid; the message names the file and
    the field."""


class RunFile(BaseModel):
    """One evaluation run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal[1] = 1
    """Version of this format."""
    suite: str = Field(min_length=1)
    """The suite's name (or the dataset file's name)."""
    dataset_hash: str = Field(min_length=1)
    """The dataset's hash (``eval.datasets``): two runs are comparable only when it is equal."""
    model: str = Field(min_length=1)
    """The alias or backend the run evaluated."""
    backend: str = Field(min_length=1)
    """The backend that answered (and its version, when known)."""
    started_at: datetime
    """When the run started (ISO 8601)."""
    judge: str | None = None
    """The judge model of the judged metrics; ``None`` when none ran."""
    cases: list[CaseScore]
    """Per-case scores, one per case id."""
    timings: dict[str, Any] | None = None
    """Free-form timings of the run (seconds): ``total_s``, and per case ``ttft_s`` and
    ``case_total_s`` as ``{mean, p50, p95}`` (``eval.run``)."""
    outputs: dict[str, dict[str, Any]] | None = None
    """Case id -> what its run produced: ``answer`` (the first 2000 characters),
    ``ttft_s``, ``total_s``, ``backend``, ``error``, ``retrieved_ids``, ``tool_calls``.
    Absent from files written before it existed."""
    versions: dict[str, str] | None = None
    """``switchyard``, ``model`` and ``backend`` versions, as far as they are known."""

    @field_validator("cases")
    @classmethod
    def _distinct(cls, cases: list[CaseScore]) -> list[CaseScore]:
        seen: set[str] = set()
        for case in cases:
            if case.case_id in seen:
                raise ValueError(f"case_id {case.case_id!r} appears more than once")
            seen.add(case.case_id)
        return cases

    def by_case(self) -> dict[str, CaseScore]:
        """Case id -> scores, in the file's order (what ``eval.gate.compare`` takes)."""
        return {case.case_id: case for case in self.cases}


def load_run(path: Path | str) -> RunFile:
    """Read and validate a run file.

    Raises:
        RunFileError: naming the file and, for an invalid field, its path (``cases.3.values``).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RunFileError(f"{path}: expected a JSON object (a run file), got {type(data).__name__}")
    try:
        return RunFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {error['msg']}" for error in exc.errors()
        )
        raise RunFileError(f"{path}: {problems}") from exc


def write_run(run: RunFile, path: Path | str) -> None:
    """Write a run file atomically: a temporary file in the same directory, then a rename, so
    a reader sees the old file or the whole new one, never half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp makes the file 0600; a report or run file is read like any other (CI artifacts).
    os.fchmod(fd, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(run.model_dump_json(indent=2))
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
