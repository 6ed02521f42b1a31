"""OpenTelemetry tracing, exported over real OTLP/HTTP to a receiver: the request,
run, node and model-call spans of both protocols, nested, continuing the caller's
W3C trace, with a failed run marked as an error."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway import Backend
from tests.conftest import ServerHandle, start_server, stop_server, write_models_file
from tests.otlp_receiver import OtlpReceiver, otlp_receiver

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

SERVER, CLIENT, ERROR = 2, 3, 2


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, OtlpReceiver]]:
    tmp: Path = tmp_path_factory.mktemp("traced")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    with otlp_receiver() as receiver:
        handle = start_server(
            tmp,
            {
                "gateway": {"models_file": str(models)},
                "graphs": {
                    "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
                    "chat-failing": {"path": "graphs.chat:make_graph", "model": "fake-500"},
                },
                "tracing": {"otlp_endpoint": receiver.url, "service_name": "switchyard-test"},
            },
            env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
        )
        try:
            yield handle, receiver
        finally:
            stop_server(handle)


def test_an_openai_stream_is_traced_under_the_callers_trace(traced: tuple[ServerHandle, OtlpReceiver]) -> None:
    server, receiver = traced
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": "chat", "messages": [{"role": "user", "content": "Say hi."}], "stream": True,
            "max_tokens": 8, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"traceparent": f"00-{trace_id}-{caller_span}-01", "x-request-id": "traced-1"}) as r:
        assert r.status_code == 200
        assert any(line == "data: [DONE]" for line in r.iter_lines())

    request = receiver.wait_for(lambda s: s.trace_id == trace_id and s.kind == SERVER)
    assert request.name == "POST /v1/chat/completions"
    assert request.parent_span_id == caller_span
    assert request.service == "switchyard-test"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["switchyard.request_id"] == "traced-1"

    run = receiver.wait_for(lambda s: s.trace_id == trace_id and s.name == "run chat")
    assert run.parent_span_id == request.span_id
    assert run.attributes["switchyard.run.kind"] == "graph"
    assert run.attributes["switchyard.run.outcome"] == "ok"
    assert run.attributes["gen_ai.usage.output_tokens"] > 0
    assert run.status != ERROR

    node = receiver.wait_for(lambda s: s.trace_id == trace_id and s.name == "node call_model")
    assert node.parent_span_id == run.span_id
    assert node.attributes["langgraph.node"] == "call_model"
    model = receiver.wait_for(lambda s: s.trace_id == trace_id and s.kind == CLIENT)
    assert model.parent_span_id == node.span_id
    assert model.name.startswith("chat ")
    assert model.attributes["gen_ai.request.max_tokens"] == 8
    assert 0 < model.attributes["gen_ai.usage.output_tokens"] <= 8
    # LangChain's internal runnables get no spans of their own.
    assert {s.name for s in receiver.children(run)} == {"node call_model"}


def test_a_langgraph_run_is_traced_with_its_thread(traced: tuple[ServerHandle, OtlpReceiver]) -> None:
    server, receiver = traced
    thread = httpx.post(server.url + "/threads", json={}, timeout=10).json()["thread_id"]
    body = {"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "Hi"}]},
            "context": {"model_params": {"max_tokens": 8}}}
    assert httpx.post(server.url + f"/threads/{thread}/runs/wait", json=body, timeout=60).status_code == 200
    run = receiver.wait_for(lambda s: s.attributes.get("switchyard.thread_id") == thread)
    assert run.name == "run chat"
    assert run.attributes["switchyard.protocol"] == "langgraph"
    assert run.attributes["switchyard.thread_status"] == "idle"
    request = receiver.wait_for(lambda s: s.span_id == run.parent_span_id)
    assert request.name == "POST /threads/{thread_id}/runs/wait"  # the route, not the raw path
    assert [s.name for s in receiver.children(run)] == ["node call_model"]


def test_a_failed_run_is_an_error_span(traced: tuple[ServerHandle, OtlpReceiver]) -> None:
    server, receiver = traced
    body = {"model": "chat-failing", "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 502
    run = receiver.wait_for(lambda s: s.name == "run chat-failing")
    assert run.status == ERROR
    assert run.attributes["switchyard.run.outcome"] == "error"
    model = receiver.wait_for(lambda s: s.kind == CLIENT and s.trace_id == run.trace_id)
    assert model.status == ERROR


def test_probes_are_not_traced(traced: tuple[ServerHandle, OtlpReceiver]) -> None:
    server, receiver = traced
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 200
    receiver.wait_for(lambda s: s.name == "GET /v1/models")  # other GETs are traced, and exported
    assert not [s for s in receiver.spans if s.name in ("GET /healthz", "GET /metrics")]
