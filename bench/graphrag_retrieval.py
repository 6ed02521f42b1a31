"""Two-hop retrieval on the graphrag suite: is every document an answer needs in the
context the model gets? ``rag`` against ``graphrag`` with the suite's curated facts, and
``graphrag`` with a graph the local model extracted.

- Corpus: the graphrag suite's (the sample corpus plus the nine city-services documents
  of eval/datasets/graphrag-corpus), ingested with the packaged embedder into Qdrant
  Edge in a temp directory, the way ``switchyard eval run`` reads it
  (`serving.eval_runner.corpus_documents`).
- Each answerable case runs the graph's own nodes up to generation (the compiled graph
  with ``interrupt_before=["generate", "no_answer"]``; a first question is not
  rewritten, so no model is called): the numbered ``sources`` are the context.
  *All needed sources*: every ``expected_sources`` document is among the sources'
  documents; *second document*: the one the question does not name (the second of
  ``expected_sources``) is. Unanswerable cases report whether the context is empty.
- ``rag``: the default settings (at most ``max_sources`` = 4 chunks); ``rag (6 sources)``:
  the same graph allowed as many chunks as ``graphrag`` may give (4 + 2), so that a
  difference is not only a bigger context.
- ``graphrag (curated)``: the suite's facts.jsonl imported under its ontology
  (LadybugDB in the temp directory).
- ``graphrag (extracted)`` with ``--extract``: the local model (llama.cpp + SmolLM2,
  started here on a free port) extracts the graph of the nine city-services documents
  under the same ontology (`KnowledgeGraph.extract`, the ontology's JSON schema); the
  extraction report (entities, relations, invalid items by reason, failed chunks) is
  recorded with the retrieval numbers. The sample corpus's documents are not extracted
  (they hold no city services; extracting them would only add time).

``--read-timeout S`` raises the local backend's read timeout (config/models.yaml says
60 s) for the extraction: on a shared 2-core machine a chunk's answer of up to
``max_tokens`` tokens can take longer, three timeouts in a row open the backend's
circuit breaker, and the chunks after them then fail at once ("circuit open").

Results: markdown on stdout, JSON in bench/results/graphrag-retrieval-<UTC time>.json
(every case's context documents per mode).

    .venv/bin/python bench/graphrag_retrieval.py [--extract [--read-timeout S]] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from langchain_core.messages import HumanMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from eval.datasets import Suite, load_suite  # noqa: E402
from gateway import ModelGateway, load_registry  # noqa: E402
from gateway.chat import GatewayChatModel  # noqa: E402
from gateway.local import start_backend, stop_backend  # noqa: E402
from graphs import GraphDeps, RunContext  # noqa: E402
from graphs.graphrag import make_graph as make_graphrag  # noqa: E402
from graphs.graphrag.nodes import GRAPH_EXTRA_SOURCES  # noqa: E402
from graphs.rag import make_graph as make_rag  # noqa: E402
from knowledge import Document, KnowledgeBase, KnowledgeGraph, KnowledgeSettings  # noqa: E402
from knowledge.embeddings.local import LocalEmbedder  # noqa: E402
from knowledge.graphstore import LadybugStore  # noqa: E402
from knowledge.ontology import load_ontology  # noqa: E402
from knowledge.settings import ExtractionSettings, GraphSettings, RagSettings  # noqa: E402
from knowledge.vectorstore.edge import EdgeStore  # noqa: E402
from serving.eval_runner import corpus_documents  # noqa: E402
from tests.fakes.openai_backend import free_port  # noqa: E402

RESULTS = REPO / "bench" / "results"


class _NoModels:
    def chat_model(self, alias: str) -> Any:
        raise AssertionError("no model is called before generation")


def _unreached_model() -> GatewayChatModel:
    # Port 9 is closed; the graphs stop before generation, so it is never called.
    return GatewayChatModel(model="m", api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0)


async def contexts(graph: Any, suite: Suite, collection: str) -> dict[str, dict[str, Any]]:
    """Case id -> what the graph would give the model: sources' documents in order,
    facts (graphrag), and how long retrieval took."""
    found: dict[str, dict[str, Any]] = {}
    for number, case in enumerate(suite.cases):
        config = {"configurable": {"thread_id": f"{collection}-{number}"}}
        started = time.perf_counter()
        await graph.ainvoke({"messages": [HumanMessage(case.input)]}, config, context=RunContext(collection=collection))
        values = (await graph.aget_state(config)).values
        found[case.id] = {
            "sources": [s["doc_id"] for s in values.get("sources", [])],
            "chars": sum(len(s["text"]) for s in values.get("sources", [])),
            "facts": [f["text"] for f in values.get("facts", [])],
            "linked": [f"{e['name']} ({e['how']})" for e in values.get("linked", [])],
            "seconds": round(time.perf_counter() - started, 3),
        }
    return found


def score(suite: Suite, found: dict[str, dict[str, Any]]) -> dict[str, Any]:
    answerable = [c for c in suite.cases if not c.expect_no_answer]
    unanswerable = [c for c in suite.cases if c.expect_no_answer]
    every = [c.id for c in answerable if set(c.expected_sources) <= set(found[c.id]["sources"])]
    second = [c.id for c in answerable if c.expected_sources[-1] in found[c.id]["sources"]]
    return {
        "cases": len(answerable),
        "all_needed_sources": len(every),
        "second_document": len(second),
        "missed": [c.id for c in answerable if c.id not in every],
        "mean_sources": round(sum(len(found[c.id]["sources"]) for c in answerable) / len(answerable), 2),
        "mean_context_chars": round(sum(found[c.id]["chars"] for c in answerable) / len(answerable)),
        "unanswerable_empty": sum(not found[c.id]["sources"] for c in unanswerable),
        "unanswerable": len(unanswerable),
    }


async def extracted_graph(
    kb: KnowledgeBase, root: Path, collection: str, suite: Suite, doc_ids: list[str], read_timeout_s: float | None
) -> tuple[KnowledgeGraph, dict[str, Any], Any]:
    """A graph extracted by the local model (started here); returns it, the report and
    a stop function for the backend."""
    port = free_port()
    os.environ["SWITCHYARD_LOCAL_BACKEND_PORT"] = str(port)
    models = REPO / "config/models.yaml"
    if read_timeout_s is not None:
        config = yaml.safe_load(models.read_text(encoding="utf-8"))
        config["backends"]["local"]["timeouts"]["read_s"] = read_timeout_s
        models = root / "models.yaml"
        models.write_text(yaml.safe_dump(config), encoding="utf-8")
    backend = load_registry(models).backends["local"]
    data_dir = root / "backend"
    data_dir.mkdir()
    start_backend(backend, data_dir)
    gateway = ModelGateway(load_registry(models))
    # The per-chunk limit (120 s by default) must not cut what the longer read timeout allows.
    extraction = ExtractionSettings(timeout_s=read_timeout_s) if read_timeout_s is not None else ExtractionSettings()
    graph = KnowledgeGraph(LadybugStore(root / "graph-extracted"), kb, GraphSettings(extraction=extraction), gateway)
    started = time.perf_counter()
    assert suite.ontology is not None
    report = await graph.extract(collection, doc_ids, ontology=load_ontology(suite.ontology))
    described = report.model_dump(mode="json")
    described["seconds"] = round(time.perf_counter() - started, 1)
    described["read_timeout_s"] = backend.timeouts.read_s

    async def stop() -> None:
        await gateway.aclose()
        stop_backend(backend, data_dir)

    return graph, described, stop


async def main(extract: bool, save: bool, read_timeout_s: float | None = None) -> None:
    suite = load_suite("graphrag")
    documents = [d for d in corpus_documents(suite) if isinstance(d, Document)]
    new_ids = sorted(d.id for d in documents if suite.corpora[-1] / d.id in set(suite.corpus_files))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = EdgeStore(root / "vectors", optimize_delay_s=None)
        kb = KnowledgeBase(store, LocalEmbedder.packaged("use-multilingual-v3"), KnowledgeSettings())
        collections = ["rag", "curated", *(["extracted"] if extract else [])]
        for name in collections:
            await kb.ingest(name, documents)
        deps = {"graph_id": "x", "model": _unreached_model(), "models": _NoModels(), "knowledge": kb}
        stop_at = ["generate", "no_answer"]
        results: dict[str, Any] = {}
        rag = make_rag(GraphDeps(**deps)).compile(checkpointer=InMemorySaver(), interrupt_before=stop_at)
        found = await contexts(rag, suite, "rag")
        results["rag"] = {"score": score(suite, found), "cases": found}
        wider = KnowledgeSettings(rag=RagSettings(max_sources=RagSettings().max_sources + GRAPH_EXTRA_SOURCES))
        rag6 = make_rag(GraphDeps(**{**deps, "knowledge": KnowledgeBase(store, kb.embedder, wider)}))
        found = await contexts(rag6.compile(checkpointer=InMemorySaver(), interrupt_before=stop_at), suite, "rag")
        results[f"rag ({wider.rag.max_sources} sources)"] = {"score": score(suite, found), "cases": found}

        curated = KnowledgeGraph(LadybugStore(root / "graph-curated"), kb, GraphSettings())
        assert suite.facts is not None and suite.ontology is not None
        imported = await curated.import_facts(
            "curated", suite.facts.read_text(encoding="utf-8").splitlines(), ontology=load_ontology(suite.ontology)
        )
        graph = make_graphrag(GraphDeps(**deps, graph=curated)).compile(checkpointer=InMemorySaver(), interrupt_before=stop_at)
        found = await contexts(graph, suite, "curated")
        results["graphrag (curated)"] = {"score": score(suite, found), "cases": found, "import": imported.model_dump(mode="json")}
        await curated.aclose()

        if extract:
            extracted, report, stop = await extracted_graph(kb, root, "extracted", suite, new_ids, read_timeout_s)
            try:
                graph = make_graphrag(GraphDeps(**deps, graph=extracted)).compile(checkpointer=InMemorySaver(), interrupt_before=stop_at)
                found = await contexts(graph, suite, "extracted")
                results["graphrag (extracted)"] = {"score": score(suite, found), "cases": found, "extraction": report}
            finally:
                await extracted.aclose()
                await stop()
        await store.aclose()

    print(f"## graphrag suite: {results['rag']['score']['cases']} two-hop questions, {len(documents)} documents\n")
    print("| graph | all needed sources in the context | second document in the context | mean sources | mean context chars | unanswerable with empty context |")
    print("|---|---|---|---|---|---|")
    for name, result in results.items():
        s = result["score"]
        print(
            f"| {name} | {s['all_needed_sources']}/{s['cases']} | {s['second_document']}/{s['cases']} | {s['mean_sources']} "
            f"| {s['mean_context_chars']} | {s['unanswerable_empty']}/{s['unanswerable']} |"
        )
    for name, result in results.items():
        if result["score"]["missed"]:
            print(f"\n{name} misses: {', '.join(result['score']['missed'])}")
    if "graphrag (extracted)" in results:
        report = results["graphrag (extracted)"]["extraction"]
        print(
            f"\nextraction of {report['documents']} documents ({report['chunks']} chunks, {report['failed_chunks']} failed) "
            f"in {report['seconds']} s (read timeout {report['read_timeout_s']} s): entities {report['entities']}, relations {report['relations']}, invalid {report['invalid']}"
        )
    if save:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"graphrag-retrieval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(json.dumps({"suite_hash": suite.hash, "documents": len(documents), "results": results}, indent=1, ensure_ascii=False))
        print(f"\nwrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extract", action="store_true", help="also measure a graph the local model extracted")
    parser.add_argument("--read-timeout", type=float, help="the local backend's read timeout in seconds, for --extract")
    parser.add_argument("--no-save", action="store_true")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.extract, not arguments.no_save, arguments.read_timeout))
