"""A client that disconnects mid-stream cancels the run: Switchyard's in-flight count
returns to zero and the real llama.cpp backend stops generating for that request."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway import Backend
from tests.conftest import ServerHandle
from tests.promql import metric, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

# Greedy decoding makes SmolLM2 run to the token limit on this prompt.
LONG = [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_disconnect_cancels_the_run_and_the_backend_request(
    server: ServerHandle, local_backend: Backend, model: str
) -> None:
    backend = local_backend.root_url
    kind = "graph" if model == "chat" else "alias"
    cancelled_before = metric(server.url, "switchyard_runs_total", kind=kind, target=model, outcome="cancelled")
    decoded_before = metric(backend, "llamacpp:n_decode_total")
    body = {"model": model, "messages": LONG, "stream": True, "max_tokens": 1800, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        # Keep the iterator open: leaving a for-loop over it would close the response.
        lines = response.iter_lines()
        received = 0
        while received < 5:
            received += next(lines).startswith("data:")
        # Mid-stream: one run in flight here, one request generating in the backend.
        assert metric(server.url, "switchyard_runs_in_flight") == 1
        assert metric(backend, "llamacpp:requests_processing") == 1
    # Leaving the block closed the connection.
    assert wait_for(lambda: metric(server.url, "switchyard_runs_in_flight") == 0, 5)
    assert wait_for(lambda: metric(backend, "llamacpp:requests_processing") == 0, 5)
    settled = metric(backend, "llamacpp:n_decode_total")
    time.sleep(0.5)
    assert metric(backend, "llamacpp:n_decode_total") == settled  # nothing is generating any more
    # Far fewer than the 1800 tokens asked for were generated: the request was cut short.
    assert settled - decoded_before < 600
    assert metric(server.url, "switchyard_runs_total", kind=kind, target=model, outcome="cancelled") == cancelled_before + 1


def _cut_after(url: str, body: dict[str, object], seconds: float) -> None:
    """Send ``body`` and hang up after ``seconds`` without an answer."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, timeout=httpx.Timeout(60, read=seconds))


@pytest.mark.parametrize("protocol", ["openai", "langgraph"])
def test_a_client_leaving_before_a_whole_answer_cancels_the_run(
    server: ServerHandle, local_backend: Backend, protocol: str
) -> None:
    """``stream: false`` and ``runs/wait``: nothing is sent until the answer is whole,
    so the server watches the connection itself; the run and the backend request stop."""
    backend = local_backend.root_url
    kind = "graph" if protocol == "openai" else "langgraph"
    cancelled_before = metric(server.url, "switchyard_runs_total", kind=kind, target="chat", outcome="cancelled")
    decoded_before = metric(backend, "llamacpp:n_decode_total")
    if protocol == "openai":
        body: dict[str, object] = {"model": "chat", "messages": LONG, "max_tokens": 1800, "temperature": 0}
        _cut_after(server.url + "/v1/chat/completions", body, 1.5)
    else:
        body = {"assistant_id": "chat", "input": {"messages": LONG},
                "context": {"model_params": {"max_tokens": 1800, "temperature": 0}}}
        _cut_after(server.url + "/runs/wait", body, 1.5)
    assert wait_for(lambda: metric(server.url, "switchyard_runs_in_flight") == 0, 5)
    assert wait_for(lambda: metric(backend, "llamacpp:requests_processing") == 0, 5)
    settled = metric(backend, "llamacpp:n_decode_total")
    time.sleep(0.5)
    assert metric(backend, "llamacpp:n_decode_total") == settled
    assert settled - decoded_before < 600
    assert wait_for(
        lambda: metric(server.url, "switchyard_runs_total", kind=kind, target="chat", outcome="cancelled")
        == cancelled_before + 1,
        5,
    )
