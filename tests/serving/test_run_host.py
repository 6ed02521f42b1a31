"""Cancellation at every await point of a run's set-up and tear-down (issue 10).

The app runs in this test's process (uvicorn on a free loopback port) with a run
hook: at the chosen stage of `serving.runs.STAGES` the hook cancels the task running
the run (what a client disconnect, a deadline or a server shutdown does), or pauses
the run while the test cancels it through the API. Afterwards nothing may be held:
the run slots are back to zero, the thread is not busy, every run record has ended
(``join`` returns, the joined stream ends), ended runs have their ``run`` audit
record, and the next run on the same thread is served. The graph's backend is the
FAKE scripted backend (tests/fakes).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from langgraph_sdk import get_client

from serving.app import create_app
from serving.runs import STAGES
from serving.settings import load_settings
from tests.conftest import write_models_file
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e]

HI = {"messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Hook:
    """Cancels (or pauses) the run at one stage, once."""

    stage: str | None = None
    action: str = "cancel"
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def arm(self, stage: str, action: str = "cancel") -> None:
        self.stage, self.action = stage, action
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, stage: str) -> None:
        if stage != self.stage or self.reached.is_set():
            return
        self.reached.set()
        if self.action == "pause":
            await self.release.wait()
            return
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)  # the CancelledError is raised here, at the stage


@dataclass
class Hosted:
    url: str
    app: FastAPI
    hook: Hook
    data_dir: Path

    def audit(self) -> list[dict[str, Any]]:
        lines = (self.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


@pytest.fixture
async def hosted(tmp_path: Path, fake_backend_url: str) -> AsyncIterator[Hosted]:
    models = write_models_file(tmp_path / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
        "server": {"dev": True, "max_concurrent_runs": 3, "shutdown_grace_s": 1},
    }))
    hook = Hook()
    app = create_app(load_settings(config), run_hook=hook)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    assert server.started, "the in-process server did not start"
    try:
        yield Hosted(url=f"http://127.0.0.1:{port}", app=app, hook=hook, data_dir=tmp_path / "data")
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def _start(http: httpx.AsyncClient, mode: str, thread: str) -> None:
    """One run on ``thread`` the way each kind of client starts it; what it answers is
    not the point (the run was cancelled under it)."""
    body = {"assistant_id": "chat", "input": HI, "stream_mode": ["values", "messages-tuple"]}
    try:
        if mode == "stream":
            async with http.stream("POST", f"/threads/{thread}/runs/stream", json=body) as response:
                async for _ in response.aiter_lines():
                    pass
        elif mode == "wait":
            await http.post(f"/threads/{thread}/runs/wait", json=body)
        else:
            await http.post(f"/threads/{thread}/runs", json=body)
    except httpx.HTTPError:
        pass  # the connection went with the cancelled request


async def _nothing_held(hosted: Hosted, http: httpx.AsyncClient, thread: str) -> list[dict[str, Any]]:
    """Wait (bounded) until the run has let go of everything; the thread's runs."""
    host = hosted.app.state.run_host
    for _ in range(100):
        status = (await http.get(f"/threads/{thread}")).json()["status"]
        if host.slots._total == 0 and status != "busy" and host.runs.active(thread) is None:
            break
        await asyncio.sleep(0.05)
    assert host.slots._total == 0, "a run slot is still held"
    assert host.slots._per_key == {}
    assert status != "busy", "the thread is still busy"
    assert host.runs.active(thread) is None
    runs = (await http.get(f"/threads/{thread}/runs")).json()
    for run in runs:
        joined = await asyncio.wait_for(http.get(f"/threads/{thread}/runs/{run['run_id']}/join"), 10)
        assert joined.status_code == 200
        assert run["status"] != "pending"
        if host.runs._runs[run["run_id"]].frames is not None:
            async with http.stream("GET", f"/threads/{thread}/runs/{run['run_id']}/stream") as joined_stream:
                await asyncio.wait_for(joined_stream.aread(), 10)  # ends: the run has
    return list(runs)


async def _next_run_is_served(http: httpx.AsyncClient, thread: str) -> None:
    answer = await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", "input": HI})
    assert answer.status_code == 200, answer.text
    assert answer.json()["messages"][-1]["content"] == "Hello from the fake"


@pytest.mark.parametrize("mode", ["stream", "wait", "background"])
@pytest.mark.parametrize("stage", STAGES)
async def test_a_cancel_at_any_stage_leaves_nothing_held(hosted: Hosted, stage: str, mode: str) -> None:
    async with httpx.AsyncClient(base_url=hosted.url, timeout=30) as http:
        thread = (await http.post("/threads", json={})).json()["thread_id"]
        hosted.hook.arm(stage)
        await _start(http, mode, thread)
        await asyncio.wait_for(hosted.hook.reached.wait(), 10)
        runs = await _nothing_held(hosted, http, thread)
        ended = [r for r in hosted.audit() if r["type"] == "run" and r.get("thread_id") == thread]
        if stage != "make_way":  # cancelled before it took anything: no run to record
            assert len(runs) == 1 and len(ended) == 1, (runs, ended)
            assert ended[0]["outcome"] in ("cancelled", "ok"), ended[0]
            # Cancelled before it marked the thread busy, it had no status to restore.
            assert ended[0]["thread_status"] in (("idle", "interrupted") if stage != "acquired" else (None,))
        hosted.hook.arm("none")
        await _next_run_is_served(http, thread)


@pytest.mark.parametrize("stage", STAGES[1:])
async def test_a_cancel_request_at_any_stage_ends_the_run(hosted: Hosted, stage: str) -> None:
    """``POST .../cancel`` while the run is paused at ``stage``: the run ends as
    ``interrupted`` (or ``success``, if its work was done) and lets go of everything."""
    async with httpx.AsyncClient(base_url=hosted.url, timeout=30) as http:
        thread = (await http.post("/threads", json={})).json()["thread_id"]
        hosted.hook.arm(stage, action="pause")
        started = asyncio.get_running_loop().create_task(_start(http, "background", thread))
        await asyncio.wait_for(hosted.hook.reached.wait(), 10)
        runs = (await http.get(f"/threads/{thread}/runs")).json()
        assert len(runs) == 1
        cancel = asyncio.get_running_loop().create_task(
            http.post(f"/threads/{thread}/runs/{runs[0]['run_id']}/cancel", params={"wait": "true"})
        )
        await asyncio.sleep(0.1)
        hosted.hook.release.set()
        assert (await asyncio.wait_for(cancel, 10)).status_code == 204
        await asyncio.wait_for(started, 10)
        [run] = await _nothing_held(hosted, http, thread)
        assert run["status"] in ("interrupted", "success")
        hosted.hook.arm("none")
        await _next_run_is_served(http, thread)


async def test_create_then_cancel_fifty_times(hosted: Hosted) -> None:
    """The langgraph-sdk sequence that used to leave runs pending and threads busy."""
    client = get_client(url=hosted.url, api_key=None)
    try:
        for _ in range(50):
            thread = (await client.threads.create())["thread_id"]
            run = await client.runs.create(thread, "chat", input=HI)
            await client.runs.cancel(thread, run["run_id"])
            await asyncio.wait_for(client.runs.join(thread, run["run_id"]), 10)
            parts = [p async for p in client.runs.join_stream(thread, run["run_id"])]
            assert all(p.event != "metadata" or p.data["run_id"] == run["run_id"] for p in parts)
            assert (await client.runs.get(thread, run["run_id"]))["status"] in ("interrupted", "success")
            assert (await client.threads.get(thread))["status"] == "idle"
        assert hosted.app.state.run_host.slots._total == 0
        # Two slots of three were never leaked: three runs at once are still served.
        threads = [(await client.threads.create())["thread_id"] for _ in range(3)]
        results = await asyncio.gather(*(client.runs.wait(t, "chat", input=HI) for t in threads))
        assert all(r["messages"][-1]["content"] == "Hello from the fake" for r in results)
    finally:
        await client.http.client.aclose()
