"""The ``eval`` section of ``config/switchyard.yaml``: how ``switchyard eval run`` and
``switchyard models promote`` evaluate a model."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from eval.gate import DEFAULT_THRESHOLDS

__all__ = ["EvalSettings"]


class EvalSettings(BaseModel):
    """Override from the environment with ``SWITCHYARD_EVAL__<FIELD>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: str | None = None
    """The model alias (or backend id) that judges faithfulness, answer relevancy and
    correctness through DeepEval. Unset: only the deterministic metrics run."""
    seed: int = 7
    """The sampling seed sent with every eval request (temperature is 0), for backends
    that honour it."""
    thresholds: Path = DEFAULT_THRESHOLDS
    """Floors and largest allowed drops per metric (``switchyard eval gate``, promotion)."""
    runs_dir: Path | None = None
    """Where promotion keeps run files and reports; default ``<data_dir>/eval``."""
    suites: dict[str, list[str]] = Field(default_factory=dict)
    """Model alias -> the suites (``eval/datasets/<name>`` or a suite directory) a promotion
    of that alias runs. An alias not listed runs the suites of the graphs that call it."""
