"""The HTML reports: parsed back with ``html.parser``, they hold one chart per metric, the
gate's verdict, the worst cases in order of their drop, and every string of a run file
escaped (case ids and answers are user data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any

import pytest

from eval.gate import MetricThreshold, StatisticSettings, Thresholds, compare
from eval.metrics import FACTS_CONTAINED, LATENCY_WITHIN, MRR, CaseScore
from eval.report import render_gate_html, render_run_html
from eval.runs import RunFile

HOSTILE = """<script>alert("x")</script>'&"""
"""A case id, answer and error message that break unescaped HTML."""

_VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr", "area", "base", "source"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    def find_all(self, tag: str, **attrs: str) -> list[Element]:
        found = []
        for child in self.children:
            if child.tag == tag and all(child.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                found.append(child)
            found += child.find_all(tag, **attrs)
        return found

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()

    def all_text(self) -> str:
        return self.text + "".join(child.all_text() for child in self.children)


class _TreeBuilder(HTMLParser):
    """A strict tree: every element closed in order (a broken document fails the test)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]
        self.starts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append(tag)
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append(tag)
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def parse(document: str) -> _TreeBuilder:
    builder = _TreeBuilder()
    builder.feed(document)
    builder.close()
    assert [e.tag for e in builder.stack] == ["#root"], "unclosed elements"
    return builder


def assert_self_contained(document: str) -> None:
    parsed = parse(document)
    assert "script" not in parsed.starts
    assert "link" not in parsed.starts
    assert "img" not in parsed.starts
    assert "http://" not in document and "https://" not in document
    assert "@import" not in document and "url(" not in document


def run_file(model: str, cases: list[CaseScore], outputs: dict[str, dict[str, Any]] | None = None, **extra: Any) -> RunFile:
    """A run file of suite ``rag``; ``outputs``, ``versions`` and ``timings`` when given."""
    return RunFile(
        suite="rag",
        dataset_hash="sha256:same",
        model=model,
        backend=f"{model}-backend",
        started_at=datetime(2026, 12, 2, tzinfo=UTC),
        judge=None,
        cases=cases,
        outputs=outputs,
        **extra,
    )


THRESHOLDS = Thresholds(
    statistic=StatisticSettings(confidence=0.95, resamples=500, seed=1),
    metrics={
        FACTS_CONTAINED: MetricThreshold(floor=0.5, max_drop=0.05),
        MRR: MetricThreshold(floor=0.3, max_drop=0.05),
        LATENCY_WITHIN: MetricThreshold(floor=0.5, max_drop=0.1),
    },
)


def _scores(facts: list[float], mrr: list[float]) -> list[CaseScore]:
    return [
        CaseScore(case_id=f"case-{i:02d}", values={FACTS_CONTAINED: f, MRR: r, LATENCY_WITHIN: 1.0})
        for i, (f, r) in enumerate(zip(facts, mrr, strict=True))
    ]


# --- the gate report ----------------------------------------------------------------------


def test_gate_report_of_a_regression_has_a_chart_per_metric_the_verdict_and_worst_cases_by_drop() -> None:
    n = 30
    base = run_file("base", _scores([1.0] * n, [1.0] * n))
    # facts drop on cases 0..9 by 1.0, 0.75, 0.5 ...; mrr drops 0.5 on case 20.
    facts = [1.0] * n
    for i, value in enumerate([0.0, 0.25, 0.5, 0.0, 0.25, 0.5, 0.0, 0.25, 0.5, 0.75]):
        facts[i] = value
    mrr = [1.0] * n
    mrr[20] = 0.5
    cand = run_file("cand", _scores(facts, mrr))
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    assert result.exit_code == 1
    document = render_gate_html(result, base, cand)
    assert_self_contained(document)
    tree = parse(document).root

    charts = [svg for svg in tree.find_all("svg") if svg.has_class("chart")]
    assert sorted(svg.attrs["data-metric"] for svg in charts) == sorted(THRESHOLDS.metrics)
    facts_chart = next(svg for svg in charts if svg.attrs["data-metric"] == FACTS_CONTAINED)
    assert facts_chart.find_all("g", **{"class": "interval"}), "the bootstrap interval is drawn"
    assert facts_chart.find_all("circle", **{"class": "delta"})

    verdict = tree.find_all("span", id="verdict")
    assert [v.all_text() for v in verdict] == ["REGRESSION"]

    rows = {row.attrs["data-metric"]: row for row in tree.find_all("tr") if "data-metric" in row.attrs and "data-case" not in row.attrs}
    cells = [td.all_text() for td in rows[FACTS_CONTAINED].find_all("td")]
    assert cells[0] == FACTS_CONTAINED
    assert cells[1] == "1.000"
    assert "regressed" in cells
    assert "ok" in [td.all_text() for td in rows[LATENCY_WITHIN].find_all("td")]

    worst = [(row.attrs["data-case"], row.attrs["data-metric"]) for row in tree.find_all("tr") if "data-case" in row.attrs]
    drops = [1.0, 1.0, 1.0, 0.75, 0.75, 0.75, 0.5, 0.5, 0.5, 0.5, 0.25]
    assert len(worst) == len(drops)
    by_case = {**base.by_case()}
    got = [by_case[c].value(m) - cand.by_case()[c].value(m) for c, m in worst]  # type: ignore[operator]
    assert got == sorted(got, reverse=True) == drops
    # Ties keep the table's metric order, then the case id.
    assert worst[:3] == [("case-00", FACTS_CONTAINED), ("case-03", FACTS_CONTAINED), ("case-06", FACTS_CONTAINED)]
    assert ("case-20", MRR) in worst[6:10]


def test_gate_report_limits_the_worst_cases() -> None:
    base = run_file("base", _scores([1.0] * 30, [1.0] * 30))
    cand = run_file("cand", _scores([0.0] * 30, [1.0] * 30))
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    tree = parse(render_gate_html(result, base, cand, worst=5)).root
    assert len([row for row in tree.find_all("tr") if "data-case" in row.attrs]) == 5
    assert "5 of 30" in tree.all_text()


def test_gate_report_escapes_case_ids_answers_and_names() -> None:
    case_ids = [HOSTILE, "case-1"]
    base = run_file(
        '"base<b>',
        [CaseScore(case_id=c, values={FACTS_CONTAINED: 1.0, MRR: 1.0, LATENCY_WITHIN: 1.0}) for c in case_ids],
        outputs={c: {"answer": f"good {HOSTILE}", "ttft_s": 0.1, "total_s": 0.5, "backend": "b", "error": None} for c in case_ids},
    )
    cand = run_file(
        "cand",
        [
            CaseScore(case_id=HOSTILE, values={FACTS_CONTAINED: 0.0, MRR: 1.0, LATENCY_WITHIN: 1.0}),
            CaseScore(case_id="case-1", values={MRR: 1.0, LATENCY_WITHIN: 1.0}, errors={FACTS_CONTAINED: HOSTILE}),
        ],
        outputs={
            HOSTILE: {"answer": f"bad {HOSTILE}", "ttft_s": 0.1, "total_s": 0.5, "backend": "c", "error": None},
            "case-1": {"answer": "", "ttft_s": None, "total_s": None, "backend": None, "error": HOSTILE},
        },
    )
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    document = render_gate_html(result, base, cand)
    assert "<script>" not in document
    assert_self_contained(document)
    parsed = parse(document)
    text = parsed.root.all_text()
    assert HOSTILE in text  # shown as text, intact
    assert f"good {HOSTILE}" in text and f"bad {HOSTILE}" in text
    assert '"base<b>' in text
    worst = [row for row in parsed.root.find_all("tr") if "data-case" in row.attrs]
    assert [row.attrs["data-case"] for row in worst] == [HOSTILE]  # the attribute round-trips
    errors = parsed.root.find_all("table", **{"class": "errors"})
    assert len(errors) == 1 and HOSTILE in errors[0].all_text() and "case-1" in errors[0].all_text()


def test_gate_report_with_no_paired_case_could_not_evaluate() -> None:
    base = run_file("base", _scores([1.0] * 3, [1.0] * 3))
    cand = run_file("cand", [CaseScore(case_id="other", values={FACTS_CONTAINED: 1.0})])
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    assert result.exit_code == 2
    document = render_gate_html(result, base, cand)
    assert_self_contained(document)
    tree = parse(document).root
    assert [v.all_text() for v in tree.find_all("span", id="verdict")] == ["COULD NOT EVALUATE"]
    charts = [svg for svg in tree.find_all("svg") if svg.has_class("chart")]
    # A chart for each metric but those no case has (not_applicable, a table row only).
    assert [svg.attrs["data-metric"] for svg in charts] == [m.metric for m in result.metrics if m.verdict != "not_applicable"]
    assert all("no case" in svg.all_text() for svg in charts)
    assert len(tree.find_all("tr", data_metric=FACTS_CONTAINED)) == 1
    assert "no case in common" in tree.all_text()
    assert "No paired case scored lower" in tree.all_text()
    assert "other" in tree.all_text()  # missing in the baseline, listed


def test_gate_report_of_an_unevaluable_metric_and_of_a_pass() -> None:
    def dead(model: str) -> RunFile:
        return run_file(
            model,
            [
                CaseScore(case_id=f"c{i}", values={FACTS_CONTAINED: 1.0, MRR: 1.0}, errors={LATENCY_WITHIN: "no token came"})
                for i in range(5)
            ],
        )

    base, cand = dead("base"), dead("cand")
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    assert result.exit_code == 2  # latency_within: no case has it in both runs
    tree = parse(render_gate_html(result, base, cand)).root
    assert [v.all_text() for v in tree.find_all("span", id="verdict")] == ["COULD NOT EVALUATE"]
    assert "Not evaluable" in tree.all_text()
    chart = next(svg for svg in tree.find_all("svg") if svg.attrs.get("data-metric") == LATENCY_WITHIN)
    assert "not_evaluable" in chart.all_text()
    assert not tree.find_all("table", **{"class": "errors"})  # the baseline failed them too

    passing = Thresholds(metrics={FACTS_CONTAINED: THRESHOLDS.metrics[FACTS_CONTAINED]})
    result = compare(base.by_case(), base.by_case(), passing)
    tree = parse(render_gate_html(result, base, base)).root
    assert [v.all_text() for v in tree.find_all("span", id="verdict")] == ["PASS"]
    assert [svg.attrs["data-metric"] for svg in tree.find_all("svg") if svg.has_class("chart")] == [FACTS_CONTAINED]
    assert MRR in tree.all_text()  # untracked, listed


def test_gate_report_charts_only_the_metrics_a_suite_has() -> None:
    chat = [CaseScore(case_id=f"c{i}", values={FACTS_CONTAINED: 1.0}) for i in range(10)]
    base, cand = run_file("base", chat), run_file("cand", chat)
    result = compare(base.by_case(), cand.by_case(), THRESHOLDS)
    assert result.exit_code == 0
    tree = parse(render_gate_html(result, base, cand)).root
    assert [v.all_text() for v in tree.find_all("span", id="verdict")] == ["PASS"]
    assert [svg.attrs["data-metric"] for svg in tree.find_all("svg") if svg.has_class("chart")] == [FACTS_CONTAINED]
    rows = {tr.attrs["data-metric"]: tr for tr in tree.find_all("tr") if "data-metric" in tr.attrs}
    assert set(rows) == set(THRESHOLDS.metrics)  # every gated metric has its row
    assert "not_applicable" in rows[MRR].all_text()
    assert "Not applicable" in tree.all_text()


# --- the run report -----------------------------------------------------------------------


def test_run_report_has_a_bar_and_error_count_per_metric_and_the_worst_cases() -> None:
    cases = [
        CaseScore(case_id="a", values={FACTS_CONTAINED: 1.0, MRR: 0.5, "correctness": 0.9, "zz_custom": 1.0, "faithfulness": 1.0}),
        CaseScore(case_id="b", values={FACTS_CONTAINED: 0.0, MRR: None}, errors={"correctness": "judge: unparseable JSON"}),
        CaseScore(case_id="c", values={FACTS_CONTAINED: 0.5, MRR: 1.0}, errors={"correctness": "judge: timeout"}),
    ]
    run = run_file("local", cases)
    document = render_run_html(run)
    assert_self_contained(document)
    tree = parse(document).root
    charts = [svg for svg in tree.find_all("svg") if svg.has_class("chart")]
    # Deterministic metrics in report order, the judged ones in theirs, then others by name.
    assert [svg.attrs["data-metric"] for svg in charts] == [MRR, FACTS_CONTAINED, "faithfulness", "correctness", "zz_custom"]
    metrics_table = tree.find_all("table")[1]
    rows = {tr.find_all("td")[0].all_text(): [td.all_text() for td in tr.find_all("td")] for tr in metrics_table.find_all("tr")[1:]}
    assert rows[FACTS_CONTAINED][1] == "0.500" and rows[FACTS_CONTAINED][3:] == ["3", "0"]
    assert rows[MRR][1] == "0.750" and rows[MRR][3:] == ["2", "0"]
    assert rows["correctness"][1] == "0.900" and rows["correctness"][3:] == ["1", "2"]

    worst = {t.attrs["data-metric"]: t for t in tree.find_all("table", **{"class": "worst"})}
    facts_rows = [tr.find_all("td")[0].all_text() for tr in worst[FACTS_CONTAINED].find_all("tr")[1:]]
    assert facts_rows == ["b", "c"]  # lowest first; a full score is not a worst case
    assert "judge: unparseable JSON" in worst["correctness"].all_text()

    case_rows = tree.find_all("table", **{"class": "cases"})[0].find_all("tr")[1:]
    assert [tr.find_all("td")[0].all_text() for tr in case_rows] == ["a", "b", "c"]
    b_cells = case_rows[1].find_all("td")
    correctness = b_cells[1 + 3]  # case id, mrr, facts, faithfulness, correctness
    assert correctness.has_class("error") and correctness.attrs["title"] == "judge: unparseable JSON"


def test_run_report_escapes_and_shows_outputs_and_failed_runs() -> None:
    long_answer = "x" * 300 + HOSTILE
    run = run_file(
        HOSTILE,
        [
            CaseScore(case_id=HOSTILE, values={FACTS_CONTAINED: 0.0}),
            CaseScore(case_id="ok", values={FACTS_CONTAINED: 1.0}),
        ],
        outputs={
            HOSTILE: {"answer": long_answer, "ttft_s": None, "total_s": 2.0, "backend": HOSTILE, "error": HOSTILE},
            "ok": {"answer": "fine", "ttft_s": 0.25, "total_s": 1.0, "backend": "local", "error": None},
        },
        versions={"switchyard": "0.1", HOSTILE: HOSTILE},
        timings={"total_s": 3.0, "ttft_s": {"mean": 0.25, "p50": 0.2, "p95": 0.5}},
    )
    document = render_run_html(run)
    assert "<script>" not in document
    assert_self_contained(document)
    tree = parse(document).root
    text = tree.all_text()
    assert text.count(HOSTILE) >= 5  # model, case id, answer, backend, error, version
    details = tree.find_all("details")
    assert any(long_answer in d.all_text() for d in details)  # a long answer folds, whole
    assert "Failed runs (1)" in text
    assert "0.250" in text and "switchyard" in text and "timing: total_s" in text
    assert "mean 0.250, p50 0.200, p95 0.500" in text


def test_run_report_of_an_empty_run() -> None:
    document = render_run_html(run_file("local", []))
    assert_self_contained(document)
    tree = parse(document).root
    assert not [svg for svg in tree.find_all("svg")]
    assert "No case has a metric" in tree.all_text()


@pytest.mark.parametrize("exit_code", [0, 1, 2])
def test_gate_report_title_names_the_outcome(exit_code: int) -> None:
    base = run_file("base", _scores([1.0] * 30, [1.0] * 30))
    if exit_code == 0:
        cand, thresholds = base, THRESHOLDS
    elif exit_code == 1:
        cand, thresholds = run_file("cand", _scores([0.0] * 30, [1.0] * 30)), THRESHOLDS
    else:
        cand, thresholds = run_file("cand", []), THRESHOLDS
    result = compare(base.by_case(), cand.by_case(), thresholds)
    assert result.exit_code == exit_code
    title = parse(render_gate_html(result, base, cand)).root.find_all("title")[0].all_text()
    assert title.startswith(f"Eval gate: {['PASS', 'REGRESSION', 'COULD NOT EVALUATE'][exit_code]}")
