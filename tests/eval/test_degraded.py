"""The gate blocks degraded candidates of the real local model and passes its re-run.

Issue 14's degraded candidates, made from SmolLM2 by ``bench/degraded_backend.py``: a
sabotaged system prompt, "I don't know." to everything, empty text, a first token after the
alias's SLA, and ``max_tokens`` 5. Each is run through the server's graphs and run host
(`serving.eval_runner`) on cases of the shipped suites that SmolLM2 answers right at
temperature 0, then gated against a baseline run with the local model's thresholds
(config/eval-thresholds.local.yaml). ``bench/eval_gate.py`` repeats every pairing five times on
the whole suite; the counts are in docs/eval.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from eval.datasets import Suite, hash_dataset, load_suite
from eval.gate import GateResult, Thresholds, compare, render_markdown
from eval.metrics import FACTS_CONTAINED, LATENCY_WITHIN
from eval.run import run_suite
from eval.runs import RunFile
from gateway import Backend
from serving.eval_runner import cli_host, open_runner, sla_for
from serving.platform import Platform
from serving.settings import Settings, load_settings
from tests.conftest import REPO
from tests.fakes.openai_backend import free_port

pytestmark = pytest.mark.integration

# Chat-suite cases SmolLM2 gets right, each fact late enough that 5 tokens cut it off.
CHAT_CASES = ("en-capital-japan", "en-capital-italy", "en-planet", "en-week-first", "en-opposite", "en-water-boil")
# Rag-suite cases it answers from the retrieved sources (facts of the fictional corpus: no
# model knows them), which the rag graph puts in the system prompt: a sabotaged system
# prompt loses them. (On the chat suite the system prompt carries nothing a small model
# needs, and SmolLM2 mostly ignores it: a sabotaged prompt changes 2 of its 15 right
# answers there, a drop the gate rightly calls noise.)
RAG_CASES = ("en-quill-creator", "en-observatory-elevation", "en-rescue-helicopter", "en-library-portolan",
             "en-apiary-hives", "en-tram-first-run")
SLA_TTFT_S = 3.0
SLOW_S = 4.0
DEGRADED = ("sabotage", "idk", "empty", "slow", "short")
SUITE_OF = {"sabotage": "rag", "idk": "chat", "empty": "chat", "slow": "chat", "short": "chat"}


@pytest.fixture(scope="module")
def proxy(local_backend: Backend) -> Iterator[str]:
    """bench/degraded_backend.py in front of the local model; its base URL (no mode)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "bench/degraded_backend.py"), "--upstream", local_backend.base_url,
         "--port", str(port), "--slow-s", str(SLOW_S)],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "the degraded backend exited"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the degraded backend did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, proxy: str) -> Settings:
    tmp = tmp_path_factory.mktemp("degraded")
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    local = {**source["backends"]["local"], "base_url": local_backend.base_url}
    backends = {"local": local}
    for mode in DEGRADED:
        backends[f"degraded-{mode}"] = {
            "kind": "vllm", "base_url": f"{proxy}/{mode}/v1", "model": local["model"],
            "timeouts": {"connect_s": 5, "read_s": 120}, "capabilities": local["capabilities"],
            "breaker": {"failures": 100000},
        }
    aliases = {"chat-default": {"targets": [{"backend": "local"}], "sla": {"ttft_s": SLA_TTFT_S, "total_s": 120}}}
    models = tmp / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": backends, "aliases": aliases}))
    graphs = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())["graphs"]
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp / "data"), "gateway": {"models_file": str(models)}, "graphs": graphs,
        # The local model's thresholds, as config/switchyard.yaml names them.
        "eval": {"thresholds": str(REPO / "config/eval-thresholds.local.yaml")},
    }))
    return load_settings(config)


def _suite(name: str) -> Suite:
    shipped = load_suite(name)
    wanted = CHAT_CASES if name == "chat" else RAG_CASES
    cases = tuple(case for case in shipped.cases if case.id in wanted)
    assert {case.id for case in cases} == set(wanted)
    return Suite(
        config=shipped.config, directory=shipped.directory, cases=cases, corpus=shipped.corpus,
        hash=hash_dataset(cases), corpus_files=shipped.corpus_files,
    )


async def _run(settings: Settings, suite: str, model: str) -> RunFile:
    platform = Platform.build(settings)
    try:
        async with cli_host(settings) as host, open_runner(platform, host, model, seed=settings.eval.seed) as runner:
            # The rag cases are about what the answers say; their time to first token (a
            # prompt of retrieved sources, on a CPU shared with the rest of the test run)
            # is not held to the chat SLA.
            sla = sla_for(platform, model, graph="chat") if suite == "chat" else None
            return await run_suite(_suite(suite), runner, sla=sla, seed=settings.eval.seed)
    finally:
        await platform.aclose()


@pytest.fixture(scope="module")
async def baselines(settings: Settings) -> dict[str, RunFile]:
    runs = {suite: await _run(settings, suite, "local") for suite in ("chat", "rag")}
    for suite, run in runs.items():
        facts = {case.case_id: case.values[FACTS_CONTAINED] for case in run.cases}
        wanted = CHAT_CASES if suite == "chat" else RAG_CASES
        assert facts == dict.fromkeys(wanted, 1.0), run.outputs  # the cases were picked for it
    return runs


def _gate(settings: Settings, baseline: RunFile, candidate: RunFile) -> GateResult:
    return compare(baseline.by_case(), candidate.by_case(), Thresholds.load(settings.eval.thresholds))


@pytest.mark.parametrize("suite", ["chat", "rag"])
async def test_a_rerun_of_the_baseline_passes(settings: Settings, baselines: dict[str, RunFile], suite: str) -> None:
    result = _gate(settings, baselines[suite], await _run(settings, suite, "local"))
    assert result.exit_code == 0, render_markdown(result)


@pytest.mark.parametrize("mode", DEGRADED)
async def test_a_degraded_candidate_is_blocked(settings: Settings, baselines: dict[str, RunFile], mode: str) -> None:
    suite = SUITE_OF[mode]
    candidate = await _run(settings, suite, f"degraded-{mode}")
    assert candidate.outputs is not None
    assert {o["backend"] for o in candidate.outputs.values()} == {f"degraded-{mode}"}
    result = _gate(settings, baselines[suite], candidate)
    assert result.exit_code == 1, render_markdown(result)
    regressed = {m.metric for m in result.metrics if m.verdict == "regressed"}
    assert (LATENCY_WITHIN if mode == "slow" else FACTS_CONTAINED) in regressed, render_markdown(result)
