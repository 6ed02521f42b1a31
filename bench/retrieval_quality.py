"""Retrieval quality on the sample corpus, per vector store: hit@1, hit@5 and MRR for
dense, sparse and hybrid search by question language; the relevance scores that set
the ``rag`` graph's grading threshold; and the ``rag`` eval suite's retrieval scores.

- ``--store edge``: `EdgeStore` (the embedded default); ``--store local``: qdrant-client's
  local mode (the store before issue 15). Both should give the same numbers: the same
  vectors, the same scoring (cosine; BM25-style sparse with Qdrant's IDF; RRF).
- Corpus questions (eval/datasets/corpus-questions.jsonl): each asks about one document;
  ``KnowledgeBase.search`` with k=10, ranked document ids.
- The ``rag`` suite (eval/datasets/rag): its corpus is ingested into the suite's
  collection the way ``switchyard eval run`` does (`serving.eval_runner.corpus_documents`),
  and every case runs the ``rag`` graph's own ``rewrite``, ``retrieve`` and ``grade`` nodes
  (`graphs.rag.nodes.RagNodes`, default `RagSettings`; a first question is not rewritten,
  so no model is called). ``recall_at_k`` (k = `eval.run.RECALL_K`) and ``mrr`` are
  computed with `eval.metrics` on the retrieved candidates' document ids in rank order,
  as the eval runner does; the expect_no_answer cases report whether grading kept nothing.

Results go to stdout (markdown) and bench/results/retrieval-<store>-<UTC time>.json
(with every query's ranked ids, to diff two stores).

    .venv/bin/python bench/retrieval_quality.py --store edge|local [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# knowledge_speed (beside this file) first: it puts the repository on sys.path.
from knowledge_speed import QUESTIONS, REPO, STORES, base_documents, open_kb, result_path

from eval.datasets import load_suite
from eval.metrics import mrr, recall_at_k
from eval.run import RECALL_K
from graphs.context import RunContext
from graphs.rag.nodes import RagNodes
from knowledge import Document, KnowledgeBase
from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime
from serving.eval_runner import corpus_documents


async def corpus_questions(kb: KnowledgeBase) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    rows: dict[str, dict[str, object]] = {}
    ranked_by_mode: dict[str, dict[str, list[str]]] = {}
    for mode in ("dense", "sparse", "hybrid"):
        ranked_by_mode[mode] = {}
        for question in questions:
            hits = await kb.search("corpus", question["q"], k=10, mode=mode)  # type: ignore[arg-type]
            ranked_by_mode[mode][question["q"]] = list(dict.fromkeys(h.doc_id for h in hits))
        for lang in ("en", "zh", "all"):
            asked = [q for q in questions if q["doc"] and (lang == "all" or q["lang"] == lang)]
            hit1 = hit5 = 0
            reciprocal = 0.0
            for question in asked:
                ranked = ranked_by_mode[mode][question["q"]]
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
        hits = await kb.search("corpus", question["q"], k=8)
        if question["doc"]:
            answerable.append(max((h.relevance or 0 for h in hits if h.doc_id == question["doc"]), default=0.0))
        else:
            unanswerable.append(max((h.relevance or 0 for h in hits), default=0.0))
    relevance = {
        "answerable_source_best": sorted(round(x, 3) for x in answerable),
        "answerable_median": round(statistics.median(answerable), 3),
        "unanswerable_best": sorted(round(x, 3) for x in unanswerable),
    }
    return rows, relevance, ranked_by_mode


async def rag_suite(kb: KnowledgeBase) -> dict[str, Any]:
    """The ``rag`` suite's retrieval through the graph's own nodes."""
    suite = load_suite("rag")
    collection = suite.config.collection
    assert collection is not None
    items = [i for i in corpus_documents(suite) if isinstance(i, Document)]
    report = await kb.ingest(collection, items)
    # rewrite() calls the model only for a follow-up (a second human message); every
    # case is a first question, so the nodes run without one.
    nodes = RagNodes(None, kb, kb.settings.rag)  # type: ignore[arg-type]
    per_case: list[dict[str, Any]] = []
    for case in suite.cases:
        runtime = Runtime(context=RunContext(collection=suite.collection_for(case)))
        state: dict[str, Any] = {"messages": [HumanMessage(case.input)]}
        state |= await nodes.rewrite(state, runtime)  # type: ignore[arg-type]
        state |= await nodes.retrieve(state, runtime)  # type: ignore[arg-type]
        state |= await nodes.grade(state, runtime)  # type: ignore[arg-type]
        ids = [str(c["doc_id"]) for c in state["candidates"]]
        row: dict[str, Any] = {
            "case": case.id,
            "retrieved_ids": ids,
            "relevance": [round(c["relevance"] or 0, 4) for c in state["candidates"]],
            "sources": [s["doc_id"] for s in state["sources"]],
        }
        if case.expected_sources:
            row["recall_at_k"] = recall_at_k(ids, case.expected_sources, RECALL_K)
            row["mrr"] = mrr(ids, case.expected_sources)
        if case.expect_no_answer:
            row["no_sources_kept"] = not state["sources"]
        per_case.append(row)
    scored = [r for r in per_case if "recall_at_k" in r]
    no_answer = [r for r in per_case if "no_sources_kept" in r]
    return {
        "suite": suite.name,
        "suite_hash": suite.hash,
        "collection": collection,
        "documents": report.added,
        "chunks": report.chunks,
        "recall_k": RECALL_K,
        "cases_with_expected_sources": len(scored),
        "recall_at_k": round(statistics.fmean(r["recall_at_k"] for r in scored), 4),
        "mrr": round(statistics.fmean(r["mrr"] for r in scored), 4),
        "expected_source_among_kept_sources": sum(
            any(s in r["sources"] for s in next(c.expected_sources for c in suite.cases if c.id == r["case"])) for r in scored
        ),
        "no_answer_cases": len(no_answer),
        "no_answer_cases_with_nothing_kept": sum(r["no_sources_kept"] for r in no_answer),
        "cases": per_case,
    }


async def measure(kind: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as tmp:
        kb = open_kb(kind, Path(tmp) / "store")
        try:
            report = await kb.ingest("corpus", base_documents())
            await kb.store.optimize("corpus", force=True)
            rows, relevance, ranked = await corpus_questions(kb)
            rag = await rag_suite(kb)
        finally:
            await kb.aclose()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": kind,
        "embedder": kb.embedder.name,
        "documents": report.added,
        "chunks": report.chunks,
        "modes": rows,
        "relevance": relevance,
        "rag_suite": rag,
        "ranked_doc_ids": ranked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=STORES, required=True)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    result = asyncio.run(measure(args.store))
    print(f"{result['store']}: {result['documents']} documents, {result['chunks']} chunks ({time.perf_counter() - started:.1f}s)\n")
    print("| mode | questions | hit@1 | hit@5 | MRR |\n|---|---|---|---|---|")
    for key, row in result["modes"].items():
        print(f"| {key} | {row['questions']} | {row['hit@1']} | {row['hit@5']} | {row['mrr']} |")
    relevance = result["relevance"]
    print(f"\nbest relevance of the right source, answerable questions (lowest 5): {relevance['answerable_source_best'][:5]}")
    print(f"median {relevance['answerable_median']}; unanswerable questions' best: {relevance['unanswerable_best']}")
    rag = result["rag_suite"]
    print(f"\n| rag suite ({rag['collection']}, {rag['chunks']} chunks) | value |\n|---|---|")
    print(f"| recall@{rag['recall_k']} (mean of {rag['cases_with_expected_sources']} cases) | {rag['recall_at_k']} |")
    print(f"| MRR | {rag['mrr']} |")
    print(f"| expected source among the sources kept by grading | {rag['expected_source_among_kept_sources']} of {rag['cases_with_expected_sources']} |")
    print(f"| expect_no_answer cases where grading kept nothing | {rag['no_answer_cases_with_nothing_kept']} of {rag['no_answer_cases']} |")
    if not args.no_save:
        out = result_path(f"retrieval-{args.store}")
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
