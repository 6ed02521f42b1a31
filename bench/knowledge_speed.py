"""Knowledge speed on this machine: ingestion throughput with the local embedder, and
search latency at ~10k chunks in Qdrant's local mode, each against a floor.

- Ingestion: chunks/s of the whole pipeline (load, chunk, embed, sparse-encode, store)
  against the embedder alone on the same chunk texts (the floor: no Python pipeline
  can beat its own embedder).
- Search: p50/p95 of `KnowledgeBase.search` per mode, with and without the query's
  embedding, against a bare ``query_points`` dense search on the same local collection.

The corpus is the sample corpus repeated with a varying line per copy (so every copy
is a distinct document). Writes bench/results/knowledge-<time>.json.

    .venv/bin/python bench/knowledge_speed.py [--chunks 10000] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from knowledge import Document, KnowledgeSettings, open_knowledge  # noqa: E402
from knowledge.cli import _items  # noqa: E402

CORPUS = REPO / "eval" / "datasets" / "corpus"
QUESTIONS = REPO / "eval" / "datasets" / "corpus-questions.jsonl"


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 2),
    }


async def measure(target_chunks: int) -> dict[str, object]:
    base = [d for d in _items([CORPUS]) if isinstance(d, Document)]
    questions = [json.loads(line)["q"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        knowledge = open_knowledge(KnowledgeSettings(), Path(tmp))
        try:
            per_copy = sum(len(knowledge.chunker.split(d)) for d in base)
            copies = max(1, round(target_chunks / per_copy))
            documents = [
                d.model_copy(update={"id": f"{n:04d}/{d.id}", "text": f"{d.text}\n\nCopy {n} of the archive, shelf {n % 97}."})
                for n in range(copies)
                for d in base
            ]
            # Floor: the embedder alone, on the texts the pipeline will embed.
            texts = [c.text for d in documents[: len(base) * 4] for c in knowledge.chunker.split(d)]
            started = time.perf_counter()
            await knowledge.embedder.embed_documents(texts)
            embed_rate = len(texts) / (time.perf_counter() - started)

            started = time.perf_counter()
            report = await knowledge.ingest("bench", documents)
            ingest_seconds = time.perf_counter() - started
            ingest_rate = report.chunks / ingest_seconds

            vectors = [await knowledge.embedder.embed_query(q) for q in questions]
            sparse = [knowledge.sparse.query(q) for q in questions]
            store = knowledge.store
            local = store._local  # noqa: SLF001 (the bare client is the floor)
            assert local is not None
            floor: list[float] = []
            for vector in vectors:
                started = time.perf_counter()
                local.query_points("bench", query=vector, using="dense", limit=5, with_payload=True)
                floor.append(time.perf_counter() - started)
            search: dict[str, dict[str, float]] = {"floor: bare dense query_points": _percentiles(floor)}
            for mode in ("dense", "sparse", "hybrid"):
                without: list[float] = []
                for vector, terms in zip(vectors, sparse, strict=True):
                    started = time.perf_counter()
                    await store.search("bench", dense=vector, sparse=terms, mode=mode, k=5, candidates=30)
                    without.append(time.perf_counter() - started)
                search[f"{mode}, query vector given"] = _percentiles(without)
                full: list[float] = []
                for question in questions:
                    started = time.perf_counter()
                    await knowledge.search("bench", question, k=5, mode=mode)  # type: ignore[arg-type]
                    full.append(time.perf_counter() - started)
                search[f"{mode}, with the query's embedding"] = _percentiles(full)
        finally:
            await knowledge.aclose()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "documents": len(documents),
        "chunks": report.chunks,
        "ingest": {
            "seconds": round(ingest_seconds, 1),
            "chunks_per_s": round(ingest_rate, 1),
            "floor_embedder_chunks_per_s": round(embed_rate, 1),
            "ratio_to_floor": round(ingest_rate / embed_rate, 3),
        },
        "search": search,
        "queries": len(questions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.chunks))
    ingest = result["ingest"]
    print(f"{result['documents']} documents, {result['chunks']} chunks")
    print(f"ingestion: {ingest['chunks_per_s']} chunks/s; embedder alone {ingest['floor_embedder_chunks_per_s']} chunks/s; "  # type: ignore[index]
          f"ratio {ingest['ratio_to_floor']}")  # type: ignore[index]
    print("\n| search | p50 ms | p95 ms |\n|---|---|---|")
    for name, row in result["search"].items():  # type: ignore[attr-defined]
        print(f"| {name} | {row['p50_ms']} | {row['p95_ms']} |")
    if not args.no_save:
        out = REPO / "bench" / "results" / f"knowledge-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(result, indent=2))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
