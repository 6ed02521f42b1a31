"""A client that disconnects mid-stream cancels the run: Switchyard's in-flight count
returns to zero and the real llama.cpp backend stops generating for that request."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from gateway import Backend
from tests.conftest import ServerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

# Greedy decoding makes SmolLM2 run to the token limit on this prompt.
LONG = [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, f"{name} not in {url}/metrics"
    return float(match.group(1))


def _cancelled(url: str, kind: str, target: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    labels = {"kind": kind, "target": target, "outcome": "cancelled"}
    for line in text.splitlines():
        if line.startswith("switchyard_runs_total{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if found == labels:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_disconnect_cancels_the_run_and_the_backend_request(
    server: ServerHandle, local_backend: Backend, model: str
) -> None:
    backend = local_backend.root_url
    kind = "graph" if model == "chat" else "alias"
    cancelled_before = _cancelled(server.url, kind, model)
    decoded_before = _metric(backend, "llamacpp:n_decode_total")
    body = {"model": model, "messages": LONG, "stream": True, "max_tokens": 1800, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        # Keep the iterator open: leaving a for-loop over it would close the response.
        lines = response.iter_lines()
        received = 0
        while received < 5:
            received += next(lines).startswith("data:")
        # Mid-stream: one run in flight here, one request generating in the backend.
        assert _metric(server.url, "switchyard_runs_in_flight") == 1
        assert _metric(backend, "llamacpp:requests_processing") == 1
    # Leaving the block closed the connection.
    assert _wait_for(lambda: _metric(server.url, "switchyard_runs_in_flight") == 0, 5)
    assert _wait_for(lambda: _metric(backend, "llamacpp:requests_processing") == 0, 5)
    settled = _metric(backend, "llamacpp:n_decode_total")
    time.sleep(0.5)
    assert _metric(backend, "llamacpp:n_decode_total") == settled  # nothing is generating any more
    # Far fewer than the 1800 tokens asked for were generated: the request was cut short.
    assert settled - decoded_before < 600
    assert _cancelled(server.url, kind, model) == cancelled_before + 1
