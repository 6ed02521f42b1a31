"""Run operations of the LangGraph Server API (issue 12, finding 3): ``runs.list`` paging
and status, ``runs.delete``, stateless background ``runs.create(None, ...)`` (``POST
/runs``), ``runs.create_batch`` (``POST /runs/batch``), and the thread stream
``threads.join_stream`` (``GET /threads/{id}/stream``), through the official
``langgraph-sdk`` client on a real two-tenant server. Runs that must be in progress wait
at a gate of ``tests/fakes/gated.py`` that the test opens: no timing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    UnprocessableEntityError,
)

from serving.runs.registry import ThreadWatcher
from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.graphs import PROBE_LOG_ENV
from tests.fakes.openai_backend import RECEIVED
from tests.serving.lg_ops_server import OpsServer, clients, ops_server, says  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


async def _at_gate(client: LangGraphClient, tid: str, gate: str, **kwargs: Any) -> dict[str, Any]:
    """A background run on ``tid`` waiting at ``gate`` (its ``custom`` event is out)."""
    run = await client.runs.create(tid, "gated", input=says(f"gate:{gate}"), stream_mode=["custom", "values"], **kwargs)
    async with aclosing(client.runs.join_stream(tid, run["run_id"], stream_mode="custom")) as parts:
        async for part in parts:
            if part.event == "custom":
                break
    return run


async def test_list_runs_pages_and_filters_and_delete_forgets_a_finished_run(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = (await acme.threads.create())["thread_id"]
    done = []
    for _ in range(3):
        run = await acme.runs.create(tid, "gated", input=says("hi"))
        await acme.runs.join(tid, run["run_id"])
        done.append(run["run_id"])
    gate = uuid.uuid4().hex
    running = await _at_gate(acme, tid, gate)

    listed = [r["run_id"] for r in await acme.runs.list(tid, limit=10)]
    assert listed == [running["run_id"], *reversed(done)]  # newest first
    assert [r["run_id"] for r in await acme.runs.list(tid, limit=2, offset=1)] == listed[1:3]
    assert [r["run_id"] for r in await acme.runs.list(tid, status="running")] == [running["run_id"]]
    assert [r["run_id"] for r in await acme.runs.list(tid, status="success")] == listed[1:]
    assert await acme.runs.list(tid, status="error") == []
    bad = await acme.http.client.get(f"/threads/{tid}/runs", params={"status": "bogus"})
    assert bad.status_code == 422 and "status" in bad.json()["detail"]
    assert (await acme.http.client.get(f"/threads/{tid}/runs", params={"limit": 0})).status_code == 422

    with pytest.raises(ConflictError, match="cancel it first"):
        await acme.runs.delete(tid, running["run_id"])
    with pytest.raises(NotFoundError):
        await globex.runs.delete(tid, done[0])
    await acme.runs.delete(tid, done[0])
    with pytest.raises(NotFoundError):
        await acme.runs.get(tid, done[0])
    with pytest.raises(NotFoundError):
        await acme.runs.delete(tid, done[0])
    assert done[0] not in [r["run_id"] for r in await acme.runs.list(tid)]

    ops_server.open_gate(gate)
    await acme.runs.join(tid, running["run_id"])
    await acme.runs.delete(tid, running["run_id"])  # finished now
    assert [r["run_id"] for r in await acme.runs.list(tid)] == list(reversed(done[1:]))


async def test_a_stateless_background_run_goes_on_after_the_answer(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme = clients["acme"]
    gate = uuid.uuid4().hex
    created: list[Any] = []
    run = await acme.runs.create(None, "gated", input=says(f"gate:{gate}"), on_run_created=created.append)
    assert run["thread_id"] is None and run["status"] in ("pending", "running")
    assert run["assistant_id"] and uuid.UUID(run["run_id"])
    assert created and created[0]["run_id"] == run["run_id"]
    ops_server.open_gate(gate)
    await ops_server.passed(gate)  # it ran on in the server's task after the answer

    with pytest.raises(NotFoundError):
        await acme.runs.create(None, "nope", input=says("hi"))
    with pytest.raises(BadRequestError, match="command.resume"):
        await acme.runs.create(None, "gated", command={"resume": "x"})


async def test_a_batch_starts_whole_or_not_at_all(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    runs = await acme.runs.create_batch([
        {"assistant_id": "gated", "input": says(f"gate:{gate}")},
        {"assistant_id": "gated", "input": says("hi"), "thread_id": tid},
    ])
    assert [r["thread_id"] for r in runs] == [None, tid]
    await acme.runs.join(tid, runs[1]["run_id"])
    assert (await acme.runs.get(tid, runs[1]["run_id"]))["status"] == "success"
    # What the JS SDK's createBatch sends: its payloads' camelCase keys beside assistant_id.
    js = await acme.http.client.post("/runs/batch", json=[
        {"assistantId": "gated", "assistant_id": "gated", "input": says("js"), "threadId": tid,
         "multitaskStrategy": "enqueue", "metadata": {"from": "js"}},
    ])
    assert js.status_code == 200, js.text
    assert js.json()[0]["thread_id"] == tid and js.json()[0]["multitask_strategy"] == "enqueue"
    await acme.runs.join(tid, js.json()[0]["run_id"])
    ops_server.open_gate(gate)
    await ops_server.passed(gate)

    # Every body is checked before any starts: the error names the item and field.
    idle = (await acme.threads.create())["thread_id"]
    with pytest.raises(UnprocessableEntityError, match=r"1\.assistant_id"):
        await acme.runs.create_batch([
            {"assistant_id": "gated", "input": says("hi"), "thread_id": idle},
            {"input": says("hi")},
        ])
    with pytest.raises(NotFoundError, match="^1: |1: assistant 'nope'"):
        await acme.runs.create_batch([
            {"assistant_id": "gated", "input": says("hi"), "thread_id": idle},
            {"assistant_id": "nope", "input": says("hi")},
        ])
    with pytest.raises(NotFoundError, match="2: thread"):
        await acme.runs.create_batch([
            {"assistant_id": "gated", "input": says("hi"), "thread_id": idle},
            {"assistant_id": "gated", "input": says("hi")},
            {"assistant_id": "gated", "input": says("hi"), "thread_id": str(uuid.uuid4())},
        ])
    with pytest.raises(BadRequestError, match=r"1\.input\.messages"):
        await acme.runs.create_batch([
            {"assistant_id": "gated", "input": says("hi"), "thread_id": idle},
            {"assistant_id": "gated", "input": says("xylophone")},
        ])
    too_many = await acme.http.client.post("/runs/batch", json=[{"assistant_id": "gated"}] * 101)
    assert too_many.status_code == 422
    assert await acme.runs.list(idle) == []  # nothing started

    # A run that cannot start (its thread is busy, multitask_strategy reject): the
    # ones started before it are cancelled, and the error names it.
    busy = (await acme.threads.create())["thread_id"]
    other = uuid.uuid4().hex
    blocking = await _at_gate(acme, busy, other)
    first = (await acme.threads.create())["thread_id"]
    with pytest.raises(ConflictError, match="^1: thread|1: thread") as refused:
        await acme.runs.create_batch([
            {"assistant_id": "gated", "input": says(f"gate:{uuid.uuid4().hex}"), "thread_id": first},
            {"assistant_id": "gated", "input": says("hi"), "thread_id": busy, "multitask_strategy": "reject"},
        ])
    assert "already has a run in progress" in str(refused.value)
    cancelled = await acme.runs.list(first)
    assert [r["status"] for r in cancelled] == ["interrupted"]
    assert (await acme.threads.get(first))["status"] == "idle"
    ops_server.open_gate(other)
    await acme.runs.join(busy, blocking["run_id"])


async def _until_end(parts: AsyncIterator[Any], run_id: str, into: list[Any]) -> None:
    async for part in parts:
        into.append(part)
        if part.event == "end" and part.data["run_id"] == run_id:
            return


async def test_the_thread_stream_carries_every_run_on_the_thread(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    first = await _at_gate(acme, tid, gate)
    seen: list[Any] = []
    # Joined from the first run's metadata (event 0): the rest of its kept events,
    # then live ones, then a later foreground run's.
    async with aclosing(await acme.threads.join_stream(tid, last_event_id=f"{first['run_id']}:0")) as parts:
        async for part in parts:
            seen.append(part)
            if part.event == "custom":
                break  # replayed: the run is at its gate
        ops_server.open_gate(gate)
        await _until_end(parts, first["run_id"], seen)
        later = asyncio.create_task(acme.runs.wait(tid, "gated", input=says("again")))
        second: list[Any] = []
        async for part in parts:
            second.append(part)
            if part.event == "end":
                break
        await later
        # A streamed (foreground) run: the thread stream gets the same events.

        async def streamed() -> list[Any]:
            return [p async for p in acme.runs.stream(tid, "gated", input=says("more"), stream_mode="values")]

        own = asyncio.create_task(streamed())
        third: list[Any] = []
        async for part in parts:
            third.append(part)
            if part.event == "end":
                break
        own_parts = await own
    ids = [p.id for p in seen]
    assert ids[0] == f"{first['run_id']}:1" and ids[-1] == f"{first['run_id']}:end"
    assert [int(i.rsplit(":", 1)[1]) for i in ids[:-1]] == list(range(1, len(ids)))
    assert {p.event for p in seen} == {"custom", "values", "end"}
    assert seen[-2].event == "values" and seen[-2].data["messages"][-1]["content"] == "2 messages"
    run_id = second[0].data["run_id"]
    assert second[0].event == "metadata" and second[0].id == f"{run_id}:0" and run_id != first["run_id"]
    assert second[-1].event == "end" and second[-1].data == {"run_id": run_id}
    assert second[-2].event == "values" and second[-2].data["messages"][-1]["content"] == "5 messages"

    assert [(p.event, p.data) for p in third[:-1]] == [(p.event, p.data) for p in own_parts]
    assert [p.id for p in third[:-1]] == [f"{own_parts[0].data['run_id']}:{i}" for i in range(len(own_parts))]

    # Resumed after an event of the first run (kept: it ran in the background): its
    # events after that one, filtered, with the same ids.
    middle = seen[1].id
    replayed: list[Any] = []
    async with aclosing(await acme.threads.join_stream(tid, last_event_id=middle, stream_mode="values")) as parts:
        await _until_end(parts, first["run_id"], replayed)
    expected = [(p.event, p.id) for p in seen[2:] if p.event in ("values", "end")]
    assert [(p.event, p.id) for p in replayed] == expected

    with pytest.raises(NotFoundError):
        async for _ in await globex.threads.join_stream(tid):
            pass
    with pytest.raises(NotFoundError):
        async for _ in await acme.threads.join_stream(str(uuid.uuid4())):
            pass
    with pytest.raises(BadRequestError, match="Last-Event-ID"):
        async for _ in await acme.threads.join_stream(tid, last_event_id="7"):
            pass
    with pytest.raises(UnprocessableEntityError, match="unknown stream_mode 'bogus'"):
        async for _ in await acme.threads.join_stream(tid, stream_mode=["values", "bogus"]):  # type: ignore[list-item]
            pass


async def test_the_thread_stream_lifecycle_mode_and_a_deleted_thread(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, tid, gate)
    seen: list[Any] = []
    async with aclosing(await acme.threads.join_stream(tid, last_event_id=f"{run['run_id']}:0", stream_mode="lifecycle")) as parts:
        ops_server.open_gate(gate)
        await _until_end(parts, run["run_id"], seen)
        # The thread is deleted: its stream ends.
        await acme.threads.delete(tid)
        async for part in parts:
            seen.append(part)
    assert [p.event for p in seen] == ["end"]


async def test_a_slow_thread_stream_client_is_disconnected_not_waited_for() -> None:
    watcher = ThreadWatcher("t", max_bytes=100)
    watcher.push("r", 0, "x" * 60)
    watcher.push("r", 1, "y" * 30)
    watcher.push("r", 2, "z" * 30)  # past the bound: the watcher is dropped
    assert watcher.overflowed
    watcher.push("r", 3, "w")
    assert await watcher.next() is None  # its stream ends (with an error event)

    fine = ThreadWatcher("t", max_bytes=100)
    fine.push("r", 0, "a" * 60)
    assert await fine.next() == ("r", 0, "a" * 60)
    fine.push("r", 1, "b" * 60)
    assert await fine.next() == ("r", 1, "b" * 60) and not fine.overflowed
    fine.close()
    assert await fine.next() is None


async def test_goto_end_resolves_an_interrupted_thread(clients: dict[str, LangGraphClient]) -> None:
    """Agent Chat UI's "Mark as Resolved" sends ``command: {goto: "__end__"}`` for a
    thread waiting at an interrupt. LangGraph alone would ignore the goto and ask
    again; here the pending task ends, nothing runs, and the thread is idle. END with
    anything else (another target, an update, a resume) or without a thread is a 400."""
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(tid, "confirm", input=says("hello"))
    asked = await acme.threads.get_state(tid)
    assert asked["next"] == ["confirm"] and (await acme.threads.get(tid))["status"] == "interrupted"

    for command, match in [
        ({"goto": ["__end__", "draft"]}, "takes no other target"),
        ({"goto": "__end__", "resume": "yes"}, "takes no other target"),
        ({"goto": "__end__", "update": {"messages": []}}, "takes no other target"),
    ]:
        refused = await acme.http.client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "confirm", "command": command})
        assert refused.status_code == 400 and match in refused.json()["detail"], refused.text
    stateless = await acme.http.client.post("/runs/wait", json={"assistant_id": "confirm", "command": {"goto": "__end__"}})
    assert stateless.status_code == 400 and "ends a thread's pending tasks" in stateless.json()["detail"], stateless.text
    assert (await acme.threads.get(tid))["status"] == "interrupted", "refused whole"

    parts = [part async for part in acme.runs.stream(tid, "confirm", input={}, command={"goto": "__end__"}, stream_mode="values")]
    assert [p.event for p in parts if p.event == "error"] == []
    state = await acme.threads.get_state(tid)
    assert state["next"] == [] and state["tasks"] == [] and state["interrupts"] == []
    assert state["values"]["messages"] == asked["values"]["messages"], "nothing ran: the draft stands, no 'Cancelled.'"
    thread = await acme.threads.get(tid)
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    # The thread goes on with a new question.
    values = await acme.runs.wait(tid, "chat", input=says("next"))
    assert values["messages"][-1]["type"] == "ai"
    # Resolved already: nothing left to end (409), and the thread stays as it was.
    again = await acme.http.client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "confirm", "command": {"goto": "__end__"}})
    assert again.status_code == 409 and "nothing to resolve" in again.json()["detail"], again.text
    assert (await acme.threads.get(tid))["status"] == "idle"


async def _asked(client: LangGraphClient) -> tuple[str, dict[str, Any]]:
    """A thread of the confirm graph waiting at its interrupt, and its state."""
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "confirm", input=says("hello"))
    state = await client.threads.get_state(tid)
    assert state["next"] == ["confirm"]
    return tid, state


@pytest.mark.parametrize("how", ["stream", "wait", "background"])
async def test_goto_end_resolves_in_every_run_mode(clients: dict[str, LangGraphClient], how: str) -> None:
    """Resolved by a streamed, a waited-for or a background run: the run succeeds with
    the state's values (nothing ran), the thread is idle with nothing next."""
    acme = clients["acme"]
    tid, asked = await _asked(acme)
    command = {"goto": "__end__"}
    if how == "stream":
        parts = [p async for p in acme.runs.stream(tid, "confirm", command=command, stream_mode=["values", "updates"])]
        assert [p.event for p in parts if p.event == "error"] == []
        values = [p.data for p in parts if p.event == "values"][-1]
    elif how == "wait":
        values = await acme.runs.wait(tid, "confirm", input={}, command=command)
    else:
        run = await acme.runs.create(tid, "confirm", command=command)
        await acme.runs.join(tid, run["run_id"])
        assert (await acme.runs.get(tid, run["run_id"]))["status"] == "success"
        values = (await acme.threads.get_state(tid))["values"]
    assert values["messages"] == asked["values"]["messages"]
    state = await acme.threads.get_state(tid)
    assert state["next"] == [] and state["interrupts"] == []
    assert (await acme.threads.get(tid))["status"] == "idle"


async def test_goto_end_never_runs_a_node_a_parallel_branch_scheduled(clients: dict[str, LangGraphClient]) -> None:
    """A subgraph asks while a parallel branch finished: ending the pending task also
    applies the finished branch's write, which schedules the node after both. The
    resolve ends that too, and nothing runs (the run only sends the state)."""
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(tid, "parallel_confirm", input=says("hello"))
    asked = await acme.threads.get_state(tid)
    assert asked["interrupts"], asked
    parts = [p async for p in acme.runs.stream(
        tid, "parallel_confirm", command={"goto": "__end__"}, stream_mode=["values", "updates"])]
    assert [p.data for p in parts if p.event == "error"] == []
    assert [p for p in parts if p.event == "updates"] == [], "no node ran"
    state = await acme.threads.get_state(tid)
    contents = [m["content"] for m in state["values"]["messages"]]
    assert "after ran" not in contents, contents
    assert state["next"] == [] and state["interrupts"] == []
    assert (await acme.threads.get(tid))["status"] == "idle"


async def test_goto_end_with_nothing_pending_or_more_than_itself_is_refused(clients: dict[str, LangGraphClient]) -> None:
    """No interrupt waiting (a new thread with no state, one created by the run, a
    finished one): 409 naming that; with an input or a checkpoint: 400. Never a 500,
    and the thread keeps its status (never ``error``)."""
    acme = clients["acme"]
    end = {"goto": "__end__"}

    def post(tid: str, **body: Any) -> Any:
        return acme.http.client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "confirm", "command": end, **body})

    fresh = (await acme.threads.create())["thread_id"]
    refused = await post(fresh)
    assert refused.status_code == 409 and "nothing to resolve" in refused.json()["detail"], refused.text
    assert (await acme.threads.get(fresh))["status"] == "idle"
    streamed = await acme.http.client.post(
        f"/threads/{fresh}/runs/stream", json={"assistant_id": "confirm", "command": end, "stream_mode": ["values"]}
    )
    assert streamed.status_code == 409, streamed.text
    created = str(uuid.uuid4())
    refused = await post(created, if_not_exists="create")
    assert refused.status_code == 409, refused.text

    finished = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(finished, "chat", input=says("hi"))
    refused = await post(finished)
    assert refused.status_code == 409 and "'idle'" in refused.json()["detail"], refused.text
    assert (await acme.threads.get(finished))["status"] == "idle"

    tid, asked = await _asked(acme)
    for body, field in [
        ({"input": says("more")}, "input"),
        ({"checkpoint": {"checkpoint_id": asked["checkpoint"]["checkpoint_id"]}}, "checkpoint"),
        ({"checkpoint_id": asked["checkpoint"]["checkpoint_id"]}, "checkpoint"),
    ]:
        refused = await post(tid, **body)
        assert refused.status_code == 400, refused.text
        detail = refused.json()["detail"]
        assert "takes no input/checkpoint" in detail and field in detail, detail
    with pytest.raises(BadRequestError, match="takes no input/checkpoint"):
        await acme.runs.create(tid, "confirm", input=says("more"), command=end)
    assert (await acme.threads.get(tid))["status"] == "interrupted", "refused whole"
    assert (await acme.threads.get_state(tid))["next"] == ["confirm"]


# ---- the agent: a resolved approval -------------------------------------------------


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[tuple[ServerHandle, str, Path]]:
    """The agent (with the probe tool, which needs a person's approval) on the scripted
    backend: its server, a key, and the file the probe writes when it really runs."""
    tmp = tmp_path_factory.mktemp("resolve-agent")
    probe_log = tmp / "probe.log"
    probe_log.write_text("")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    registry = yaml.safe_load(models.read_text())
    registry["backends"]["fake-tools"] = {**registry["backends"]["fake-ok"], "model": "fake-tools"}
    registry["aliases"]["fake-tools"] = "fake-tools"
    models.write_text(yaml.safe_dump(registry))
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"agent": {"path": "tests.fakes.graphs:make_probe_agent", "model": "fake-tools", "tools": ["probe"]}},
        "tools": {"require_approval": ["probe"]},
        "auth": {"tenants": {"acme": {"graphs": ["*"]}}},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    key = create_key(config, "acme")
    handle = start_server(tmp, settings, dev=False, env={PROBE_LOG_ENV: str(probe_log)})
    try:
        yield handle, key, probe_log
    finally:
        stop_server(handle)


async def test_a_resolved_approval_answers_the_call_and_never_runs_it(
    agent_server: tuple[ServerHandle, str, Path],
) -> None:
    """Agent Chat UI's "Mark as Resolved" on the agent's approval: the tool never runs,
    the AI message's call is answered by a refused tool message (so the next turn
    hands the model no unanswered call), and the next user turn is answered."""
    handle, key, probe_log = agent_server
    client = get_client(url=handle.url, api_key=key)
    try:
        tid = (await client.threads.create())["thread_id"]
        await client.runs.wait(tid, "agent", input=says("probe"))
        asked = await client.threads.get_state(tid)
        assert asked["next"] and asked["interrupts"], asked
        [call] = asked["values"]["messages"][-1]["tool_calls"]

        parts = [
            p async for p in client.runs.stream(tid, "agent", input={}, command={"goto": "__end__"},
                                                stream_mode=["values", "messages-tuple"])
        ]
        assert [p.event for p in parts if p.event == "error"] == []
        final = [p.data for p in parts if p.event == "values"][-1]
        answer = final["messages"][-1]
        assert answer["type"] == "tool" and answer["tool_call_id"] == call["id"] and answer["status"] == "error"
        assert answer["artifact"]["decision"] == "refused" and "resolved" in answer["artifact"]["reason"]
        assert "not run" in answer["content"]
        state = await client.threads.get_state(tid)
        assert state["next"] == [] and state["interrupts"] == [] and state["values"] == final
        assert (await client.threads.get(tid))["status"] == "idle"
        assert probe_log.read_text() == "", "the tool never ran"

        received = len(RECEIVED)
        values = await client.runs.wait(tid, "agent", input=says("thanks"))
        assert values["messages"][-1]["type"] == "ai" and values["messages"][-1]["content"]
        [turn] = [b for b in RECEIVED[received:] if b.get("model") == "fake-tools"]
        roles = [m["role"] for m in turn["messages"]]
        assert roles[-3:] == ["assistant", "tool", "user"], roles  # the call answered before the next turn
        assert probe_log.read_text() == ""
        assert (await client.threads.get(tid))["status"] == "idle"
    finally:
        await client.http.client.aclose()
