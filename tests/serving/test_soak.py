"""Soak: many langgraph-sdk clients creating threads and streaming runs on them at once, the
way Agent Chat UI does, on each thread store (SQLite in the data directory, and a real
PostgreSQL), over the scripted benchmark backend (64 tokens, 10 ms apart).

Issue 10, seen 1: 20 such clients on SQLite got only 500s (``database is locked``) and the
server stayed broken until restarted. Here: zero errors at 50 clients, then zero errors for a
single client, then every thread holds its conversation and none is left ``busy``. The chat-UI
variant mixes in clients that hang up mid-stream and runs cancelled right after they are
created (issue 10, seen 2): every run ends, every thread is usable again, nothing stays in
flight.

Any HTTP 5xx, SDK exception or ``error`` event is a failure, whatever its body says; so is a
5xx in the server's audit log or an ERROR line in its log. Timings are printed (``-s``), never
asserted (speed targets live in ``bench/``).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.conftest import ServerHandle, start_server, stop_server
from tests.promql import metric, wait_for
from tests.scripted import (
    ScriptedBackend,
    chat_config,
    running_scripted_backend,
    server_errors,
    write_scripted_models_file,
)

pytestmark = pytest.mark.e2e

TOKENS = 64
"""The scripted backend's answer: 64 words, 10 ms apart."""
CLIENTS = 50
ROUNDS = 10
SOLO_ROUNDS = 3
MIXED_ROUNDS = 6
STREAM_MODE = ["values", "messages-tuple"]
PHASE_TIMEOUT_S = 300.0
"""A phase still running after this long has hung (500 runs of ~0.7 s each on 2 cores
take well under a minute when nothing is wrong)."""
SETTLE_TIMEOUT_S = 30.0
"""How long a cancelled or abandoned run may take to end."""

T = TypeVar("T")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[ScriptedBackend]:
    with running_scripted_backend(tmp_path, delay_ms=10, tokens=TOKENS) as scripted:
        yield scripted


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest) -> str | None:
    """``None``: the default SQLite store in the data directory; else a fresh PostgreSQL
    database's DSN."""
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        return dsn
    return None


@pytest.fixture
def soak_server(tmp_path: Path, backend: ScriptedBackend, store_dsn: str | None) -> Iterator[ServerHandle]:
    models = write_scripted_models_file(tmp_path / "models.yaml", backend)
    handle = start_server(tmp_path, chat_config(models, postgres_dsn=store_dsn))
    try:
        yield handle
    finally:
        stop_server(handle)


@asynccontextmanager
async def sdk_client(url: str) -> AsyncIterator[LangGraphClient]:
    """One chat-UI user: its own langgraph-sdk client (and connection pool)."""
    client = get_client(url=url, api_key=None, timeout=httpx.Timeout(60, connect=10))
    try:
        yield client
    finally:
        await client.http.client.aclose()


# ---------------------------------------------------------------- rounds


@dataclass(slots=True)
class Outcome:
    """One round of one client."""

    kind: str
    question: str = ""
    thread_id: str | None = None
    run_id: str | None = None
    seconds: float = 0.0
    first_token_s: float | None = None
    error: str | None = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.request.method} {exc.request.url.path}: {exc.response.text[:200]}"
    return f"{type(exc).__name__}: {exc}"[:300]


def _input(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def streamed_round(
    client: LangGraphClient, text: str, *, thread_id: str | None = None, context: dict[str, Any] | None = None
) -> Outcome:
    """``POST /threads`` (unless ``thread_id``), then a streamed run on it to the end."""
    outcome = Outcome(kind="full", question=text, thread_id=thread_id)
    start = time.monotonic()
    try:
        if outcome.thread_id is None:
            outcome.thread_id = (await client.threads.create())["thread_id"]
        events: list[str] = []
        async with aclosing(
            client.runs.stream(outcome.thread_id, "chat", input=_input(text), stream_mode=STREAM_MODE, context=context)
        ) as parts:
            async for part in parts:
                events.append(part.event)
                if part.event == "metadata":
                    outcome.run_id = part.data.get("run_id")
                elif part.event == "messages" and outcome.first_token_s is None:
                    outcome.first_token_s = time.monotonic() - start
                elif part.event == "error":
                    outcome.error = f"error event: {part.data}"
                    break
        if outcome.error is None and (not events or events[0] != "metadata" or "messages" not in events
                                      or "values" not in events):
            outcome.error = f"incomplete stream: {Counter(events)}"
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and reported
        outcome.error = _describe(exc)
    outcome.seconds = time.monotonic() - start
    return outcome


async def disconnect_round(client: LangGraphClient, text: str, after: int) -> Outcome:
    """A streamed run the client walks away from after ``after`` message events."""
    outcome = Outcome(kind="disconnect", question=text)
    start = time.monotonic()
    try:
        outcome.thread_id = (await client.threads.create())["thread_id"]
        seen = 0
        async with aclosing(
            client.runs.stream(outcome.thread_id, "chat", input=_input(text), stream_mode=STREAM_MODE)
        ) as parts:
            async for part in parts:
                if part.event == "metadata":
                    outcome.run_id = part.data.get("run_id")
                elif part.event == "error":
                    outcome.error = f"error event: {part.data}"
                    break
                elif part.event == "messages":
                    seen += 1
                    if seen >= after:
                        break  # aclosing closes the response: the connection goes away
    except Exception as exc:  # noqa: BLE001
        outcome.error = _describe(exc)
    outcome.seconds = time.monotonic() - start
    return outcome


async def cancel_round(client: LangGraphClient, text: str, delay_s: float) -> Outcome:
    """``runs.create`` then ``runs.cancel`` ``delay_s`` later (0: right away), as a chat UI's
    stop button does."""
    outcome = Outcome(kind="cancel" if delay_s == 0 else "cancel-mid", question=text)
    start = time.monotonic()
    try:
        outcome.thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(outcome.thread_id, "chat", input=_input(text))
        outcome.run_id = run["run_id"]
        if delay_s:
            await asyncio.sleep(delay_s)
        await client.runs.cancel(outcome.thread_id, outcome.run_id)
    except Exception as exc:  # noqa: BLE001
        outcome.error = _describe(exc)
    outcome.seconds = time.monotonic() - start
    return outcome


# ---------------------------------------------------------------- checks


async def bounded(label: str, timeout_s: float, work: Awaitable[T]) -> T:
    """``work``, failing the test (not hanging it) after ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        pytest.fail(f"{label}: no end after {timeout_s:.0f} s (hung)")


async def gather_limited(limit: int, jobs: list[Callable[[], Awaitable[T]]]) -> list[T]:
    semaphore = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


def assert_no_errors(label: str, outcomes: list[Outcome]) -> None:
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        kinds = Counter(_UUID.sub("{id}", o.error.split(":")[0]) for o in failed if o.error)
        examples = "\n  ".join(f"[{o.kind}] {o.error}" for o in failed[:8])
        pytest.fail(f"{label}: {len(failed)} of {len(outcomes)} rounds failed {dict(kinds)}:\n  {examples}")


def report(label: str, outcomes: list[Outcome], wall_s: float) -> None:
    def pct(values: list[float], q: float) -> str:
        if not values:
            return "-"
        values = sorted(values)
        return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:.0f}"

    seconds = [o.seconds for o in outcomes if o.error is None]
    ttft = [o.first_token_s for o in outcomes if o.first_token_s is not None]
    mean = f"{statistics.fmean(seconds) * 1000:.0f}" if seconds else "-"
    print(
        f"\n[soak] {label}: {len(outcomes)} rounds in {wall_s:.1f} s, "
        f"round ms p50 {pct(seconds, 0.5)} p95 {pct(seconds, 0.95)} mean {mean}, "
        f"first token ms p50 {pct(ttft, 0.5)} p95 {pct(ttft, 0.95)}, "
        f"kinds {dict(Counter(o.kind for o in outcomes))}"
    )


async def thread_problem(
    client: LangGraphClient, thread_id: str, *, question: str | None = None, words: int | None = None
) -> str | None:
    """Why ``thread_id`` is not as it should be (``None`` if it is): readable, ``idle``, its
    last two messages the human ``question`` (when given: no other thread's) and a non-empty
    AI answer of ``words`` words (when given: the scripted backend's whole answer)."""
    try:
        thread = await client.threads.get(thread_id)
        if thread["status"] != "idle":
            return f"{thread_id}: status {thread['status']!r}"
        state = await client.threads.get_state(thread_id)
        messages = (state.get("values") or {}).get("messages") or []
        types = [m.get("type") for m in messages]
        if types[-2:] != ["human", "ai"] or not messages[-1].get("content"):
            return f"{thread_id}: messages {types}"
        if question is not None and messages[-2].get("content") != question:
            return f"{thread_id}: asked {question!r}, holds {messages[-2].get('content')!r}"
        if words is not None and len(str(messages[-1]["content"]).split()) != words:
            return f"{thread_id}: an answer of {len(str(messages[-1]['content']).split())} words, not {words}"
    except Exception as exc:  # noqa: BLE001
        return f"{thread_id}: {_describe(exc)}"
    return None


async def wait_not_busy(client: LangGraphClient, thread_ids: list[str], timeout_s: float) -> dict[str, str]:
    """Poll until no thread in ``thread_ids`` is ``busy``; the last status of each."""
    statuses: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    pending = list(thread_ids)
    while pending:
        found = await gather_limited(10, [lambda t=t: client.threads.get(t) for t in pending])
        for thread in found:
            statuses[thread["thread_id"]] = thread["status"]
        pending = [t for t in pending if statuses[t] == "busy"]
        if not pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    return statuses


async def assert_server_settled(client: LangGraphClient, handle: ServerHandle) -> None:
    """No thread anywhere is ``busy``, no run is in flight, the server recorded no 5xx or
    ERROR."""
    busy = await client.threads.search(status="busy", limit=100)
    assert busy == [], f"threads left busy: {[t['thread_id'] for t in busy]}"
    assert wait_for(lambda: metric(handle.url, "switchyard_runs_in_flight") == 0, 10), (
        f"switchyard_runs_in_flight stays at {metric(handle.url, 'switchyard_runs_in_flight')}"
    )
    problems = server_errors(handle.log_file, handle.data_dir / "audit" / "audit.jsonl")
    assert problems == [], "the server recorded failures:\n  " + "\n  ".join(problems[:20])


# ---------------------------------------------------------------- tests


async def test_soak_threads_and_streamed_runs(soak_server: ServerHandle, store_dsn: str | None) -> None:
    url = soak_server.url
    outcomes: list[Outcome] = []

    async def user(n: int) -> None:
        async with sdk_client(url) as client:
            for r in range(ROUNDS):
                outcomes.append(await streamed_round(client, f"user {n}, round {r}: tell me a story"))

    started = time.monotonic()
    await bounded(f"{CLIENTS} clients x {ROUNDS} rounds", PHASE_TIMEOUT_S,
                  asyncio.gather(*(user(n) for n in range(CLIENTS))))
    report(f"{CLIENTS} concurrent clients", outcomes, time.monotonic() - started)
    assert len(outcomes) == CLIENTS * ROUNDS
    assert_no_errors(f"{CLIENTS} concurrent clients", outcomes)

    solo: list[Outcome] = []
    async with sdk_client(url) as client:
        started = time.monotonic()

        async def one_user() -> None:
            for r in range(SOLO_ROUNDS):
                solo.append(await streamed_round(client, f"alone, round {r}"))

        await bounded("one client afterwards", 60, one_user())
        report("one client afterwards", solo, time.monotonic() - started)
        assert_no_errors("one client afterwards", solo)

        started = time.monotonic()
        rounds = [o for o in outcomes + solo if o.thread_id is not None]
        thread_ids = [o.thread_id for o in rounds]
        problems = await bounded("reading every thread", 120, gather_limited(
            10, [lambda o=o: thread_problem(client, o.thread_id, question=o.question, words=TOKENS) for o in rounds]))
        print(f"[soak] read {len(thread_ids)} threads and their state in {time.monotonic() - started:.1f} s")
        bad = [p for p in problems if p is not None]
        assert bad == [], f"{len(bad)} of {len(thread_ids)} threads are wrong:\n  " + "\n  ".join(bad[:10])
        await assert_server_settled(client, soak_server)


async def test_soak_with_disconnects_and_cancels(soak_server: ServerHandle, store_dsn: str | None) -> None:
    """Chat-UI behaviour under load: a quarter of the rounds stream to the end, a quarter hang
    up mid-stream, a quarter cancel the run right after creating it, a quarter cancel it
    mid-answer. Then every thread is usable, every run ends, and new runs are served."""
    url = soak_server.url
    outcomes: list[Outcome] = []

    async def user(n: int) -> None:
        async with sdk_client(url) as client:
            for r in range(MIXED_ROUNDS):
                text = f"user {n}, round {r}: tell me a story"
                match (n + r) % 4:
                    case 0:
                        outcomes.append(await streamed_round(client, text))
                    case 1:
                        outcomes.append(await disconnect_round(client, text, after=1 + (7 * n + r) % 20))
                    case 2:
                        outcomes.append(await cancel_round(client, text, delay_s=0))
                    case _:
                        outcomes.append(await cancel_round(client, text, delay_s=0.05 + 0.05 * (r % 4)))

    started = time.monotonic()
    await bounded(f"{CLIENTS} chat-UI clients x {MIXED_ROUNDS} rounds", PHASE_TIMEOUT_S,
                  asyncio.gather(*(user(n) for n in range(CLIENTS))))
    report(f"{CLIENTS} chat-UI clients", outcomes, time.monotonic() - started)
    assert len(outcomes) == CLIENTS * MIXED_ROUNDS
    # A cancelled run holds its run slot until it has wound down (its thread status written),
    # and these clients do not wait for that: the documented 429 for a server at
    # `max_concurrent_runs` can happen here and is no failure. Anything else is; a slot that
    # is never given back shows below, as 429s for a lone client and runs left in flight.
    refused = [o for o in outcomes if o.error is not None and o.error.startswith("HTTP 429 ")]
    print(f"[soak] refused with 429 (server at its run limit): {len(refused)}")
    assert_no_errors(f"{CLIENTS} chat-UI clients", [o for o in outcomes if o not in refused])
    outcomes = [o for o in outcomes if o not in refused]

    async with sdk_client(url) as client:
        # Every thread leaves `busy`, and only for `idle` (a cancel is not a failure).
        started = time.monotonic()
        thread_ids = [o.thread_id for o in outcomes if o.thread_id is not None]
        statuses = await bounded("threads leaving busy", SETTLE_TIMEOUT_S + 30,
                                 wait_not_busy(client, thread_ids, SETTLE_TIMEOUT_S))
        print(f"[soak] thread statuses after {time.monotonic() - started:.1f} s: {dict(Counter(statuses.values()))}")
        by_kind = Counter((o.kind, statuses.get(o.thread_id or "")) for o in outcomes)
        assert set(statuses.values()) == {"idle"}, f"thread status by round kind: {dict(by_kind)}"

        # Every run that was created ends: join returns and the run has a final status.
        runs = [o for o in outcomes if o.run_id is not None and o.thread_id is not None]
        assert len(runs) >= CLIENTS * MIXED_ROUNDS // 2, f"only {len(runs)} runs were created"

        async def joined(o: Outcome) -> str | None:
            assert o.thread_id and o.run_id
            try:
                async with asyncio.timeout(SETTLE_TIMEOUT_S):
                    await client.runs.join(o.thread_id, o.run_id)
                status = (await client.runs.get(o.thread_id, o.run_id))["status"]
            except TimeoutError:
                return f"[{o.kind}] join({o.thread_id}, {o.run_id}) did not return in {SETTLE_TIMEOUT_S:.0f} s"
            except Exception as exc:  # noqa: BLE001
                return f"[{o.kind}] {o.run_id}: {_describe(exc)}"
            expected = {"success"} if o.kind == "full" else {"interrupted", "success"}
            return None if status in expected else f"[{o.kind}] {o.run_id}: status {status!r}"

        started = time.monotonic()
        joins = await bounded("joining every run", SETTLE_TIMEOUT_S + 60,
                              gather_limited(20, [lambda o=o: joined(o) for o in runs]))
        print(f"[soak] joined {len(runs)} runs in {time.monotonic() - started:.1f} s")
        bad = [j for j in joins if j is not None]
        assert bad == [], f"{len(bad)} of {len(runs)} runs did not end well:\n  " + "\n  ".join(bad[:10])

        # joinStream of every cancelled background run ends: with the run's events, and at
        # most a `RunCancelled` error (a cancel is the one error these runs may report).
        async def stream_ends(o: Outcome) -> str | None:
            assert o.thread_id and o.run_id
            try:
                async with asyncio.timeout(SETTLE_TIMEOUT_S):
                    parts = [part async for part in client.runs.join_stream(o.thread_id, o.run_id)]
            except TimeoutError:
                return f"[{o.kind}] join_stream({o.thread_id}, {o.run_id}) did not end in {SETTLE_TIMEOUT_S:.0f} s"
            except Exception as exc:  # noqa: BLE001
                return f"[{o.kind}] join_stream {o.run_id}: {_describe(exc)}"
            errors = [part.data for part in parts if part.event == "error"]
            if any(not isinstance(e, dict) or e.get("error") != "RunCancelled" for e in errors):
                return f"[{o.kind}] join_stream {o.run_id}: {errors}"
            return None

        cancelled = [o for o in runs if o.kind.startswith("cancel")]
        started = time.monotonic()
        streams = await bounded("join_stream of every cancelled run", SETTLE_TIMEOUT_S + 60,
                                gather_limited(20, [lambda o=o: stream_ends(o) for o in cancelled]))
        print(f"[soak] join_stream of {len(cancelled)} cancelled runs ended in {time.monotonic() - started:.1f} s")
        bad = [j for j in streams if j is not None]
        assert bad == [], f"{len(bad)} of {len(cancelled)} join streams:\n  " + "\n  ".join(bad[:10])

        # Threads whose run was cut short take a new run (no 409, no 429), then hold it.
        cut = [o.thread_id for o in outcomes if o.kind != "full" and o.thread_id is not None][:20]
        started = time.monotonic()
        retried = await bounded("new runs on cut threads", 120, gather_limited(
            10, [lambda t=t: streamed_round(client, "once more", thread_id=t) for t in cut]))
        report("new runs on threads cut short", retried, time.monotonic() - started)
        assert_no_errors("new runs on threads cut short", retried)
        problems = await gather_limited(
            10, [lambda t=t: thread_problem(client, t, question="once more", words=TOKENS) for t in cut])
        bad = [p for p in problems if p is not None]
        assert bad == [], "\n  ".join(bad)

        # And the server still serves a client on new threads.
        solo: list[Outcome] = []

        async def one_user() -> None:
            for r in range(SOLO_ROUNDS):
                solo.append(await streamed_round(client, f"alone, round {r}"))

        await bounded("one client afterwards", 60, one_user())
        assert_no_errors("one client afterwards", solo)
        full = [o for o in outcomes + solo if o.kind == "full" and o.thread_id is not None]
        problems = await gather_limited(
            10, [lambda o=o: thread_problem(client, o.thread_id, question=o.question, words=TOKENS) for o in full])
        bad = [p for p in problems if p is not None]
        assert bad == [], f"{len(bad)} of {len(full)} answered threads are wrong:\n  " + "\n  ".join(bad[:10])
        await assert_server_settled(client, soak_server)
