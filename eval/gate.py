"""The gate: does a candidate run regress against a baseline run?

The statistic, stated once: for each metric, the cases both runs scored (paired by case id)
give per-case differences ``d_i = candidate_i - baseline_i``. ``delta`` is their mean. Its
confidence interval is a **paired percentile bootstrap**: ``resamples`` times, draw ``n``
case indices uniformly with replacement (numpy ``default_rng(seed)``, so the interval is the
same on every run), take the mean of those ``d_i``; the interval is the ``(1 - confidence) / 2``
and ``(1 + confidence) / 2`` quantiles of those means.

Verdict per metric (all metrics are "higher is better"):

- ``regressed`` when the candidate's mean is under the metric's ``floor``, or when the drop
  (``-delta``) is larger than ``max_drop`` *and* the interval's upper bound is below zero
  (the drop is outside the noise: a re-run of the baseline passes);
- ``regressed`` also when the candidate could not be scored (a failed run, a judge error) on
  more of the cases than the baseline, by a share larger than ``max_drop``: an unscored case
  is not averaged in, so this is what stops a candidate that fails half its requests;
- ``not_applicable`` when no paired case has the metric and neither run has an error on it
  (a chat suite has no ``expected_sources``: its runs have no ``recall_at_k``); it does not
  block and does not stop the gate, so one thresholds file serves every suite;
- ``not_evaluable`` when no paired case has a value in both runs but some have errors (the
  candidate could not be scored: a dead backend, a judge that never answered);
- ``ok`` otherwise.

Exit codes (:attr:`GateResult.exit_code`): 0 pass, 1 a metric regressed, 2 could not
evaluate (no case in common, or a gated metric both runs have only as errors).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eval.metrics import CaseScore

__all__ = [
    "DEFAULT_THRESHOLDS",
    "GateResult",
    "MetricThreshold",
    "MetricVerdict",
    "StatisticSettings",
    "Thresholds",
    "ThresholdsError",
    "Verdict",
    "compare",
    "render_markdown",
]

DEFAULT_THRESHOLDS = Path(__file__).with_name("thresholds.yaml")
"""The thresholds shipped with Switchyard."""

Verdict = Literal["ok", "regressed", "not_evaluable", "not_applicable"]

# Float sums of identical runs may differ in the last bits.
_EPSILON = 1e-9


class ThresholdsError(ValueError):
    """The thresholds file is missing, unreadable or invalid; the message names the bad key."""


class MetricThreshold(BaseModel):
    """What a candidate must keep on one metric."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    floor: float = Field(ge=0.0, le=1.0)
    """The candidate's mean may not be under this, whatever the baseline did."""
    max_drop: float = Field(ge=0.0, le=1.0)
    """The largest drop of the mean (baseline minus candidate) tolerated even when it is
    outside the noise."""


class StatisticSettings(BaseModel):
    """The paired bootstrap's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Two-sided confidence of the interval of the mean difference."""
    resamples: int = Field(default=2000, ge=100, le=1_000_000)
    """Bootstrap resamples."""
    seed: int = Field(default=0, ge=0)
    """Seed of the resampling: the same runs always get the same interval."""


class Thresholds(BaseModel):
    """``eval/thresholds.yaml``: per metric a floor and a largest drop, and the statistic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    statistic: StatisticSettings = StatisticSettings()
    """How a drop is told from noise."""
    metrics: dict[str, MetricThreshold] = Field(min_length=1)
    """Metric name -> its threshold. Only these metrics are gated."""

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "thresholds") -> Thresholds:
        """Validate parsed YAML or JSON.

        Raises:
            ThresholdsError: naming each bad key by its path (``metrics.mrr.floor``).
        """
        if not isinstance(data, Mapping):
            raise ThresholdsError(f"{source}: expected a mapping with 'metrics' (and 'statistic'), got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {error['msg']}" for error in exc.errors()
            )
            raise ThresholdsError(f"{source}: {problems}") from exc

    @classmethod
    def load(cls, path: Path | str = DEFAULT_THRESHOLDS) -> Thresholds:
        """Read a thresholds YAML file.

        Raises:
            ThresholdsError: the file cannot be read or parsed, or a key is invalid.
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ThresholdsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ThresholdsError(f"{path}: not valid YAML: {exc}") from exc
        return cls.from_mapping(data, source=str(path))


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricVerdict:
    """One metric's comparison."""

    metric: str
    verdict: Verdict
    reason: str
    """Why, in one line."""
    cases: int
    """Paired cases that have the metric in both runs."""
    baseline: float | None = None
    """Baseline mean over the paired cases."""
    candidate: float | None = None
    """Candidate mean over the paired cases."""
    delta: float | None = None
    """Mean of the per-case differences, candidate minus baseline."""
    ci_low: float | None = None
    ci_high: float | None = None
    """The paired bootstrap interval of ``delta``."""
    baseline_errors: int = 0
    candidate_errors: int = 0
    """Cases the run could not score on this metric (among the paired cases)."""
    threshold: MetricThreshold | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GateResult:
    """The gate's decision."""

    metrics: tuple[MetricVerdict, ...]
    paired_cases: int
    """Cases both runs have."""
    missing_in_candidate: tuple[str, ...] = ()
    """Baseline cases the candidate does not have."""
    missing_in_baseline: tuple[str, ...] = ()
    """Candidate cases the baseline does not have."""
    untracked: tuple[str, ...] = ()
    """Metrics the runs have that the thresholds do not gate."""
    statistic: StatisticSettings = field(default_factory=StatisticSettings)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 a metric regressed, 2 could not evaluate."""
        if any(m.verdict == "regressed" for m in self.metrics):
            return 1
        if self.paired_cases == 0 or any(m.verdict == "not_evaluable" for m in self.metrics):
            return 2
        return 0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        """The decision as plain JSON, for ``--json``."""
        return {
            "exit_code": self.exit_code,
            "passed": self.passed,
            "paired_cases": self.paired_cases,
            "missing_in_candidate": list(self.missing_in_candidate),
            "missing_in_baseline": list(self.missing_in_baseline),
            "untracked": list(self.untracked),
            "statistic": {"method": "paired percentile bootstrap of the mean difference", **self.statistic.model_dump()},
            "metrics": [
                {
                    "metric": m.metric,
                    "verdict": m.verdict,
                    "reason": m.reason,
                    "cases": m.cases,
                    "baseline": m.baseline,
                    "candidate": m.candidate,
                    "delta": m.delta,
                    "interval": None if m.ci_low is None else [m.ci_low, m.ci_high],
                    "baseline_errors": m.baseline_errors,
                    "candidate_errors": m.candidate_errors,
                    "floor": None if m.threshold is None else m.threshold.floor,
                    "max_drop": None if m.threshold is None else m.threshold.max_drop,
                }
                for m in self.metrics
            ],
        }


def _interval(diffs: np.ndarray, statistic: StatisticSettings) -> tuple[float, float]:
    # One generator per call, seeded: the same differences always give the same interval.
    rng = np.random.default_rng(statistic.seed)
    picks = rng.integers(0, len(diffs), size=(statistic.resamples, len(diffs)))
    means = diffs[picks].mean(axis=1)
    tail = (1.0 - statistic.confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _judge(
    metric: str,
    threshold: MetricThreshold,
    pairs: list[tuple[CaseScore, CaseScore]],
    statistic: StatisticSettings,
) -> MetricVerdict:
    base_errors = sum(metric in b.errors for b, _ in pairs)
    cand_errors = sum(metric in c.errors for _, c in pairs)
    both = [(b.value(metric), c.value(metric)) for b, c in pairs]
    values = [(b, c) for b, c in both if b is not None and c is not None]
    common = {"metric": metric, "threshold": threshold, "baseline_errors": base_errors, "candidate_errors": cand_errors}
    applicable = sum(
        1 for b, c in pairs
        if metric in b.errors or metric in c.errors or b.value(metric) is not None or c.value(metric) is not None
    )
    extra_errors = cand_errors - base_errors
    if applicable and extra_errors / applicable > threshold.max_drop + _EPSILON:
        # An unscored case is not averaged in, so without this a candidate failing half
        # its requests would be judged on the half that worked.
        return MetricVerdict(
            verdict="regressed",
            reason=f"the candidate could not be scored on {cand_errors} of {applicable} cases "
            f"(baseline: {base_errors}); {extra_errors / applicable:.3f} more > max_drop {threshold.max_drop:.3f}",
            cases=len(values),
            baseline=float(np.mean([b for b, _ in values])) if values else None,
            candidate=float(np.mean([c for _, c in values])) if values else None,
            **common,
        )
    if not values:
        if not base_errors and not cand_errors and not any(b.value(metric) is not None or c.value(metric) is not None for b, c in pairs):
            return MetricVerdict(verdict="not_applicable", reason="no case of these runs has this metric", cases=0, **common)
        return MetricVerdict(
            verdict="not_evaluable",
            reason=f"no case has this metric in both runs (errors: baseline {base_errors}, candidate {cand_errors})",
            cases=0,
            **common,
        )
    base = np.array([b for b, _ in values], dtype=float)
    cand = np.array([c for _, c in values], dtype=float)
    diffs = cand - base
    delta = float(diffs.mean())
    low, high = _interval(diffs, statistic)
    base_mean, cand_mean = float(base.mean()), float(cand.mean())
    drop = -delta
    ci = f"{statistic.confidence:.0%} CI [{low:+.3f}, {high:+.3f}]"
    if cand_mean < threshold.floor - _EPSILON:
        verdict: Verdict = "regressed"
        reason = f"candidate {cand_mean:.3f} is under the floor {threshold.floor:.3f}"
    elif drop > threshold.max_drop + _EPSILON and high < 0.0:
        verdict = "regressed"
        reason = f"drop {drop:.3f} > max_drop {threshold.max_drop:.3f} and outside the noise ({ci})"
    elif drop > threshold.max_drop + _EPSILON:
        verdict = "ok"
        reason = f"drop {drop:.3f} > max_drop {threshold.max_drop:.3f} but within the noise ({ci})"
    else:
        verdict = "ok"
        reason = "within max_drop" if drop > _EPSILON else "no drop"
    return MetricVerdict(
        verdict=verdict,
        reason=reason,
        cases=len(values),
        baseline=base_mean,
        candidate=cand_mean,
        delta=delta,
        ci_low=low,
        ci_high=high,
        **common,
    )


def compare(
    baseline: Mapping[str, CaseScore],
    candidate: Mapping[str, CaseScore],
    thresholds: Thresholds | None = None,
) -> GateResult:
    """Gate a candidate run against a baseline run, case by case.

    Args:
        baseline: case id -> the baseline's scores.
        candidate: case id -> the candidate's scores.
        thresholds: the floors, drops and statistic; ``eval/thresholds.yaml`` when ``None``.

    Returns:
        Every gated metric's verdict (see the module docstring for the statistic), the cases
        only one run has, and the metrics the thresholds do not gate.
    """
    thresholds = thresholds if thresholds is not None else Thresholds.load()
    shared = [case for case in baseline if case in candidate]
    pairs = [(baseline[case], candidate[case]) for case in shared]
    seen = {m for b, c in pairs for m in (*b.values, *c.values, *b.errors, *c.errors)}
    return GateResult(
        metrics=tuple(_judge(m, t, pairs, thresholds.statistic) for m, t in thresholds.metrics.items()),
        paired_cases=len(pairs),
        missing_in_candidate=tuple(case for case in baseline if case not in candidate),
        missing_in_baseline=tuple(case for case in candidate if case not in baseline),
        untracked=tuple(sorted(seen - thresholds.metrics.keys())),
        statistic=thresholds.statistic,
    )


def _number(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


# Case ids and metric names come from run files and datasets: in the Markdown (a CI job
# summary) they must stay text, never links, images, HTML, table cells or a forged verdict.
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>!|~])")


def _md(text: str) -> str:
    """``text`` as literal Markdown text on one line: special characters escaped."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _cases(ids: tuple[str, ...], limit: int = 20) -> str:
    shown = ", ".join(_md(case) for case in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def render_markdown(result: GateResult) -> str:
    """The decision as a Markdown table (metric, baseline, candidate, delta, interval, verdict),
    followed by the reasons, the cases only one run has and the untracked metrics."""
    outcome = {0: "PASS", 1: "REGRESSION", 2: "COULD NOT EVALUATE"}[result.exit_code]
    lines = [
        f"**Gate: {outcome}** (exit {result.exit_code}; {result.paired_cases} paired cases; "
        f"paired bootstrap, {result.statistic.confidence:.0%} interval, "
        f"{result.statistic.resamples} resamples, seed {result.statistic.seed})",
        "",
        f"| metric | baseline | candidate | delta | {result.statistic.confidence:.0%} interval | cases | errors (b/c) | verdict |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for m in result.metrics:
        interval = "–" if m.ci_low is None else f"[{_number(m.ci_low, True)}, {_number(m.ci_high, True)}]"
        lines.append(
            f"| {_md(m.metric)} | {_number(m.baseline)} | {_number(m.candidate)} | {_number(m.delta, True)} | {interval} "
            f"| {m.cases} | {m.baseline_errors}/{m.candidate_errors} | {m.verdict} |"
        )
    lines += ["", *(f"- **{_md(m.metric)}**: {m.verdict}: {m.reason}" for m in result.metrics)]
    if result.missing_in_candidate:
        lines.append(f"- missing in the candidate ({len(result.missing_in_candidate)}): {_cases(result.missing_in_candidate)}")
    if result.missing_in_baseline:
        lines.append(f"- missing in the baseline ({len(result.missing_in_baseline)}): {_cases(result.missing_in_baseline)}")
    if result.untracked:
        lines.append(f"- not gated (no threshold): {', '.join(_md(m) for m in result.untracked)}")
    return "\n".join(lines) + "\n"
