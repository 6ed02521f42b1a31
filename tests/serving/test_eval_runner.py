"""serving.eval_runner: eval cases through the server's graph builders and run host,
against real backends (the failure-injection fake, a dead port, the local model)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml

from eval.datasets import Case, Suite, SuiteConfig, hash_dataset, load_suite
from eval.metrics import FACTS_CONTAINED, MRR, NO_ANSWER_DETECTED, RECALL_AT_K, TOOLS_MATCH, error_counts
from eval.run import run_suite
from eval.runner import CaseRunner
from eval.runs import load_run, write_run
from gateway import UnknownModelError
from knowledge import KnowledgeError
from serving.eval_runner import cli_host, open_runner, resolve_model, sla_for
from serving.platform import Platform
from serving.settings import Settings, load_settings
from tests.conftest import REPO, write_models_file
from tests.fakes.openai_backend import free_port

pytestmark = pytest.mark.integration


def _corpus() -> Path:
    """The sample corpus, wherever the rag suite keeps it."""
    corpus = load_suite("rag").corpus
    assert corpus is not None
    return corpus


def _models(tmp: Path, fake_url: str, local: object | None = None) -> Path:
    """The test registry plus: a second fake backend no alias names, a dead one, the
    tool-calling fake, an alias falling back from the dead backend to the fake, and one
    with an SLA."""
    path = write_models_file(tmp / "models.yaml", local, fake_url, chat_default="local" if local else "fake-ok")  # type: ignore[arg-type]
    data = yaml.safe_load(path.read_text())
    fake = data["backends"]["fake-ok"]
    data["backends"]["fake-ok-2"] = dict(fake)
    data["backends"]["fake-tools"] = {**fake, "model": "fake-tools"}
    data["backends"]["dead"] = {**fake, "base_url": f"http://127.0.0.1:{free_port()}/v1", "timeouts": {"connect_s": 1, "read_s": 2}}
    data["aliases"]["canary"] = {"targets": [{"backend": "dead"}], "fallbacks": ["fake-ok"]}
    data["aliases"]["both"] = {"targets": [{"backend": "fake-ok", "weight": 1}, {"backend": "fake-ok-2", "weight": 1}]}
    data["aliases"]["tools"] = "fake-tools"
    data["aliases"]["promised"] = {"targets": [{"backend": "fake-ok"}], "sla": {"ttft_s": 30, "total_s": 60}}
    path.write_text(yaml.safe_dump(data))
    return path


def _settings(tmp: Path, models: Path) -> Settings:
    graphs = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())["graphs"]
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), "gateway": {"models_file": str(models)}, "graphs": graphs}))
    return load_settings(config)


@asynccontextmanager
async def _server_side(settings: Settings) -> AsyncIterator[tuple[Platform, object]]:
    """The platform as the server builds it (the user's knowledge store open) and a host."""
    platform = Platform.build(settings)
    try:
        async with cli_host(settings) as host:
            yield platform, host
    finally:
        await platform.aclose()


def _suite(graph: str, cases: list[Case], **config: object) -> Suite:
    suite_config = SuiteConfig(name=f"t-{graph}", graph=graph, **config)  # type: ignore[arg-type]
    return Suite(config=suite_config, directory=Path("."), cases=tuple(cases), corpus=None, hash=hash_dataset(cases))


CHAT_CASES = [
    Case(id="hello", input="Say hello.", expected_facts=["hello"]),
    Case(id="fake", input="Who are you?", expected_facts=["the fake"]),
    Case(id="both", input="Greet me.", expected_facts=["hello", "bonjour"]),
    Case(id="never", input="Say bye.", expected_facts=["goodbye"]),
    Case(id="wide", input="Say it loud.", expected_facts=["ＨＥＬＬＯ ＦＲＯＭ"]),
]


@pytest.fixture
def settings(tmp_path: Path, fake_backend_url: str) -> Iterator[Settings]:
    yield _settings(tmp_path, _models(tmp_path, fake_backend_url))


async def test_alias_run_scores_the_fake_answer(settings: Settings, tmp_path: Path) -> None:
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "chat-default", seed=3) as runner:
            assert isinstance(runner, CaseRunner)
            run = await run_suite(_suite("chat", CHAT_CASES), runner, seed=3)
    facts = {case.case_id: case.values[FACTS_CONTAINED] for case in run.cases}
    assert facts == {"hello": 1.0, "fake": 1.0, "both": 0.5, "never": 0.0, "wide": 1.0}
    assert run.outputs is not None
    for output in run.outputs.values():
        assert output["answer"] == "Hello from the fake"
        assert output["backend"] == "fake-ok" and output["error"] is None
        assert output["ttft_s"] is not None and output["total_s"] >= output["ttft_s"]
    assert run.model == "chat-default" and run.backend.startswith("fake-ok (fake-ok")
    path = tmp_path / "run.json"
    write_run(run, path)
    assert load_run(path) == run


async def test_cases_go_through_the_run_host_with_temperature_zero_and_the_seed(settings: Settings) -> None:
    from tests.fakes.openai_backend import RECEIVED

    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "chat-default", seed=1234) as runner:
            before = len(RECEIVED)
            await run_suite(_suite("chat", CHAT_CASES[:2]), runner, seed=1234)
        metrics = host.metrics.registry  # type: ignore[attr-defined]
        ran = metrics.get_sample_value("switchyard_runs_total", {"kind": "graph", "target": "chat", "outcome": "ok", "backend": "fake-ok"})
    sent = RECEIVED[before:]
    assert len(sent) == 2
    assert all(body["temperature"] == 0 and body["seed"] == 1234 for body in sent)
    assert all("max_tokens" not in body and "max_completion_tokens" not in body for body in sent)  # no bound set
    assert ran == 2
    records = [yaml.safe_load(line) for line in (settings.eval_runs_dir / "audit.jsonl").read_text().splitlines()]
    runs = [r for r in records if r["type"] == "run"]
    assert len(runs) == 2 and {r["tenant"] for r in runs} == {"switchyard-eval"}


async def test_the_suites_max_tokens_bounds_every_answer(settings: Settings) -> None:
    from tests.fakes.openai_backend import RECEIVED

    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "chat-default") as runner:
            before = len(RECEIVED)
            await run_suite(_suite("chat", CHAT_CASES[:2], max_tokens=7), runner)
    # LangChain's ChatOpenAI sends the bound as max_completion_tokens.
    assert [body.get("max_completion_tokens", body.get("max_tokens")) for body in RECEIVED[before:]] == [7, 7]


async def test_a_backend_id_evaluates_that_backend_alone(settings: Settings) -> None:
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "fake-ok-2") as runner:
            pinned = await run_suite(_suite("chat", CHAT_CASES), runner)
        async with open_runner(platform, host, "canary") as runner:
            fell_back = await run_suite(_suite("chat", CHAT_CASES[:2]), runner)
        async with open_runner(platform, host, "dead") as runner:
            dead = await run_suite(_suite("chat", CHAT_CASES), runner)
        # The configured aliases are untouched by the private one.
        assert "eval-backend-fake-ok-2" not in platform.gateway.registry.aliases
    assert pinned.outputs is not None and {o["backend"] for o in pinned.outputs.values()} == {"fake-ok-2"}
    assert pinned.model == "fake-ok-2" and pinned.backend.startswith("fake-ok-2 ")
    # The alias may fall back; the backend id may not.
    assert fell_back.outputs is not None and {o["backend"] for o in fell_back.outputs.values()} == {"fake-ok"}
    assert error_counts(dead.cases) == {FACTS_CONTAINED: len(CHAT_CASES)}
    assert dead.outputs is not None and all("dead" in (o["error"] or "") for o in dead.outputs.values())
    assert dead.timings is not None and dead.timings["failed_cases"] == len(CHAT_CASES)


async def test_model_names_and_sla(settings: Settings) -> None:
    async with _server_side(settings) as (platform, _):
        gateway = platform.gateway
        assert resolve_model(gateway, "both") == ("both", None)
        alias, backend = resolve_model(gateway, "backend:fake-ok")  # an alias has the name too
        assert alias == "eval-backend-fake-ok" and backend is not None and backend.id == "fake-ok"
        with pytest.raises(UnknownModelError, match="nope"):
            resolve_model(gateway, "nope")
        with pytest.raises(UnknownModelError):
            resolve_model(gateway, "backend:canary")  # an alias, not a backend
        sla = sla_for(platform, "promised")
        assert sla is not None and (sla.ttft_s, sla.total_s) == (30, 60)
        assert sla_for(platform, "chat-default") is None and sla_for(platform, "fake-ok-2") is None
        # A backend id is a candidate for the alias its graph calls, held to its promise.
        assert sla_for(platform, "fake-ok-2", graph="chat") is None  # chat-default promises nothing
    graphs = {**settings.graphs, "chat": settings.graphs["chat"].model_copy(update={"model": "promised"})}
    async with _server_side(settings.model_copy(update={"graphs": graphs})) as (platform, _):
        assert sla_for(platform, "fake-ok-2", graph="chat") == sla_for(platform, "promised")
        assert sla_for(platform, "backend:fake-ok", graph="chat") == sla_for(platform, "promised")
        assert sla_for(platform, "chat-default", graph="chat") is None  # an alias keeps its own


async def test_agent_tool_calls_are_captured(settings: Settings) -> None:
    cases = [
        Case(
            id="calc",
            input="SCRIPT: calc",
            expected_facts=["hello"],
            expected_tools=[{"name": "calculator", "args": {"expression": "6 * 7"}}],  # type: ignore[list-item]
        ),
        Case(id="chat", input="hi there"),
    ]
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "tools") as runner:
            run = await run_suite(_suite("agent", cases, collection="nothing-here"), runner)
    by_case = run.by_case()
    assert run.outputs is not None
    assert run.outputs["calc"]["tool_calls"] == [{"name": "calculator", "args": {"expression": "6 * 7"}}]
    assert by_case["calc"].values[TOOLS_MATCH] == 1.0 and by_case["calc"].values[FACTS_CONTAINED] == 1.0
    assert run.outputs["chat"]["tool_calls"] == [] and by_case["chat"].values[TOOLS_MATCH] == 1.0


def _tiny_suite(tmp: Path) -> Path:
    """A suite directory with three documents of the sample corpus."""
    corpus = tmp / "corpus"
    corpus.mkdir()
    for name in ("01-harbor-tides.md", "02-tram-network.md", "08-brannock-bakery.md"):
        shutil.copy(_corpus() / name, corpus / name)
    suite = tmp / "tiny"
    suite.mkdir()
    (suite / "suite.yaml").write_text(
        yaml.safe_dump({"name": "tiny", "graph": "rag", "corpus": str(corpus), "collection": "eval-tiny"})
    )
    rag = {c.id: c for c in load_suite("rag").cases}
    cases = [rag["en-harbor-neap"], rag["en-harbor-deep-berth"], next(c for c in rag.values() if c.expect_no_answer)]
    (suite / "cases.jsonl").write_text("".join(c.model_dump_json() + "\n" for c in cases))
    return suite


async def test_rag_corpus_ingested_once_into_the_eval_store(settings: Settings, tmp_path: Path) -> None:
    suite_dir = _tiny_suite(tmp_path)
    suite = load_suite(suite_dir)
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "chat-default") as runner:
            first = await run_suite(suite, runner)
            assert [(r.added, r.updated) for r in runner.ingests] == [(3, 0)]
        async with open_runner(platform, host, "chat-default") as runner:
            second = await run_suite(suite, runner)
            assert runner.ingests == []  # the collection already holds exactly the corpus
        # An edited corpus file is ingested again (and only it).
        edited = tmp_path / "corpus" / "08-brannock-bakery.md"
        edited.write_text(edited.read_text() + "\nThe bakery also sells rye.\n")
        async with open_runner(platform, host, "chat-default") as runner:
            await run_suite(load_suite(suite_dir), runner)
            assert [(r.added, r.updated, r.skipped) for r in runner.ingests] == [(0, 1, 2)]
        # The scratch collection never reaches the user's store.
        assert platform.knowledge is not None
        assert "eval-tiny" not in {c.name for c in await platform.knowledge.collections()}
    assert (settings.eval_runs_dir / "vectors").is_dir()
    for run in (first, second):
        by_case = run.by_case()
        assert by_case["en-harbor-neap"].values[RECALL_AT_K] == 1.0
        assert by_case["en-harbor-neap"].values[MRR] == 1.0
        assert run.outputs is not None and run.outputs["en-harbor-neap"]["retrieved_ids"][0] == "01-harbor-tides.md"
    unanswerable = next(c for c in suite.cases if c.expect_no_answer)
    assert NO_ANSWER_DETECTED in first.by_case()[unanswerable.id].values


async def test_on_a_shared_store_the_eval_writes_as_itself_and_leaves_others_alone(settings: Settings, tmp_path: Path) -> None:
    # With knowledge.qdrant_url the eval's scratch collections live on a server others write
    # to; the embedded eval store stands in for it here (marked shared).
    from serving.eval_runner import EVAL_TENANT, corpus_documents

    suite = load_suite(_tiny_suite(tmp_path))
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "chat-default") as runner:
            knowledge = runner.knowledge  # type: ignore[attr-defined]
            kb = knowledge.get()
            knowledge.shared = True
            await kb.ingest("team-docs", corpus_documents(suite))  # the operator's own
            with pytest.raises(KnowledgeError, match="'team-docs' holds documents of the operator"):
                await runner.ensure_corpus(suite, "team-docs")
            assert len(await kb.store.documents("team-docs")) == 3  # nothing deleted or taken over
            await runner.ensure_corpus(suite, "eval-scratch")
            owners = {d.owner for d in (await kb.store.documents("eval-scratch")).values()}
            assert owners == {EVAL_TENANT}


@pytest.mark.llm
async def test_the_local_model(tmp_path: Path, fake_backend_url: str, local_backend: object) -> None:
    settings = _settings(tmp_path, _models(tmp_path, fake_backend_url, local_backend))
    cases = [
        Case(id="add", input="What is 2 + 2? Reply with the number only.", expected_facts=["4"]),
        Case(id="capital", input="What is the capital of France?", expected_facts=["Paris"]),
        Case(id="hi", input="Say hello.", expected_facts=["hello"]),
    ]
    async with _server_side(settings) as (platform, host):
        async with open_runner(platform, host, "local") as runner:
            run = await run_suite(_suite("chat", cases), runner)
    assert run.outputs is not None
    for output in run.outputs.values():
        assert output["error"] is None and output["answer"].strip()
        assert output["backend"] == "local" and output["ttft_s"] is not None
    assert "llamacpp" in run.backend or run.backend.startswith("local (")
    assert all(FACTS_CONTAINED in case.values for case in run.cases)
