"""Two replicas sharing one PostgreSQL (threads, checkpoints and the run board) and one
Redis: any replica serves any run request (issue 17, item 2).

Real processes (`tests/replicas.py`): A and B are ``switchyard serve`` on their own
ports; the model is the scripted benchmark backend (bench/scripted_backend.py), whose
streams are slow and deterministic (``max_tokens`` tokens, 20 ms apart), so a run is
still going when the test reaches it through the other replica.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from langgraph_sdk import get_sync_client

from gateway.registry import AliasTarget
from serving.cli import CliEnv
from serving.shared.promotions import PostgresPromotionStore

from tests.replicas import Replica, create_key, start_replicas, stop_replicas
from tests.scripted import error_log_lines, failed_requests, start_scripted_backend, write_scripted_models_file

pytestmark = [pytest.mark.e2e]

HI = {"messages": [{"role": "user", "content": "hi"}]}


def _body(tokens: int, **more: Any) -> dict[str, Any]:
    return {
        "assistant_id": "chat",
        "input": HI,
        "stream_mode": ["values", "messages-tuple"],
        "context": {"model_params": {"max_tokens": tokens}},
        **more,
    }


def _events(lines: Iterator[str]) -> Iterator[tuple[str | None, str, str]]:
    """(id, event, data) of each SSE event."""
    event_id, name, data = None, "", ""
    for line in lines:
        if not line:
            if name:
                yield event_id, name, data
            event_id, name, data = None, "", ""
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]


@pytest.fixture
def pair(tmp_path: Path, postgres_dsn: str, redis_url: str) -> Iterator[tuple[Replica, Replica, dict[str, str]]]:
    backend = start_scripted_backend(tmp_path, delay_ms=20, tokens=20)
    replicas: list[Replica] = []
    try:
        models = write_scripted_models_file(tmp_path / "models.yaml", backend)
        replicas = start_replicas(tmp_path, dsn=postgres_dsn, redis_url=redis_url, models_file=models)
        key = create_key(replicas[0], "acme")
        yield replicas[0], replicas[1], {"x-api-key": key}
        for replica in replicas:
            audit = replica.data_dir / "audit" / "audit.jsonl"
            assert failed_requests(audit) == [], replica.name
            assert error_log_lines(replica.log_file) == [], replica.name
    finally:
        stop_replicas(replicas)
        backend.stop()


def _wait_for(check: Any, timeout_s: float = 15, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_background_run_started_on_a_is_read_streamed_joined_and_cancelled_through_b(
    pair: tuple[Replica, Replica, dict[str, str]],
) -> None:
    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=30) as a, httpx.Client(
        base_url=b_rep.url, headers=headers, timeout=30
    ) as b:
        thread = a.post("/threads", json={}).json()["thread_id"]
        run = a.post(f"/threads/{thread}/runs", json=_body(60)).json()
        run_id = run["run_id"]
        # Visible through B at once, while it runs on A.
        seen = b.get(f"/threads/{thread}/runs/{run_id}")
        assert seen.status_code == 200, seen.text
        assert seen.json()["status"] in ("pending", "running")
        assert run_id in [r["run_id"] for r in b.get(f"/threads/{thread}/runs").json()]
        assert b.get(f"/threads/{thread}").json()["status"] == "busy"

        # The whole stream through B, then a resume after event 2 (Last-Event-ID).
        with b.stream("GET", f"/threads/{thread}/runs/{run_id}/stream") as response:
            assert response.status_code == 200
            whole = list(_events(response.iter_lines()))
        ids = [int(i) for i, _, _ in whole if i is not None]
        assert ids == list(range(len(ids))) and len(ids) > 5, ids
        assert whole[0][1] == "metadata" and any(name == "messages" for _, name, _ in whole)
        with b.stream("GET", f"/threads/{thread}/runs/{run_id}/stream", headers={"Last-Event-ID": "2"}) as response:
            rest = list(_events(response.iter_lines()))
        assert rest == whole[3:]

        joined = b.get(f"/threads/{thread}/runs/{run_id}/join")
        assert joined.status_code == 200, joined.text
        assert joined.json()["messages"][-1]["type"] == "ai"
        assert b.get(f"/threads/{thread}/runs/{run_id}").json()["status"] == "success"
        assert b.get(f"/threads/{thread}").json()["status"] == "idle"

        # A long one, cancelled through B: it ends interrupted, A's own stream ends.
        long_run = a.post(f"/threads/{thread}/runs", json=_body(1500, multitask_strategy="enqueue")).json()
        long_id = long_run["run_id"]
        with a.stream("GET", f"/threads/{thread}/runs/{long_id}/stream") as on_a, b.stream(
            "GET", f"/threads/{thread}/runs/{long_id}/stream"
        ) as on_b:
            b_events = _events(on_b.iter_lines())
            _wait_for(lambda: next(name for _, name, _ in b_events if name == "messages"), what="a token through B")
            started = time.monotonic()
            cancelled = b.post(f"/threads/{thread}/runs/{long_id}/cancel", params={"wait": "true", "reason": "from B"})
            assert cancelled.status_code == 204, cancelled.text
            assert time.monotonic() - started < 10
            a_events = list(_events(on_a.iter_lines()))  # ends: the run has
            b_tail = list(b_events)
        assert a_events[-1][1] == "error" and "from B" in a_events[-1][2], a_events[-1]
        assert b_tail[-1][1] == "error", b_tail[-1:]
        assert b.get(f"/threads/{thread}/runs/{long_id}").json()["status"] == "interrupted"
        assert a.get(f"/threads/{thread}/runs/{long_id}").json()["status"] == "interrupted"
        assert _wait_for(lambda: b.get(f"/threads/{thread}").json()["status"] == "idle", what="thread idle")


def test_runs_of_one_thread_alternate_between_replicas(pair: tuple[Replica, Replica, dict[str, str]]) -> None:
    a_rep, b_rep, headers = pair
    clients = [get_sync_client(url=r.url, api_key=headers["x-api-key"]) for r in (a_rep, b_rep)]
    thread = clients[0].threads.create()["thread_id"]
    for turn in range(4):
        client = clients[turn % 2]
        result = client.runs.wait(
            thread, "chat", input={"messages": [{"role": "user", "content": f"turn {turn}"}]},
            context={"model_params": {"max_tokens": 5}},
        )
        assert isinstance(result, dict) and result["messages"][-1]["type"] == "ai", result
    state = clients[1].threads.get_state(thread)
    humans = [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]
    assert humans == [f"turn {turn}" for turn in range(4)]
    assert len(state["values"]["messages"]) == 8
    for client in clients:
        runs = client.runs.list(thread, limit=10)
        assert len(runs) == 4 and all(r["status"] == "success" for r in runs)


def test_reject_through_b_while_a_runs_the_thread(pair: tuple[Replica, Replica, dict[str, str]]) -> None:
    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=30) as a, httpx.Client(
        base_url=b_rep.url, headers=headers, timeout=30
    ) as b:
        thread = a.post("/threads", json={}).json()["thread_id"]
        run_id = a.post(f"/threads/{thread}/runs", json=_body(400)).json()["run_id"]
        refused = b.post(f"/threads/{thread}/runs/wait", json=_body(5, multitask_strategy="reject"))
        assert refused.status_code == 409, refused.text
        assert run_id in refused.text and "replica A" in refused.text
        # Refused runs leave no record; a state update through B is refused too.
        assert [r["run_id"] for r in b.get(f"/threads/{thread}/runs").json()] == [run_id]
        update = b.post(f"/threads/{thread}/state", json={"values": {"messages": []}})
        assert update.status_code == 409, update.text
        # interrupt through B: A's run is cancelled, B's runs.
        result = b.post(f"/threads/{thread}/runs/wait", json=_body(5, multitask_strategy="interrupt"))
        assert result.status_code == 200, result.text
        assert a.get(f"/threads/{thread}/runs/{run_id}").json()["status"] == "interrupted"
        assert b.get(f"/threads/{thread}").json()["status"] == "idle"
        # A delete through B cancels A's run first, then deletes the thread.
        last = a.post(f"/threads/{thread}/runs", json=_body(1500)).json()["run_id"]
        deleted = b.delete(f"/threads/{thread}")
        assert deleted.status_code == 204, deleted.text
        assert a.get(f"/threads/{thread}/runs/{last}").json()["status"] == "interrupted"
        assert a.get(f"/threads/{thread}").status_code == 404


def test_kill_9_of_a_mid_stream_the_retry_through_b_finds_the_thread_intact(
    pair: tuple[Replica, Replica, dict[str, str]],
) -> None:
    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=30) as a, httpx.Client(
        base_url=b_rep.url, headers=headers, timeout=30
    ) as b:
        thread = a.post("/threads", json={}).json()["thread_id"]
        first = a.post(f"/threads/{thread}/runs/wait", json=_body(5))
        assert first.status_code == 200
        # A background run on another thread of A's: followed through B when A dies.
        other = a.post("/threads", json={}).json()["thread_id"]
        background = a.post(f"/threads/{other}/runs", json=_body(1500)).json()["run_id"]
        dead_run = None
        with pytest.raises(httpx.HTTPError), a.stream("POST", f"/threads/{thread}/runs/stream", json=_body(1500)) as response:
            for _, name, data in _events(response.iter_lines()):
                if name == "metadata":
                    dead_run = httpx.Response(200, content=data).json()["run_id"]
                if name == "messages":
                    a_rep.kill()  # mid-stream: the client's connection breaks
        assert dead_run is not None
        # The client's retry through B: enqueued behind the dead run until its lease ends.
        started = time.monotonic()
        retry = b.post(
            f"/threads/{thread}/runs/wait",
            json={**_body(5, multitask_strategy="enqueue"), "input": {"messages": [{"role": "user", "content": "again"}]}},
        )
        assert retry.status_code == 200, retry.text
        assert time.monotonic() - started < 20
        messages = retry.json()["messages"]
        assert messages[0]["content"] == "hi" and messages[1]["type"] == "ai"  # the first run's turn
        assert messages[-2]["content"] == "again" and messages[-1]["type"] == "ai"
        dead = b.get(f"/threads/{thread}/runs/{dead_run}").json()
        assert dead["status"] == "error", dead
        assert b.get(f"/threads/{thread}").json()["status"] == "idle"
        # The background run: ended by B's sweeper, its thread usable, its followers told.
        assert b.get(f"/threads/{other}/runs/{background}").json()["status"] == "error"
        assert b.get(f"/threads/{other}").json()["status"] == "idle"
        with b.stream("GET", f"/threads/{other}/runs/{background}/stream") as response:
            followed = list(_events(response.iter_lines()))
        assert followed[0][1] == "metadata" and followed[-1][1] == "error"
        assert "ReplicaLost" in followed[-1][2] and "replica A" in followed[-1][2]
        metrics = b.get("/metrics").text
        assert "switchyard_replica_runs_reaped_total 2.0" in metrics


def test_a_replica_stopped_cleanly_ends_its_runs_and_leaves(
    pair: tuple[Replica, Replica, dict[str, str]], postgres_dsn: str
) -> None:
    """SIGTERM: A ends its background run itself (``interrupted``, as a single server
    does at shutdown, not an ``error`` found by a sweeper) and removes its replica row."""
    import psycopg  # noqa: PLC0415 - only this test reads the tables

    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=30) as a, httpx.Client(
        base_url=b_rep.url, headers=headers, timeout=30
    ) as b:
        # POST /runs/cancel through B reaches a run on A by its id.
        other = a.post("/threads", json={}).json()["thread_id"]
        cancelled = a.post(f"/threads/{other}/runs", json=_body(1500)).json()["run_id"]
        missing = b.post("/runs/cancel", json={"run_ids": [cancelled, "no-such-run"]})
        assert missing.status_code == 404 and "no-such-run" in missing.text
        assert b.post("/runs/cancel", json={"run_ids": [cancelled]}).status_code == 204
        _wait_for(lambda: a.get(f"/threads/{other}/runs/{cancelled}").json()["status"] == "interrupted", what="cancel")

        thread = a.post("/threads", json={}).json()["thread_id"]
        run_id = a.post(f"/threads/{thread}/runs", json=_body(1500)).json()["run_id"]
        _wait_for(lambda: b.get(f"/threads/{thread}").json()["status"] == "busy", what="the run on A")
        a_rep.stop()
        assert a_rep.process.returncode == 143  # exited on SIGTERM, after its clean-up
        assert b.get(f"/threads/{thread}/runs/{run_id}").json()["status"] == "interrupted"
        assert b.get(f"/threads/{thread}").json()["status"] == "idle"
        with b.stream("GET", f"/threads/{thread}/runs/{run_id}/stream") as response:
            followed = list(_events(response.iter_lines()))
        assert followed[-1][1] == "error" and "ServerShutdown" in followed[-1][2], followed[-1]
        with psycopg.connect(postgres_dsn) as connection:
            replicas = [row[0] for row in connection.execute("SELECT replica_id FROM switchyard_replicas")]
        assert replicas == ["B"]
        # Nothing was left for B to sweep.
        assert "switchyard_replica_runs_reaped_total 0.0" in b.get("/metrics").text
        # Cancelling the tenant's runs by status through B finds none active.
        assert b.post("/runs/cancel", json={"status": "running"}).status_code == 204


def test_enqueued_runs_from_both_replicas_take_turns_on_one_thread(pair: tuple[Replica, Replica, dict[str, str]]) -> None:
    """Four runs on one thread at once, two through each replica, ``enqueue``: each
    waits for the one before (locally, or across replicas through the board); all
    answer, one after the other, and the thread keeps every turn."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    a_rep, b_rep, headers = pair
    thread = httpx.post(a_rep.url + "/threads", json={}, headers=headers).json()["thread_id"]

    def turn(index: int) -> httpx.Response:
        url = (a_rep if index % 2 == 0 else b_rep).url
        body = {**_body(30, multitask_strategy="enqueue"), "input": {"messages": [{"role": "user", "content": f"t{index}"}]}}
        return httpx.post(f"{url}/threads/{thread}/runs/wait", json=body, headers=headers, timeout=60)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(turn, range(4)))
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    state = httpx.get(f"{b_rep.url}/threads/{thread}/state", headers=headers).json()
    humans = sorted(m["content"] for m in state["values"]["messages"] if m["type"] == "human")
    assert humans == ["t0", "t1", "t2", "t3"]
    # One run at a time: each question answered before the next one came in.
    assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai"] * 4
    runs = httpx.get(f"{a_rep.url}/threads/{thread}/runs", headers=headers).json()
    assert len(runs) == 4 and all(r["status"] == "success" for r in runs)


def test_cli_commands_read_the_shared_promotions(tmp_path: Path, postgres_dsn: str) -> None:
    """``switchyard graph ...`` and ``eval run`` build their gateway from
    `CliEnv.promoted_registry`: with shared state, a promotion made through any replica
    (the shared store), not the data directory's ``promotions.json``."""
    backend = {"kind": "vllm", "model": "m", "capabilities": {"context_window": 4096}}
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({
        "backends": {"a": {**backend, "base_url": "http://127.0.0.1:9/v1"}, "b": {**backend, "base_url": "http://127.0.0.1:9/v1"}},
        "aliases": {"main": {"targets": [{"backend": "a", "weight": 100}]}},
    }))
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "gateway": {"models_file": str(models)},
        "threads": {"postgres_dsn": postgres_dsn},
    }))
    shared = PostgresPromotionStore(postgres_dsn).open()
    try:
        shared.record_promotion(
            "main", expected_override=None, expected_seq=0, from_targets=(AliasTarget(backend="a", weight=100),),
            to_targets=(AliasTarget(backend="b", weight=100),), by="replica A", backend="b", weight=None,
        )
    finally:
        shared.close()
    registry = CliEnv(config).promoted_registry()
    assert [t.backend for t in registry.aliases["main"].targets] == ["b"]
    # Without shared state the data directory's file is what counts (nothing promoted there).
    alone = tmp_path / "alone.yaml"
    alone.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "gateway": {"models_file": str(models)}}))
    assert [t.backend for t in CliEnv(alone).promoted_registry().aliases["main"].targets] == ["a"]


def test_a_replica_starting_leaves_the_threads_of_anothers_runs_busy(
    pair: tuple[Replica, Replica, dict[str, str]],
) -> None:
    """Start-up recovery (threads a crashed server left ``busy`` made ``idle``) skips
    threads with an active run on the board: B killed and started again while A runs a
    thread leaves that thread ``busy`` until A's run ends."""
    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=30) as a:
        thread = a.post("/threads", json={}).json()["thread_id"]
        run_id = a.post(f"/threads/{thread}/runs", json=_body(1500)).json()["run_id"]
        _wait_for(lambda: a.get(f"/threads/{thread}").json()["status"] == "busy", what="thread busy")
        b_rep.kill()
        b_rep.restart()
        with httpx.Client(base_url=b_rep.url, headers=headers, timeout=30) as b:
            assert b.get(f"/threads/{thread}").json()["status"] == "busy"
            assert b.get(f"/threads/{thread}/runs/{run_id}").json()["status"] == "running"
            # B's start said so in its log: nothing recovered.
            assert "left busy" not in b_rep.log_file.read_text()
            # It ends (cancelled through B): now the thread is idle.
            cancelled = b.post(f"/threads/{thread}/runs/{run_id}/cancel", params={"wait": "true"})
            assert cancelled.status_code == 204, cancelled.text
            assert _wait_for(lambda: b.get(f"/threads/{thread}").json()["status"] == "idle", what="thread idle")


def test_a_run_waiting_for_another_replicas_run_holds_no_run_slot(pair: tuple[Replica, Replica, dict[str, str]]) -> None:
    """An enqueued run through B waits for A's run on the thread before it takes a run
    slot: it is not counted in ``switchyard_runs_in_flight`` (which drives the
    autoscaler) and holds no slot an unrelated run could use."""
    import threading

    a_rep, b_rep, headers = pair
    with httpx.Client(base_url=a_rep.url, headers=headers, timeout=60) as a, httpx.Client(
        base_url=b_rep.url, headers=headers, timeout=60
    ) as b:
        thread = a.post("/threads", json={}).json()["thread_id"]
        first = a.post(f"/threads/{thread}/runs", json=_body(1500)).json()["run_id"]
        answers: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: answers.append(b.post(f"/threads/{thread}/runs/wait", json=_body(5, multitask_strategy="enqueue")))
        )
        waiter.start()
        time.sleep(1.5)  # B's run is waiting for A's
        assert not answers
        in_flight = [line for line in b.get("/metrics").text.splitlines() if line.startswith("switchyard_runs_in_flight ")]
        assert in_flight == ["switchyard_runs_in_flight 0.0"], in_flight
        assert a.post(f"/threads/{thread}/runs/{first}/cancel").status_code in (200, 202, 204)
        waiter.join(30)
        assert answers and answers[0].status_code == 200, answers
