"""Readers while the store writes and optimises: the evidence that optimisation never
blocks searches.

One store (``--store edge``, the default: `EdgeStore`; ``--store local`` for the
before). A collection ``readers`` holds ``--chunks`` chunks of the scaled sample corpus
(vectors from the bench cache, see knowledge_speed.py), optimised. Two reader tasks run
hybrid searches (k=5, candidates=30) with precomputed query vectors, one every
``--period-ms`` (default 20): reader ``stable`` on ``readers`` and reader ``written`` on
``incoming``, the collection being written. A ticker measures the event loop's lag
(a 5 ms sleep's overshoot): a call that holds the GIL or blocks the loop shows there.

Phases, one after the other:

1. ``idle``: nothing else runs (``--idle-s``).
2. ``ingest``: `KnowledgeBase.ingest` of ``--ingest-chunks`` chunks into ``incoming``
   (the whole pipeline, as ``switchyard ingest`` runs it, in this process; whatever
   background optimisation the store starts on its own happens here too). With
   ``--write-cached``, ``write_document`` of vectors reused from the readers' corpus
   instead (no embedder), to reach 100k chunks in minutes.
3. ``optimize``: ``await store.optimize("incoming", force=True)`` (EdgeStore builds the
   segments in a child process and swaps the shard in).
4. ``after``: ``--after-s`` more seconds of readers alone.

Per phase and reader: searches, p50/p95/max latency, errors (with the first message);
the loop lag p95/max; the child processes seen (sampled every 100 ms); the other
load on the host. Writes bench/results/readers-<store>-<UTC time>.json.

    .venv/bin/python bench/edge_readers.py [--store edge|local] [--chunks 10000] [--ingest-chunks 10000] [--write-cached]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import defaultdict
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
    query_set,
    result_path,
    reused_corpus,
    scaled_documents,
    write_prepared,
)

from knowledge import KnowledgeBase

PHASES = ("idle", "ingest", "optimize", "after")


class Recorder:
    """What the readers and the ticker saw, by phase."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.latency: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.errors: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.lag: dict[str, list[float]] = defaultdict(list)
        self.children: dict[str, set[str]] = defaultdict(set)
        self.stop = False


async def reader(kb: KnowledgeBase, name: str, collection: str, queries: list[Any], period: float, rec: Recorder) -> None:
    n = 0
    while not rec.stop:
        _text, dense, sparse = queries[n % len(queries)]
        n += 1
        phase = rec.phase
        started = time.perf_counter()
        try:
            await kb.store.search(collection, dense=dense, sparse=sparse, mode="hybrid", k=5, candidates=30)
        except Exception as exc:  # boundary: an error is a finding, counted per phase
            rec.errors[(phase, name)].append(f"{type(exc).__name__}: {exc}"[:300])
        else:
            rec.latency[(phase, name)].append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, period - (time.perf_counter() - started)))


async def ticker(rec: Recorder) -> None:
    while not rec.stop:
        started = time.perf_counter()
        await asyncio.sleep(0.005)
        rec.lag[rec.phase].append(time.perf_counter() - started - 0.005)


def _child_processes() -> set[str]:
    me = str(os.getpid())
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        fields = text[text.rfind(")") + 2 :].split()
        if fields and fields[1] == me:
            found.add(f"{stat.parent.name} {text[text.find('(') + 1 : text.rfind(')')]}")
    return found


async def children(rec: Recorder) -> None:
    while not rec.stop:
        rec.children[rec.phase] |= _child_processes()
        await asyncio.sleep(0.1)


async def measure(
    kind: str, chunks: int, ingest_chunks: int, period: float, idle_s: float, after_s: float, write_cached: bool
) -> dict[str, Any]:
    rec = Recorder()
    timings: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as tmp:
        kb = open_kb(kind, Path(tmp) / "store")
        try:
            prepared = await prepared_corpus(kb, chunks)
            setup_write = await write_prepared(kb, "readers", prepared)
            started = time.perf_counter()
            await kb.store.optimize("readers", force=True)
            setup_optimize = time.perf_counter() - started
            print(f"setup: {sum(len(p.chunks) for p in prepared)} chunks written in {setup_write:.0f}s, optimised in {setup_optimize:.1f}s", flush=True)
            await kb.store.ensure_collection("incoming", dimensions=kb.embedder.dimensions, embedder=kb.embedder.name)
            documents = scaled_documents(kb, ingest_chunks)
            queries = await query_set(kb)
            tasks = [
                asyncio.create_task(reader(kb, "stable", "readers", queries, period, rec)),
                asyncio.create_task(reader(kb, "written", "incoming", queries[::-1], period, rec)),
                asyncio.create_task(ticker(rec)),
                asyncio.create_task(children(rec)),
            ]

            async def phase(name: str, work: Any) -> Any:
                rec.phase = name
                host = HostLoad()
                started = time.perf_counter()
                result = await work
                timings[name] = {"seconds": round(time.perf_counter() - started, 2), "other_cores": host.other_cores()}
                print(f"{name}: {timings[name]['seconds']}s", flush=True)
                return result

            await phase("idle", asyncio.sleep(idle_s))
            if write_cached:
                # The store's writes alone, of vectors reused from the readers' corpus:
                # sizes whose embedding would take too long (see knowledge_speed.reused_corpus).
                await phase("ingest", write_prepared(kb, "incoming", reused_corpus(kb, ingest_chunks, prepared)))
                timings["ingest"]["chunks"] = sum(c.chunks for c in (await kb.store.collections()) if c.name == "incoming")
                timings["ingest"]["how"] = "write_document of cached/reused vectors (no embedder)"
            else:
                report = await phase("ingest", kb.ingest("incoming", documents))
                timings["ingest"]["chunks"] = report.chunks
                timings["ingest"]["how"] = "KnowledgeBase.ingest (the whole pipeline)"
            changed = await phase("optimize", kb.store.optimize("incoming", force=True))
            timings["optimize"]["changed"] = changed
            await phase("after", asyncio.sleep(after_s))
            rec.stop = True
            await asyncio.gather(*tasks)
        finally:
            rec.stop = True
            await kb.aclose()
    rows: dict[str, Any] = {}
    for name in PHASES:
        rows[name] = {
            **timings[name],
            "readers": {
                who: {
                    **percentiles(rec.latency[(name, who)]),
                    "errors": len(rec.errors[(name, who)]),
                    "first_error": (rec.errors[(name, who)] or [None])[0],
                }
                for who in ("stable", "written")
            },
            "loop_lag": percentiles(rec.lag[name]),
            "child_processes": sorted(rec.children[name]),
        }
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": kind,
        "readers_collection_chunks": sum(len(p.chunks) for p in prepared),
        "setup": {"write_s": round(setup_write, 1), "optimize_s": round(setup_optimize, 2)},
        "period_ms": period * 1000,
        "phases": rows,
        "loadavg_after": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=STORES, default="edge")
    parser.add_argument("--chunks", type=int, default=10_000, help="chunks in the collection the stable reader searches")
    parser.add_argument("--ingest-chunks", type=int, default=10_000)
    parser.add_argument("--period-ms", type=float, default=20.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--write-cached", action="store_true",
                        help="the ingest phase writes reused cached vectors instead of running the pipeline (for large --ingest-chunks)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(
        measure(args.store, args.chunks, args.ingest_chunks, args.period_ms / 1000, args.idle_s, args.after_s, args.write_cached)
    )
    print(f"\n{result['store']}: readers every {result['period_ms']:.0f} ms, hybrid k=5\n")
    print("| phase | s | other cores | reader | searches | p50 ms | p95 ms | max ms | errors | loop lag p95/max ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in result["phases"].items():
        for who, r in row["readers"].items():
            print(
                f"| {name} | {row['seconds']} | {row['other_cores']} | {who} | {r.get('n', 0)} | {r.get('p50_ms')} | "
                f"{r.get('p95_ms')} | {r.get('max_ms')} | {r['errors']} | {row['loop_lag'].get('p95_ms')}/{row['loop_lag'].get('max_ms')} |"
            )
    for name, row in result["phases"].items():
        for who, r in row["readers"].items():
            if r["first_error"]:
                print(f"{name}/{who} first error: {r['first_error']}")
        print(f"{name}: child processes seen: {row['child_processes'] or 'none'}")
    if not args.no_save:
        out = result_path(f"readers-{args.store}")
        out.write_text(json.dumps(result, indent=2))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
