"""``/metrics`` moves as expected after a known sequence of requests (through the FAKE
scripted backend, so token counts are exact)."""

from __future__ import annotations


import httpx
import pytest

from tests.conftest import ServerHandle
from tests.promql import sample

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

HELLO = [{"role": "user", "content": "hello"}]


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
    assert sample(after, "switchyard_runs_in_flight") == 0 or "switchyard_runs_in_flight 0.0" in after
