"""The ``graphrag`` graph end to end: a real server, the real local model and embedder,
the graphrag suite's city-services documents ingested and its curated facts imported
through the CLI (which hands off to the server holding the stores), then two-hop
questions over the OpenAI API (the ``openai`` client, whole and streamed: the facts
arrive next to the citations, before the answer) and the LangGraph API (facts in the
thread's state)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from openai import OpenAI

from eval.datasets import DATASETS_DIR
from gateway import Backend
from tests.conftest import REPO, SWITCHYARD, ServerHandle, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

CITY = DATASETS_DIR / "graphrag-corpus"
# The price is in the second document only (39): the question names the allowance (38).
QUESTION = "How much does each extract cost that I must bring for the childcare allowance?"
BOTH = {"38-childcare-allowance.md", "39-birth-register-extract.md"}


def _cli(server: ServerHandle, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(server.config), *args, "--json"],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def graphrag_server(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("graphrag")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {"graphrag": {"path": "graphs.graphrag:make_graph", "model": "chat-default"}},
            "knowledge": {"default_collection": "city"},
        },
    )
    try:
        ingested = _cli(handle, "ingest", str(CITY / "documents"), "-c", "city")
        assert (ingested["added"], ingested["failed"]) == (14, 0)
        imported = _cli(handle, "graph", "import", str(CITY / "facts.jsonl"), "-c", "city", "--ontology", str(CITY / "ontology.yaml"))
        assert imported["invalid"] == {} and sum(imported["relations"].values()) == 33
        yield handle
    finally:
        stop_server(handle)


def _client(server: ServerHandle) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def test_a_two_hop_answer_cites_both_documents_and_lists_its_facts(graphrag_server: ServerHandle) -> None:
    completion = _client(graphrag_server).chat.completions.create(
        model="graphrag", messages=[{"role": "user", "content": QUESTION}], max_tokens=60, temperature=0
    )
    body = completion.model_dump()
    citations, facts = body["citations"], body["facts"]
    assert BOTH <= {c["doc_id"] for c in citations}
    assert [c["index"] for c in citations] == list(range(1, len(citations) + 1))
    chain = next(f for f in facts if f["relation"] == "ISSUED_BY" and f["subject"] == "Birth Register Extract")
    assert chain["object"] == "Civil Registry Hall" and chain["hops"] == 2
    cited = {c["index"]: c for c in citations}
    assert [cited[n]["doc_id"] for n in chain["cited_as"]] == ["39-birth-register-extract.md"]
    assert all(f["cited_as"] and set(f["cited_as"]) <= set(cited) for f in facts)
    content = body["choices"][0]["message"]["content"]
    # Cited in the text, or the graph's sources line: never an uncited answer.
    assert any(f"[{n}]" in content for n in cited), content


def test_the_stream_sends_citations_then_facts_before_the_answer(graphrag_server: ServerHandle) -> None:
    stream = _client(graphrag_server).chat.completions.create(
        model="graphrag", messages=[{"role": "user", "content": QUESTION}], max_tokens=40, temperature=0, stream=True
    )
    chunks = [chunk.model_dump() for chunk in stream]
    with_citations = [i for i, c in enumerate(chunks) if c.get("citations")]
    with_facts = [i for i, c in enumerate(chunks) if c.get("facts")]
    with_text = [i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(with_citations) == 1 and len(with_facts) == 1 and with_text
    assert with_citations[0] < with_facts[0] < with_text[0]
    assert BOTH <= {c["doc_id"] for c in chunks[with_citations[0]]["citations"]}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_collection_without_a_graph_still_answers(graphrag_server: ServerHandle) -> None:
    _cli(graphrag_server, "ingest", str(CITY / "documents" / "38-childcare-allowance.md"), "-c", "plain")
    completion = _client(graphrag_server).chat.completions.create(
        model="graphrag", messages=[{"role": "user", "content": QUESTION}], max_tokens=30, temperature=0,
        extra_body={"collection": "plain"},
    )
    body = completion.model_dump()
    assert {c["doc_id"] for c in body["citations"]} == {"38-childcare-allowance.md"}
    assert body.get("facts") is None


async def test_the_langgraph_api_keeps_the_facts_in_the_thread(graphrag_server: ServerHandle) -> None:
    client = get_client(url=graphrag_server.url, api_key=None)
    thread = (await client.threads.create())["thread_id"]
    result = await client.runs.wait(
        thread, "graphrag", input={"messages": [{"role": "user", "content": QUESTION}]},
        context={"model_params": {"max_tokens": 30, "temperature": 0}},
    )
    assert isinstance(result, dict)
    assert BOTH <= {s["doc_id"] for s in result["sources"]}
    assert any(f["object"] == "Civil Registry Hall" for f in result["facts"])
    state = await client.threads.get_state(thread)
    assert state["values"]["facts"] == result["facts"]
    await client.http.client.aclose()
