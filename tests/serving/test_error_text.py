"""What clients are told when a run fails (issue 11, finding 9b): a stable error type
and a message written for them. A known failure (the model backend answered 500)
keeps its message; an unexpected exception inside a graph run becomes
``InternalError`` with a generic message naming the request and run ids, on both
protocols, streamed and whole, while the server log has the exception itself.

The graphs below fail the way a library bug does: after the answer has started
streaming (the FAKE backend's tokens), with an internal ``AttributeError``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph

from graphs import GraphDeps
from graphs.chat.state import ChatState
from tests.conftest import ServerHandle, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

INTERNAL = "'str' object has no attribute 'get_next_version'"
"""The text of the library error the review saw reach a client."""
HI = [{"role": "user", "content": "Hi"}]


def make_late_crash_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """Streams the model's answer, then fails with an internal error."""

    async def answer(state: ChatState) -> dict[str, Any]:
        reply = await deps.model.ainvoke(state["messages"])
        return {"messages": [reply]}

    async def crash(state: ChatState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        return "".get_next_version()  # type: ignore[attr-defined,no-any-return]

    builder = StateGraph(ChatState)
    builder.add_node("answer", answer)
    builder.add_node("crash", crash)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "crash")
    builder.add_edge("crash", END)
    return builder


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("error-text")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "late-crash": {"path": "tests.serving.test_error_text:make_late_crash_graph", "model": "fake-ok"},
                "chat-failing": {"path": "graphs.chat:make_graph", "model": "fake-500"},
            },
        },
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def _events(server: ServerHandle, path: str, body: dict[str, Any], request_id: str) -> tuple[str, list[tuple[str, Any]], str]:
    """The raw SSE body, its events, and the run id (``Content-Location``)."""
    events, current = [], None
    with httpx.stream("POST", server.url + path, json=body, headers={"x-request-id": request_id}, timeout=30) as r:
        raw = r.read().decode()
        location = r.headers.get("content-location", "")
    assert r.status_code == 200, raw
    for line in raw.splitlines():
        if line.startswith("event: "):
            current = line[7:]
        elif line.startswith("data: "):
            events.append((current, json.loads(line[6:])))
    return raw, events, location.rsplit("/", 1)[-1]


def _assert_generic(error: dict[str, Any], request_id: str, run_id: str | None = None) -> None:
    assert error["error"] == "InternalError", error
    assert request_id in error["message"] and "internal error" in error["message"]
    if run_id is not None:
        assert run_id in error["message"]
    assert "get_next_version" not in json.dumps(error)


def _logged(server: ServerHandle, *needles: str) -> bool:
    """Whether the server log has a failure record naming every needle (the record and
    its traceback)."""
    log = server.log_file.read_text()
    for match in re.finditer(r"^\S+ \S+ ERROR .*$", log, re.M):
        record = log[match.start() : match.start() + 20000].split("\n20", 1)[0]
        if all(n in record for n in needles):
            return True
    return False


def test_an_unexpected_error_in_a_langgraph_stream(failing_server: ServerHandle) -> None:
    tid = httpx.post(failing_server.url + "/threads", json={}).json()["thread_id"]
    body = {"assistant_id": "late-crash", "input": {"messages": HI}, "stream_mode": ["messages-tuple", "values"]}
    raw, events, run_id = _events(failing_server, f"/threads/{tid}/runs/stream", body, "lg-bug-1")
    assert any(name == "messages" for name, _ in events)  # the answer had started
    assert events[-1][0] == "error"
    _assert_generic(events[-1][1], "lg-bug-1", run_id)
    assert INTERNAL not in raw and "AttributeError" not in raw
    assert _logged(failing_server, "lg-bug-1", run_id, INTERNAL)  # the operator sees it all


@pytest.mark.parametrize("mode", ["tasks", "debug", "checkpoints"])
def test_a_failed_task_in_task_debug_and_checkpoint_events(failing_server: ServerHandle, mode: str) -> None:
    """These modes carry the failed task's exception object: it reaches the client as
    its client error (the same as the run's ``error`` event), never as its ``repr``,
    and is logged once."""
    tid = httpx.post(failing_server.url + "/threads", json={}).json()["thread_id"]
    request_id = f"lg-bug-{mode}"
    body = {"assistant_id": "late-crash", "input": {"messages": HI}, "stream_mode": [mode, "values"]}
    raw, events, run_id = _events(failing_server, f"/threads/{tid}/runs/stream", body, request_id)
    assert "get_next_version" not in raw and "AttributeError" not in raw, raw
    assert events[-1][0] == "error"
    _assert_generic(events[-1][1], request_id, run_id)

    def task_errors(value: Any) -> list[Any]:
        if isinstance(value, dict):
            found = [value["error"]] if value.get("error") and "name" in value else []
            return found + [e for item in value.values() for e in task_errors(item)]
        if isinstance(value, list):
            return [e for item in value for e in task_errors(item)]
        return []

    errors = [e for name, data in events if name == mode for e in task_errors(data)]
    if mode != "checkpoints":  # the failed step writes no checkpoint in its own run
        assert errors and all(e == events[-1][1] for e in errors), errors
    log = failing_server.log_file.read_text()
    assert len([line for line in log.splitlines() if " ERROR " in line and request_id in line]) == 1
    # Run again from the failed step: the checkpoint holds the task's error as its
    # text (LangGraph stores the exception's repr), which is not sent either.
    again = {"assistant_id": "late-crash", "input": None, "stream_mode": [mode]}
    raw, events, _ = _events(failing_server, f"/threads/{tid}/runs/stream", again, f"{request_id}-again")
    assert "get_next_version" not in raw and "AttributeError" not in raw, raw
    if mode == "checkpoints":
        errors = [e for name, data in events if name == mode for e in task_errors(data)]
        assert errors and all(e["error"] == "InternalError" for e in errors), errors


def test_a_failed_task_read_back_from_the_state_says_no_more(failing_server: ServerHandle) -> None:
    tid = httpx.post(failing_server.url + "/threads", json={}).json()["thread_id"]
    body = {"assistant_id": "late-crash", "input": {"messages": HI}}
    httpx.post(failing_server.url + f"/threads/{tid}/runs/wait", json=body, timeout=30)
    state = httpx.get(failing_server.url + f"/threads/{tid}/state")
    assert [task["name"] for task in state.json()["tasks"]] == ["crash"]
    assert state.json()["tasks"][0]["error"].startswith("internal error")
    assert INTERNAL not in state.text and "AttributeError" not in state.text


def test_an_unexpected_error_in_langgraph_wait_and_background_runs(failing_server: ServerHandle) -> None:
    body = {"assistant_id": "late-crash", "input": {"messages": HI}}
    waited = httpx.post(failing_server.url + "/runs/wait", json=body, headers={"x-request-id": "lg-bug-2"}, timeout=30)
    assert waited.status_code == 200
    _assert_generic(waited.json()["__error__"], "lg-bug-2")
    assert INTERNAL not in waited.text
    tid = httpx.post(failing_server.url + "/threads", json={}).json()["thread_id"]
    run = httpx.post(failing_server.url + f"/threads/{tid}/runs", json=body, headers={"x-request-id": "lg-bug-3"}).json()
    joined = httpx.get(failing_server.url + f"/threads/{tid}/runs/{run['run_id']}/stream", timeout=30).text
    assert INTERNAL not in joined
    error = json.loads(joined.strip().splitlines()[-2].removeprefix("data: "))
    _assert_generic(error, "lg-bug-3", run["run_id"])
    assert _logged(failing_server, "lg-bug-3", run["run_id"], INTERNAL)


def test_a_known_error_keeps_its_message(failing_server: ServerHandle) -> None:
    body = {"assistant_id": "chat-failing", "input": {"messages": HI}}
    raw, events, _ = _events(failing_server, "/runs/stream", body, "lg-known")
    message = "model backend 'fake-500' answered 500: scripted failure"
    assert events[-1] == ("error", {"error": "BackendError", "message": message})


@pytest.mark.parametrize("stream", [False, True])
def test_an_unexpected_error_in_an_openai_answer(failing_server: ServerHandle, stream: bool) -> None:
    request_id = f"oa-bug-{stream}"
    body = {"model": "late-crash", "messages": HI, "stream": stream}
    response = httpx.post(failing_server.url + "/v1/chat/completions", json=body, headers={"x-request-id": request_id},
                          timeout=30)
    assert INTERNAL not in response.text and "AttributeError" not in response.text
    if stream:  # after the first chunk: an in-band error, then [DONE]
        assert response.status_code == 200
        payloads = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert payloads[-1] == "[DONE]"
        error = json.loads(payloads[-2])["error"]
    else:
        assert response.status_code == 500
        error = response.json()["error"]
    assert error["code"] == "internal_error" and request_id in error["message"]
    assert _logged(failing_server, request_id, INTERNAL)
    # The official client surfaces the error without the exception's text.
    client = openai.OpenAI(base_url=failing_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError) as raised:
        answer = client.chat.completions.create(model="late-crash", messages=HI, stream=stream)  # type: ignore[call-overload]
        if stream:
            list(answer)
    assert "get_next_version" not in str(raised.value)
