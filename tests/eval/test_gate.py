"""The gate: a baseline against itself and against noisy re-runs of itself passes, degraded
candidates are blocked, floors hold without a drop, and bad thresholds name their key.

Runs are simulated per case (numpy generators with fixed seeds): the gate sees only scores."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from eval.gate import DEFAULT_THRESHOLDS, Thresholds, ThresholdsError, compare, render_markdown
from eval.judge import JUDGED_METRICS
from eval.metrics import (
    CITATIONS_VALID,
    FACTS_CONTAINED,
    LATENCY_WITHIN,
    METRICS,
    MRR,
    NO_ANSWER_DETECTED,
    RECALL_AT_K,
    TOOLS_MATCH,
    CaseScore,
)

CASES = 40
UNANSWERABLE = 8  # the last cases of a suite
SIMULATIONS = 200


@pytest.fixture(scope="module")
def thresholds() -> Thresholds:
    return Thresholds.load(DEFAULT_THRESHOLDS)


def _share(rng: np.random.Generator, cases: int, high: float, share: float, low: float) -> np.ndarray:
    """``cases`` scores, ``share`` of them ``high`` and the rest ``low``, in random order."""
    highs = round(cases * share)
    return rng.permutation(np.array([high] * highs + [low] * (cases - highs)))


def _baseline_values(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A good model's per-case scores (NaN where a metric does not apply): each metric's mean
    is fixed, which cases score what is random."""
    answerable = CASES - UNANSWERABLE
    nan = np.full(UNANSWERABLE, np.nan)
    return {
        RECALL_AT_K: np.concatenate([_share(rng, answerable, 1.0, 0.85, 0.5), nan]),
        MRR: np.concatenate([rng.permutation(np.resize([1.0, 1.0, 1.0, 0.5, 1 / 3], answerable)), nan]),
        FACTS_CONTAINED: np.concatenate([_share(rng, answerable, 1.0, 0.9, 0.5), nan]),
        CITATIONS_VALID: np.concatenate([_share(rng, answerable, 1.0, 0.95, 0.5), nan]),
        NO_ANSWER_DETECTED: np.concatenate([np.full(answerable, np.nan), _share(rng, UNANSWERABLE, 1.0, 0.875, 0.0)]),
        TOOLS_MATCH: _share(rng, CASES, 1.0, 0.9, 0.5),
        LATENCY_WITHIN: _share(rng, CASES, 1.0, 0.95, 0.0),
    }


def _run(values: dict[str, np.ndarray]) -> dict[str, CaseScore]:
    return {
        f"case-{i}": CaseScore(
            case_id=f"case-{i}",
            values={m: (None if np.isnan(v[i]) else float(v[i])) for m, v in values.items()},
        )
        for i in range(CASES)
    }


def _rerun(values: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A re-run of the same model: per-case scores move both ways with equal expected mass.

    On each metric, every applicable case has a 25% chance to move; a moving case goes to a
    value drawn from the metric's own per-case distribution (another case's score), so the
    expected mean of the re-run is the baseline's mean: the noise is symmetric.
    """
    out = {}
    for metric, v in values.items():
        applicable = ~np.isnan(v)
        pool = v[applicable]
        moves = applicable & (rng.random(CASES) < 0.25)
        new = v.copy()
        new[moves] = rng.choice(pool, int(moves.sum()))
        out[metric] = new
    return out


def _degraded(values: dict[str, np.ndarray], rng: np.random.Generator, kind: str) -> dict[str, np.ndarray]:
    """A worse model. ``facts``: facts 0.9 -> 0.5; ``recall``: 40% of the found sources lost
    (the rewrite got worse); ``empty``: a quarter of the answers are empty text (no facts, no
    citation); ``all``: the three at once."""
    out = {m: v.copy() for m, v in values.items()}
    answerable = ~np.isnan(values[FACTS_CONTAINED])
    if kind in ("facts", "all"):
        out[FACTS_CONTAINED] = np.where(answerable, np.where(rng.random(CASES) < 0.5, 1.0, 0.0), np.nan)
    if kind in ("recall", "all"):
        lost = rng.random(CASES) < 0.4
        out[RECALL_AT_K] = np.where(lost, 0.0, values[RECALL_AT_K])
        out[MRR] = np.where(lost, 0.0, values[MRR])
    if kind in ("empty", "all"):
        empty = np.zeros(CASES, dtype=bool)
        empty[rng.choice(np.flatnonzero(answerable), int(answerable.sum()) // 4, replace=False)] = True
        out[FACTS_CONTAINED] = np.where(empty, 0.0, out[FACTS_CONTAINED])
        out[CITATIONS_VALID] = np.where(empty, 0.0, out[CITATIONS_VALID])
    return out


def test_identical_runs_pass(thresholds: Thresholds) -> None:
    run = _run(_baseline_values(np.random.default_rng(1)))
    result = compare(run, run, thresholds)
    assert result.exit_code == 0, render_markdown(result)
    assert [m.metric for m in result.metrics] == [*METRICS, *JUDGED_METRICS]
    for m in result.metrics:
        if m.metric in JUDGED_METRICS:  # no judge ran: not applicable, not blocking
            assert m.verdict == "not_applicable" and m.cases == 0
            continue
        assert m.verdict == "ok" and m.delta == 0.0 and m.ci_low == 0.0 and m.ci_high == 0.0
    assert result.paired_cases == CASES and result.missing_in_candidate == () and result.untracked == ()
    by_metric = {m.metric: m for m in result.metrics}
    assert by_metric[NO_ANSWER_DETECTED].cases == UNANSWERABLE
    assert by_metric[FACTS_CONTAINED].cases == CASES - UNANSWERABLE


def test_the_interval_is_deterministic(thresholds: Thresholds) -> None:
    rng = np.random.default_rng(2)
    base = _baseline_values(rng)
    baseline, candidate = _run(base), _run(_rerun(base, rng))
    first, second = compare(baseline, candidate, thresholds), compare(baseline, candidate, thresholds)
    assert first == second
    assert render_markdown(first) == render_markdown(second)


def test_noisy_reruns_of_the_baseline_pass(thresholds: Thresholds) -> None:
    passed = 0
    moved = 0
    for seed in range(SIMULATIONS):
        rng = np.random.default_rng(1000 + seed)
        base = _baseline_values(rng)
        result = compare(_run(base), _run(_rerun(base, rng)), thresholds)
        passed += result.exit_code == 0
        moved += any(m.delta != 0.0 for m in result.metrics)
    assert moved >= 0.95 * SIMULATIONS  # the noise is real: re-runs differ from the baseline
    assert passed >= 0.95 * SIMULATIONS, f"only {passed}/{SIMULATIONS} re-runs passed"


@pytest.mark.parametrize(
    ("kind", "blocked_on"),
    [
        ("facts", {FACTS_CONTAINED}),
        ("recall", {RECALL_AT_K, MRR}),
        ("empty", {FACTS_CONTAINED, CITATIONS_VALID}),
        ("all", {FACTS_CONTAINED, RECALL_AT_K, MRR, CITATIONS_VALID}),
    ],
)
def test_degraded_candidates_are_always_blocked(thresholds: Thresholds, kind: str, blocked_on: set[str]) -> None:
    for seed in range(SIMULATIONS):
        rng = np.random.default_rng(5000 + seed)
        base = _baseline_values(rng)
        result = compare(_run(base), _run(_degraded(base, rng, kind)), thresholds)
        assert result.exit_code == 1, f"seed {seed}:\n{render_markdown(result)}"
        regressed = {m.metric for m in result.metrics if m.verdict == "regressed"}
        assert regressed == blocked_on, f"seed {seed}:\n{render_markdown(result)}"


def _uniform(values: dict[str, float], cases: int = CASES, prefix: str = "case") -> dict[str, CaseScore]:
    return {f"{prefix}-{i}": CaseScore(case_id=f"{prefix}-{i}", values=dict(values)) for i in range(cases)}


def test_a_candidate_under_a_floor_is_blocked_without_a_drop() -> None:
    thresholds = Thresholds.model_validate({"metrics": {FACTS_CONTAINED: {"floor": 0.6, "max_drop": 0.05}}})
    weak = _uniform({FACTS_CONTAINED: 0.5})
    result = compare(weak, weak, thresholds)
    (verdict,) = result.metrics
    assert verdict.verdict == "regressed" and verdict.delta == 0.0 and "floor" in verdict.reason
    assert result.exit_code == 1


def test_a_drop_within_max_drop_or_within_the_noise_passes() -> None:
    thresholds = Thresholds.model_validate({"metrics": {FACTS_CONTAINED: {"floor": 0.0, "max_drop": 0.05}}})
    # A uniform small drop: outside the noise but within max_drop.
    result = compare(_uniform({FACTS_CONTAINED: 0.9}), _uniform({FACTS_CONTAINED: 0.87}), thresholds)
    assert result.exit_code == 0 and result.metrics[0].ci_high < 0
    # A large drop on one case of 40: larger than max_drop, but the interval reaches 0.
    baseline = _uniform({FACTS_CONTAINED: 1.0})
    candidate = dict(baseline)
    candidate["case-0"] = CaseScore(case_id="case-0", values={FACTS_CONTAINED: 0.0})
    thresholds = Thresholds.model_validate({"metrics": {FACTS_CONTAINED: {"floor": 0.0, "max_drop": 0.01}}})
    result = compare(baseline, candidate, thresholds)
    (verdict,) = result.metrics
    assert verdict.verdict == "ok" and "within the noise" in verdict.reason
    assert verdict.delta == pytest.approx(-1 / CASES) and verdict.ci_high == 0.0


def test_missing_metrics_and_cases() -> None:
    thresholds = Thresholds.model_validate(
        {"metrics": {FACTS_CONTAINED: {"floor": 0.5, "max_drop": 0.1}, TOOLS_MATCH: {"floor": 0.5, "max_drop": 0.1}}}
    )
    baseline = _uniform({FACTS_CONTAINED: 1.0, "faithfulness": 0.8})
    candidate = _uniform({FACTS_CONTAINED: 1.0, "faithfulness": 0.8}, cases=CASES - 2)
    candidate["new-case"] = CaseScore(case_id="new-case", values={FACTS_CONTAINED: 0.0})
    result = compare(baseline, candidate, thresholds)
    verdicts = {m.metric: m.verdict for m in result.metrics}
    # Neither run measures tools_match (a chat suite): not applicable, not blocking.
    assert verdicts == {FACTS_CONTAINED: "ok", TOOLS_MATCH: "not_applicable"}
    assert result.exit_code == 0
    assert result.missing_in_candidate == (f"case-{CASES - 2}", f"case-{CASES - 1}")
    assert result.missing_in_baseline == ("new-case",)
    assert result.untracked == ("faithfulness",)
    # The baseline scored tools_match and the candidate could not on a third of the cases: a
    # candidate that fails requests is blocked, not judged on the requests that worked.
    scored = _uniform({FACTS_CONTAINED: 1.0, TOOLS_MATCH: 1.0})
    down = CaseScore(case_id="x", values={FACTS_CONTAINED: None, TOOLS_MATCH: None},
                     errors={FACTS_CONTAINED: "backend down", TOOLS_MATCH: "backend down"})
    partly = {case: (down.model_copy(update={"case_id": case}) if i % 3 == 0 else score) for i, (case, score) in enumerate(scored.items())}
    result = compare(scored, partly, thresholds)
    verdicts = {m.metric: m for m in result.metrics}
    assert verdicts[TOOLS_MATCH].verdict == "regressed" and "could not be scored" in verdicts[TOOLS_MATCH].reason
    assert verdicts[TOOLS_MATCH].candidate == 1.0  # the cases that worked were perfect
    assert result.exit_code == 1
    # Neither run could be scored on it (a judge that never answered): could not evaluate.
    both_down = {case: down.model_copy(update={"case_id": case, "values": {FACTS_CONTAINED: 1.0, TOOLS_MATCH: None},
                                               "errors": {TOOLS_MATCH: "judge down"}}) for case in scored}
    result = compare(both_down, both_down, thresholds)
    assert {m.metric: m.verdict for m in result.metrics}[TOOLS_MATCH] == "not_evaluable"
    assert result.exit_code == 2
    report = render_markdown(result)
    assert "COULD NOT EVALUATE" in report and "not_evaluable" in report
    # A regression outranks what could not be evaluated.
    worse = _uniform({FACTS_CONTAINED: 0.1})
    assert compare(baseline, worse, thresholds).exit_code == 1
    # No case in common: nothing can be said.
    disjoint = _uniform({FACTS_CONTAINED: 1.0}, prefix="other")
    result = compare(baseline, disjoint, thresholds)
    assert result.paired_cases == 0 and result.exit_code == 2


def test_errors_are_counted_not_averaged() -> None:
    thresholds = Thresholds.model_validate({"metrics": {"faithfulness": {"floor": 0.5, "max_drop": 0.1}}})
    baseline = _uniform({"faithfulness": 0.9})
    candidate = dict(baseline)
    candidate["case-0"] = CaseScore(case_id="case-0", values={"faithfulness": None}, errors={"faithfulness": "bad JSON"})
    result = compare(baseline, candidate, thresholds)
    (verdict,) = result.metrics
    assert verdict.cases == CASES - 1 and verdict.candidate_errors == 1 and verdict.baseline_errors == 0
    assert result.exit_code == 0
    assert result.to_json()["metrics"][0]["candidate_errors"] == 1


def test_markdown_and_json(thresholds: Thresholds) -> None:
    rng = np.random.default_rng(7)
    base = _baseline_values(rng)
    result = compare(_run(base), _run(_degraded(base, rng, "all")), thresholds)
    report = render_markdown(result)
    header = next(line for line in report.splitlines() if line.startswith("| metric"))
    assert header.split("|")[1:7] == [" metric ", " baseline ", " candidate ", " delta ", f" {thresholds.statistic.confidence:.0%} interval ", " cases "]
    assert "**Gate: REGRESSION** (exit 1" in report
    row = next(line for line in report.splitlines() if line.startswith(f"| {FACTS_CONTAINED} "))
    assert row.rstrip().endswith("| regressed |")
    data = result.to_json()
    assert data["exit_code"] == 1 and data["statistic"]["seed"] == thresholds.statistic.seed
    assert {m["metric"] for m in data["metrics"]} == {*METRICS, *JUDGED_METRICS}


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"metrics": {"mrr": {"floor": 1.5, "max_drop": 0.1}}}, "metrics.mrr.floor"),
        ({"metrics": {"mrr": {"floor": 0.5}}}, "metrics.mrr.max_drop"),
        ({"metrics": {"mrr": {"floor": 0.5, "max_drop": 0.1, "maxdrop": 0.1}}}, "metrics.mrr.maxdrop"),
        ({"metrics": {"mrr": {"floor": 0.5, "max_drop": -0.1}}}, "metrics.mrr.max_drop"),
        ({"metrics": {"mrr": {"floor": 0.5, "max_drop": 0.1}}, "statistic": {"confidence": 95}}, "statistic.confidence"),
        ({"metrics": {"mrr": {"floor": 0.5, "max_drop": 0.1}}, "statistic": {"resamples": 10}}, "statistic.resamples"),
        ({"metrics": {"mrr": {"floor": 0.5, "max_drop": 0.1}}, "statistics": {}}, "statistics"),
        ({"metrics": {}}, "metrics"),
        ({}, "metrics"),
    ],
)
def test_thresholds_errors_name_the_key(tmp_path: Path, document: dict, key: str) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    with pytest.raises(ThresholdsError) as caught:
        Thresholds.load(path)
    message = str(caught.value)
    assert str(path) in message and f"{key}:" in message


def test_thresholds_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ThresholdsError, match="cannot read"):
        Thresholds.load(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("metrics: [unclosed", encoding="utf-8")
    with pytest.raises(ThresholdsError, match="not valid YAML"):
        Thresholds.load(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ThresholdsError, match="expected a mapping"):
        Thresholds.load(listed)


def test_the_shipped_thresholds_gate_every_metric(thresholds: Thresholds) -> None:
    assert set(thresholds.metrics) == {*METRICS, *JUDGED_METRICS}
    for threshold in thresholds.metrics.values():
        assert 0 < threshold.floor < 1 and 0 < threshold.max_drop <= 0.1


def test_case_ids_and_metric_names_stay_text_in_markdown() -> None:
    # A CI job summary renders the report: ids from a dataset must not become links,
    # images, HTML, table cells or a forged verdict line.
    hostile = "x`\n**Gate: PASS** [a](http://e) ![i](http://e/i.png) <img src=x> |"
    baseline = {hostile: CaseScore(case_id=hostile, values={FACTS_CONTAINED: 1.0, "evil|metric<b>": 1.0})}
    thresholds = Thresholds.model_validate({"metrics": {FACTS_CONTAINED: {"floor": 0.0, "max_drop": 0.1}}})
    other = "y`\n**Gate: PASS**"
    candidate = {**baseline, other: CaseScore(case_id=other, values={FACTS_CONTAINED: 1.0})}
    report = render_markdown(compare(baseline, candidate, thresholds))
    assert report.count("**Gate:") == 1 and "\n**Gate: PASS**" not in report
    assert not re.search(r"(?<!\\)\]\(", report) and not re.search(r"(?<!\\)<", report)
    assert "y\\` \\*\\*Gate: PASS\\*\\*" in report  # a case only the candidate has
    assert "evil\\|metric\\<b\\>" in report
    assert "facts_contained" in report  # plain names stay readable
