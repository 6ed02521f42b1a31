"""Canary split (issue 13): a 90/10 alias over two scripted backends, through a real
``switchyard serve``.

Stateless requests (OpenAI API) hash their request id, so over 1,000 of them the share that
lands on the 10% target is a binomial count: it must lie in the exact central 99% region of
Binomial(1000, 0.10) (76..125), which a router ignoring the weights (50%), inverting them
(90%) or draining the canary (0%) falls far outside. LangGraph runs hash their thread id: 50
threads × 4 runs never change backend. Which backend served a request is read from the
response header ``x-switchyard-backend``, and cross-checked with the run's metadata and the
``switchyard_runs_total{backend}`` counter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.traffic import (
    Answer,
    acceptance_region,
    gateway_config,
    gather_limited,
    langgraph_wait,
    new_thread,
    openai_complete,
    run_metadata,
    running_backends,
    running_server,
    splice_problem,
    targets,
    write_models,
)
from tests.promql import sample
from tests.scripted import ScriptedBackend, failed_requests

pytestmark = pytest.mark.e2e

REQUESTS = 1000
CONCURRENCY = 20
CANARY_SHARE = 0.10
THREADS = 50
RUNS_PER_THREAD = 4
STATELESS_RUNS = 60
ALIASES = {
    "canary": {"targets": targets(a=90, b=10)},
    "even": {"targets": targets(a=50, b=50)},
}
GRAPHS = {"chat-canary": "canary", "chat-even": "even"}


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[dict[str, ScriptedBackend]]:
    """Two fast scripted backends (1 ms a token): the test measures routing, not generation."""
    with running_backends(tmp_path, ("a", "b"), delay_ms=1, tokens=8) as running:
        yield running


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, connect=5),
                             limits=httpx.Limits(max_connections=CONCURRENCY * 2))


def _failures(answers: list[Answer]) -> str:
    failed = [a for a in answers if not a.ok or a.backend not in ("a", "b") or splice_problem(a.tokens)]
    return f"{len(failed)} of {len(answers)}: " + "\n  ".join(str(a) for a in failed[:10])


async def test_canary_split_over_stateless_requests(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    models = write_models(tmp_path / "models.yaml", backends, ALIASES)
    with running_server(tmp_path, gateway_config(models, GRAPHS)) as server:
        async with _client(server.url) as client:
            # Fixed request ids (a stateless request's sticky key): the split is the same
            # every run, so the test cannot fail by chance, yet it still checks the weight.
            # Ids the server made would land in the 99% region 99 runs in 100.
            answers = await gather_limited(
                CONCURRENCY, [lambda n=n: openai_complete(client, "canary", max_tokens=2, request_id=f"canary-{n:04d}")
                              for n in range(REQUESTS)])
        assert all(a.ok and a.backend in ("a", "b") for a in answers), _failures(answers)
        assert all(a.tokens == [" lorem", " ipsum"] for a in answers), _failures(answers)
        counts = Counter(a.backend for a in answers)
        low, high = acceptance_region(REQUESTS, CANARY_SHARE, 0.99)
        print(f"\n[canary] {REQUESTS} requests: {dict(counts)}; 99% region for b: {low}..{high}; "
              f"request ms p50 {sorted(a.seconds for a in answers)[REQUESTS // 2] * 1000:.0f}")
        assert low <= counts["b"] <= high, (
            f"{counts['b']} of {REQUESTS} requests on the 10% target, outside the 99% region {low}..{high}")

        # The metric agrees with the header, request for request.
        metrics = httpx.get(server.url + "/metrics", timeout=5).text
        by_backend = {name: sample(metrics, "switchyard_runs_total", backend=name) for name in ("a", "b")}
        print(f"[canary] switchyard_runs_total by backend: {by_backend}")
        assert by_backend == {"a": counts["a"], "b": counts["b"]}, (
            f"switchyard_runs_total{{backend}} {by_backend} != the headers' counts {dict(counts)}")
        assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []


async def test_threads_never_change_backend(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """50 threads × 4 runs (``runs/wait``): every run of a thread on the same backend, named
    alike by the header and the run's metadata. Half the threads use the 90/10 alias, half
    a 50/50 one, where both backends must get threads (a 90/10 split leaves the canary
    without any of 25 threads 7% of the time; 50/50, 2 in 10 million). Then 60 stateless
    runs (no thread: the request id is the key) on the 50/50 alias split within its 99% region."""
    models = write_models(tmp_path / "models.yaml", backends, ALIASES)
    with running_server(tmp_path, gateway_config(models, GRAPHS)) as server:
        async with _client(server.url) as client:

            async def conversation(n: int) -> tuple[str, list[Answer]]:
                graph = "chat-canary" if n % 2 == 0 else "chat-even"
                thread_id = await new_thread(client)
                runs = [await langgraph_wait(client, thread_id, graph, max_tokens=2, text=f"thread {n} run {r}")
                        for r in range(RUNS_PER_THREAD)]
                return graph, runs

            threads = await gather_limited(CONCURRENCY, [lambda n=n: conversation(n) for n in range(THREADS)])
            answers = [a for _, runs in threads for a in runs]
            assert all(a.ok and a.backend in ("a", "b") for a in answers), _failures(answers)
            changed = [f"{runs[0].thread_id}: {[a.backend for a in runs]}"
                       for _, runs in threads if len({a.backend for a in runs}) != 1]
            assert changed == [], f"{len(changed)} threads changed backend:\n  " + "\n  ".join(changed[:10])

            # The run's metadata names the same backend as the header.
            disagree = []
            for _, runs in threads:
                last = runs[-1]
                assert last.thread_id and last.run_id, last
                named = (await run_metadata(client, last.thread_id, last.run_id)).get("switchyard_backend")
                if named != last.backend:
                    disagree.append(f"run {last.run_id}: header {last.backend}, metadata {named}")
            assert disagree == [], "\n  ".join(disagree[:10])

        per_graph = {graph: Counter(runs[0].backend for g, runs in threads if g == graph) for graph in GRAPHS}
        print(f"\n[canary] threads per backend: {per_graph}")
        assert set(per_graph["chat-even"]) == {"a", "b"}, f"a 50/50 alias sent all 25 threads to one backend: {per_graph}"

        # Stateless runs (no thread) hash their request id: a 50/50 alias spreads them
        # (fixed ids, as above: the same split every run).
        async with _client(server.url) as client:
            stateless = await gather_limited(CONCURRENCY, [
                lambda n=n: langgraph_wait(client, None, "chat-even", max_tokens=2, request_id=f"stateless-{n:02d}")
                for n in range(STATELESS_RUNS)])
        assert all(a.ok and a.backend in ("a", "b") for a in stateless), _failures(stateless)
        spread = Counter(a.backend for a in stateless)
        low, high = acceptance_region(STATELESS_RUNS, 0.5, 0.99)
        print(f"[canary] {STATELESS_RUNS} stateless runs on the 50/50 alias: {dict(spread)} (99% region {low}..{high})")
        assert low <= spread["b"] <= high, f"stateless runs {dict(spread)}, outside the 99% region {low}..{high} for b"
        assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []
