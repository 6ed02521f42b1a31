"""Run deadlines: past ``server.run_deadline_s`` (or the lower ``x-run-deadline-s`` a
request asks for) the run is cancelled, the backend stops generating, and the client
gets a clear timeout error."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from langgraph_sdk import get_client

from gateway import Backend
from tests.conftest import ServerHandle
from tests.promql import backend_idle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

LONG = [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]
DEADLINE = {"x-run-deadline-s": "1.5"}


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_a_stream_past_its_deadline_ends_with_a_timeout_error(
    server: ServerHandle, local_backend: Backend, model: str
) -> None:
    body = {"model": model, "messages": LONG, "max_tokens": 1800, "temperature": 0, "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=DEADLINE, timeout=60) as response:
        assert response.status_code == 200
        payloads = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data:")]
    elapsed = time.monotonic() - started
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout" and "1.5s" in error["message"]
    assert len(payloads) > 3  # tokens streamed before the deadline
    assert elapsed < 10  # 1800 tokens would take far longer
    assert backend_idle(local_backend)


def test_a_whole_answer_past_its_deadline_is_504(server: ServerHandle, local_backend: Backend) -> None:
    body = {"model": "chat", "messages": LONG, "max_tokens": 1800, "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers=DEADLINE, timeout=60)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert backend_idle(local_backend)


def test_a_bad_deadline_header_is_400(server: ServerHandle) -> None:
    body = {"model": "chat", "messages": LONG, "max_tokens": 4}
    for bad in ("soon", "-1", "0", "inf"):
        response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"x-run-deadline-s": bad})
        assert response.status_code == 400 and response.json()["error"]["param"] == "x-run-deadline-s"


async def test_a_langgraph_run_past_its_deadline_gets_a_timeout_event(
    server: ServerHandle, local_backend: Backend
) -> None:
    client = get_client(url=server.url, api_key=None)
    thread = await client.threads.create()
    parts = [
        part
        async for part in client.runs.stream(
            thread["thread_id"], "chat", input={"messages": LONG}, stream_mode="messages-tuple",
            context={"model_params": {"max_tokens": 1800, "temperature": 0}}, headers=DEADLINE,
        )
    ]
    assert parts[0].event == "metadata" and any(p.event == "messages" for p in parts)
    assert parts[-1].event == "error" and parts[-1].data["error"] == "DeadlineExceeded"
    assert (await client.threads.get(thread["thread_id"]))["status"] == "idle"  # usable again
    assert backend_idle(local_backend)
    await client.http.client.aclose()
