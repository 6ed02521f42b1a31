"""The LangGraph Server API through the official ``langgraph-sdk`` client (its SSE
parser and error mapping are the compatibility check), against the real local model."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError

from serving.langgraph_api.protocol import assistant_uuid
from tests.conftest import REPO, ServerHandle, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

HI = {"messages": [{"role": "user", "content": "My name is Ada. Say hello to me."}]}
SHORT = {"model_params": {"max_tokens": 24}}  # run context: keeps the small model's answers short


@pytest.fixture
async def client(server: ServerHandle) -> AsyncIterator[LangGraphClient]:
    client = get_client(url=server.url, api_key=None)
    yield client
    await client.http.client.aclose()


async def _events(client: LangGraphClient, thread_id: str | None, assistant: str, **kwargs: Any) -> list[Any]:
    return [part async for part in client.runs.stream(thread_id, assistant, **kwargs)]


async def test_assistants_are_the_registered_graphs(client: LangGraphClient) -> None:
    assistants = await client.assistants.search(limit=100)
    by_graph = {a["graph_id"]: a for a in assistants}
    assert {"chat", "confirm", "crash"} <= set(by_graph)
    assert by_graph["chat"]["assistant_id"] == assistant_uuid("chat") == str(uuid.uuid5(
        uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "chat"))
    assert (await client.assistants.get("chat"))["graph_id"] == "chat"
    assert (await client.assistants.get(assistant_uuid("chat")))["graph_id"] == "chat"
    with pytest.raises(NotFoundError):
        await client.assistants.get("nope")


async def test_threads_create_get_search(client: LangGraphClient) -> None:
    tag = uuid.uuid4().hex
    thread = await client.threads.create(metadata={"tag": tag})
    assert thread["status"] == "idle" and thread["values"] is None
    assert (await client.threads.get(thread["thread_id"]))["metadata"] == {"tag": tag}
    found = await client.threads.search(metadata={"tag": tag})
    assert [t["thread_id"] for t in found] == [thread["thread_id"]]
    with pytest.raises(ConflictError):
        await client.threads.create(thread_id=thread["thread_id"])
    same = await client.threads.create(thread_id=thread["thread_id"], if_exists="do_nothing")
    assert same["thread_id"] == thread["thread_id"]
    with pytest.raises(NotFoundError):
        await client.threads.get(str(uuid.uuid4()))
    with pytest.raises(httpx.HTTPStatusError) as missing:  # runs.wait surfaces httpx's error
        await client.runs.wait(str(uuid.uuid4()), "chat", input=HI)
    assert missing.value.response.status_code == 404


async def test_stream_modes_on_a_thread_and_memory_across_runs(client: LangGraphClient, server: ServerHandle) -> None:
    thread = await client.threads.create()
    tid = thread["thread_id"]
    created: list[Any] = []
    parts = await _events(
        client, tid, "chat", input=HI, stream_mode=["values", "updates", "messages-tuple"], context=SHORT,
        on_run_created=created.append,
    )
    events = [p.event for p in parts]
    assert events[0] == "metadata" and set(events) == {"metadata", "values", "updates", "messages"}
    run_id = parts[0].data["run_id"]
    assert created and created[0]["run_id"] == run_id and created[0]["thread_id"] == tid  # from Content-Location
    tokens = [p.data for p in parts if p.event == "messages"]
    assert all(message["type"] == "AIMessageChunk" and message["id"] for message, _ in tokens)
    assert tokens[0][1]["langgraph_node"] == "call_model" and tokens[0][1]["thread_id"] == tid
    text = "".join(message["content"] for message, _ in tokens)
    updates = [p.data for p in parts if p.event == "updates"]
    assert updates[-1]["call_model"]["messages"][0]["content"] == text
    final = [p.data for p in parts if p.event == "values"][-1]
    assert [m["type"] for m in final["messages"]] == ["human", "ai"]

    # The thread remembers: the second run starts from the first's messages.
    second = await client.runs.wait(
        tid, "chat", input={"messages": [{"role": "user", "content": "What is my name?"}]}, context=SHORT
    )
    assert [m["type"] for m in second["messages"]] == ["human", "ai", "human", "ai"]
    state = await client.threads.get_state(tid)
    assert state["next"] == [] and state["checkpoint"]["thread_id"] == tid
    assert len(state["values"]["messages"]) == 4
    stored = await client.threads.get(tid)
    assert stored["status"] == "idle" and stored["metadata"]["graph_id"] == "chat"
    assert stored["metadata"]["assistant_id"] == assistant_uuid("chat")
    history = await client.threads.get_history(tid, limit=3)
    assert len(history) == 3 and history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    older = await client.threads.get_history(tid, limit=2, before=history[0]["checkpoint"])
    assert [h["checkpoint"]["checkpoint_id"] for h in older] == [h["checkpoint"]["checkpoint_id"] for h in history[1:3]]
    earlier = await client.threads.get_state(tid, checkpoint_id=history[2]["checkpoint"]["checkpoint_id"])
    assert earlier["values"] == history[2]["values"] and earlier["checkpoint"] == history[2]["checkpoint"]
    with pytest.raises(NotFoundError):
        await client.threads.get_state(tid, checkpoint_id="no-such-checkpoint")

    # Raw SSE: every event carries an increasing id; JSON data.
    body = {"assistant_id": "chat", "input": HI, "stream_mode": ["values"], "context": SHORT}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as raw:
        async with raw.stream("POST", f"/threads/{tid}/runs/stream", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert re.fullmatch(rf"/threads/{tid}/runs/[0-9a-f-]{{36}}", response.headers["content-location"])
            ids = [line.removeprefix("id: ") async for line in response.aiter_lines() if line.startswith("id:")]
    assert ids == [str(i) for i in range(len(ids))] and len(ids) >= 3


async def test_custom_events_interrupt_and_resume(client: LangGraphClient) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = await _events(client, tid, "confirm", input=HI, stream_mode=["updates", "custom", "values"])
    assert {"event": "custom", "data": {"progress": "drafting"}} in [{"event": p.event, "data": p.data} for p in parts]
    interrupt = next(p.data["__interrupt__"][0] for p in parts if p.event == "updates" and "__interrupt__" in p.data)
    assert interrupt["value"]["question"] == "Send this answer?" and interrupt["id"]
    assert [p for p in parts if p.event == "values"][-1].data["__interrupt__"] == [interrupt]

    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert list(thread["interrupts"].values()) == [[interrupt]]
    state = await client.threads.get_state(tid)
    assert state["next"] == ["confirm"] and state["interrupts"] == [interrupt]
    assert state["tasks"][0]["interrupts"] == [interrupt]

    resumed = await client.runs.wait(tid, "confirm", command={"resume": "no"})
    assert resumed["messages"][-1]["content"] == "Cancelled."
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_stateless_runs_leave_no_thread(client: LangGraphClient, server: ServerHandle) -> None:
    before = len(await client.threads.search(limit=1000))
    answer = await client.runs.wait(None, "chat", input=HI, context=SHORT)
    assert answer["messages"][-1]["type"] == "ai" and answer["messages"][-1]["content"]
    parts = await _events(client, None, "chat", input=HI, stream_mode="messages-tuple", context=SHORT)
    assert parts[0].event == "metadata" and any(p.event == "messages" for p in parts)
    assert len(await client.threads.search(limit=1000)) == before


async def test_a_failing_run_is_an_error_event_and_an_error_thread(client: LangGraphClient) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = await _events(client, tid, "crash", input=HI)
    assert parts[-1].event == "error"
    # An unexpected exception: a stable type and a generic message, never its text
    # (tests/serving/test_error_text.py has the rest).
    assert parts[-1].data["error"] == "InternalError" and "a bug in a node" not in parts[-1].data["message"]
    assert (await client.threads.get(tid))["status"] == "error"
    with pytest.raises(Exception, match="InternalError: internal error") as raised:
        await client.runs.wait(tid, "crash", input=HI)
    assert "a bug in a node" not in str(raised.value)


async def test_a_second_run_on_a_busy_thread_is_refused(client: LangGraphClient) -> None:
    tid = (await client.threads.create())["thread_id"]
    long = {"messages": [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]}
    stream = client.runs.stream(tid, "chat", input=long, stream_mode="messages-tuple", context={"model_params": {"max_tokens": 300}})
    first = await anext(stream)
    assert first.event == "metadata"
    assert (await client.threads.get(tid))["status"] == "busy"
    with pytest.raises(httpx.HTTPStatusError) as busy:
        await client.runs.wait(tid, "chat", input=HI)
    assert busy.value.response.status_code == 409
    with pytest.raises(ConflictError):
        await _events(client, tid, "chat", input=HI)
    await stream.aclose()
    await asyncio.sleep(0.5)
    assert (await client.threads.get(tid))["status"] != "busy"


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_thread_survives_a_server_restart(
    local_backend: object, tmp_path: Any, store: str, request: pytest.FixtureRequest
) -> None:
    config: dict[str, Any] = {"gateway": {"models_file": str(REPO / "config/models.yaml")}}
    if store == "postgres":
        config["threads"] = {"postgres_dsn": request.getfixturevalue("postgres_dsn")}
    first = start_server(tmp_path, config)
    try:
        client = get_client(url=first.url, api_key=None)
        tid = (await client.threads.create(metadata={"owner": "restart-test"}))["thread_id"]
        await client.runs.wait(tid, "chat", input=HI, context=SHORT)
        await client.http.client.aclose()
    finally:
        stop_server(first)
    second = start_server(tmp_path, config)  # same data directory, new process
    try:
        client = get_client(url=second.url, api_key=None)
        thread = await client.threads.get(tid)
        assert thread["metadata"]["owner"] == "restart-test" and thread["status"] == "idle"
        assert [m["type"] for m in thread["values"]["messages"]] == ["human", "ai"]
        again = await client.runs.wait(
            tid, "chat", input={"messages": [{"role": "user", "content": "And again?"}]}, context=SHORT
        )
        assert [m["type"] for m in again["messages"]] == ["human", "ai", "human", "ai"]
        await client.http.client.aclose()
    finally:
        stop_server(second)
    assert (tmp_path / "data" / "threads.sqlite").is_file() == (store == "sqlite")
