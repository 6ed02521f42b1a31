"""The knowledge base and the ``rag`` graph over HTTP, with the real local model and
embedder: ingestion through the running server (the CLI hands off when the server
holds the store), the collections API, and answers with citations on both protocols,
including the "no relevant information" path."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client

from gateway import Backend
from tests.conftest import REPO, SWITCHYARD, ServerHandle, start_server, stop_server, write_models_file
from tests.knowledge.conftest import CORPUS

pytestmark = [pytest.mark.e2e, pytest.mark.llm]


@pytest.fixture(scope="module")
def rag_server(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("rag")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {"rag": {"path": "graphs.rag:make_graph", "model": "chat-default"}},
            "knowledge": {"default_collection": "corpus"},
        },
    )
    try:
        result = subprocess.run(
            [str(SWITCHYARD), "--config", str(handle.config), "ingest", str(CORPUS), "-c", "corpus", "--json"],
            capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "sending the documents through it" in result.stderr  # the server holds the store
        report = json.loads(result.stdout)
        assert (report["added"], report["failed"]) == (25, 0)
        yield handle
    finally:
        stop_server(handle)


def _ask(server: ServerHandle, question: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "rag", "messages": [{"role": "user", "content": question}], "max_tokens": 60, "temperature": 0, **extra}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_delete_missing_through_the_server(rag_server: ServerHandle, tmp_path: Any) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("01-harbor-tides.md", "02-tram-network.md"):
        (source / name).write_text((CORPUS / name).read_text())

    def ingest() -> dict[str, Any]:
        result = subprocess.run(
            [str(SWITCHYARD), "--config", str(rag_server.config), "ingest", str(source), "-c", "small", "--json",
             "--delete-missing"],
            capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
        )
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    assert ingest()["added"] == 2
    (source / "02-tram-network.md").unlink()
    report = ingest()
    assert (report["skipped"], report["deleted"]) == (1, 1) and report["seconds"] > 0
    listed = httpx.get(rag_server.url + "/v1/collections/small/documents").json()["documents"]
    assert [d["doc_id"] for d in listed] == ["01-harbor-tides.md"]


def test_the_collections_api(rag_server: ServerHandle) -> None:
    url = rag_server.url
    listed = httpx.get(url + "/v1/collections").json()["data"]
    assert ("corpus", 25, "use-multilingual-v3") in [(c["name"], c["documents"], c["embedder"]) for c in listed]
    hits = httpx.post(url + "/v1/collections/corpus/search", json={"query": "云梯线单程票价和往返票价是多少", "k": 3}).json()["results"]
    assert hits[0]["doc_id"] == "14-qiaocheng-cable-car.md"
    assert set(hits[0]) >= {"doc_id", "chunk_id", "score", "text", "source"}
    assert httpx.post(url + "/v1/collections/corpus/search", json={"query": "  "}).status_code == 422
    missing = httpx.post(url + "/v1/collections/nope/search", json={"query": "x"})
    assert missing.status_code == 404 and "unknown collection 'nope'" in missing.json()["error"]["message"]
    upload = {"documents": [{"id": "tmp-1", "text": "The Verrin zeppelin mast is 84 metres tall.", "metadata": {"tags": ["tmp"]}}]}
    first = httpx.post(url + "/v1/collections/scratch/documents", json=upload).json()
    again = httpx.post(url + "/v1/collections/scratch/documents", json=upload).json()
    assert (first["added"], again["skipped"]) == (1, 1)
    assert httpx.delete(url + "/v1/collections/scratch/documents/tmp-1").status_code == 204
    assert httpx.delete(url + "/v1/collections/scratch/documents/tmp-1").status_code == 404


def test_an_answer_cites_its_sources(rag_server: ServerHandle) -> None:
    answer = _ask(rag_server, "What is the spring tidal range at Verrin Harbor?")
    citations = answer["citations"]
    assert citations and citations[0]["index"] == 1
    assert "01-harbor-tides.md" in {c["doc_id"] for c in citations}
    assert all(c["relevance"] >= 0.28 for c in citations)
    content = answer["choices"][0]["message"]["content"]
    assert "[1]" in content or "[2]" in content or "Sources: [1]" in content  # never uncited


def test_the_stream_sends_citations_before_the_answer(rag_server: ServerHandle) -> None:
    body = {"model": "rag", "collection": "corpus", "stream": True, "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "青泥窑每年开几次窑？"}]}
    chunks = []
    with httpx.stream("POST", rag_server.url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    with_citations = [i for i, c in enumerate(chunks) if "citations" in c]
    with_text = [i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(with_citations) == 1 and with_text and with_citations[0] < with_text[0]
    assert chunks[with_citations[0]]["citations"][0]["doc_id"] == "17-qingni-kiln.md"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_an_unanswerable_question_says_so(rag_server: ServerHandle) -> None:
    answer = _ask(rag_server, "Who painted the Mona Lisa?")
    assert "citations" not in answer
    assert "no relevant information" in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"
    missing = httpx.post(rag_server.url + "/v1/chat/completions", timeout=60,
                         json={"model": "rag", "collection": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "collection_not_found"


async def test_the_langgraph_api_keeps_the_sources_in_the_thread(rag_server: ServerHandle) -> None:
    client = get_client(url=rag_server.url, api_key=None)
    thread = (await client.threads.create())["thread_id"]
    result = await client.runs.wait(
        thread, "rag", input={"messages": [{"role": "user", "content": "Which bakery bakes the Harbor Rye loaf?"}]},
        context={"collection": "corpus", "model_params": {"max_tokens": 40}},
    )
    assert result["sources"] and result["sources"][0]["index"] == 1
    assert "08-brannock-bakery.md" in {s["doc_id"] for s in result["sources"]}
    assert result["messages"][-1]["type"] == "ai"
    # A follow-up: the question is rewritten with the conversation, then searched.
    follow = await client.runs.wait(
        thread, "rag", input={"messages": [{"role": "user", "content": "And when does it open?"}]},
        context={"collection": "corpus", "model_params": {"max_tokens": 40}},
    )
    assert follow["query"] and follow["messages"][-1]["type"] == "ai"
    await client.http.client.aclose()
