"""Retrieval quality on the sample corpus: hit@1, hit@5 and MRR for dense, sparse and
hybrid search, by question language; and the relevance scores that set the ``rag``
graph's grading threshold. Results go to stdout (markdown) and bench/results/.

    .venv/bin/python bench/retrieval_quality.py [--no-save]
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

from knowledge import KnowledgeSettings, open_knowledge  # noqa: E402
from knowledge.cli import _items  # noqa: E402

CORPUS = REPO / "eval" / "datasets" / "corpus"
QUESTIONS = REPO / "eval" / "datasets" / "corpus-questions.jsonl"


async def measure() -> dict[str, object]:
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        knowledge = open_knowledge(KnowledgeSettings(), Path(tmp))
        try:
            report = await knowledge.ingest("corpus", list(_items([CORPUS])))
            rows: dict[str, dict[str, object]] = {}
            for mode in ("dense", "sparse", "hybrid"):
                for lang in ("en", "zh", "all"):
                    asked = [q for q in questions if q["doc"] and (lang == "all" or q["lang"] == lang)]
                    hit1 = hit5 = 0
                    reciprocal = 0.0
                    for question in asked:
                        hits = await knowledge.search("corpus", question["q"], k=10, mode=mode)  # type: ignore[arg-type]
                        ranked = list(dict.fromkeys(h.doc_id for h in hits))
                        if ranked[:1] == [question["doc"]]:
                            hit1 += 1
                        if question["doc"] in ranked[:5]:
                            hit5 += 1
                            reciprocal += 1 / (ranked.index(question["doc"]) + 1)
                    rows[f"{mode}/{lang}"] = {
                        "questions": len(asked),
                        "hit@1": round(hit1 / len(asked), 3),
                        "hit@5": round(hit5 / len(asked), 3),
                        "mrr": round(reciprocal / len(asked), 3),
                    }
            answerable, unanswerable = [], []
            for question in questions:
                hits = await knowledge.search("corpus", question["q"], k=8)
                if question["doc"]:
                    answerable.append(max((h.relevance or 0 for h in hits if h.doc_id == question["doc"]), default=0.0))
                else:
                    unanswerable.append(max((h.relevance or 0 for h in hits), default=0.0))
        finally:
            await knowledge.aclose()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "embedder": "use-multilingual-v3",
        "documents": report.added,
        "chunks": report.chunks,
        "modes": rows,
        "relevance": {
            "answerable_source_best": sorted(round(x, 3) for x in answerable),
            "answerable_median": round(statistics.median(answerable), 3),
            "unanswerable_best": sorted(round(x, 3) for x in unanswerable),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    result = asyncio.run(measure())
    print(f"{result['documents']} documents, {result['chunks']} chunks ({time.perf_counter() - started:.1f}s)\n")
    print("| mode | questions | hit@1 | hit@5 | MRR |\n|---|---|---|---|---|")
    for key, row in result["modes"].items():  # type: ignore[attr-defined]
        print(f"| {key} | {row['questions']} | {row['hit@1']} | {row['hit@5']} | {row['mrr']} |")
    relevance = result["relevance"]
    print(f"\nbest relevance of the right source, answerable questions (lowest 5): {relevance['answerable_source_best'][:5]}")  # type: ignore[index]
    print(f"median {relevance['answerable_median']}; unanswerable questions' best: {relevance['unanswerable_best']}")  # type: ignore[index]
    if not args.no_save:
        out = REPO / "bench" / "results" / f"retrieval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
