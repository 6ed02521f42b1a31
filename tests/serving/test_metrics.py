"""``/metrics`` moves as expected after a known sequence of requests (through the FAKE
scripted backend, so token counts are exact), and after rag runs (the real packaged
embedder and embedded vector store): time to first token by graph, hits per search."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file
from tests.promql import sample

pytestmark = [pytest.mark.e2e]

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.llm
def test_counters_move_with_a_known_sequence(server: ServerHandle) -> None:
    before = httpx.get(server.url + "/metrics").text
    post = lambda body: httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)  # noqa: E731
    assert post({"model": "chat-fake", "messages": HELLO}).status_code == 200
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={"model": "fake-ok", "messages": HELLO, "stream": True}) as r:
        assert r.status_code == 200 and list(r.iter_lines())
    assert post({"model": "fake-500", "messages": HELLO}).status_code == 502
    assert post({"model": "no-such-model", "messages": HELLO}).status_code == 404
    after = httpx.get(server.url + "/metrics").text

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("switchyard_runs_total", kind="graph", target="chat-fake", outcome="ok") == 1
    assert delta("switchyard_runs_total", kind="alias", target="fake-ok", outcome="ok") == 1
    assert delta("switchyard_runs_total", kind="alias", target="fake-500", outcome="error") == 1
    assert delta("switchyard_output_tokens_total", kind="graph", target="chat-fake") == 4  # the fake's usage
    assert delta("switchyard_output_tokens_total", kind="alias", target="fake-ok") == 4
    assert delta("switchyard_backend_errors_total", backend="fake-500", error="BackendResponseError") == 1
    route = "/v1/chat/completions"
    assert delta("switchyard_request_duration_seconds_count", route=route, status="200") == 2
    assert delta("switchyard_request_duration_seconds_count", route=route, status="502") == 1
    assert delta("switchyard_request_duration_seconds_count", route=route, status="404") == 1
    assert delta("switchyard_time_to_first_token_seconds_count", kind="alias") == 1
    assert delta("switchyard_time_to_first_token_seconds_count", kind="alias", target="fake-ok", backend="fake-ok") == 1
    assert sample(after, "switchyard_runs_in_flight") == 0 or "switchyard_runs_in_flight 0.0" in after


@pytest.fixture(scope="module")
def rag_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    """A rag graph answered by the fake backend, over collection ``docs`` (one
    document) and collection ``emptied`` (its only document deleted: it exists, and
    holds nothing)."""
    tmp = tmp_path_factory.mktemp("rag-metrics")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "rag-fake": {"path": "graphs.rag:make_graph", "model": "fake-ok"},
                "rag-500": {"path": "graphs.rag:make_graph", "model": "fake-500"},
            },
            "knowledge": {"default_collection": "docs"},
        },
    )
    try:
        collections = handle.url + "/v1/collections"
        document = {"id": "card.md", "text": "The Citizen Desk issues the Resident Card.", "format": "markdown"}
        for name in ("docs", "emptied"):
            upload = httpx.post(f"{collections}/{name}/documents", json={"documents": [document]}, timeout=60)
            assert upload.status_code == 200 and upload.json()["added"] == 1, upload.text
        assert httpx.delete(f"{collections}/emptied/documents/card.md", timeout=30).status_code == 204
        yield handle
    finally:
        stop_server(handle)


def test_a_rag_run_is_timed_by_graph_and_its_search_counted(rag_server: ServerHandle) -> None:
    url = rag_server.url
    before = httpx.get(url + "/metrics").text
    question = [{"role": "user", "content": "Who issues the Resident Card?"}]
    answered = httpx.post(url + "/v1/chat/completions", json={"model": "rag-fake", "messages": question}, timeout=60)
    assert answered.status_code == 200 and answered.json()["citations"], answered.text
    streamed = {"model": "rag-fake", "messages": question, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=streamed, timeout=60) as response:
        assert response.status_code == 200 and list(response.iter_lines())
    # The emptied collection: the search finds nothing, the graph says so (no citation).
    nothing = httpx.post(
        url + "/v1/chat/completions", json={"model": "rag-fake", "messages": question, "collection": "emptied"}, timeout=60
    )
    assert nothing.status_code == 200 and not nothing.json().get("citations"), nothing.text
    # An unknown collection is an error before any search: not counted as an empty one.
    missing = httpx.post(
        url + "/v1/chat/completions", json={"model": "rag-fake", "messages": question, "collection": "nope"}, timeout=60
    )
    assert missing.status_code >= 400
    after = httpx.get(url + "/metrics").text

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    # Time to first token is measured on streams, labelled by the graph that served.
    assert delta("switchyard_time_to_first_token_seconds_count", kind="graph", target="rag-fake", backend="fake-ok") == 1
    assert delta("switchyard_time_to_first_token_seconds_count") == 1
    # One search per run that reached retrieval; the emptied collection's in the 0 bucket.
    assert delta("switchyard_retrieval_hits_count", source="vectors") == 3
    assert delta("switchyard_retrieval_hits_bucket", source="vectors", le="0.0") == 1
    assert delta("switchyard_retrieval_hits_sum", source="vectors") == 2  # one chunk each time it was there
    assert delta("switchyard_retrieval_hits_count", source="graph") == 0


def test_time_to_first_token_waits_for_the_model(rag_server: ServerHandle) -> None:
    """A retrieval graph streams its role and citations before the model answers: they
    are not the first token. A run whose model fails after the citations went out
    streamed no token, so no time to first token is counted for it."""
    url = rag_server.url
    before = httpx.get(url + "/metrics").text
    question = [{"role": "user", "content": "Who issues the Resident Card?"}]
    streamed = {"model": "rag-500", "messages": question, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=streamed, timeout=60) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert any('"citations"' in line for line in lines), lines  # sent before the model failed
    assert any('"error"' in line for line in lines), lines
    after = httpx.get(url + "/metrics").text
    assert sample(after, "switchyard_time_to_first_token_seconds_count", target="rag-500") == sample(
        before, "switchyard_time_to_first_token_seconds_count", target="rag-500"
    )
