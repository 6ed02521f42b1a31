"""The run board on a real PostgreSQL, in process (`serving.shared.runs.RunBoard`).

Several boards on one database stand for several replicas (each its own pool and
LISTEN connection, its own replica id). What is checked: one active run per thread
whoever inserts first, a dead replica's runs ended by exactly one sweeper, a cancel
reaching its run by the poll when no notification comes, and background frames
bounded and replayed in order.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from serving._tasks import RunCancelledError
from serving.errors import ServingError
from serving.observability import ServingMetrics
from serving.persistence import ThreadSettings, ThreadStores, open_thread_stores
from serving.runs import RunRecord, RunRegistry
from serving.shared.runs import ReplicaIdInUseError, RunBoard, RunConflictError, default_replica_id
from serving.shared.settings import StateSettings

pytestmark = [pytest.mark.integration]

Open = Callable[..., Awaitable[RunBoard]]


@pytest.fixture
async def boards(postgres_dsn: str) -> AsyncIterator[Open]:
    opened: list[RunBoard] = []

    async def open_board(replica_id: str, *, heartbeat_s: float = 0.2, lease_s: float = 1.0, **kwargs: object) -> RunBoard:
        board = await RunBoard.open(
            postgres_dsn, StateSettings(replica_id=replica_id, heartbeat_s=heartbeat_s, lease_s=lease_s), **kwargs  # type: ignore[arg-type]
        )
        opened.append(board)
        return board

    try:
        yield open_board
    finally:
        for board in opened:
            await board.aclose()


def _record(thread_id: str | None, strategy: str = "reject") -> RunRecord:
    return RunRecord(
        run_id=str(uuid.uuid4()), thread_id=thread_id, assistant_id="chat", tenant="acme",
        multitask_strategy=strategy, metadata={},
    )


async def _rows(dsn: str, query: str, *args: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        return await (await connection.execute(query, args)).fetchall()  # type: ignore[arg-type]


async def test_two_replicas_admitting_a_run_on_one_thread_at_once_exactly_one_wins(boards: Open) -> None:
    x, y = await boards("X"), await boards("Y")
    for _ in range(10):
        thread = str(uuid.uuid4())
        first, second = _record(thread), _record(thread)
        outcomes = await asyncio.gather(
            x.admit(first, deadline_s=5), y.admit(second, deadline_s=5), return_exceptions=True
        )
        refused = [o for o in outcomes if isinstance(o, RunConflictError)]
        assert len(refused) == 1 and outcomes.count(None) == 1, outcomes
        assert refused[0].status == 409 and "already has a run in progress" in str(refused[0])
        active = await x.active_on(thread)
        winner = first if outcomes[0] is None else second
        assert active is not None and active.run_id == winner.run_id


async def test_enqueue_waits_for_the_other_replicas_run_and_a_cancelled_wait_leaves_no_row(
    boards: Open, postgres_dsn: str
) -> None:
    x, y = await boards("X"), await boards("Y")
    on_x = RunRegistry(board=x)
    await x.start(on_x)
    await y.start(RunRegistry(board=y))
    thread = str(uuid.uuid4())
    holder = _record(thread)
    on_x.add(holder)  # running on X (a row with no run behind it is ended by X's poll)
    await x.admit(holder, deadline_s=5)
    waiting = _record(thread, "enqueue")
    task = asyncio.get_running_loop().create_task(y.admit(waiting, deadline_s=10))
    await asyncio.sleep(0.5)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _rows(postgres_dsn, "SELECT 1 FROM switchyard_runs WHERE run_id = %s", waiting.run_id) == []
    # Past its deadline: a 409 naming the run it waited for.
    with pytest.raises(ServingError) as late:
        await y.admit(_record(thread, "enqueue"), deadline_s=0.5)
    assert late.value.status == 409 and holder.run_id in str(late.value)
    # When the holder ends, the enqueued run is admitted (woken by the notification).
    queued = _record(thread, "enqueue")
    task = asyncio.get_running_loop().create_task(y.admit(queued, deadline_s=10))
    await asyncio.sleep(0.2)
    holder.finish("success")
    x.ended(holder)
    await asyncio.wait_for(task, 5)
    assert (await y.active_on(thread)).run_id == queued.run_id  # type: ignore[union-attr]


async def test_a_dead_replicas_runs_are_ended_by_exactly_one_sweeper(boards: Open, postgres_dsn: str) -> None:
    # It beats at start, then not for a minute: dead for sweepers with a 1 s lease.
    dead = await boards("dead", heartbeat_s=60, lease_s=120)
    await dead.start(RunRegistry(board=dead))
    thread = str(uuid.uuid4())
    run = _record(thread)
    await dead.admit(run, deadline_s=5)
    dead.mark_background(run)
    dead.frame(run, 0, "event: metadata\ndata: {}\nid: 0\n\n")
    assert await dead.flushed(run.run_id, 5)
    metrics = [ServingMetrics(), ServingMetrics()]
    reaped_threads: list[str] = []

    async def on_reaped(thread_id: str, tenant: str) -> None:
        assert tenant == "acme"
        reaped_threads.append(thread_id)

    sweepers = [await boards(name, metrics=m) for name, m in zip(("Y", "Z"), metrics, strict=True)]
    for sweeper in sweepers:
        sweeper._on_reaped = on_reaped
    assert [await s.sweep() for s in sweepers] == [0, 0]  # its lease has not run out
    await asyncio.sleep(1.3)
    counts = await asyncio.gather(*(s.sweep() for s in sweepers))
    assert sorted(counts) == [0, 1]
    assert reaped_threads == [thread]
    assert sum(m.replica_runs_reaped._value.get() for m in metrics) == 1  # type: ignore[attr-defined]
    shared = await sweepers[0].get(run.run_id)
    assert shared is not None and shared.status == "error" and "replica dead stopped" in (shared.error or "")
    frames = [frame async for frame in sweepers[0].follow(run.run_id)]
    assert frames[0].startswith("event: metadata") and frames[-1].startswith("event: error\n")
    assert "ReplicaLost" in frames[-1] and "\nid: " not in frames[-1]
    # The thread is free for a run on a live replica.
    await sweepers[1].admit(_record(thread), deadline_s=5)


async def test_a_cancel_reaches_the_run_by_the_poll_without_a_notification(boards: Open, postgres_dsn: str) -> None:
    owner = await boards("owner")
    registry = RunRegistry(board=owner)
    await owner.start(registry)
    run = _record(str(uuid.uuid4()))
    registry.add(run)
    await owner.admit(run, deadline_s=5)
    # Written as another replica's cancel would be, but with no NOTIFY.
    await _rows(postgres_dsn, "UPDATE switchyard_runs SET cancel_reason = %s WHERE run_id = %s RETURNING 1", "by poll", run.run_id)
    for _ in range(40):
        if run.guard.error is not None:
            break
        await asyncio.sleep(0.05)
    assert isinstance(run.guard.error, RunCancelledError) and str(run.guard.error) == "by poll"


async def test_a_cancel_request_notifies_the_owner(boards: Open) -> None:
    owner, other = await boards("owner", heartbeat_s=5, lease_s=20), await boards("other", heartbeat_s=5, lease_s=20)
    registry = RunRegistry(board=owner)
    await owner.start(registry)
    run = _record(str(uuid.uuid4()))
    registry.add(run)
    await owner.admit(run, deadline_s=5)
    await asyncio.sleep(0.2)  # the owner listens
    assert await other.request_cancel(run.run_id, "from other")
    for _ in range(40):  # well before the owner's 5 s poll
        if run.guard.error is not None:
            break
        await asyncio.sleep(0.05)
    assert str(run.guard.error) == "from other"


async def test_frames_are_bounded_per_run_and_replayed_in_order(boards: Open) -> None:
    owner = await boards("owner", replay_bytes=300)
    reader = await boards("reader")
    registry = RunRegistry(board=owner, replay_bytes=300)
    await owner.start(registry)
    await reader.start(RunRegistry(board=reader))
    run = _record(str(uuid.uuid4()))
    registry.add(run)
    await owner.admit(run, deadline_s=5)
    owner.mark_background(run)
    assert await owner.flushed(run.run_id, 5)
    follower = reader.follow(run.run_id, 2)
    frames = [f"event: values\ndata: {{\"n\": {i}, \"pad\": \"{'x' * 20}\"}}\nid: {i}\n\n" for i in range(20)]
    first = asyncio.get_running_loop().create_task(anext(follower))
    for index, item in enumerate(frames[:5]):
        owner.frame(run, index, item)
    assert await asyncio.wait_for(first, 5) == frames[3]  # live, after Last-Event-ID 2
    assert await asyncio.wait_for(anext(follower), 5) == frames[4]
    for index, item in enumerate(frames[5:], start=5):
        owner.frame(run, index, item)
    run.finish("success")
    owner.ended(run)  # held until the pump is done: after the last frame
    owner.pumped(run)
    assert await owner.flushed(run.run_id, 5)
    rest = [item async for item in follower]
    total, kept = 0, 0
    for item in reversed(frames):  # the newest frames that fit in 300 bytes
        if total + len(item) > 300:
            break
        total, kept = total + len(item), kept + 1
    assert rest[0].startswith(": ") and "earlier events are no longer kept" in rest[0]
    assert rest[1:] == frames[-kept:]
    replay = [item async for item in reader.follow(run.run_id, 17)]
    assert replay == frames[18:]
    shared = await reader.get(run.run_id)
    assert shared is not None and shared.status == "success" and shared.background


async def test_the_listener_reconnects_after_its_connection_is_killed(boards: Open, postgres_dsn: str) -> None:
    owner, other = await boards("owner", heartbeat_s=10, lease_s=30), await boards("other", heartbeat_s=10, lease_s=30)
    registry = RunRegistry(board=owner)
    await owner.start(registry)
    await asyncio.sleep(0.3)
    killed = await _rows(
        postgres_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' AND datname = current_database()",
    )
    assert killed, "no LISTEN connection found"
    await asyncio.sleep(1.0)  # reconnects after 0.2 s
    run = _record(str(uuid.uuid4()))
    registry.add(run)
    await owner.admit(run, deadline_s=5)
    assert await other.request_cancel(run.run_id, "after the reconnect")
    for _ in range(40):  # well before the owner's 10 s poll
        if run.guard.error is not None:
            break
        await asyncio.sleep(0.05)
    assert str(run.guard.error) == "after the reconnect"


async def test_replicas_setting_up_a_fresh_database_at_once_both_succeed(postgres_dsn: str, tmp_path: Path) -> None:
    """The checkpointer's and the store's migrations run under one advisory lock: four
    replicas opening their thread stores together on a fresh database all start (they
    failed on ``store_migrations``' primary key: exit 3)."""
    settings = ThreadSettings(postgres_dsn=postgres_dsn, pool_size=2)
    dirs = [tmp_path / f"r{n}" for n in range(4)]
    for path in dirs:
        path.mkdir()
    opened = await asyncio.gather(*(open_thread_stores(settings, path) for path in dirs), return_exceptions=True)
    try:
        assert [str(o) for o in opened if isinstance(o, BaseException)] == []
        versions = await _rows(postgres_dsn, "SELECT v, count(*) FROM store_migrations GROUP BY v HAVING count(*) > 1")
        assert versions == []
    finally:
        for stores in opened:
            if isinstance(stores, ThreadStores):
                await stores.aclose()


async def _die(board: RunBoard) -> None:
    """As a process killed -9 ends: its connections close, its rows stay as they were."""
    board._closed = True  # the fixture's aclose does nothing more
    for task in [*board._tasks, *([board._writer] if board._writer else [])]:
        task.cancel()
    await asyncio.gather(*board._tasks, *([board._writer] if board._writer else []), return_exceptions=True)
    assert board._id_lock is not None
    await board._id_lock.close()
    await board._pool.close()


async def test_a_live_replicas_id_is_refused_and_a_dead_ones_is_taken_over_with_its_runs_ended(
    boards: Open, postgres_dsn: str
) -> None:
    # A long lease: what frees the id is the process's end, not a lease running out.
    first = await boards("same", heartbeat_s=5, lease_s=60)
    await first.start(RunRegistry(board=first))
    with pytest.raises(ReplicaIdInUseError) as refused:
        await boards("same", heartbeat_s=5, lease_s=60)
    assert "'same'" in str(refused.value) and "state.replica_id" in str(refused.value)
    thread = str(uuid.uuid4())
    run = _record(thread)
    await first.admit(run, deadline_s=5)
    await _die(first)
    reaped: list[str] = []

    async def on_reaped(thread_id: str, tenant: str) -> None:
        reaped.append(thread_id)

    # Restarted under its id within the lease: its predecessor's run is ended at start,
    # before any run is taken, and the thread takes a new run at once.
    again = await boards("same", heartbeat_s=5, lease_s=60)
    await again.start(RunRegistry(board=again), on_reaped=on_reaped)
    shared = await again.get(run.run_id)
    assert shared is not None and shared.status == "error" and "restarted" in (shared.error or "")
    assert reaped == [thread]
    await again.admit(_record(thread), deadline_s=1)


def test_the_default_replica_id_is_stable_for_a_data_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert default_replica_id(tmp_path / "a") == default_replica_id(tmp_path / "b" / ".." / "a")
    assert default_replica_id(tmp_path / "a") != default_replica_id(tmp_path / "b")
    assert default_replica_id(tmp_path / "a").startswith(socket.gethostname() + "-")


async def test_recovery_at_start_skips_threads_with_an_active_run_on_the_board(
    boards: Open, postgres_dsn: str, tmp_path: Path
) -> None:
    stores = await open_thread_stores(ThreadSettings(postgres_dsn=postgres_dsn, pool_size=2), tmp_path)
    try:
        board = await boards("other")
        running, left = str(uuid.uuid4()), str(uuid.uuid4())
        for thread in (running, left):
            await stores.threads.create(tenant="acme", thread_id=thread)
            await stores.threads.update(thread, status="busy")
        await board.admit(_record(running), deadline_s=5)  # going on replica "other"
        assert await stores.threads.recover() == 1
        statuses = {t: (await stores.threads.get(t, tenant="acme")).status for t in (running, left)}  # type: ignore[union-attr]
        assert statuses == {running: "busy", left: "idle"}
    finally:
        await stores.aclose()


async def test_the_id_lock_is_taken_again_after_its_connection_is_lost(boards: Open, postgres_dsn: str) -> None:
    board = await boards("kept", heartbeat_s=5, lease_s=60)
    assert board._id_lock is not None
    pid = board._id_lock.info.backend_pid
    await _rows(postgres_dsn, "SELECT pg_terminate_backend(%s)", pid)
    await board._keep_id()  # as the next heartbeat does
    assert board._id_lock is not None and board._id_lock.info.backend_pid != pid
    with pytest.raises(ReplicaIdInUseError):
        await boards("kept", heartbeat_s=5, lease_s=60)


async def _terminate_all(dsn: str) -> None:
    """As a PostgreSQL restart: every other connection to the database is dropped."""
    await _rows(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()",
    )


async def _status_within(dsn: str, run_id: str, seconds: float, wanted: str) -> object:
    status: object = None
    for _ in range(int(seconds / 0.1)):
        rows = await _rows(dsn, "SELECT status FROM switchyard_runs WHERE run_id = %s", run_id)
        status = rows[0][0] if rows else None
        if status == wanted:
            break
        await asyncio.sleep(0.1)
    return status


async def test_an_end_written_while_the_database_restarts_still_reaches_the_board(
    boards: Open, postgres_dsn: str
) -> None:
    """The end write failed on a dropped connection: it is tried again (and the owner's
    poll ends such a row), so the thread takes a run on another replica. It stayed
    ``running`` for ever (the owner is alive: no sweeper ends it)."""
    x, y = await boards("X", heartbeat_s=0.3), await boards("Y", heartbeat_s=0.3)
    on_x = RunRegistry(board=x)
    await x.start(on_x)
    await y.start(RunRegistry(board=y))
    thread = str(uuid.uuid4())
    holder = _record(thread)
    on_x.add(holder)
    await x.admit(holder, deadline_s=5)
    holder.set_status("running")
    await _terminate_all(postgres_dsn)
    on_x.ended(holder)
    holder.finish("success")
    x.ended(holder)
    assert await _status_within(postgres_dsn, holder.run_id, 5, "success") == "success"
    await y.admit(_record(thread), deadline_s=2)


async def test_an_active_row_of_this_replica_with_no_run_behind_it_is_ended_by_its_poll(
    boards: Open, postgres_dsn: str
) -> None:
    """An admission whose insert committed but whose reply was lost (503 to the client)
    leaves a row with no run: the owner's heartbeat ends it and the thread is free."""
    x, y = await boards("X", heartbeat_s=0.2), await boards("Y", heartbeat_s=0.2)
    on_x = RunRegistry(board=x)
    await x.start(on_x)
    await y.start(RunRegistry(board=y))
    thread, kept_thread = str(uuid.uuid4()), str(uuid.uuid4())
    orphan, kept = _record(thread), _record(kept_thread)
    on_x.add(kept)
    await x.admit(kept, deadline_s=5)
    await x.admit(orphan, deadline_s=5)  # never registered here: nothing runs it
    assert await _status_within(postgres_dsn, orphan.run_id, 3, "error") == "error"
    error = await _rows(postgres_dsn, "SELECT error FROM switchyard_runs WHERE run_id = %s", orphan.run_id)
    assert "not recorded" in error[0][0]
    await y.admit(_record(thread), deadline_s=2)
    # A run that is running here keeps its row.
    assert (await y.active_on(kept_thread)).run_id == kept.run_id  # type: ignore[union-attr]


async def test_a_slow_sweep_neither_stops_the_sweepers_heartbeat_nor_holds_row_locks(
    boards: Open, postgres_dsn: str
) -> None:
    """Setting a reaped run's thread status is slow (a busy thread store): the sweeper
    keeps beating meanwhile (a third replica does not take it for dead and reap its live
    run), and the dead run's row is ended and committed before that status is set."""
    dead = await boards("dead", heartbeat_s=60, lease_s=120)
    await dead.start(RunRegistry(board=dead))
    lost = _record(str(uuid.uuid4()))
    await dead.admit(lost, deadline_s=5)
    seen_in_hook: list[object] = []

    async def slow_on_reaped(thread_id: str, tenant: str) -> None:
        seen_in_hook.append((await _rows(postgres_dsn, "SELECT status FROM switchyard_runs WHERE run_id = %s", lost.run_id))[0][0])
        await asyncio.sleep(3)

    sweeper = await boards("Y", heartbeat_s=0.2, lease_s=1.0)
    on_y = RunRegistry(board=sweeper)
    await sweeper.start(on_y, on_reaped=slow_on_reaped)
    live = _record(str(uuid.uuid4()))
    on_y.add(live)
    await sweeper.admit(live, deadline_s=5)
    third = await boards("Z", heartbeat_s=0.2, lease_s=1.0)
    await asyncio.sleep(3.0)  # "dead" is past its lease (1 s) and Y is inside its 3 s hook
    assert await third.sweep() == 0
    assert (await third.get(live.run_id)).status == "running"  # type: ignore[union-attr]
    assert seen_in_hook == ["error"]


async def test_a_client_resuming_after_its_replica_died_always_ends_with_an_error_event(boards: Open) -> None:
    """The dead host had sent events 0..7 live but written 0..4: the sweeper's ``error``
    frame must not take id 5 (the client saw it), and a client resuming after any id it
    saw gets that error, never an empty stream."""
    dead = await boards("dead", heartbeat_s=60, lease_s=120)
    await dead.start(RunRegistry(board=dead))
    run = _record(str(uuid.uuid4()))
    await dead.admit(run, deadline_s=5)
    dead.mark_background(run)
    for index in range(5):
        dead.frame(run, index, f"event: messages\ndata: {{}}\nid: {index}\n\n")
    assert await dead.flushed(run.run_id, 5)
    sweeper = await boards("B")
    await asyncio.sleep(1.2)
    assert await sweeper.sweep() == 1
    for after in (3, 4, 5, 7):
        got = [frame async for frame in sweeper.follow(run.run_id, after)]
        assert got[-1].startswith("event: error\n") and "ReplicaLost" in got[-1], (after, got)
        assert "\nid: " not in got[-1]  # no id: it collides with none the client saw
        assert len(got) == max(4 - after, 0) + 1, (after, got)
    # A run ended in error whose frames the client has all seen: told how it ended.
    await sweeper.start(RunRegistry(board=sweeper))
    done = _record(str(uuid.uuid4()))
    await sweeper.admit(done, deadline_s=5)
    sweeper.mark_background(done)
    sweeper.frame(done, 0, "event: metadata\ndata: {}\nid: 0\n\n")
    done.finish("error")
    sweeper.ended(done)
    sweeper.pumped(done)
    assert await sweeper.flushed(done.run_id, 5)
    got = [frame async for frame in sweeper.follow(done.run_id, 0)]
    assert len(got) == 1 and got[0].startswith("event: error\n") and '"status":"error"' in got[0]


async def test_a_runs_end_is_written_before_other_runs_queued_frames(boards: Open) -> None:
    """A busy replica has thousands of frames of background runs queued: a finished
    run's end does not wait behind them (the thread stayed refused on the other
    replicas for about a second), and `end_written` returns once it is on the board."""
    x, y = await boards("X", heartbeat_s=2, lease_s=10), await boards("Y", heartbeat_s=2, lease_s=10)
    on_x = RunRegistry(board=x)
    await x.start(on_x)
    await y.start(RunRegistry(board=y))
    streaming = []
    for _ in range(20):
        run = _record(None)
        run.frames = []
        on_x.add(run)
        await x.admit(run, deadline_s=5)
        x.mark_background(run)
        streaming.append(run)
    thread = str(uuid.uuid4())
    holder = _record(thread)
    on_x.add(holder)
    await x.admit(holder, deadline_s=5)
    for index in range(300):
        for run in streaming:
            x.frame(run, index, f"event: messages\ndata: {'x' * 200}\nid: {index}\n\n")
    on_x.ended(holder)
    holder.finish("success")
    x.ended(holder)
    await x.end_written(holder.run_id, 5)
    assert len(x._ops) > 1000  # the frames are still queued
    await y.admit(_record(thread), deadline_s=0)
