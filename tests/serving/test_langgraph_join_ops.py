"""Joining runs the way the SDKs do: the JS SDK's ``useStream`` rejoins with
``Last-Event-ID: -1``, ``runs.joinStream`` may ask to cancel the run when it leaves
(``cancel_on_disconnect``), and a stateless run is joined at ``/runs/{run_id}/stream``;
a kept stateless run names the thread it made. Runs wait at a gate the test opens
(``tests/fakes/gated.py``): no timing."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

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


def _events(response: httpx.Response) -> list[tuple[str, str]]:
    """(event, id) of each frame of an SSE body."""
    found, name = [], None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("id: ") and name is not None:
            found.append((name, line[4:]))
            name = None
    return found


async def test_last_event_id_minus_one_replays_the_whole_run(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    run = await acme.runs.create(tid, "gated", input=says("hi"), stream_mode=["values"])
    await acme.runs.join(tid, run["run_id"])
    url = f"/threads/{tid}/runs/{run['run_id']}/stream"
    everything = await acme.http.client.get(url)
    rejoined = await acme.http.client.get(url, headers={"Last-Event-ID": "-1"})
    assert rejoined.status_code == 200, rejoined.text
    assert _events(rejoined) == _events(everything) and _events(everything)[0] == ("metadata", "0")
    assert (await acme.http.client.get(url, headers={"Last-Event-ID": "-2"})).status_code == 400
    # A thread's stream is live (it waits for the thread's next run): -1 is accepted, not a 400.
    async with acme.http.client.stream("GET", f"/threads/{tid}/stream", headers={"Last-Event-ID": "-1"}) as live:
        assert live.status_code == 200


async def test_a_joiner_with_cancel_on_disconnect_cancels_the_run_when_it_leaves(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await _at_gate(acme, tid, gate)
    url = f"{ops_server.handle.url}/threads/{tid}/runs/{run['run_id']}/stream"
    headers = {"x-api-key": ops_server.keys["acme"]}
    # A joiner without the flag leaves: the run goes on.
    async with httpx.AsyncClient(headers=headers) as http:
        async with http.stream("GET", url, params={"cancel_on_disconnect": "0"}) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("event: custom"):
                    break
    assert (await acme.runs.get(tid, run["run_id"]))["status"] in ("pending", "running")
    # One with it leaves: the run is cancelled, what it saved stays.
    async with httpx.AsyncClient(headers=headers) as http:
        async with http.stream("GET", url, params={"cancel_on_disconnect": "1"}) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("event: custom"):
                    break
    for _ in range(500):  # a bound, not a timing assertion: without the cancel the run waits for good
        status = (await acme.runs.get(tid, run["run_id"]))["status"]
        if status not in ("pending", "running"):
            break
        await asyncio.sleep(0.02)
    assert status == "interrupted"
    assert (await acme.threads.get(tid))["status"] == "idle"
    ops_server.open_gate(gate)  # nothing waits there any more


async def test_a_stateless_run_is_joined_at_runs_and_a_kept_one_names_its_thread(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    gate = uuid.uuid4().hex
    run = await acme.runs.create(None, "gated", input=says(f"gate:{gate}"), stream_mode=["custom", "values"])
    assert run["thread_id"] is None
    url = f"/runs/{run['run_id']}/stream"
    assert (await globex.http.client.get(url)).status_code == 404  # another tenant's run
    ops_server.open_gate(gate)
    live = await acme.http.client.get(url)  # joined while it runs: ends when the run ends
    joined = await acme.http.client.get(url, headers={"Last-Event-ID": "-1"})  # and after it ended
    assert live.status_code == joined.status_code == 200
    assert _events(joined) == _events(live)
    names = [name for name, _ in _events(joined)]
    assert names[0] == "metadata" and "custom" in names and names[-1] == "values"
    # A thread's run is not a stateless one.
    tid = (await acme.threads.create())["thread_id"]
    on_thread = await acme.runs.create(tid, "gated", input=says("hi"))
    assert (await acme.http.client.get(f"/runs/{on_thread['run_id']}/stream")).status_code == 404
    # on_completion: keep makes a thread, and the run says which.
    kept = await acme.runs.create(None, "gated", input=says("keep me"), on_completion="keep")
    assert kept["thread_id"] is not None
    await acme.runs.join(kept["thread_id"], kept["run_id"])
    assert (await acme.runs.get(kept["thread_id"], kept["run_id"]))["status"] == "success"
    values = (await acme.threads.get_state(kept["thread_id"]))["values"]
    assert values["messages"][0]["content"] == "keep me"
