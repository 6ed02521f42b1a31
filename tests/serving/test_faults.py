"""Faults (issue 10): the model backend killed with SIGKILL mid-stream, and the Switchyard
server itself killed with SIGKILL while 20 clients stream on threads.

The backend is the scripted benchmark backend as its own process (``tests/scripted.py``),
restarted on the same port after the kill. The server is ``switchyard serve`` restarted on
the same data directory (and the same PostgreSQL database). Clients are the real ``openai``
and ``langgraph-sdk`` SDKs, plus raw HTTP where the test checks the SSE wire format itself.

Every request here is bounded in time: a stream that neither ends nor errors within its
deadline is a failure ("hung"), and so is any HTTP 500, whatever its body says.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langgraph_sdk.client import LangGraphClient

from tests.conftest import ServerHandle, start_server, stop_server
from tests.promql import metric, wait_for
from tests.scripted import (
    ALIAS,
    ScriptedBackend,
    chat_config,
    error_log_lines,
    failed_requests,
    running_scripted_backend,
    write_scripted_models_file,
)
from tests.serving.test_soak import (
    STREAM_MODE,
    Outcome,
    assert_no_errors,
    bounded,
    gather_limited,
    report,
    sdk_client,
    streamed_round,
    thread_problem,
)

pytestmark = pytest.mark.e2e

STREAM_DEADLINE_S = 30.0
"""After the kill, the stream must end (with its error) within this long."""
QUESTION = [{"role": "user", "content": "Tell me a long story."}]


def _audit(handle: ServerHandle) -> Path:
    return handle.data_dir / "audit" / "audit.jsonl"


def _ready(handle: ServerHandle) -> int:
    try:
        return httpx.get(handle.url + "/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _restart_backend(backend: ScriptedBackend, handle: ServerHandle) -> None:
    backend.restart()
    assert wait_for(lambda: _ready(handle) == 200, 30), (
        f"/readyz is {_ready(handle)}, not 200, 30 s after the backend came back on the same port"
    )


def _assert_no_500(handle: ServerHandle, *, allowed: frozenset[int] = frozenset({503})) -> None:
    """No request answered 5xx (a 503 for a backend that is down is allowed where noted)."""
    failed = failed_requests(_audit(handle), allowed=allowed)
    logged = error_log_lines(handle.log_file)
    # A dead backend is an error worth logging; a traceback is not how it should look.
    tracebacks = [line for line in logged if "Traceback" in line or "Exception in ASGI" in line]
    print("\n[faults] server ERROR lines:\n  " + "\n  ".join(logged[:10]))
    assert failed == [] and tracebacks == [], "\n  ".join(failed + tracebacks)


# ---------------------------------------------------------------- backend killed mid-stream


@pytest.fixture
def slow_backend(tmp_path: Path) -> Iterator[ScriptedBackend]:
    """400 tokens 20 ms apart: an 8-second answer, so the kill lands mid-stream."""
    with running_scripted_backend(tmp_path, delay_ms=20, tokens=400) as scripted:
        yield scripted


@pytest.fixture
def fault_server(tmp_path: Path, slow_backend: ScriptedBackend) -> Iterator[ServerHandle]:
    models = write_scripted_models_file(tmp_path / "models.yaml", slow_backend)
    handle = start_server(tmp_path, chat_config(models))
    try:
        yield handle
    finally:
        stop_server(handle)


def _sse_data(lines: Iterator[str], deadline: float) -> Iterator[str]:
    """The ``data:`` payloads of an SSE stream, failing past ``deadline`` (keep-alive
    comments would otherwise keep a hung stream open for ever)."""
    for line in lines:
        if time.monotonic() > deadline:
            pytest.fail(f"the stream did not end within {STREAM_DEADLINE_S:.0f} s of the kill (hung)")
        if line.startswith("data:"):
            yield line[5:].strip()


@pytest.mark.parametrize("model", ["chat", ALIAS], ids=["graph", "alias"])
def test_backend_killed_mid_stream_openai(
    fault_server: ServerHandle, slow_backend: ScriptedBackend, model: str
) -> None:
    """A final ``data: {"error": {...}}`` event, then ``data: [DONE]``; while the backend is
    down a 503 JSON error; once it is back (``/readyz`` 200), the next request is served."""
    body = {"model": model, "stream": True, "messages": QUESTION}
    before: list[dict[str, Any]] = []
    after: list[str] = []
    with httpx.stream("POST", fault_server.url + "/v1/chat/completions", json=body,
                      timeout=httpx.Timeout(STREAM_DEADLINE_S, connect=5)) as response:
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()
        data = _sse_data(lines, time.monotonic() + 60)
        while sum(1 for c in before if c.get("choices") and c["choices"][0]["delta"].get("content")) < 5:
            payload = next(data, None)
            assert payload is not None and payload != "[DONE]", f"the stream ended before the kill: {before}"
            before.append(json.loads(payload))
        slow_backend.kill()
        data = _sse_data(lines, time.monotonic() + STREAM_DEADLINE_S)
        after = list(data)
    assert after, "the stream ended without a word after the backend died"
    assert after[-1] == "[DONE]", f"last events: {after[-3:]}"
    assert after.count("[DONE]") == 1
    final = json.loads(after[-2])
    assert set(final) == {"error"}, f"the event before [DONE] is not an error: {after[-2]}"
    assert isinstance(final["error"], dict) and isinstance(final["error"].get("message"), str), final
    assert final["error"]["message"], final
    for payload in after[:-2]:  # anything in between is an ordinary chunk, never an error as text
        chunk = json.loads(payload)
        assert "error" not in chunk and chunk.get("object") == "chat.completion.chunk", payload
    print(f"\n[faults] {model}: error event after the kill: {after[-2]}")

    # While the backend is down: a JSON error with its real status before any byte.
    assert wait_for(lambda: _ready(fault_server) == 503, 15), "/readyz does not report the dead backend"
    down = httpx.post(fault_server.url + "/v1/chat/completions", json=body, timeout=STREAM_DEADLINE_S)
    assert down.status_code == 503, (down.status_code, down.text)
    assert isinstance(down.json().get("error", {}).get("message"), str), down.text

    _restart_backend(slow_backend, fault_server)
    client = openai.OpenAI(base_url=fault_server.url + "/v1", api_key="unused-in-dev-mode",
                           timeout=STREAM_DEADLINE_S, max_retries=0)
    text, finish = "", None
    for chunk in client.chat.completions.create(model=model, messages=QUESTION, stream=True, max_tokens=16):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert text.strip() and finish == "length", (text, finish)
    assert wait_for(lambda: metric(fault_server.url, "switchyard_runs_in_flight") == 0, 10)
    _assert_no_500(fault_server)


async def test_backend_killed_mid_stream_langgraph(
    fault_server: ServerHandle, slow_backend: ScriptedBackend
) -> None:
    """An ``error`` event with ``error`` and ``message``, the last of the stream; the thread
    is not left busy; once the backend is back, the next run on the same thread is served."""
    async with sdk_client(fault_server.url) as client:
        tid = (await client.threads.create())["thread_id"]
        events: list[tuple[str, Any]] = []

        async def stream() -> None:
            messages = 0
            async with aclosing(client.runs.stream(tid, "chat", input={"messages": QUESTION},
                                                   stream_mode=STREAM_MODE)) as parts:
                async for part in parts:
                    events.append((part.event, part.data))
                    messages += part.event == "messages"
                    if messages == 5:
                        slow_backend.kill()

        await bounded("the LangGraph stream after the backend was killed", 60 + STREAM_DEADLINE_S, stream())
        names = [name for name, _ in events]
        assert "error" in names, f"no error event; events: {names[-5:]}"
        assert names[-1] == "error", f"events after the error: {names[names.index('error'):]}"
        error = events[-1][1]
        assert isinstance(error, dict) and {"error", "message"} <= set(error), error
        assert isinstance(error["error"], str) and isinstance(error["message"], str) and error["message"], error
        print(f"\n[faults] langgraph: error event after the kill: {error}")

        # The run has ended: the thread is not busy.
        assert await _eventually_not_busy(client, tid), f"thread {tid} stays busy after its run failed"

        # While the backend is down: an HTTP error (not 500) or an error event, not a hang.
        assert wait_for(lambda: _ready(fault_server) == 503, 15), "/readyz does not report the dead backend"
        down = await bounded("a run while the backend is down", STREAM_DEADLINE_S + 10,
                             streamed_round(client, "anyone there?", thread_id=tid))
        assert down.error is not None and "HTTP 500" not in down.error, down
        print(f"[faults] langgraph while the backend is down: {down.error}")
        assert await _eventually_not_busy(client, tid), f"thread {tid} stays busy after a run on a dead backend"

        _restart_backend(slow_backend, fault_server)
        again = await bounded("a run once the backend is back", 60,
                              streamed_round(client, "and now?", thread_id=tid, context={"model_params": {"max_tokens": 16}}))
        assert_no_errors("a run once the backend is back", [again])
        assert await thread_problem(client, tid, question="and now?", words=16) is None, (
            await thread_problem(client, tid, question="and now?", words=16))
        assert wait_for(lambda: metric(fault_server.url, "switchyard_runs_in_flight") == 0, 10)
    _assert_no_500(fault_server)


async def _eventually_not_busy(client: LangGraphClient, thread_id: str, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await client.threads.get(thread_id))["status"] != "busy":
            return True
        await asyncio.sleep(0.2)
    return False


# ---------------------------------------------------------------- server killed mid-soak

CRASH_CLIENTS = 20
SHORT = {"model_params": {"max_tokens": 8}}
"""An 8-word answer."""
LONG = {"model_params": {"max_tokens": 600}}
"""600 tokens 10 ms apart: still streaming when the server is killed."""


@pytest.fixture(params=["sqlite", "postgres"])
def crash_store(request: pytest.FixtureRequest) -> str | None:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        return dsn
    return None


def _integrity(database: Path) -> list[str]:
    """``PRAGMA integrity_check`` on a read-only connection (``["ok"]`` when sound)."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        return [row[0] for row in connection.execute("PRAGMA integrity_check")]
    finally:
        connection.close()


async def test_server_killed_during_soak_restarts_on_the_same_data(
    tmp_path: Path, crash_store: str | None
) -> None:
    """kill -9 the server while 20 clients stream on threads; restart it on the same data
    directory: the SQLite file is sound, every thread is readable, threads left ``busy`` by
    the crash are usable again, and new runs on them succeed."""
    with running_scripted_backend(tmp_path, delay_ms=10, tokens=64) as backend:
        config = chat_config(write_scripted_models_file(tmp_path / "models.yaml", backend), postgres_dsn=crash_store)
        first = start_server(tmp_path, config)
        answered: list[Outcome] = []
        mid_stream: set[str] = set()
        cut: list[str] = []
        early: list[str] = []  # failures while the first server was still alive
        busy_at_kill: list[str] = []
        killed = False

        async def user(n: int) -> None:
            async with sdk_client(first.url) as client:
                try:
                    # One finished conversation per client...
                    answered.append(await streamed_round(client, f"user {n}: hello", context=SHORT))
                    # ...then one the crash interrupts.
                    tid = (await client.threads.create())["thread_id"]
                    cut.append(tid)
                    messages = 0
                    async with aclosing(client.runs.stream(tid, "chat", input={"messages": QUESTION},
                                                           stream_mode=STREAM_MODE, context=LONG)) as parts:
                        async for part in parts:
                            messages += part.event == "messages"
                            if messages == 3:
                                mid_stream.add(tid)
                            if part.event == "error" and not killed:
                                early.append(f"user {n}: error event {part.data}")
                except Exception as exc:  # noqa: BLE001 - expected once the server is killed
                    if not killed:
                        early.append(f"user {n}: {type(exc).__name__}: {exc}"[:300])

        try:
            users = asyncio.ensure_future(asyncio.gather(*(user(n) for n in range(CRASH_CLIENTS))))
            started = time.monotonic()
            deadline = started + 120
            while len(mid_stream) < CRASH_CLIENTS and not early and not users.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if len(mid_stream) == CRASH_CLIENTS:
                async with sdk_client(first.url) as probe:
                    busy_at_kill.extend(t["thread_id"] for t in await probe.threads.search(status="busy", limit=100))
            killed = True
            first.process.kill()  # SIGKILL: no shutdown, no clean-up
            first.process.wait()
            print(f"\n[faults] killed the server {time.monotonic() - started:.1f} s in, "
                  f"{len(answered)} answered threads, {len(mid_stream)} runs mid-stream")
            await bounded("clients noticing the dead server", 60, users)
        finally:
            if first.process.poll() is None:
                first.process.kill()
                first.process.wait()
        assert early == [], "failures before the kill:\n  " + "\n  ".join(early[:10])
        assert len(mid_stream) == CRASH_CLIENTS, f"only {len(mid_stream)} clients were mid-stream after 120 s"
        assert_no_errors("runs before the kill", answered)
        assert sorted(busy_at_kill) == sorted(cut), "the crash must find every second thread busy"
        (tmp_path / "server-before-kill.out").write_bytes((tmp_path / "server.out").read_bytes())

        if crash_store is None:
            database = first.data_dir / "threads.sqlite"
            assert database.is_file()
            assert _integrity(database) == ["ok"], "the SQLite file is damaged by the crash"

        started = time.monotonic()
        second = start_server(tmp_path, config)  # same config file, same data directory, new port
        print(f"[faults] restarted in {time.monotonic() - started:.1f} s")
        try:
            async with sdk_client(second.url) as client:
                thread_ids = [o.thread_id for o in answered if o.thread_id] + cut
                assert len(thread_ids) == 2 * CRASH_CLIENTS

                async def readable(tid: str) -> str | None:
                    try:
                        thread = await client.threads.get(tid)
                        await client.threads.get_state(tid)
                    except Exception as exc:  # noqa: BLE001
                        return f"{tid}: {type(exc).__name__}: {exc}"[:300]
                    return f"{tid}: still busy after the restart" if thread["status"] == "busy" else None

                problems = await bounded("reading every thread", 60,
                                         gather_limited(10, [lambda t=t: readable(t) for t in thread_ids]))
                bad = [p for p in problems if p is not None]
                assert bad == [], f"{len(bad)} of {len(thread_ids)} threads:\n  " + "\n  ".join(bad[:10])
                statuses = [(await client.threads.get(t))["status"] for t in cut]
                print(f"[faults] threads cut by the crash, after the restart: {statuses}")
                assert await client.threads.search(status="busy", limit=100) == []

                finished = await gather_limited(10, [
                    lambda o=o: thread_problem(client, o.thread_id, question=o.question, words=8) for o in answered])
                bad = [p for p in finished if p is not None]
                assert bad == [], "threads answered before the crash lost their answer:\n  " + "\n  ".join(bad)

                started = time.monotonic()
                retried = await bounded("new runs on the threads cut by the crash", 120, gather_limited(
                    10, [lambda t=t: streamed_round(client, "once more", thread_id=t, context=SHORT) for t in cut]))
                report("new runs on threads cut by the crash", retried, time.monotonic() - started)
                assert_no_errors("new runs on threads cut by the crash", retried)
                settled = await gather_limited(
                    10, [lambda t=t: thread_problem(client, t, question="once more", words=8) for t in cut])
                bad = [p for p in settled if p is not None]
                assert bad == [], "\n  ".join(bad)
                assert wait_for(lambda: metric(second.url, "switchyard_runs_in_flight") == 0, 10)
            _assert_no_500(second, allowed=frozenset())
        finally:
            stop_server(second)
        if crash_store is None:
            assert _integrity(second.data_dir / "threads.sqlite") == ["ok"]
