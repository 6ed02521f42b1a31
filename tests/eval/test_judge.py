"""The DeepEval judge: known scores from a scripted judge, failures as scored errors, the
real local model returning parseable verdicts, and DeepEval's tool correctness."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eval.datasets import Case
from eval.judge import (
    ANSWER_RELEVANCY,
    CORRECTNESS,
    FAITHFULNESS,
    JUDGED_METRICS,
    Judge,
    configure_deepeval,
    tool_correctness,
)
from eval.runner import CaseOutput
from gateway import Backend, ModelGateway, load_registry
from tests.fakes import judge_backend
from tests.fakes.judge_backend import run_judge_backend, write_judge_models_file
from tests.fakes.openai_backend import free_port

REPO = Path(__file__).resolve().parents[2]

CASE = Case(id="tides-1", input="What is the spring tidal range at Verrin Harbor?", expected_facts=["5.8 metres"])
OUTPUT = CaseOutput(
    answer="The spring tidal range at Verrin Harbor is 5.8 metres [1].",
    contexts=["Verrin Harbor tide table. At spring tides the range between high and low water is 5.8 metres."],
)
NO_ANSWER_CASE = Case(id="tides-x", input="Who founded Verrin Harbor?", expect_no_answer=True)


@pytest.fixture(scope="module", autouse=True)
def _deepeval(tmp_path_factory: pytest.TempPathFactory) -> None:
    configure_deepeval(tmp_path_factory.mktemp("deepeval-work"))


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with run_judge_backend() as url:
        yield url


@pytest.fixture
async def gateway(judge_url: str, tmp_path: Path) -> AsyncIterator[ModelGateway]:
    gateway = ModelGateway(load_registry(write_judge_models_file(tmp_path / "models.yaml", judge_url, free_port())))
    yield gateway
    await gateway.aclose()


def test_configure_deepeval_sets_its_environment_and_is_idempotent(tmp_path: Path) -> None:
    before = dict(os.environ)
    configure_deepeval(tmp_path)  # a later call keeps the first directory
    assert dict(os.environ) == before
    assert os.environ["DEEPEVAL_TELEMETRY_OPT_OUT"] == "YES"
    assert os.environ["DEEPEVAL_DISABLE_DOTENV"] == "1"
    assert os.environ["ENABLE_DEEPEVAL_CACHE"] == "NO"
    hidden = Path(os.environ["DEEPEVAL_CACHE_FOLDER"])
    assert hidden.is_absolute() and hidden.name == ".deepeval"
    assert REPO not in hidden.parents
    assert "CONFIDENT_API_KEY" not in os.environ

    from deepeval.constants import HIDDEN_DIR

    assert Path(HIDDEN_DIR) == hidden


async def test_scripted_judge_gives_known_scores(gateway: ModelGateway) -> None:
    judge = Judge.for_model(gateway.chat_model("judge-ok"), "judge-ok")
    assert judge.name == "judge-ok"
    start = len(judge_backend.RECEIVED)
    values, errors = await judge.score(CASE, OUTPUT)
    assert errors == {}
    assert values == judge_backend.EXPECTED
    requests = judge_backend.RECEIVED[start:]
    # Each step asked for schema-constrained JSON, at temperature 0.
    schemas = sorted(r["response_format"]["json_schema"]["name"] for r in requests)
    assert schemas == ["Claims", "ReasonScore", "Statements", "Truths", "Verdicts", "Verdicts"]
    assert all(r["response_format"]["type"] == "json_schema" and r["temperature"] == 0 for r in requests)
    # The G-Eval rubric saw the expected fact.
    geval = next(r for r in requests if r["response_format"]["json_schema"]["name"] == "ReasonScore")
    assert "5.8 metres" in geval["messages"][-1]["content"]


async def test_unparseable_json_is_a_scored_error_and_the_rest_is_scored(gateway: ModelGateway) -> None:
    judge = Judge.for_model(gateway.chat_model("judge-bad-json"), "judge-bad-json")
    values, errors = await judge.score(CASE, OUTPUT)
    assert values == {FAITHFULNESS: 0.75, ANSWER_RELEVANCY: 0.5, CORRECTNESS: None}
    assert list(errors) == [CORRECTNESS]
    assert errors[CORRECTNESS].startswith("unparseable JSON for ReasonScore")
    assert "eight out of ten" in errors[CORRECTNESS]


async def test_a_judge_that_is_down_is_an_error_per_metric(gateway: ModelGateway) -> None:
    judge = Judge.for_model(gateway.chat_model("down"), "down")
    values, errors = await judge.score(CASE, OUTPUT)
    assert values == dict.fromkeys(JUDGED_METRICS)
    assert set(errors) == set(JUDGED_METRICS)
    assert all("BackendUnavailableError" in reason and "'down'" in reason for reason in errors.values())


async def test_a_timeout_is_a_scored_error(judge_url: str, tmp_path: Path) -> None:
    # A judge that accepts the connection and never answers: a listening socket nobody serves.
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        gateway = ModelGateway(load_registry(write_judge_models_file(tmp_path / "models.yaml", judge_url, port)))
        try:
            judge = Judge.for_model(gateway.chat_model("down"), "down", timeout_s=0.5)
            values, errors = await judge.score(CASE, OUTPUT)
        finally:
            await gateway.aclose()
    assert values == dict.fromkeys(JUDGED_METRICS)
    assert errors == dict.fromkeys(JUDGED_METRICS, "judge timed out after 0.5 s")


async def test_metrics_that_do_not_apply(gateway: ModelGateway) -> None:
    judge = Judge.for_model(gateway.chat_model("judge-ok"), "judge-ok")
    # No retrieved contexts: faithfulness does not apply (not an error).
    values, errors = await judge.score(CASE, CaseOutput(answer=OUTPUT.answer))
    assert values == {FAITHFULNESS: None, ANSWER_RELEVANCY: 0.5, CORRECTNESS: 0.8}
    assert errors == {}
    # Nothing expected: correctness does not apply.
    chat = Case(id="hi", input="Say hello.")
    values, errors = await judge.score(chat, CaseOutput(answer="Hello!"))
    assert values == {FAITHFULNESS: None, ANSWER_RELEVANCY: 0.5, CORRECTNESS: None}
    # An unanswerable case is judged against "says it has no relevant information".
    start = len(judge_backend.RECEIVED)
    values, errors = await judge.score(NO_ANSWER_CASE, CaseOutput(answer="I do not know."))
    assert values[CORRECTNESS] == 0.8
    geval = next(r for r in judge_backend.RECEIVED[start:] if r["response_format"]["json_schema"]["name"] == "ReasonScore")
    assert "no relevant information" in geval["messages"][-1]["content"]
    # An empty answer is neither relevant nor correct, and claims nothing; no judge call.
    start = len(judge_backend.RECEIVED)
    values, errors = await judge.score(CASE, CaseOutput(answer="  ", contexts=OUTPUT.contexts))
    assert values == {FAITHFULNESS: None, ANSWER_RELEVANCY: 0.0, CORRECTNESS: 0.0}
    assert errors == {}
    assert len(judge_backend.RECEIVED) == start
    # A failed run: every judged metric is an error.
    values, errors = await judge.score(CASE, CaseOutput(error="backend down"))
    assert values == dict.fromkeys(JUDGED_METRICS)
    assert errors == dict.fromkeys(JUDGED_METRICS, "run failed: backend down")


async def test_cases_are_scored_concurrently_with_one_judge(gateway: ModelGateway) -> None:
    import asyncio

    judge = Judge.for_model(gateway.chat_model("judge-ok"), "judge-ok")
    results = await asyncio.gather(*(judge.score(CASE, OUTPUT) for _ in range(4)))
    assert all(result == (judge_backend.EXPECTED, {}) for result in results)


# --- the real local model ---------------------------------------------------------------


@pytest.mark.llm
@pytest.mark.integration
async def test_local_model_returns_parseable_verdicts(local_backend: Backend) -> None:
    """SmolLM2 is no judge of truth, but under ``json_schema`` its verdicts parse: each
    metric is a score in [0, 1], none an error. One case, all three metrics (six judge
    calls); slow on a CPU, hence the long timeout."""
    gateway = ModelGateway(load_registry(REPO / "config/models.yaml"))
    try:
        judge = Judge.for_model(gateway.chat_model("chat-default"), "chat-default", timeout_s=1200)
        start = time.monotonic()
        values, errors = await judge.score(CASE, OUTPUT)
        print(f"{CASE.id}: {values} {errors} in {time.monotonic() - start:.1f} s")  # for the record (-s)
    finally:
        await gateway.aclose()
    assert errors == {}
    for metric in JUDGED_METRICS:
        value = values[metric]
        assert value is not None and 0.0 <= value <= 1.0, (metric, value)


# --- tool correctness -------------------------------------------------------------------


def test_tool_correctness_with_deepeval() -> None:
    calc = {"name": "calculator", "args": {"expression": "2+2"}}
    assert tool_correctness([calc], [calc]) == 1.0
    assert tool_correctness([calc], [{"name": "calculator", "args": {"expression": "3+3"}}]) == 0.0
    # DeepEval's partial credit: the share of the expected argument keys that agree.
    search = {"name": "search", "args": {"query": "paris", "k": 5}}
    assert tool_correctness([search], [{"name": "search", "args": {"query": "Paris", "k": 6}}]) == 0.5
    # Identical calls are distinct calls: two expected, two made.
    assert tool_correctness([calc, calc], [calc, calc]) == 1.0
    assert tool_correctness([calc, calc], [calc]) == 0.5
    # A name-only expectation beside one with args for the same tool: the call for it
    # must not give those args (DeepEval compares {} with them).
    assert tool_correctness([{"name": "calculator"}, calc], [calc, {"name": "calculator", "args": {"expression": "9"}}]) == 0.5
    # No model is ever called, and nothing is written to the working tree.
    assert not (REPO / ".deepeval").exists()
