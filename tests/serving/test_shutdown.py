"""Graceful shutdown: on SIGTERM the server stops accepting, lets running streams
finish within ``server.shutdown_grace_s``, cancels the rest with an error event, and
leaves no backend request generating."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway import Backend
from tests.conftest import REPO, start_server, stop_server
from tests.promql import backend_idle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

LONG = [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]


@pytest.mark.parametrize(("max_tokens", "finishes"), [(20, True), (1800, False)])
def test_sigterm_drains_or_cancels_streams(
    tmp_path: Path, local_backend: Backend, max_tokens: int, finishes: bool
) -> None:
    server = start_server(
        tmp_path, {"gateway": {"models_file": str(REPO / "config/models.yaml")}, "server": {"shutdown_grace_s": 2}}
    )
    payloads: list[str] = []
    try:
        body = {"model": "chat", "messages": LONG, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            while not payloads:
                line = next(lines)
                if line.startswith("data:"):
                    payloads.append(line.removeprefix("data: "))
            signalled = time.monotonic()
            threading.Thread(target=server.process.send_signal, args=(signal.SIGTERM,)).start()
            payloads += [line.removeprefix("data: ") for line in lines if line.startswith("data:")]
        ended = time.monotonic() - signalled
        assert server.process.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        stop_server(server)
    assert payloads[-1] == "[DONE]"
    if finishes:
        last = json.loads(payloads[-2])
        assert last["choices"][0]["finish_reason"] in ("stop", "length")  # finished within the grace period
    else:
        error = json.loads(payloads[-2])["error"]
        assert error["code"] == "server_shutdown"
        assert 1.5 < ended < 10  # ran for the grace period, then was cut
        assert backend_idle(local_backend, within_s=0.5)  # no orphan backend request
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url + "/healthz", timeout=2)  # no longer accepting


def test_sigterm_cancels_a_langgraph_run_with_an_error_event(tmp_path: Path, local_backend: Backend) -> None:
    server = start_server(
        tmp_path, {"gateway": {"models_file": str(REPO / "config/models.yaml")}, "server": {"shutdown_grace_s": 1}}
    )
    events: list[tuple[str, str]] = []
    try:
        body = {
            "assistant_id": "chat", "input": {"messages": LONG}, "stream_mode": ["messages-tuple"],
            "context": {"model_params": {"max_tokens": 1800, "temperature": 0}},
        }
        with httpx.stream("POST", server.url + "/runs/stream", json=body, timeout=60) as response:
            name = ""
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("event:"):
                    name = line.removeprefix("event: ")
                elif line.startswith("data:"):
                    events.append((name, line.removeprefix("data: ")))
                    if name == "messages":
                        break
            threading.Thread(target=server.process.send_signal, args=(signal.SIGTERM,)).start()
            for line in lines:
                if line.startswith("event:"):
                    name = line.removeprefix("event: ")
                elif line.startswith("data:"):
                    events.append((name, line.removeprefix("data: ")))
        assert server.process.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        stop_server(server)
    assert events[0][0] == "metadata"
    assert events[-1][0] == "error" and json.loads(events[-1][1])["error"] == "ServerShutdown"
    assert backend_idle(local_backend, within_s=0.5)
