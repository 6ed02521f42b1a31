"""eval.run: which metric applies to which case, failed runs as errors, the run file.

No services: the cases run through a runner written here (the runner interface is what
``eval`` defines for this; the serving layer's runner is tested in
tests/serving/test_eval_runner.py against real backends).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from eval.datasets import Case, Suite, SuiteConfig, hash_dataset
from eval.metrics import (
    CITATIONS_VALID,
    FACTS_CONTAINED,
    LATENCY_WITHIN,
    MRR,
    NO_ANSWER_DETECTED,
    RECALL_AT_K,
    TOOLS_MATCH,
    LatencySla,
    aggregate,
    error_counts,
)
from eval.run import ANSWER_CHARS, run_suite, score_case
from eval.runner import CaseOutput, CaseRequest, CaseRunner
from eval.runs import load_run, write_run


def _suite(graph: str, cases: list[Case], *, collection: str | None = None) -> Suite:
    config = SuiteConfig(name=f"test-{graph}", graph=graph, collection=collection)  # type: ignore[arg-type]
    return Suite(config=config, directory=Path("."), cases=tuple(cases), corpus=None, hash=hash_dataset(cases))


class ScriptedRunner:
    """A runner answering each case id with a prepared output (an exception is raised)."""

    def __init__(self, outputs: Mapping[str, CaseOutput | Exception]) -> None:
        self.outputs = outputs
        self.requests: list[CaseRequest] = []

    @property
    def model(self) -> str:
        return "scripted-model"

    @property
    def backend_version(self) -> str:
        return "scripted (v1)"

    async def ensure_corpus(self, suite: Suite, collection: str) -> None:
        raise AssertionError("a suite without a corpus ingests nothing")

    async def run_case(self, request: CaseRequest) -> CaseOutput:
        self.requests.append(request)
        output = self.outputs[request.case.id]
        if isinstance(output, Exception):
            raise output
        return output


RAG_CASES = [
    Case(id="hit", input="q1", expected_facts=["2.1 metres", "Berth 9"], expected_sources=["a.md"]),
    Case(id="late-hit", input="q2", expected_facts=["１，２３４ 元"], expected_sources=["b.md"]),
    Case(id="none", input="q3", expect_no_answer=True),
    Case(id="down", input="q4", expected_facts=["x"], expected_sources=["a.md"]),
]


def test_runner_written_here_is_a_case_runner() -> None:
    assert isinstance(ScriptedRunner({}), CaseRunner)


def test_rag_case_scores() -> None:
    suite = _suite("rag", RAG_CASES)
    output = CaseOutput(
        answer="Neap range is 2.1 metres [1]; berth 9 is deepest [2] and [7].",
        retrieved_ids=["a.md", "c.md", "a.md", "d.md", "e.md"],
        contexts=["one", "two", "three"],
    )
    score = score_case(suite, RAG_CASES[0], output, sla=None)
    assert score.values == {RECALL_AT_K: 1.0, MRR: 1.0, FACTS_CONTAINED: 1.0, CITATIONS_VALID: 2 / 3}
    assert score.errors == {}


def test_recall_k_and_normalised_facts() -> None:
    suite = _suite("rag", RAG_CASES)
    output = CaseOutput(answer="It costs 1,234 元 [1].", retrieved_ids=["a", "c", "d", "e", "b.md"], contexts=["x"])
    score = score_case(suite, RAG_CASES[1], output, sla=None)
    assert score.values[RECALL_AT_K] == 0.0  # fifth: past k = 4
    assert score.values[MRR] == pytest.approx(0.2)
    assert score.values[FACTS_CONTAINED] == 1.0
    assert score_case(suite, RAG_CASES[1], output, sla=None, k=5).values[RECALL_AT_K] == 1.0


def test_no_answer_case() -> None:
    suite = _suite("rag", RAG_CASES)
    said = score_case(suite, RAG_CASES[2], CaseOutput(answer="I don't know."), sla=None)
    assert said.values == {CITATIONS_VALID: None, NO_ANSWER_DETECTED: 1.0}
    made_up = score_case(suite, RAG_CASES[2], CaseOutput(answer="It is 42 [1].", contexts=["c"]), sla=None)
    assert made_up.values == {CITATIONS_VALID: 1.0, NO_ANSWER_DETECTED: 0.0}


def test_failed_run_is_an_error_on_every_applicable_metric() -> None:
    suite = _suite("rag", RAG_CASES)
    sla = LatencySla(ttft_s=1.0)
    score = score_case(suite, RAG_CASES[3], CaseOutput(error="backend down"), sla=sla)
    applicable = {RECALL_AT_K, MRR, FACTS_CONTAINED, CITATIONS_VALID, LATENCY_WITHIN}
    assert set(score.errors) == applicable
    assert all("backend down" in reason for reason in score.errors.values())
    assert score.values == dict.fromkeys(applicable)


def test_agent_and_chat_metrics() -> None:
    agent = _suite("agent", [])
    case = Case(
        id="calc",
        input="4837 * 2915?",
        expected_facts=["14099855"],
        expected_tools=[{"name": "calculator", "args": {"expression": "4837 * 2915"}}],  # type: ignore[list-item]
    )
    called = CaseOutput(answer="14,099,855", tool_calls=[{"name": "calculator", "args": {"expression": "4837 * 2915"}}])
    assert score_case(agent, case, called, sla=None).values == {FACTS_CONTAINED: 1.0, TOOLS_MATCH: 1.0}
    assert score_case(agent, case, CaseOutput(answer="about 14 million"), sla=None).values[TOOLS_MATCH] == 0.0
    small_talk = Case(id="hi", input="hello")
    assert score_case(agent, small_talk, CaseOutput(answer="hi"), sla=None).values == {TOOLS_MATCH: 1.0}
    chat = _suite("chat", [])
    assert score_case(chat, Case(id="c", input="2+2?", expected_facts=["4"]), CaseOutput(answer="4"), sla=None).values == {
        FACTS_CONTAINED: 1.0
    }


def test_latency_against_the_sla() -> None:
    chat = _suite("chat", [])
    case = Case(id="c", input="hi", expected_facts=["hi"])
    sla = LatencySla(ttft_s=0.5, total_s=2.0)
    fast = CaseOutput(answer="hi", ttft_s=0.1, total_s=1.0)
    slow_first = CaseOutput(answer="hi", ttft_s=0.9, total_s=1.0)
    nothing = CaseOutput(answer="", ttft_s=None, total_s=0.1)
    assert score_case(chat, case, fast, sla=sla).values[LATENCY_WITHIN] == 1.0
    assert score_case(chat, case, slow_first, sla=sla).values[LATENCY_WITHIN] == 0.0
    assert score_case(chat, case, nothing, sla=sla).values[LATENCY_WITHIN] == 0.0
    assert LATENCY_WITHIN not in score_case(chat, case, fast, sla=None).values


async def test_run_suite_scores_counts_errors_and_round_trips(tmp_path: Path) -> None:
    suite = _suite("rag", RAG_CASES, collection="docs")
    long_answer = "Neap 2.1 metres, berth 9 [1]. " + "x" * 3000
    runner = ScriptedRunner(
        {
            "hit": CaseOutput(
                answer=long_answer, retrieved_ids=["a.md"], contexts=["a"], ttft_s=0.2, total_s=1.0, backend="b1"
            ),
            "late-hit": CaseOutput(answer="1,234 元 [1]", retrieved_ids=["b.md"], contexts=["b"], ttft_s=0.4, total_s=2.0, backend="b1"),
            "none": CaseOutput(answer="I do not know.", ttft_s=0.1, total_s=0.5, backend="b1"),
            "down": RuntimeError("connection refused"),  # a runner that raises is still scored as errors
        }
    )
    seen: list[tuple[int, int]] = []
    run = await run_suite(suite, runner, seed=11, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [r.seed for r in runner.requests] == [11] * 4
    assert {r.collection for r in runner.requests} == {"docs"}
    assert run.suite == "test-rag" and run.dataset_hash == suite.hash and run.model == "scripted-model"
    assert run.backend == "scripted (v1)" and run.judge is None
    means = aggregate(run.cases)
    assert means[FACTS_CONTAINED] == 1.0 and means[RECALL_AT_K] == 1.0 and means[NO_ANSWER_DETECTED] == 1.0
    assert error_counts(run.cases) == {RECALL_AT_K: 1, MRR: 1, FACTS_CONTAINED: 1, CITATIONS_VALID: 1}
    assert run.outputs is not None
    assert len(run.outputs["hit"]["answer"]) == ANSWER_CHARS and run.outputs["hit"]["answer_chars"] == len(long_answer)
    assert "connection refused" in run.outputs["down"]["error"]
    assert run.timings is not None
    assert run.timings["failed_cases"] == 1
    assert run.timings["ttft_s"]["p50"] == pytest.approx(0.2)
    assert run.timings["case_total_s"]["mean"] == pytest.approx(3.5 / 3, abs=1e-3)
    assert run.versions is not None and run.versions["backend"] == "scripted (v1)"
    path = tmp_path / "run.json"
    write_run(run, path)
    assert load_run(path) == run


class _Judge:
    name = "judge-alias"

    def __init__(self) -> None:
        self.scored: list[str] = []

    async def score(self, case: Case, output: CaseOutput) -> tuple[dict[str, float | None], dict[str, str]]:
        self.scored.append(case.id)
        if case.id == "b":
            raise ValueError("unparseable JSON")
        return {"correctness": 0.5, "answer_relevancy": None}, {"answer_relevancy": "judge said nothing"}


async def test_judge_values_and_errors() -> None:
    cases = [Case(id=i, input="hi", expected_facts=["hi"]) for i in ("a", "b", "c")]
    runner = ScriptedRunner(
        {"a": CaseOutput(answer="hi"), "b": CaseOutput(answer="hi"), "c": CaseOutput(error="backend down")}
    )
    judge = _Judge()
    run = await run_suite(_suite("chat", cases), runner, judge=judge)
    assert run.judge == "judge-alias"
    assert judge.scored == ["a", "b"]  # a failed run is not judged
    by_case = run.by_case()
    assert by_case["a"].values["correctness"] == 0.5 and by_case["a"].errors == {"answer_relevancy": "judge said nothing"}
    assert "unparseable JSON" in by_case["b"].errors["correctness"]
    assert set(by_case["c"].errors) == {FACTS_CONTAINED, "answer_relevancy", "correctness"}


def test_old_run_files_without_outputs_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(
        '{"format": 1, "suite": "rag", "dataset_hash": "h", "model": "m", "backend": "b", '
        '"started_at": "2026-12-01T00:00:00Z", "cases": [{"case_id": "x", "values": {"mrr": 1.0}}]}'
    )
    run = load_run(path)
    assert run.outputs is None and run.versions is None
