"""The ``rag`` graph's added latency: the time its retrieval takes per request, at a
given concurrency, over a collection of ~10k chunks, the model excluded.

Each request runs the graph's own nodes (`graphs.rag.nodes.RagNodes`, default
`RagSettings`: 8 candidates, hybrid) on a knowledge base over ``--store edge``
(`EdgeStore`, after issue 15) or ``--store local`` (qdrant-client's local mode,
before), with the packaged embedder embedding each query as the graph does:

- ``first``: a first question: ``rewrite`` (no model call for a first question),
  ``retrieve`` (one `KnowledgeBase.search`), ``grade``.
- ``follow-up``: a follow-up whose rewrite is given (the rewrite's model call is the
  excluded model time): ``retrieve`` searches the rewrite and the question as asked,
  concurrently (two `KnowledgeBase.search`), then ``grade``.

The questions are the ``rag`` suite's inputs and the corpus questions, in turn. The
collection is the scaled sample corpus (knowledge_speed.py's), written from the bench's
cached vectors and optimised before the clock starts. ``--requests`` requests per
level (default 200) run on ``--concurrency`` workers (default 10), after a warm-up;
a c=1 level (50 requests) gives the unloaded figure. Writes
bench/results/rag-latency-<store>-<UTC time>.json.

    .venv/bin/python bench/rag_latency.py --store edge|local [--chunks 10000] [--concurrency 10] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# knowledge_speed (beside this file) first: it puts the repository on sys.path.
from knowledge_speed import (
    REPO,
    STORES,
    HostLoad,
    loadavg,
    open_kb,
    percentiles,
    prepared_corpus,
    query_texts,
    result_path,
    write_prepared,
)

from graphs.context import RunContext
from graphs.rag.nodes import RagNodes
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.runtime import Runtime

COLLECTION = "rag-bench"


async def one_request(nodes: RagNodes, runtime: Runtime[RunContext], kind: str, question: str, rewrite: str) -> float:
    """Seconds the graph spends before generation on one request."""
    started = time.perf_counter()
    if kind == "first":
        state: dict[str, Any] = {"messages": [HumanMessage(question)]}
        state |= await nodes.rewrite(state, runtime)  # type: ignore[arg-type]
    else:
        state = {
            "messages": [HumanMessage(rewrite), AIMessage("(an earlier answer)"), HumanMessage(question)],
            "query": rewrite,
        }
    state |= await nodes.retrieve(state, runtime)  # type: ignore[arg-type]
    state |= await nodes.grade(state, runtime)  # type: ignore[arg-type]
    return time.perf_counter() - started


async def level(
    nodes: RagNodes, runtime: Runtime[RunContext], kind: str, questions: list[str], concurrency: int, requests: int
) -> dict[str, Any]:
    samples: list[float] = []
    errors: list[str] = []
    counter = iter(range(requests))

    async def worker() -> None:
        for n in counter:
            question, rewrite = questions[n % len(questions)], questions[(n + 7) % len(questions)]
            try:
                samples.append(await one_request(nodes, runtime, kind, question, rewrite))
            except Exception as exc:  # boundary: a failed request is counted, not fatal
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    host = HostLoad()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {
        "kind": kind,
        "concurrency": concurrency,
        "requests": requests,
        "retrieval": percentiles(samples),
        "requests_per_s": round(len(samples) / wall, 1),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "other_cores": host.other_cores(),
    }


async def measure(store: str, chunks: int, concurrency: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as tmp:
        kb = open_kb(store, Path(tmp) / "store")
        try:
            prepared = await prepared_corpus(kb, chunks)
            write_s = await write_prepared(kb, COLLECTION, prepared)
            started = time.perf_counter()
            await kb.store.optimize(COLLECTION, force=True)
            optimize_s = time.perf_counter() - started
            stored = sum(len(p.chunks) for p in prepared)
            print(f"{stored} chunks written in {write_s:.0f}s, optimised in {optimize_s:.1f}s", flush=True)
            # rewrite() calls the model only for a follow-up, and the follow-up requests
            # here skip it: no model is ever called.
            nodes = RagNodes(None, kb, kb.settings.rag)  # type: ignore[arg-type]
            runtime = Runtime(context=RunContext(collection=COLLECTION))
            questions = query_texts()
            levels = []
            for kind in ("first", "follow-up"):
                await level(nodes, runtime, kind, questions, concurrency, concurrency * 2)  # warm-up
                for c, n in ((1, 50), (concurrency, requests)):
                    row = await level(nodes, runtime, kind, questions, c, n)
                    levels.append(row)
                    r = row["retrieval"]
                    print(f"{kind} c={c}: p50 {r.get('p50_ms')} ms, p95 {r.get('p95_ms')} ms, {row['errors']} errors", flush=True)
        finally:
            await kb.aclose()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": store,
        "chunks": stored,
        "setup": {"write_s": round(write_s, 1), "optimize_s": round(optimize_s, 2)},
        "rag_settings": kb.settings.rag.model_dump(),
        "retrieval_settings": kb.settings.retrieval.model_dump(),
        "levels": levels,
        "loadavg_after": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=STORES, required=True)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.store, args.chunks, args.concurrency, args.requests))
    print(f"\n{result['store']}: {result['chunks']} chunks; retrieval per request (rewrite/retrieve/grade, no model)\n")
    print("| request | c | requests | p50 ms | p95 ms | max ms | req/s | errors | other cores |\n|---|---|---|---|---|---|---|---|---|")
    for row in result["levels"]:
        r = row["retrieval"]
        print(
            f"| {row['kind']} | {row['concurrency']} | {row['requests']} | {r.get('p50_ms')} | {r.get('p95_ms')} | "
            f"{r.get('max_ms')} | {row['requests_per_s']} | {row['errors']} | {row['other_cores']} |"
        )
    if not args.no_save:
        out = result_path(f"rag-latency-{args.store}")
        out.write_text(json.dumps(result, indent=2))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
