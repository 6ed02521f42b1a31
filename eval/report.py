"""HTML reports of eval runs and of the gate, for people and CI artifacts.

:func:`render_run_html` shows one run (each metric's mean with a bar, its error count, the
per-case scores and each metric's worst cases); :func:`render_gate_html` shows the gate's
decision on two runs (the verdict first, a chart per gated metric with the baseline's and
the candidate's means and the bootstrap interval of the paired difference, the table
``render_markdown`` prints, and the cases that dropped the most).

A report is one self-contained HTML document: inline CSS and SVG, no JavaScript, no
external stylesheet, font or image, so it opens offline from a CI artifact. Everything a
run file holds (case ids, answers, error messages, model and metric names) is user data and
is HTML-escaped wherever it is written, in text and in attributes alike.

Pure: the functions return strings and write nothing (``eval.cli`` writes them
atomically). They show the run file's optional ``outputs`` (case id -> answer, timings,
backend, error) and ``versions`` when the run has them, and do without them otherwise.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eval.gate import GateResult, MetricVerdict
from eval.metrics import METRICS, CaseScore, aggregate, error_counts
from eval.run import JUDGED_METRICS
from eval.runs import RunFile

__all__ = ["WORST_CASES", "render_gate_html", "render_run_html"]

WORST_CASES = 20
"""How many of the most dropped cases the gate report lists (and how many worst cases per
metric the run report lists, divided by four)."""

# Answers longer than this are folded into a <details> element (no JavaScript needed).
_ANSWER_PREVIEW = 120
# Float sums of identical runs may differ in the last bits (as in eval.gate).
_EPSILON = 1e-9

_OUTCOMES = {0: ("PASS", "ok"), 1: ("REGRESSION", "regressed"), 2: ("COULD NOT EVALUATE", "not_evaluable")}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif;margin:1.5rem;color:#1f2328;
 max-width:72rem;line-height:1.4}
h1{font-size:1.4rem;margin:0 0 .5rem} h2{font-size:1.15rem;margin:1.6rem 0 .5rem} h3{font-size:1rem;margin:1rem 0 .3rem}
table{border-collapse:collapse;margin:.4rem 0;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85em}
.verdict{display:inline-block;padding:.5rem 1rem;border-radius:.4rem;font-weight:700;font-size:1.2rem;color:#fff}
.verdict.ok{background:#1a7f37} .verdict.regressed{background:#cf222e} .verdict.not_evaluable{background:#9a6700}
td.ok{color:#1a7f37;font-weight:600} td.regressed{color:#cf222e;font-weight:700} td.not_evaluable{color:#9a6700;font-weight:600}
td.not_applicable{color:#656d76} td.error{color:#cf222e} .muted{color:#656d76}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
.chart-box{border:1px solid #d0d7de;border-radius:.4rem;padding:.5rem}
details summary{cursor:pointer} .answer{white-space:pre-wrap;max-width:36rem}
"""


def _e(value: Any) -> str:
    """HTML-escape anything (quotes too, so the result is safe in attributes)."""
    return html.escape(str(value), quote=True)


def _num(value: float | None, *, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _metric_order(names: Iterable[str]) -> list[str]:
    """The deterministic metrics in report order, the judged ones, then any other by name."""
    rank = {metric: i for i, metric in enumerate((*METRICS, *JUDGED_METRICS))}
    return sorted(set(names), key=lambda m: (rank.get(m, len(rank)), m))


def _document(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )


# --- what a run file may carry ------------------------------------------------------------


def _outputs(run: RunFile) -> dict[str, Mapping[str, Any]]:
    """The run's per-case outputs (case id -> ``answer``, ``ttft_s``, ...), or ``{}`` for a
    run file written before they were recorded."""
    return {case_id: output for case_id, output in (run.outputs or {}).items() if isinstance(output, Mapping)}


def _answer_html(answer: Any) -> str:
    """An answer, escaped; a long one folded into ``<details>``."""
    if answer is None:
        return '<span class="muted">–</span>'
    text = str(answer)
    if not text:
        return '<span class="muted">(empty)</span>'
    if len(text) <= _ANSWER_PREVIEW:
        return f'<div class="answer">{_e(text)}</div>'
    return (
        f"<details><summary>{_e(text[:_ANSWER_PREVIEW])}…</summary>"
        f'<div class="answer">{_e(text)}</div></details>'
    )


def _shown(value: Any) -> str:
    """A recorded value as text: numbers to 3 decimals, a ``{mean, p50, p95}`` mapping as
    ``mean 1.234, p50 ...``; not escaped yet."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {_shown(item)}" for key, item in value.items())
    return str(value)


def _key_values(rows: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{_e(key)}</th><td>{_e(_shown(value))}</td></tr>" for key, value in rows)
    return f"<table>{cells}</table>"


def _run_facts(run: RunFile) -> list[tuple[str, Any]]:
    facts: list[tuple[str, Any]] = [
        ("suite", run.suite),
        ("model", run.model),
        ("backend", run.backend),
        ("judge", run.judge if run.judge is not None else "none (deterministic metrics only)"),
        ("started at", run.started_at.isoformat()),
        ("dataset hash", run.dataset_hash),
        ("cases", len(run.cases)),
    ]
    facts += [(f"version: {key}", value) for key, value in (run.versions or {}).items()]
    timings = run.timings or {}
    facts += [(f"timing: {key}", value) for key, value in timings.items()]
    return facts


# --- one run ------------------------------------------------------------------------------

_BAR_W, _BAR_H = 200, 14


def _mean_bar(metric: str, mean: float | None) -> str:
    """A bar of the mean on a 0..1 scale."""
    width = 0.0 if mean is None else max(0.0, min(1.0, mean)) * _BAR_W
    label = f"{metric}: mean {_num(mean)}"
    return (
        f'<svg class="chart" data-metric="{_e(metric)}" width="{_BAR_W}" height="{_BAR_H}" '
        f'viewBox="0 0 {_BAR_W} {_BAR_H}" role="img" aria-label="{_e(label)}">'
        f"<title>{_e(label)}</title>"
        f'<rect x="0" y="0" width="{_BAR_W}" height="{_BAR_H}" fill="#eaeef2"/>'
        f'<rect x="0" y="0" width="{width:.1f}" height="{_BAR_H}" fill="#0969da"/>'
        "</svg>"
    )


def _score_cell(score: CaseScore, metric: str) -> str:
    if metric in score.errors:
        return f'<td class="error" title="{_e(score.errors[metric])}">error</td>'
    return f'<td class="num">{_num(score.value(metric))}</td>'


def render_run_html(run: RunFile) -> str:
    """One run as a self-contained HTML page.

    Sections: the run (suite, model, backend, judge, dataset hash, versions and timings
    when recorded); each metric's mean over the cases it applies to, with a bar (an inline
    SVG with ``class="chart"`` and ``data-metric``), the number of cases it scored and of
    cases it could not score; each metric's worst cases (lowest scores, then errors); every
    case's scores, with its answer, timings and error when the run file has outputs.
    """
    means = aggregate(run.cases)
    errors = error_counts(run.cases)
    metrics = _metric_order([*means, *errors])
    outputs = _outputs(run)
    scored = {m: sum(c.value(m) is not None for c in run.cases) for m in metrics}

    body = [f"<h1>Eval run: {_e(run.suite)} on {_e(run.model)}</h1>", _key_values(_run_facts(run))]

    body.append("<h2>Metrics</h2>")
    if not metrics:
        body.append('<p class="muted">No case has a metric.</p>')
    else:
        rows = "".join(
            f'<tr><td>{_e(m)}</td><td class="num">{_num(means.get(m))}</td><td>{_mean_bar(m, means.get(m))}</td>'
            f'<td class="num">{scored[m]}</td><td class="num">{errors.get(m, 0)}</td></tr>'
            for m in metrics
        )
        body.append(
            "<table><thead><tr><th>metric</th><th>mean</th><th>0 – 1</th><th>cases scored</th>"
            f"<th>errors</th></tr></thead><tbody>{rows}</tbody></table>"
        )

    failed = [(case_id, out.get("error")) for case_id, out in outputs.items() if out.get("error")]
    if failed:
        body.append(f"<h2>Failed runs ({len(failed)})</h2>")
        body.append(
            "<table><thead><tr><th>case</th><th>error</th></tr></thead><tbody>"
            + "".join(f'<tr><td class="mono">{_e(c)}</td><td>{_e(err)}</td></tr>' for c, err in failed)
            + "</tbody></table>"
        )

    per_metric = max(1, WORST_CASES // 4)
    worst_sections = []
    for metric in metrics:
        low = sorted(
            (c for c in run.cases if c.value(metric) is not None and c.value(metric) < 1.0 - _EPSILON),
            key=lambda c: (c.value(metric), c.case_id),
        )[:per_metric]
        bad = [c for c in run.cases if metric in c.errors][:per_metric]
        if not low and not bad:
            continue
        rows = "".join(
            f'<tr><td class="mono">{_e(c.case_id)}</td><td class="num">{_num(c.value(metric))}</td>'
            f"<td>{_answer_html(outputs.get(c.case_id, {}).get('answer'))}</td></tr>"
            for c in low
        ) + "".join(
            f'<tr><td class="mono">{_e(c.case_id)}</td><td class="error">error: {_e(c.errors[metric])}</td>'
            f"<td>{_answer_html(outputs.get(c.case_id, {}).get('answer'))}</td></tr>"
            for c in bad
        )
        worst_sections.append(
            f'<h3 data-metric="{_e(metric)}">{_e(metric)}</h3>'
            f'<table class="worst" data-metric="{_e(metric)}"><thead><tr><th>case</th><th>score</th>'
            f"<th>answer</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    body.append("<h2>Worst cases per metric</h2>")
    body += worst_sections or ['<p class="muted">Every scored case has the full score.</p>']

    body.append("<h2>Cases</h2>")
    head = "".join(f"<th>{_e(m)}</th>" for m in metrics)
    extra_head = "<th>answer</th><th>ttft (s)</th><th>total (s)</th><th>backend</th><th>error</th>" if outputs else ""
    rows_html = []
    for case in run.cases:
        cells = "".join(_score_cell(case, m) for m in metrics)
        if outputs:
            out = outputs.get(case.case_id, {})
            ttft, total = out.get("ttft_s"), out.get("total_s")
            cells += (
                f"<td>{_answer_html(out.get('answer'))}</td>"
                f'<td class="num">{_num(ttft) if isinstance(ttft, int | float) else "–"}</td>'
                f'<td class="num">{_num(total) if isinstance(total, int | float) else "–"}</td>'
                f"<td>{_e(out.get('backend') or '–')}</td>"
                + (f'<td class="error">{_e(out["error"])}</td>' if out.get("error") else "<td></td>")
            )
        rows_html.append(f'<tr><td class="mono">{_e(case.case_id)}</td>{cells}</tr>')
    body.append(
        f'<table class="cases"><thead><tr><th>case</th>{head}{extra_head}</tr></thead>'
        f"<tbody>{''.join(rows_html)}</tbody></table>"
    )
    return _document(f"Eval run: {run.suite} on {run.model}", body)


# --- the gate -----------------------------------------------------------------------------

_CHART_W = 420
_LABEL_W = 80
_PLOT_W = _CHART_W - _LABEL_W - 50
_ROW_H = 22


def _x01(value: float) -> float:
    """A 0..1 value's x in the means plot."""
    return _LABEL_W + max(0.0, min(1.0, value)) * _PLOT_W


def _gate_chart(m: MetricVerdict, confidence: float) -> str:
    """One metric: the baseline's and candidate's means on 0..1 (the floor dashed), and the
    delta with its bootstrap interval on a symmetric scale around zero (``-max_drop``
    dashed)."""
    height = _ROW_H * 4 + 26
    label = (
        f"{m.metric}: baseline {_num(m.baseline)}, candidate {_num(m.candidate)}, delta {_num(m.delta, signed=True)}"
        + ("" if m.ci_low is None else f", {confidence:.0%} interval [{_num(m.ci_low, signed=True)}, {_num(m.ci_high, signed=True)}]")
        + f", {m.verdict}"
    )
    parts = [
        f'<svg class="chart" data-metric="{_e(m.metric)}" width="{_CHART_W}" height="{height}" '
        f'viewBox="0 0 {_CHART_W} {height}" role="img" aria-label="{_e(label)}" '
        'font-family="system-ui,sans-serif" font-size="11">',
        f"<title>{_e(label)}</title>",
    ]
    if m.baseline is None or m.candidate is None:
        # Not evaluable (errors) or not applicable (no case of the suite has the metric).
        parts.append(
            f'<text x="{_CHART_W / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" '
            f'fill="{"#9a6700" if m.verdict == "not_evaluable" else "#656d76"}">{_e(m.verdict)}: {_e(m.reason)}</text></svg>'
        )
        return "".join(parts)

    # Means, 0..1.
    for row, (name, value, colour) in enumerate((("baseline", m.baseline, "#8c959f"), ("candidate", m.candidate, "#0969da"))):
        y = 4 + row * _ROW_H
        parts.append(f'<text x="{_LABEL_W - 6}" y="{y + 13}" text-anchor="end">{name}</text>')
        parts.append(f'<rect x="{_LABEL_W}" y="{y}" width="{_PLOT_W}" height="16" fill="#eaeef2"/>')
        parts.append(f'<rect x="{_LABEL_W}" y="{y}" width="{_x01(value) - _LABEL_W:.1f}" height="16" fill="{colour}"/>')
        parts.append(f'<text x="{_LABEL_W + _PLOT_W + 4}" y="{y + 13}">{_num(value)}</text>')
    if m.threshold is not None:
        x = _x01(m.threshold.floor)
        parts.append(
            f'<line class="floor" x1="{x:.1f}" y1="2" x2="{x:.1f}" y2="{2 * _ROW_H + 2}" stroke="#cf222e" '
            f'stroke-dasharray="3,2"><title>floor {_num(m.threshold.floor)}</title></line>'
        )

    # Delta and its interval, on [-span, span].
    values = [abs(v) for v in (m.delta, m.ci_low, m.ci_high) if v is not None]
    if m.threshold is not None:
        values.append(m.threshold.max_drop)
    span = max(0.1, *values) * 1.15
    span = math.ceil(span * 20) / 20  # to 0.05

    def xd(value: float) -> float:
        return _LABEL_W + (value + span) / (2 * span) * _PLOT_W

    y = 4 + 2 * _ROW_H + 10
    mid = y + 8
    parts.append(f'<text x="{_LABEL_W - 6}" y="{mid + 4}" text-anchor="end">delta</text>')
    parts.append(f'<line x1="{_LABEL_W}" y1="{mid}" x2="{_LABEL_W + _PLOT_W}" y2="{mid}" stroke="#d0d7de"/>')
    parts.append(f'<line x1="{xd(0):.1f}" y1="{y - 2}" x2="{xd(0):.1f}" y2="{y + 18}" stroke="#1f2328"/>')
    if m.threshold is not None:
        x = xd(-m.threshold.max_drop)
        parts.append(
            f'<line class="max-drop" x1="{x:.1f}" y1="{y - 2}" x2="{x:.1f}" y2="{y + 18}" stroke="#cf222e" '
            f'stroke-dasharray="3,2"><title>-max_drop {_num(-m.threshold.max_drop, signed=True)}</title></line>'
        )
    colour = {"ok": "#1a7f37", "regressed": "#cf222e"}.get(m.verdict, "#9a6700")
    if m.ci_low is not None and m.ci_high is not None:
        lo, hi = xd(m.ci_low), xd(m.ci_high)
        parts.append(
            f'<g class="interval"><line x1="{lo:.1f}" y1="{mid}" x2="{hi:.1f}" y2="{mid}" stroke="{colour}" stroke-width="3"/>'
            f'<line x1="{lo:.1f}" y1="{mid - 5}" x2="{lo:.1f}" y2="{mid + 5}" stroke="{colour}" stroke-width="2"/>'
            f'<line x1="{hi:.1f}" y1="{mid - 5}" x2="{hi:.1f}" y2="{mid + 5}" stroke="{colour}" stroke-width="2"/></g>'
        )
    if m.delta is not None:
        parts.append(f'<circle class="delta" cx="{xd(m.delta):.1f}" cy="{mid}" r="4" fill="{colour}"/>')
        parts.append(f'<text x="{_LABEL_W + _PLOT_W + 4}" y="{mid + 4}">{_num(m.delta, signed=True)}</text>')
    axis_y = y + 32
    parts.append(f'<text x="{_LABEL_W}" y="{axis_y}" fill="#656d76">{-span:+.2f}</text>')
    parts.append(f'<text x="{xd(0):.1f}" y="{axis_y}" text-anchor="middle" fill="#656d76">0</text>')
    parts.append(f'<text x="{_LABEL_W + _PLOT_W}" y="{axis_y}" text-anchor="end" fill="#656d76">{span:+.2f}</text>')
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class _Drop:
    case_id: str
    metric: str
    baseline: float
    candidate: float

    @property
    def drop(self) -> float:
        return self.baseline - self.candidate


def _drops(result: GateResult, baseline: RunFile, candidate: RunFile) -> list[_Drop]:
    """Every (paired case, gated metric) whose score dropped, largest drop first (ties: the
    report's metric order, then case id)."""
    base, cand = baseline.by_case(), candidate.by_case()
    order = {m.metric: i for i, m in enumerate(result.metrics)}
    drops = []
    for case_id, b in base.items():
        c = cand.get(case_id)
        if c is None:
            continue
        for metric in order:
            bv, cv = b.value(metric), c.value(metric)
            if bv is not None and cv is not None and bv - cv > _EPSILON:
                drops.append(_Drop(case_id=case_id, metric=metric, baseline=bv, candidate=cv))
    drops.sort(key=lambda d: (-d.drop, order[d.metric], d.case_id))
    return drops


def _new_errors(result: GateResult, baseline: RunFile, candidate: RunFile) -> list[tuple[str, str, float | None, str]]:
    """(case, metric, baseline score, candidate's error) for gated metrics the candidate
    could not score on a paired case the baseline did not fail."""
    base, cand = baseline.by_case(), candidate.by_case()
    found = []
    for m in result.metrics:
        for case_id, c in cand.items():
            b = base.get(case_id)
            if b is not None and m.metric in c.errors and m.metric not in b.errors:
                found.append((case_id, m.metric, b.value(m.metric), c.errors[m.metric]))
    return found


def _case_list(ids: Sequence[str], limit: int = 50) -> str:
    shown = ", ".join(f"<code>{_e(case)}</code>" for case in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def render_gate_html(
    result: GateResult, baseline: RunFile, candidate: RunFile, *, worst: int = WORST_CASES
) -> str:
    """The gate's decision on two runs as a self-contained HTML page.

    Sections: the verdict (PASS, REGRESSION or COULD NOT EVALUATE, with the exit code and
    the statistic); the two runs; a chart per gated metric that applies to the suite (an inline SVG with
    ``class="chart"`` and ``data-metric``: the two means with the floor, and the mean paired
    difference with its bootstrap interval and ``-max_drop``); the table of
    :func:`eval.gate.render_markdown` (metric, baseline, candidate, delta, interval, cases,
    errors, verdict) and each verdict's reason; the cases only one run has; the worst
    regressed cases (the ``worst`` largest per-case drops on gated metrics, with both
    scores and, when the run files have outputs, both answers); the gated metrics the
    candidate could not score where the baseline could.

    Args:
        result: what :func:`eval.gate.compare` decided on these two runs.
        baseline: the baseline's run file.
        candidate: the candidate's run file.
        worst: how many dropped cases to list.
    """
    outcome, css = _OUTCOMES[result.exit_code]
    stat = result.statistic
    conf = f"{stat.confidence:.0%}"
    body = [
        f"<h1>Eval gate: {_e(candidate.model)} against {_e(baseline.model)} on {_e(candidate.suite)}</h1>",
        f'<p><span class="verdict {css}" id="verdict">{outcome}</span> '
        f"exit {result.exit_code}; {result.paired_cases} paired cases; paired percentile bootstrap of the mean "
        f"difference, {conf} interval, {stat.resamples} resamples, seed {stat.seed}.</p>",
    ]
    regressed = [m.metric for m in result.metrics if m.verdict == "regressed"]
    unevaluable = [m.metric for m in result.metrics if m.verdict == "not_evaluable"]
    if regressed:
        body.append(f"<p>Regressed: {', '.join(f'<strong>{_e(m)}</strong>' for m in regressed)}.</p>")
    if result.paired_cases == 0:
        body.append("<p>The two runs have no case in common: nothing could be compared.</p>")
    elif unevaluable:
        body.append(
            "<p>Not evaluable (no case has the metric in both runs, and some could not be scored): "
            f"{', '.join(f'<strong>{_e(m)}</strong>' for m in unevaluable)}.</p>"
        )
    inapplicable = [m.metric for m in result.metrics if m.verdict == "not_applicable"]
    if inapplicable and result.paired_cases:
        body.append(
            '<p class="muted">Not applicable (no case of these runs has the metric; not gated): '
            f"{', '.join(_e(m) for m in inapplicable)}.</p>"
        )

    body.append("<h2>Runs</h2>")
    facts = [dict(_run_facts(baseline)), dict(_run_facts(candidate))]
    keys = list(dict.fromkeys([*facts[0], *facts[1]]))
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(_shown(facts[0].get(k, '–')))}</td><td>{_e(_shown(facts[1].get(k, '–')))}</td></tr>"
        for k in keys
    )
    body.append(f"<table><thead><tr><th></th><th>baseline</th><th>candidate</th></tr></thead><tbody>{rows}</tbody></table>")

    body.append("<h2>Metrics</h2>")
    if result.metrics:
        body.append(
            '<p class="muted">Bars: mean over the paired cases that have the metric (dashed red: the floor). '
            f"Delta: mean per-case difference, candidate minus baseline, with its {conf} bootstrap interval "
            "(dashed red: minus the largest allowed drop).</p>"
        )
        body.append(
            '<div class="charts">'
            + "".join(
                f'<div class="chart-box"><h3>{_e(m.metric)}</h3>{_gate_chart(m, stat.confidence)}</div>'
                for m in result.metrics
                # A metric no case of the suite has (recall on a chat suite) gets a table row, not a chart.
                if m.verdict != "not_applicable"
            )
            + "</div>"
        )
        rows = "".join(
            f'<tr data-metric="{_e(m.metric)}"><td>{_e(m.metric)}</td><td class="num">{_num(m.baseline)}</td>'
            f'<td class="num">{_num(m.candidate)}</td><td class="num">{_num(m.delta, signed=True)}</td>'
            f"<td>{'–' if m.ci_low is None else f'[{_num(m.ci_low, signed=True)}, {_num(m.ci_high, signed=True)}]'}</td>"
            f'<td class="num">{m.cases}</td><td class="num">{m.baseline_errors}/{m.candidate_errors}</td>'
            f'<td class="num">{"–" if m.threshold is None else _num(m.threshold.floor)}</td>'
            f'<td class="num">{"–" if m.threshold is None else _num(m.threshold.max_drop)}</td>'
            f'<td class="{_e(m.verdict)}">{_e(m.verdict)}</td><td>{_e(m.reason)}</td></tr>'
            for m in result.metrics
        )
        body.append(
            '<table class="metrics"><thead><tr><th>metric</th><th>baseline</th><th>candidate</th><th>delta</th>'
            f"<th>{conf} interval</th><th>cases</th><th>errors (b/c)</th><th>floor</th><th>max drop</th>"
            f"<th>verdict</th><th>reason</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        body.append('<p class="muted">No metric is gated.</p>')
    if result.missing_in_candidate:
        body.append(
            f"<p>Missing in the candidate ({len(result.missing_in_candidate)}): {_case_list(result.missing_in_candidate)}</p>"
        )
    if result.missing_in_baseline:
        body.append(
            f"<p>Missing in the baseline ({len(result.missing_in_baseline)}): {_case_list(result.missing_in_baseline)}</p>"
        )
    if result.untracked:
        body.append(f"<p>Not gated (no threshold): {', '.join(_e(m) for m in result.untracked)}</p>")

    drops = _drops(result, baseline, candidate)
    base_out, cand_out = _outputs(baseline), _outputs(candidate)
    with_answers = bool(base_out or cand_out)
    body.append("<h2>Worst regressed cases</h2>")
    if not drops:
        body.append('<p class="muted">No paired case scored lower on a gated metric.</p>')
    else:
        shown = drops[: max(0, worst)]
        body.append(
            f"<p>The largest per-case drops on gated metrics: {len(shown)} of {len(drops)} "
            "(case, metric) pairs that dropped.</p>"
        )
        head = "<th>case</th><th>metric</th><th>baseline</th><th>candidate</th><th>drop</th>"
        if with_answers:
            head += "<th>baseline answer</th><th>candidate answer</th>"
        rows = []
        for d in shown:
            cells = (
                f'<td class="mono">{_e(d.case_id)}</td><td>{_e(d.metric)}</td><td class="num">{_num(d.baseline)}</td>'
                f'<td class="num">{_num(d.candidate)}</td><td class="num">{_num(-d.drop, signed=True)}</td>'
            )
            if with_answers:
                cells += (
                    f"<td>{_answer_html(base_out.get(d.case_id, {}).get('answer'))}</td>"
                    f"<td>{_answer_html(cand_out.get(d.case_id, {}).get('answer'))}</td>"
                )
            rows.append(f'<tr data-case="{_e(d.case_id)}" data-metric="{_e(d.metric)}">{cells}</tr>')
        body.append(f'<table class="worst"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')

    errors = _new_errors(result, baseline, candidate)
    if errors:
        body.append(f"<h2>Candidate errors ({len(errors)})</h2>")
        body.append(
            "<p>Gated metrics the candidate could not score on cases the baseline scored"
            f"{'' if len(errors) <= worst else f' (the first {max(0, worst)})'}.</p>"
        )
        rows = "".join(
            f'<tr><td class="mono">{_e(case_id)}</td><td>{_e(metric)}</td><td class="num">{_num(score)}</td>'
            f'<td class="error">{_e(message)}</td>'
            + (f"<td>{_answer_html(cand_out.get(case_id, {}).get('answer'))}</td>" if with_answers else "")
            + "</tr>"
            for case_id, metric, score, message in errors[: max(0, worst)]
        )
        head = "<th>case</th><th>metric</th><th>baseline</th><th>candidate error</th>"
        head += "<th>candidate answer</th>" if with_answers else ""
        body.append(f'<table class="errors"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>')

    return _document(f"Eval gate: {outcome}: {candidate.model} against {baseline.model}", body)
