"""The cost of a routing decision for ``model: "auto"`` (`serving.routing.SemanticRouter`)
with the real packaged embedder (``use-multilingual-v3``, CPU), against a floor.

Rows (each after a warm-up; utterances cycle through the test's held-back and off-topic
sets, English and Chinese mixed, so the route table and the traffic are the ones
``tests/serving/test_routing.py`` checks for accuracy):

- floor: the embedder alone on one text (the one embedding a decision needs);
- ``decide``: a whole semantic decision (text extraction, embedding, the similarity
  product over every example, threshold), one at a time;
- ``decide``, 240 examples: the same against a table with ten times the examples;
- ``decide``, task_type: an explicit ``metadata.task_type`` (no embedding);
- ``decide``, long message: 20,000-character user messages, cut to ``max_chars``;
- ``decide``, bursts of 50: 50 decisions started at once (what c=50 arrivals would see;
  the router embeds the texts that arrive during an embedding as one batch); latency
  per decision.

Each set of rows runs with the embedder's BLAS threads at 2 (the package's default) and
at 1 (`serving.routing.packaged_embedder`, the router's). Also the process CPU time per decision (all threads; a waiting BLAS thread spins,
so 2 threads cost more CPU than wall time), and the other load on the host. Prints a markdown table and writes
``bench/results/routing-<time>.json``. Target (issue 13): p95 under 20 ms.

    .venv/bin/python bench/routing.py [--decisions 1000] [--threads 2,1] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from knowledge.embeddings.local import LocalEmbedder  # noqa: E402
from serving.routing import RoutingSettings, SemanticRouter  # noqa: E402
from tests.serving.test_routing import HELD_BACK, OFF_TOPIC, TABLE  # noqa: E402

WARM_UP = 50


def _percentiles(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99), "max_ms": at(1.0)}


def _host_busy() -> float:
    """Busy CPU seconds of the whole host, from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


async def _serial(call: Callable[[str], Awaitable[Any]], texts: list[str], n: int) -> dict[str, Any]:
    for i in range(WARM_UP):
        await call(texts[i % len(texts)])
    samples: list[float] = []
    cpu = time.process_time()
    host = _host_busy()
    wall = time.perf_counter()
    for i in range(n):
        started = time.perf_counter()
        await call(texts[i % len(texts)])
        samples.append(time.perf_counter() - started)
    wall = time.perf_counter() - wall
    row = _percentiles(samples)
    own = time.process_time() - cpu
    row["cpu_ms_per_decision"] = round(own / n * 1000, 2)
    row["other_cpu_cores"] = _other(host, own, wall)
    return row


def _other(host_before: float, own: float, wall: float) -> float | None:
    """Host CPU not used by this process, in cores, over the row's wall time (None for a
    row too short for ``/proc/stat``'s clock ticks to say)."""
    if wall < 1.0:
        return None
    return round(max(0.0, _host_busy() - host_before - own) / wall, 2)


async def _bursts(call: Callable[[str], Awaitable[Any]], texts: list[str], n: int, size: int) -> dict[str, Any]:
    samples: list[float] = []

    async def one(text: str) -> None:
        started = time.perf_counter()
        await call(text)
        samples.append(time.perf_counter() - started)

    for i in range(WARM_UP):
        await call(texts[i % len(texts)])
    cpu = time.process_time()
    host = _host_busy()
    wall = time.perf_counter()
    done = 0
    while done < n:
        await asyncio.gather(*(one(texts[(done + j) % len(texts)]) for j in range(size)))
        done += size
    wall = time.perf_counter() - wall
    row = _percentiles(samples)
    own = time.process_time() - cpu
    row["cpu_ms_per_decision"] = round(own / len(samples) * 1000, 2)
    row["other_cpu_cores"] = _other(host, own, wall)
    return row


def _big_table() -> RoutingSettings:
    """The test's table with every example repeated ten times, each with a distinct tail."""
    routes = {
        name: {**spec, "examples": [f"{text} ({n})" for n in range(10) for text in spec["examples"]]}  # type: ignore[index]
        for name, spec in TABLE["routes"].items()  # type: ignore[union-attr]
    }
    return RoutingSettings.model_validate({**TABLE, "routes": routes})


async def _rows(tag: str, threads: int, decisions: int, texts: list[str]) -> dict[str, dict[str, Any]]:
    embedder = LocalEmbedder.packaged("use-multilingual-v3", threads=threads)
    messages = {text: [{"role": "user", "content": text}] for text in texts}
    router = SemanticRouter(RoutingSettings.model_validate(TABLE), embedder)
    big = SemanticRouter(_big_table(), embedder)
    await router.prepare()
    await big.prepare()
    long_texts = [(text + " ") * (20_000 // (len(text) + 1) + 1) for text in texts[:10]]
    long_messages = {text: [{"role": "user", "content": text}] for text in long_texts}
    rows: dict[str, dict[str, Any]] = {}
    try:
        rows[f"{tag} floor: the embedder alone, one text"] = await _serial(lambda t: embedder.embed_documents([t]), texts, decisions)
        rows[f"{tag} decide (semantic)"] = await _serial(lambda t: router.decide(messages[t]), texts, decisions)
        rows[f"{tag} decide, 240 examples"] = await _serial(lambda t: big.decide(messages[t]), texts, decisions)
        rows[f"{tag} decide, 20,000-char message"] = await _serial(lambda t: router.decide(long_messages[t]), long_texts, decisions)
        rows[f"{tag} decide, bursts of 50 at once"] = await _bursts(lambda t: router.decide(messages[t]), texts, decisions, 50)
        if threads == 2:
            rows[f"{tag} decide, task_type given"] = await _serial(lambda t: router.decide(messages[t], "qa"), texts, decisions)
    finally:
        await router.aclose()
        await big.aclose()
        await embedder.aclose()
    return rows


async def measure(decisions: int, threads: list[int]) -> dict[str, Any]:
    texts = [text for text, _ in HELD_BACK] + OFF_TOPIC
    settings = RoutingSettings.model_validate(TABLE)
    embedder = LocalEmbedder.packaged("use-multilingual-v3")
    router = SemanticRouter(settings, embedder)
    started = time.perf_counter()
    await router.prepare()
    prepare_ms = round((time.perf_counter() - started) * 1000, 1)
    await router.aclose()
    load_before = os.getloadavg()
    rows: dict[str, dict[str, Any]] = {}
    for number, count in enumerate(threads):
        tag = f"threads={count}" + (f" (run {number + 1})" if threads.count(count) > 1 else "")
        rows.update(await _rows(tag, count, decisions, texts))
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "embedder": embedder.name,
        "routes": len(settings.routes),
        "examples": sum(len(spec.examples) for spec in settings.routes.values()),
        "utterances": len(texts),
        "max_chars": settings.max_chars,
        "prepare_ms": prepare_ms,
        "warm_up": WARM_UP,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=1000, help="decisions per row (at least 500)")
    parser.add_argument("--threads", default="2,1", help="the embedder's BLAS threads, one set of rows each (default 2,1)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    if args.decisions < 500:
        parser.error("--decisions: at least 500")
    result = asyncio.run(measure(args.decisions, [int(n) for n in args.threads.split(",")]))
    print(
        f"{result['routes']} routes, {result['examples']} examples, {result['utterances']} utterances; "
        f"prepare {result['prepare_ms']} ms; load average {result['load_average_before']} -> {result['load_average_after']}"
    )
    print("\n| row | n | p50 ms | p95 ms | p99 ms | max ms | CPU ms/decision | other load (cores) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in result["rows"].items():
        print(
            f"| {name} | {row['n']} | {row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['max_ms']} "
            f"| {row['cpu_ms_per_decision']} | {row['other_cpu_cores']} |"
        )
    for name, row in result["rows"].items():
        if name.endswith("decide (semantic)"):
            verdict = "PASS" if row["p95_ms"] < 20 else "FAIL"
            print(f"target p95 < 20 ms, {name}: {verdict} ({row['p95_ms']} ms)")
    if not args.no_save:
        out = REPO / "bench" / "results" / f"routing-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(result, indent=2))
        print(f"results written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
