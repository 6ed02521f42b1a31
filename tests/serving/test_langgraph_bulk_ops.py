"""Bulk and flagged operations of the LangGraph API the JS SDK 1.15.0 calls:
``threads.prune`` (``delete`` / ``keep_latest``), ``runs.cancelMany``, a cancel's
``reason``, and ``runs.join`` with ``cancel_on_disconnect``. Two tenants: another
tenant's threads and runs are never pruned or cancelled, and never named. Runs wait at
a gate the test opens (``tests/fakes/gated.py``): no timing."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIStatusError

from tests.serving.lg_ops_server import OpsServer, clients, ops_server, says  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.e2e]


async def _at_gate(client: LangGraphClient, tid: str, gate: str) -> dict[str, Any]:
    """A background run on ``tid`` waiting at ``gate`` (its ``custom`` event is out)."""
    run = await client.runs.create(tid, "gated", input=says(f"gate:{gate}"), stream_mode=["custom", "values"])
    async with aclosing(client.runs.join_stream(tid, run["run_id"], stream_mode="custom")) as parts:
        async for part in parts:
            if part.event == "custom":
                break
    return run


async def _status(client: LangGraphClient, tid: str, run_id: str) -> str:
    return str((await client.runs.get(tid, run_id))["status"])


async def _ended(client: LangGraphClient, tid: str, run_id: str) -> str:
    """The run's status once it has ended (joined: no timing)."""
    await client.runs.join(tid, run_id)
    return await _status(client, tid, run_id)


def _error_event(body: str) -> dict[str, Any]:
    lines = body.splitlines()
    for index, line in enumerate(lines):
        if line == "event: error":
            return dict(json.loads(lines[index + 1].removeprefix("data: ")))
    raise AssertionError(f"no error event in {body!r}")


async def _refused(call: Any, status: int) -> str:
    with pytest.raises(APIStatusError) as caught:
        await call
    assert caught.value.response.status_code == status, caught.value.response.text
    return str(caught.value.response.json()["detail"])


async def _history_len(client: LangGraphClient, tid: str) -> int:
    return len(await client.threads.get_history(tid, limit=100))


# ---- threads.prune -----------------------------------------------------------------


async def test_prune_delete_deletes_the_tenants_threads_and_skips_others(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    idle = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(idle, "gated", input=says("hi"))
    busy = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, busy, gate)
    theirs = (await globex.threads.create())["thread_id"]

    # Another tenant's prune: nothing of acme's is touched or counted.
    assert await globex.threads.prune([idle, busy]) == {"pruned_count": 0}
    assert (await acme.threads.get(idle))["thread_id"] == idle
    assert await _status(acme, busy, run["run_id"]) in ("pending", "running")

    result = await acme.threads.prune([idle, busy, idle, theirs, "no-such-thread"], strategy="delete")
    assert result == {"pruned_count": 2}
    for tid in (idle, busy):  # the run in progress was cancelled first, then all went
        assert await _refused(acme.threads.get(tid), 404)
    assert (await globex.threads.get(theirs))["thread_id"] == theirs
    ops_server.open_gate(gate)  # nothing waits there any more


async def test_prune_refuses_bad_input(clients: dict[str, LangGraphClient]) -> None:
    http = clients["acme"].http.client
    too_many = await http.post("/threads/prune", json={"thread_ids": [str(uuid.uuid4()) for _ in range(1001)]})
    assert too_many.status_code == 422 and "thread_ids" in too_many.text
    strategy = await http.post("/threads/prune", json={"thread_ids": [], "strategy": "all"})
    assert strategy.status_code == 422 and "strategy" in strategy.text
    missing = await http.post("/threads/prune", json={})
    assert missing.status_code == 422 and "thread_ids" in missing.text


async def test_prune_keep_latest_keeps_the_thread_and_its_latest_state(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = (await acme.threads.create())["thread_id"]
    for text in ("one", "two"):
        await acme.runs.wait(tid, "gated", input=says(text))
    state = await acme.threads.get_state(tid)
    assert await _history_len(acme, tid) > 1

    assert await globex.threads.prune([tid], strategy="keep_latest") == {"pruned_count": 0}
    before = await _history_len(acme, tid)
    assert before > 1  # untouched by the other tenant

    assert await acme.threads.prune([tid], strategy="keep_latest") == {"pruned_count": 1}
    history = await acme.threads.get_history(tid, limit=100)
    assert len(history) == 1
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert (await acme.threads.get_state(tid))["values"] == state["values"]
    assert (await acme.threads.get(tid))["status"] == "idle"
    # The thread goes on from its latest state.
    values = await acme.runs.wait(tid, "gated", input=says("three"))
    assert isinstance(values, dict) and len(values["messages"]) == len(state["values"]["messages"]) + 3  # input, gate, reply

    # A thread with a run in progress: 409 naming it, and nothing is pruned.
    busy = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(busy, "gated", input=says("hi"))
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, busy, gate)
    kept = await _history_len(acme, tid)
    detail = await _refused(acme.threads.prune([tid, busy], strategy="keep_latest"), 409)
    assert busy in detail and run["run_id"] in detail
    assert await _history_len(acme, tid) == kept > 1
    ops_server.open_gate(gate)
    assert await _ended(acme, busy, run["run_id"]) == "success"
    assert await acme.threads.prune([tid, busy], strategy="keep_latest") == {"pruned_count": 2}
    assert await _history_len(acme, busy) == 1


# ---- runs.cancel_many --------------------------------------------------------------


async def test_cancel_many_by_run_ids(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme, globex = clients["acme"], clients["globex"]
    gate = uuid.uuid4().hex
    t1, t2, t3 = [(await acme.threads.create())["thread_id"] for _ in range(3)]
    r1, r2, r3 = [await _at_gate(acme, t, gate) for t in (t1, t2, t3)]
    theirs_tid = (await globex.threads.create())["thread_id"]
    theirs = await _at_gate(globex, theirs_tid, gate)

    # Another tenant's run ids are not found, and nothing is cancelled.
    detail = await _refused(globex.runs.cancel_many(run_ids=[r1["run_id"], theirs["run_id"]]), 404)
    assert r1["run_id"] in detail and theirs["run_id"] not in detail
    # With thread_id, the runs must be on it.
    detail = await _refused(acme.runs.cancel_many(thread_id=t1, run_ids=[r1["run_id"], r2["run_id"]]), 404)
    assert r2["run_id"] in detail
    await _refused(acme.runs.cancel_many(run_ids=[r1["run_id"]], action="rollback"), 400)
    missing = await acme.http.client.post("/runs/cancel", json={"thread_id": t1})
    assert missing.status_code == 422 and "run_ids or status" in missing.text
    for tid, run in ((t1, r1), (t2, r2), (t3, r3)):
        assert await _status(acme, tid, run["run_id"]) in ("pending", "running")

    response = await acme.http.client.post("/runs/cancel", json={"run_ids": [r1["run_id"], r2["run_id"]]})
    assert response.status_code == 204, response.text
    assert await _ended(acme, t1, r1["run_id"]) == await _ended(acme, t2, r2["run_id"]) == "interrupted"
    await acme.runs.cancel_many(thread_id=t1, run_ids=[r1["run_id"]])  # an ended run: nothing to do
    assert await _status(acme, t3, r3["run_id"]) in ("pending", "running")
    assert await _status(globex, theirs_tid, theirs["run_id"]) in ("pending", "running")
    ops_server.open_gate(gate)
    assert await _ended(acme, t3, r3["run_id"]) == "success"
    assert await _ended(globex, theirs_tid, theirs["run_id"]) == "success"


async def test_cancel_many_by_status(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme, globex = clients["acme"], clients["globex"]
    gate = uuid.uuid4().hex
    t1, t2 = [(await acme.threads.create())["thread_id"] for _ in range(2)]
    r1, r2 = [await _at_gate(acme, t, gate) for t in (t1, t2)]
    theirs_tid = (await globex.threads.create())["thread_id"]
    theirs = await _at_gate(globex, theirs_tid, gate)

    await _refused(globex.runs.cancel_many(thread_id=t1, status="all"), 404)  # another tenant's thread
    await acme.runs.cancel_many(thread_id=t1, status="running")
    assert await _ended(acme, t1, r1["run_id"]) == "interrupted"
    assert await _status(acme, t2, r2["run_id"]) in ("pending", "running")

    await acme.runs.cancel_many(status="all")
    assert await _ended(acme, t2, r2["run_id"]) == "interrupted"
    assert await _status(globex, theirs_tid, theirs["run_id"]) in ("pending", "running")
    ops_server.open_gate(gate)
    assert await _ended(globex, theirs_tid, theirs["run_id"]) == "success"


# ---- runs.cancel reason; runs.join cancel_on_disconnect ----------------------------


async def test_a_cancel_reason_is_in_the_runs_error_event(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, tid, gate)
    url = f"/threads/{tid}/runs/{run['run_id']}/cancel"
    for bad in ("line\nbreak", "next\u0085line", "x" * 501):
        refused = await acme.http.client.post(url, params={"reason": bad})
        assert refused.status_code == 422 and "reason" in refused.text
    assert await _status(acme, tid, run["run_id"]) in ("pending", "running")
    await acme.runs.cancel(tid, run["run_id"], wait=True, params={"reason": "the user changed their mind"})
    assert await _status(acme, tid, run["run_id"]) == "interrupted"
    body = (await acme.http.client.get(f"/threads/{tid}/runs/{run['run_id']}/stream")).text
    error = _error_event(body)
    assert error["error"] == "RunCancelled" and error["message"].endswith(": the user changed their mind")
    ops_server.open_gate(gate)


async def _leave_join(ops_server: OpsServer, tid: str, run_id: str, flag: str) -> None:
    """Ask to join the run, then leave before it ends: the request is sent whole (the
    read times out after it), so the server reads it and then sees the client gone."""
    url = f"{ops_server.handle.url}/threads/{tid}/runs/{run_id}/join"
    async with httpx.AsyncClient(headers={"x-api-key": ops_server.keys["acme"]}) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(url, params={"cancel_on_disconnect": flag}, timeout=httpx.Timeout(10, read=0.5))


async def test_a_joiner_with_cancel_on_disconnect_cancels_the_run_when_it_leaves(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, tid, gate)
    # Without the flag, a joiner that leaves cancels nothing: the run is cancelled
    # later, by request, and says so.
    await _leave_join(ops_server, tid, run["run_id"], "0")
    await acme.runs.cancel(tid, run["run_id"], wait=True, params={"reason": "by request"})
    body = (await acme.http.client.get(f"/threads/{tid}/runs/{run['run_id']}/stream")).text
    assert _error_event(body)["message"].endswith(": by request")

    other = await _at_gate(acme, tid, gate)
    await _leave_join(ops_server, tid, other["run_id"], "1")
    for _ in range(500):  # a bound, not a timing assertion: without the cancel the run waits for good
        status = await _status(acme, tid, other["run_id"])
        if status not in ("pending", "running"):
            break
        await asyncio.sleep(0.02)
    assert status == "interrupted"
    body = (await acme.http.client.get(f"/threads/{tid}/runs/{other['run_id']}/stream")).text
    assert "cancel_on_disconnect" in _error_event(body)["message"]
    ops_server.open_gate(gate)
    # A joiner that stays gets the values, as before.
    done = await acme.runs.create(tid, "gated", input=says("hi"))
    values = await acme.http.client.get(f"/threads/{tid}/runs/{done['run_id']}/join", params={"cancel_on_disconnect": "1"})
    assert values.status_code == 200 and values.json()["messages"][-1]["content"].endswith("messages")
