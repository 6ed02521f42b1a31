"""The `KnowledgeGraph` facade: binding an ontology, documents leaving the knowledge
base taking their facts with them, extraction that counts a failing model's chunks
instead of failing, skips what is up to date and retries what was partial, the real
local model's extraction end to end, and the errors of reading a graph that is not
there. Real engines: LadybugDB, Qdrant Edge and the packaged embedder in a temp
directory; the model is the real llama.cpp server or the scripted benchmark backend
(answers that are not JSON, on demand)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway import Backend, ModelGateway, load_registry
from knowledge import (
    Document,
    GraphNotFoundError,
    KnowledgeBase,
    KnowledgeError,
    KnowledgeGraph,
    KnowledgeSettings,
    OntologyMismatchError,
    OntologyRequiredError,
    entities_collection,
    open_knowledge_graph,
)
from knowledge.embeddings.local import LocalEmbedder
from knowledge.errors import InvalidCollectionNameError, StoreLockedError
from knowledge.extraction import INVALID_REASONS
from knowledge.graphstore import LadybugStore
from knowledge.knowledge_graph import PARTIAL_PREFIX
from knowledge.ontology import load_ontology, parse_ontology
from knowledge.settings import ExtractionSettings, GraphSettings
from knowledge.vectorstore.edge import EdgeStore
from tests.fakes.openai_backend import free_port
from tests.scripted import running_scripted_backend

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")

BENEFIT = Document(
    id="benefit.md", format="markdown", source="benefit.md",
    text="# Unemployment benefit\n\nTo apply for the unemployment benefit you need a Separation Certificate from "
    "your last employer. The Employment Office handles the unemployment benefit.\n",
)
CERTIFICATE = Document(
    id="certificate.md", format="markdown", source="certificate.md",
    text="# When the employer refuses\n\nIf an employer refuses to write the Separation Certificate, the Labour "
    "Arbitration Office issues it instead.\n",
)
FACTS = [
    {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"},
    {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "benefit.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "benefit.md"},
    {"kind": "entity", "type": "Office", "name": "Employment Office", "source": "benefit.md"},
    {"kind": "relation", "type": "HANDLED_BY", "from": "Unemployment Benefit", "to": "Employment Office", "source": "benefit.md"},
    # Stated by both documents: stays while either does.
    {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "certificate.md"},
    {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "source": "certificate.md"},
    {"kind": "relation", "type": "ISSUED_INSTEAD_BY", "from": "Separation Certificate", "to": "Labour Arbitration Office",
     "source": "certificate.md"},
]


@pytest.fixture
async def knowledge(tmp_path: Path, embedder: LocalEmbedder) -> AsyncIterator[KnowledgeBase]:
    vectors = EdgeStore(tmp_path / "vectors")
    kb = KnowledgeBase(vectors, embedder, KnowledgeSettings())
    await kb.ingest("city", [BENEFIT, CERTIFICATE])
    yield kb
    await vectors.aclose()  # the embedder is the session's


@pytest.fixture
async def graph(tmp_path: Path, knowledge: KnowledgeBase) -> AsyncIterator[KnowledgeGraph]:
    opened = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    knowledge.on_removed = opened.delete_document  # as open_knowledge_graph wires it
    yield opened
    await opened.aclose()


async def _imported(graph: KnowledgeGraph) -> None:
    report = await graph.import_facts("city", [json.dumps(f) for f in FACTS], ontology=ONTOLOGY)
    assert report.invalid == {}


async def test_binding(graph: KnowledgeGraph) -> None:
    with pytest.raises(OntologyRequiredError, match="collection 'city' has no knowledge graph yet"):
        await graph.bind("city", None)
    assert await graph.bind("city", ONTOLOGY) == ONTOLOGY
    assert await graph.bind("city", None) == ONTOLOGY
    assert await graph.bind("city", ONTOLOGY) == ONTOLOGY  # the same again: fine
    other = parse_ontology("name: other\nentity_types: {Thing: {}}\n")
    with pytest.raises(OntologyMismatchError) as caught:
        await graph.bind("city", other)
    assert ONTOLOGY.describe() in str(caught.value) and other.describe() in str(caught.value)
    assert await graph.graphs() == ["city"]
    with pytest.raises(KnowledgeError, match="entity companion"):
        await graph.bind("city__entities", ONTOLOGY)
    with pytest.raises(InvalidCollectionNameError):
        await graph.bind("no/slashes", ONTOLOGY)


async def test_deleting_a_document_takes_only_its_facts(graph: KnowledgeGraph) -> None:
    await _imported(graph)
    assert (await graph.stats("city")).documents == 2
    assert await graph.knowledge.delete("city", "certificate.md")
    facts = (await graph.neighbors("city", "Separation Certificate", hops=1)).facts
    # The certificate's own relation went; the certificate itself stays (benefit.md names it).
    assert [(f.source.name, f.relation, f.target.name) for f in facts] == [
        ("Unemployment Benefit", "REQUIRES", "Separation Certificate")
    ]
    assert not (await graph.neighbors("city", "Labour Arbitration Office")).matched
    companion = await graph.knowledge.store.documents("city__entities")
    assert len(companion) == 3  # the office's point went with it
    stats = await graph.stats("city")
    assert stats.documents == 1 and stats.entities["Office"] == 1


async def test_a_replaced_document_loses_its_facts_an_unchanged_one_keeps_them(graph: KnowledgeGraph) -> None:
    await _imported(graph)
    await graph.knowledge.ingest("city", [BENEFIT, CERTIFICATE])  # unchanged: skipped
    assert (await graph.stats("city")).documents == 2
    changed = CERTIFICATE.model_copy(update={"text": CERTIFICATE.text + "\nBring your last payslip.\n"})
    await graph.knowledge.ingest("city", [changed])
    assert sorted(await graph.store.documents("city")) == ["benefit.md"]
    assert not (await graph.neighbors("city", "Labour Arbitration Office")).matched


async def test_reading_a_graph_that_is_not_there(graph: KnowledgeGraph) -> None:
    with pytest.raises(GraphNotFoundError, match="collection 'city' has no knowledge graph"):
        await graph.retrieve("city", "Where do I get a separation certificate?")
    with pytest.raises(GraphNotFoundError):
        await graph.neighbors("city", "Separation Certificate")
    with pytest.raises(GraphNotFoundError):
        await graph.stats("city")
    await graph.delete_document("city", "benefit.md")  # no graph: nothing to do
    await _imported(graph)
    with pytest.raises(KnowledgeError, match="the question is empty"):
        await graph.retrieve("city", "  ")
    with pytest.raises(KnowledgeError, match="hops must be an integer from 1 to 4, got 9"):
        await graph.retrieve("city", "a question", hops=9)
    with pytest.raises(KnowledgeError, match="max_facts must be"):
        await graph.retrieve("city", "a question", max_facts=0)
    with pytest.raises(KnowledgeError, match="the entity name is empty"):
        await graph.neighbors("city", "")
    with pytest.raises(KnowledgeError, match="limit must be"):
        await graph.neighbors("city", "Separation Certificate", limit=10_000)


async def test_neighbours(graph: KnowledgeGraph) -> None:
    await _imported(graph)
    found = await graph.neighbors("city", "the separation certificate", hops=1)  # not a key: linked by meaning
    assert [e.name for e in found.matched][:1] == ["Separation Certificate"]
    near = await graph.neighbors("city", "separation certificate.", hops=1)
    assert [e.name for e in near.matched] == ["Separation Certificate"]
    assert {(f.relation, f.hops) for f in near.facts} == {("REQUIRES", 1), ("ISSUED_INSTEAD_BY", 1)}
    far = await graph.neighbors("city", "Separation Certificate", hops=2, limit=2)
    assert len(far.facts) == 2 and all(f.hops == 1 for f in far.facts)  # nearer first
    as_json = near.json()
    assert as_json["matched"][0]["type"] == "Document"
    assert {f["doc_id"] for f in as_json["facts"]} == {"benefit.md", "certificate.md"}
    nothing = await graph.neighbors("city", "Mona Lisa")
    assert nothing.matched == () and nothing.facts == ()


def _scripted_models(path: Path, base_url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "backends": {
            "scripted": {
                "kind": "vllm", "base_url": base_url, "model": "scripted",
                "timeouts": {"connect_s": 2, "read_s": 30},
                "capabilities": {"context_window": 4096, "json_schema": True},
            },
        },
        "aliases": {"chat-default": "scripted"},
    }))
    return path


async def test_extraction_counts_failed_chunks_and_retries_them(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    # The scripted backend answers lorem ipsum: every chunk fails, none stops the run.
    with running_scripted_backend(tmp_path, delay_ms=1) as backend:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", backend.base_url)))
        settings = GraphSettings(extraction=ExtractionSettings(max_tokens=16, timeout_s=30))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, settings, gateway)
        try:
            with pytest.raises(KnowledgeError, match="extraction needs the model gateway"):
                await KnowledgeGraph(graph.store, knowledge, settings).extract("city", ontology=ONTOLOGY)
            seen: list[tuple[int, int]] = []
            report = await graph.extract(
                "city", ["benefit.md", "missing.md"], ontology=ONTOLOGY, progress=lambda d, t: seen.append((d, t))
            )
            assert report.documents == 0 and report.chunks == 1 and report.failed_chunks == 1
            assert report.invalid == {"bad_json": 1, "unknown_document": 1}
            assert {p["reason"] for p in report.problems} == {"bad_json", "unknown_document"}
            assert seen == [(1, 1)]
            # Nothing came back: nothing is written, and the next extraction tries again.
            assert await graph.store.documents("city") == {}
            again = await graph.extract("city")
            assert again.documents == 0 and again.skipped == 0 and again.failed_chunks == 2

            # Curated facts record the documents' versions: an extraction skips them...
            await graph.import_facts("city", [json.dumps(f) for f in FACTS])
            skipped = await graph.extract("city")
            assert skipped.skipped == 2 and skipped.documents == 0 and skipped.chunks == 0
            # ...unless forced, which would replace what the documents had (curated facts
            # too); a model that answers nothing leaves it as it was.
            forced = await graph.extract("city", ["certificate.md"], force=True)
            assert forced.documents == 0 and forced.failed_chunks == 1
            assert (await graph.neighbors("city", "Labour Arbitration Office")).facts
        finally:
            await graph.aclose()
            await gateway.aclose()


@pytest.fixture
async def local_gateway(local_backend: Backend, tmp_path: Path) -> AsyncIterator[ModelGateway]:
    # A longer read timeout than config/models.yaml's: the two cores are shared.
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    local = {**source["backends"]["local"], "base_url": local_backend.base_url, "timeouts": {"connect_s": 5, "read_s": 300}}
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": {"local": local}, "aliases": {"chat-default": "local"}}))
    gateway = ModelGateway(load_registry(models))
    yield gateway
    await gateway.aclose()


@pytest.mark.llm
async def test_extraction_with_the_local_model(tmp_path: Path, knowledge: KnowledgeBase, local_gateway: ModelGateway) -> None:
    settings = GraphSettings(extraction=ExtractionSettings(max_entities=6, max_relations=4, max_tokens=512, timeout_s=300))
    graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, settings, local_gateway)
    try:
        report = await graph.extract("city", ["benefit.md"], ontology=ONTOLOGY)
        # Quality is not asserted: the counts add up, the graph holds what was reported.
        assert report.documents == 1 and report.chunks == 1 and report.failed_chunks == 0, report.problems
        assert set(report.invalid) <= set(INVALID_REASONS)
        stats = await graph.stats("city")
        assert {t: n for t, n in stats.entities.items() if n} == report.entities
        assert {t: n for t, n in stats.relations.items() if n} == report.relations
        companion = await knowledge.store.documents("city__entities")
        assert len(companion) == sum(report.entities.values())
        entry = await knowledge.store.document("city", "benefit.md")
        assert entry is not None and (await graph.store.documents("city"))["benefit.md"] == entry.version
        assert (await graph.extract("city", ["benefit.md"])).skipped == 1
    finally:
        await graph.aclose()


async def test_open_knowledge_graph_wires_the_knowledge_base(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    graph = open_knowledge_graph(KnowledgeSettings(), tmp_path / "data", knowledge)
    try:
        assert isinstance(graph.store, LadybugStore) and graph.store.location == str(tmp_path / "data" / "graph")
        assert knowledge.on_removed == graph.delete_document
        with pytest.raises(StoreLockedError):
            LadybugStore(tmp_path / "data" / "graph")
        await _imported(graph)
        await knowledge.delete("city", "benefit.md")
        assert sorted(await graph.store.documents("city")) == ["certificate.md"]
    finally:
        await graph.aclose()
    assert knowledge.on_removed is None


async def test_a_long_collection_name_gets_a_valid_companion(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    long = "c" * 64
    assert entities_collection("city") == "city__entities"
    companion = entities_collection(long)
    assert len(companion) == 64 and companion.endswith("__entities") and companion != entities_collection("c" * 63 + "d")
    await knowledge.ingest(long, [BENEFIT])
    graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings())
    try:
        line = json.dumps({"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"})
        assert (await graph.import_facts(long, [line], ontology=ONTOLOGY)).entities == {"Procedure": 1}
        assert len(await knowledge.store.documents(companion)) == 1
    finally:
        await graph.aclose()


# ---- a FAKE extraction backend (failure injection: some chunks answer, others not) ----------

GOOD_ANSWER = {
    "entities": [
        {"name": "Unemployment Benefit", "type": "Procedure"},
        {"name": "Separation Certificate", "type": "Document", "aliases": ["leaving paper"]},
        {"name": "Bob", "type": "Person"},
    ],
    "relations": [
        {"type": "REQUIRES", "from": "unemployment benefit", "to": "Separation Certificate"},
        {"type": "REQUIRES", "from": "Separation Certificate", "to": "Unemployment Benefit"},
    ],
}


@contextmanager
def fake_extraction_backend(
    answers_all: list[bool], *, stall_s: float = 0.0, calls: dict[str, int] | None = None
) -> Iterator[str]:
    """FAKE: answers `GOOD_ANSWER` for a chunk about the benefit (or any chunk while
    ``answers_all[0]``), text that is not JSON otherwise. A chunk not about the
    benefit is answered after ``stall_s`` seconds. ``calls`` (if given) counts
    ``started``, ``answered`` and the most requests in flight at once (``most``).
    Yields its ``/v1`` URL."""
    counts = calls if calls is not None else {}
    for key in ("started", "answered", "in_flight", "most"):
        counts.setdefault(key, 0)

    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        body = await request.json()
        text = body["messages"][-1]["content"]
        counts["started"] += 1
        counts["in_flight"] += 1
        counts["most"] = max(counts["most"], counts["in_flight"])
        try:
            if stall_s and "benefit" not in text.lower():
                await asyncio.sleep(stall_s)
        finally:
            counts["in_flight"] -= 1
        counts["answered"] += 1
        content = json.dumps(GOOD_ANSWER) if answers_all[0] or "benefit" in text.lower() else "I cannot help with that."
        if body.get("stream"):
            # As a backend streams: the text in pieces, then the finish reason, then [DONE].
            def frame(delta: dict[str, str], finish: str | None) -> str:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                return "data: " + json.dumps({"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": body["model"], "choices": [choice]}) + "\n\n"

            pieces = [content[i : i + 16] for i in range(0, len(content), 16)]
            frames = [frame({"role": "assistant", "content": ""}, None)] + [frame({"content": p}, None) for p in pieces]
            frames += [frame({}, "stop"), "data: [DONE]\n\n"]
            return StreamingResponse(iter(frames), media_type="text/event-stream")
        return JSONResponse({
            "id": "fake", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        })

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake backend did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_extraction_writes_what_passes_and_retries_partial_documents(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    two_chunks = Document(
        id="guide.md", format="markdown", source="guide.md",
        text="# Guide\n\n## Benefit\n\nThe unemployment benefit requires a Separation Certificate.\n\n"
        "## Weather\n\nIt rains a lot in Verrin.\n",
    )
    await knowledge.ingest("city", [two_chunks])
    answers_all = [False]
    with fake_extraction_backend(answers_all) as url:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", url)))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings(), gateway)
        try:
            report = await graph.extract("city", ["guide.md"], ontology=ONTOLOGY)
            assert report.documents == 1 and report.chunks == 2 and report.failed_chunks == 1
            assert report.entities == {"Document": 1, "Procedure": 1} and report.relations == {"REQUIRES": 1}
            assert report.invalid == {"bad_json": 1, "relation_not_allowed": 1, "unknown_entity_type": 1}
            assert {p["where"] for p in report.problems} == {"chunk guide.md#0", "chunk guide.md#1"}
            facts = (await graph.neighbors("city", "leaving paper", hops=1)).facts
            assert [(f.source.name, f.relation, f.target.name, f.chunk_ids) for f in facts] == [
                ("Unemployment Benefit", "REQUIRES", "Separation Certificate", ("guide.md#0",))
            ]
            assert (await graph.store.documents("city"))["guide.md"].startswith(PARTIAL_PREFIX)
            assert len(await knowledge.store.documents("city__entities")) == 2
            # Partial: tried again; once every chunk answers, the version is recorded.
            answers_all[0] = True
            retried = await graph.extract("city", ["guide.md"])
            assert retried.documents == 1 and retried.failed_chunks == 0
            entry = await knowledge.store.document("city", "guide.md")
            assert entry is not None and (await graph.store.documents("city"))["guide.md"] == entry.version
            assert (await graph.extract("city", ["guide.md"])).skipped == 1
            # Both chunks now state the relation; still one relation, one entity each.
            stats = await graph.stats("city")
            assert stats.relations["REQUIRES"] == 1 and stats.entities["Document"] == 1
            facts = (await graph.neighbors("city", "Unemployment Benefit", hops=1)).facts
            assert facts[0].chunk_ids == ("guide.md#0", "guide.md#1")
        finally:
            await graph.aclose()
            await gateway.aclose()


async def test_documents_are_extracted_concurrently(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    more = [
        Document(id=f"benefit-{i}.md", format="markdown", source=f"benefit-{i}.md",
                 text=f"# Benefit {i}\n\nThe unemployment benefit requires a Separation Certificate ({i}).\n")
        for i in range(4)
    ]
    await knowledge.ingest("city", more)
    with fake_extraction_backend([True]) as url:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", url)))
        settings = GraphSettings(extraction=ExtractionSettings(concurrency=3))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, settings, gateway)
        try:
            seen: list[tuple[int, int]] = []
            report = await graph.extract("city", ontology=ONTOLOGY, progress=lambda d, t: seen.append((d, t)))
            assert report.documents == 6 and report.chunks == 6 and report.failed_chunks == 0
            assert seen == [(n, 6) for n in range(1, 7)]
            # Six documents state the same two entities and one relation: merged, not copied.
            assert report.entities == {"Document": 1, "Procedure": 1} and report.relations == {"REQUIRES": 1}
            facts = (await graph.neighbors("city", "Unemployment Benefit", hops=1)).facts
            assert len(facts) == 1 and len(facts[0].doc_ids) == 6
            assert len(await knowledge.store.documents("city__entities")) == 2
            # A failure inside one document's work is raised as itself, not as an
            # exception group (a caller maps KnowledgeError subclasses to statuses).

            def interrupted(done: int, total: int) -> None:
                raise KnowledgeError("stopped by the caller")

            with pytest.raises(KnowledgeError, match="stopped by the caller"):
                await graph.extract("city", force=True, progress=interrupted)
        finally:
            await graph.aclose()
            await gateway.aclose()


async def test_an_unexpected_failure_stops_the_other_chunks_model_calls(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    three = Document(
        id="guide.md", format="markdown", source="guide.md",
        text="# Guide\n\n## Benefit\n\nThe unemployment benefit requires a Separation Certificate.\n\n"
        "## Weather\n\nIt rains a lot in Verrin.\n\n## Trams\n\nThe trams run all night in Verrin.\n",
    )
    await knowledge.ingest("city", [three])
    assert (await knowledge.store.document("city", "guide.md")).chunks == 3  # type: ignore[union-attr]
    calls: dict[str, int] = {}
    with fake_extraction_backend([True], stall_s=1.0, calls=calls) as url:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", url)))
        settings = GraphSettings(extraction=ExtractionSettings(concurrency=3))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, settings, gateway)
        try:
            progressed: list[int] = []

            def interrupted(done: int, total: int) -> None:
                progressed.append(done)
                raise KnowledgeError("stopped by the caller")

            with pytest.raises(KnowledgeError, match="stopped by the caller"):
                await graph.extract("city", ["guide.md"], ontology=ONTOLOGY, progress=interrupted)
            # The two stalled chunks' calls were cancelled with the extraction, not
            # left running to report progress (and fail again) after it returned.
            await asyncio.sleep(1.5)
            assert progressed == [1] and calls["started"] >= 1
            assert await graph.store.documents("city") == {}
        finally:
            await graph.aclose()
            await gateway.aclose()


async def test_concurrent_extractions_share_the_model_call_bound(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    more = [
        Document(id=f"weather-{i}.md", format="markdown", source=f"weather-{i}.md", text=f"# Weather {i}\n\nIt rains ({i}).\n")
        for i in range(4)
    ]
    await knowledge.ingest("city", more)
    calls: dict[str, int] = {}
    with fake_extraction_backend([True], stall_s=0.3, calls=calls) as url:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", url)))
        settings = GraphSettings(extraction=ExtractionSettings(concurrency=2))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, settings, gateway)
        try:
            await graph.bind("city", ONTOLOGY)
            reports = await asyncio.gather(
                graph.extract("city", ["weather-0.md", "weather-1.md"]), graph.extract("city", ["weather-2.md", "weather-3.md"])
            )
            assert [r.documents for r in reports] == [2, 2] and calls["started"] == 4
            # ``concurrency`` bounds the model calls of this graph, not of each request.
            assert calls["most"] == 2
        finally:
            await graph.aclose()
            await gateway.aclose()


async def test_extracting_every_document_removes_the_facts_of_documents_gone(tmp_path: Path, knowledge: KnowledgeBase) -> None:
    with fake_extraction_backend([True]) as url:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", url)))
        graph = KnowledgeGraph(LadybugStore(tmp_path / "graph"), knowledge, GraphSettings(), gateway)
        try:
            await _imported(graph)
            # No hook wired (as when it failed): the graph keeps a deleted document's facts...
            await knowledge.delete("city", "certificate.md")
            assert sorted(await graph.store.documents("city")) == ["benefit.md", "certificate.md"]
            # ...and an extraction of named documents leaves them be...
            named = await graph.extract("city", ["benefit.md"])
            assert named.skipped == 1 and named.removed == 0
            # ...but one of every document removes them, and their entities' companion points.
            report = await graph.extract("city")
            assert report.removed == 1 and report.skipped == 1 and report.documents == 0
            assert sorted(await graph.store.documents("city")) == ["benefit.md"]
            assert await graph.store.find_entities("city", ["Labour Arbitration Office"]) == []
            companion = await knowledge.store.documents(entities_collection("city"))
            assert len(companion) == 3  # benefit.md's benefit, certificate and office
            assert (await graph.extract("city")).removed == 0
        finally:
            await graph.aclose()
            await gateway.aclose()
