"""Runs in progress and recently finished, for cancelling, joining and resuming.

A run streamed in its request's task has a `RunRecord` too, so that another request
can cancel it (``POST .../cancel``, ``multitask_strategy: interrupt``). A *background*
run (``POST /threads/{id}/runs``, or a stream with ``stream_resumable`` or
``on_disconnect: continue``) runs in a task of its own and keeps its SSE frames in
its record: any number of clients can join its stream and resume after event id N
(``Last-Event-ID``). Records live in memory for ``retention_s`` after the run ends;
threads and their checkpoints are what survives a restart.

Kept frames are bounded: a run keeps at most ``replay_bytes`` of them (older frames
are dropped first; a client resuming before the oldest kept frame gets an SSE comment
saying how many were dropped, then the rest), and finished runs keep at most
``finished_replay_bytes`` in all (the oldest finished runs lose their frames first).

Thread streams (``GET /threads/{id}/stream``): every run on a thread, streamed in a
request or in the background, hands its frames to `RunRegistry.relay`, which copies
them to the thread's `ThreadWatcher` queues (none: nothing is done) and ends each
run with an ``end`` marker. A watcher's queue is bounded (``watch_bytes``): a joiner
too slow to keep up is disconnected (its stream ends with an ``error`` event), never
waited for, so a run never slows down for its watchers; it can reconnect with
``Last-Event-ID`` and replays what background runs kept.

With replicas sharing PostgreSQL (`serving.shared.runs.RunBoard`, ``board``), every
record is also written to the board, and a background run's frames too, so that
other replicas can read, join, stream and cancel it; this registry stays the
authority for the runs this process hosts.

Thread claims serialise what must not overlap a run on the same thread: a delete
(``claim(thread, "delete")``) refuses new runs and state updates while it cancels
the thread's run and removes its checkpoints and record, so no run can write a
checkpoint of a half-deleted thread; a state update (``"update"``) refuses new runs
while it writes; a copy (``"copy"``) only keeps the thread from being deleted under
it. A run is admitted (`RunRegistry.admit`) after its multitask strategy made way and
before it takes anything, with no await in between.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import orjson

from serving._tasks import RunGuard
from serving.errors import ServingError

if TYPE_CHECKING:
    from serving.shared.runs import RunBoard

__all__ = ["CONTROL_EVENTS", "RunRecord", "RunRegistry", "RunStatus", "ThreadOp", "ThreadWatcher", "end_frame", "event_mode"]

log = logging.getLogger(__name__)

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


CONTROL_EVENTS = frozenset({"metadata", "error", "end"})
"""Events a joined stream sends whatever its ``stream_mode`` filter."""


def event_mode(frame: str) -> str | None:
    """The stream mode of an SSE frame: its event name without a subgraph's ``|ns``
    (``None`` for a comment)."""
    if not frame.startswith("event: "):
        return None
    name = frame[7 : frame.find("\n")]
    return name.split("|", 1)[0]


def _now() -> str:
    return datetime.now(UTC).isoformat()


ThreadOp = Literal["delete", "update", "copy"]
"""What holds a thread claim (see the module docstring)."""

_OP_NAMES: dict[ThreadOp, str] = {"delete": "a delete", "update": "a state update", "copy": "a copy"}


def _shutdown_frame(index: int) -> str:
    data = orjson.dumps({"error": "ServerShutdown", "message": "the server is shutting down; the run was cancelled"})
    return f"event: error\ndata: {data.decode()}\nid: {index}\n\n"


def end_frame(run_id: str) -> str:
    """The ``end`` event a thread stream sends after a run's last event."""
    return f"event: end\ndata: {orjson.dumps({'run_id': run_id}).decode()}\nid: {run_id}:end\n\n"


class ThreadWatcher:
    """One thread-stream client's queue of ``(run_id, index, frame)`` items (index
    ``None``: the run's end). Bounded by bytes: past ``max_bytes`` the watcher is
    marked ``overflowed`` and gets nothing more (the client is disconnected)."""

    def __init__(self, thread_id: str, max_bytes: int) -> None:
        self.thread_id = thread_id
        self.max_bytes = max_bytes
        self.overflowed = False
        self.closed = False
        """The thread was deleted: nothing more will come."""
        self._items: deque[tuple[str, int | None, str]] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()

    def push(self, run_id: str, index: int | None, frame: str) -> None:
        if self.overflowed or self.closed:
            return
        if self._bytes + len(frame) > self.max_bytes and self._items:
            # Disconnect rather than drop: a dropped event would be a silent hole in
            # the client's stream; a disconnected client knows, and can resume.
            self.overflowed = True
            self._items.clear()
            self._bytes = 0
        else:
            self._items.append((run_id, index, frame))
            self._bytes += len(frame)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def next(self) -> tuple[str, int | None, str] | None:
        """The next item; None once the watcher overflowed or was closed."""
        while not self._items:
            if self.overflowed or self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        if self.overflowed:
            return None
        item = self._items.popleft()
        self._bytes -= len(item[2])
        return item


@dataclass(eq=False)
class RunRecord:
    run_id: str
    thread_id: str | None
    """None for a stateless run."""
    assistant_id: str
    tenant: str
    multitask_strategy: str
    metadata: dict[str, Any]
    guard: RunGuard = field(default_factory=RunGuard)
    status: RunStatus = "pending"
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
    frames: list[str] | None = None
    """SSE frames of a background run still kept; ``frames[i]`` carries ``id:
    dropped + i``."""
    dropped: int = 0
    """Frames dropped from the front of ``frames`` (the replay buffer is bounded)."""
    frames_bytes: int = 0
    replay_bytes: int = 1 << 20
    """The most frame bytes this run keeps."""
    ended_at: float | None = None
    stream_closed: bool = False
    """Its last frame has been relayed (`RunRegistry.relay`): thread streams have
    had its ``end``."""
    _done: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": {},
        }

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def set_status(self, status: RunStatus) -> None:
        self.status = status
        self.updated_at = _now()

    def finish(self, status: RunStatus) -> None:
        self.set_status(status)
        self.ended_at = time.monotonic()
        self._done.set()
        self._changed.set()

    async def wait(self) -> None:
        await self._done.wait()

    def append(self, frame: str) -> None:
        assert self.frames is not None
        self.frames.append(frame)
        self.frames_bytes += len(frame)
        # Keep the newest frame even if it alone is over the limit.
        while self.frames_bytes > self.replay_bytes and len(self.frames) > 1:
            self.frames_bytes -= len(self.frames.pop(0))
            self.dropped += 1
        self._changed.set()

    def drop_frames(self) -> int:
        """Forget every kept frame (a finished run's, to bound memory); returns the
        bytes freed."""
        freed = self.frames_bytes
        if self.frames:
            self.dropped += len(self.frames)
            self.frames.clear()
        self.frames_bytes = 0
        return freed

    def kept(self, after: int = -1) -> tuple[int, list[str]]:
        """The kept frames after event id ``after`` (now, without waiting), and how
        many of the wanted ones are no longer kept."""
        assert self.frames is not None
        start = max(after + 1, 0)
        missing = max(self.dropped - start, 0)
        return missing, self.frames[max(start - self.dropped, 0) :]

    async def follow(self, after: int = -1, events: frozenset[str] | None = None) -> AsyncIterator[str]:
        """The frames after event id ``after`` (``-1``: all kept), then new ones as
        they come, until the run has ended.

        Args:
            after: the last event id the client has.
            events: send only frames of these event names (a subgraph's ``name|ns``
                counts as ``name``), plus the control events in ``CONTROL_EVENTS``;
                ``None`` sends all. Ids stay the run's own, so a filtered client
                resumes with ``Last-Event-ID`` like any other.
        """
        assert self.frames is not None
        index = max(after + 1, 0)
        if index < self.dropped:
            yield f": {self.dropped - index} earlier events are no longer kept\n\n"
        while True:
            index = max(index, self.dropped)
            while index - self.dropped < len(self.frames):
                kept = self.frames[index - self.dropped]
                mode = event_mode(kept)
                if events is None or mode is None or mode in events or mode in CONTROL_EVENTS:
                    yield kept
                index += 1
                index = max(index, self.dropped)
            if self.done:
                return
            self._changed.clear()
            if index - self.dropped < len(self.frames) or self.done:
                continue
            await self._changed.wait()


class RunRegistry:
    """The process's run records, by run id and by thread."""

    def __init__(
        self,
        *,
        retention_s: float = 3600.0,
        max_finished: int = 1000,
        replay_bytes: int = 1 << 20,
        finished_replay_bytes: int = 64 << 20,
        watch_bytes: int = 8 << 20,
        board: RunBoard | None = None,
    ) -> None:
        self.board = board
        """The shared run board (replicas), or None for a single replica."""
        self._replay_bytes = replay_bytes
        self._finished_replay_bytes = finished_replay_bytes
        self._finished_frames = 0
        """Bytes of frames kept by finished runs."""
        self._runs: dict[str, RunRecord] = {}
        self._active: dict[str, RunRecord] = {}
        self._finished: deque[RunRecord] = deque()
        """Finished runs kept for reads, oldest first (runs end in this order)."""
        self._retention_s = retention_s
        self._max_finished = max_finished
        self._tasks: dict[asyncio.Task[None], Callable[[], Awaitable[None]]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._claims: dict[str, list[ThreadOp]] = {}
        self._watchers: dict[str, set[ThreadWatcher]] = {}
        self.watch_bytes = watch_bytes

    # ---- thread claims ---------------------------------------------------------------

    @contextmanager
    def claim(self, thread_id: str, op: ThreadOp) -> Iterator[None]:
        """Hold ``thread_id`` for ``op`` (see the module docstring) for the block.

        Raises:
            ServingError: 409 when the thread is held by a conflicting operation, or
                (``update``) has a run in progress.
        """
        held = self._claims.get(thread_id, [])
        conflict = "delete" in held if op == "copy" else bool(held)
        if conflict:
            raise ServingError(409, f"thread {thread_id!r} is busy: {_OP_NAMES[held[0]]} is in progress")
        if op == "update" and (active := self._active.get(thread_id)) is not None:
            raise ServingError(409, f"thread {thread_id!r} has a run in progress ({active.run_id})")
        self._claims.setdefault(thread_id, []).append(op)
        try:
            yield
        finally:
            held = self._claims[thread_id]
            held.remove(op)
            if not held:
                del self._claims[thread_id]

    def admit(self, record: RunRecord) -> None:
        """Refuse a run on a thread being deleted or having its state updated (called
        right before the run takes anything, with no await until `add`).

        Raises:
            ServingError: 409 naming what holds the thread.
        """
        if record.thread_id is None:
            return
        for op in self._claims.get(record.thread_id, ()):
            if op != "copy":
                raise ServingError(409, f"thread {record.thread_id!r} is busy: {_OP_NAMES[op]} is in progress")

    def deleting(self, thread_id: str) -> bool:
        return "delete" in self._claims.get(thread_id, ())

    def refuse_if_deleting(self, thread_id: str) -> None:
        """Raises ServingError 409 while a delete holds the thread."""
        if self.deleting(thread_id):
            raise ServingError(409, f"thread {thread_id!r} is busy: {_OP_NAMES['delete']} is in progress")

    # ---- thread streams --------------------------------------------------------------

    def watch(self, thread_id: str) -> ThreadWatcher:
        """A watcher of the thread's runs' frames from now on; the caller must `unwatch` it."""
        watcher = ThreadWatcher(thread_id, self.watch_bytes)
        self._watchers.setdefault(thread_id, set()).add(watcher)
        return watcher

    def unwatch(self, watcher: ThreadWatcher) -> None:
        watchers = self._watchers.get(watcher.thread_id)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[watcher.thread_id]

    def watched(self, thread_id: str | None) -> bool:
        return thread_id is not None and thread_id in self._watchers

    def publish(self, record: RunRecord, index: int | None, frame: str) -> None:
        """Hand one of the run's frames (``index`` None: its end) to its thread's watchers."""
        if record.thread_id is None:
            return
        for watcher in self._watchers.get(record.thread_id, ()):
            watcher.push(record.run_id, index, frame)

    def close_stream(self, record: RunRecord) -> None:
        """The run's last frame has gone out: its thread's watchers get its ``end``."""
        if not record.stream_closed:
            record.stream_closed = True
            if self.watched(record.thread_id):
                self.publish(record, None, end_frame(record.run_id))

    async def relay(self, record: RunRecord, frames: AsyncIterator[str]) -> AsyncIterator[str]:
        """``frames`` (the run's SSE frames, ids 0, 1, ...), each also handed to the
        thread's watchers, then the run's ``end``. Closes ``frames``."""
        index = 0
        try:
            async with aclosing(frames) as source:  # type: ignore[type-var]
                async for item in source:
                    if item.startswith("event: "):
                        if self.watched(record.thread_id):
                            self.publish(record, index, item)
                        index += 1
                    yield item
        finally:
            self.close_stream(record)

    def forget_thread(self, thread_id: str) -> None:
        """The thread was deleted: drop its runs' records and end its streams."""
        for run in [r for r in self._runs.values() if r.thread_id == thread_id and r.done]:
            self._forget(run)
        for watcher in self._watchers.get(thread_id, ()):
            watcher.close()
        if self.board is not None:
            self.board.forget_thread(thread_id)

    def _forget(self, record: RunRecord) -> None:
        self._runs.pop(record.run_id, None)
        if record in self._finished:
            self._finished.remove(record)
            self._finished_frames -= record.drop_frames()

    def delete(self, record: RunRecord) -> None:
        """Forget a finished run (``DELETE .../runs/{id}``).

        Raises:
            ServingError: 409 for a run not finished.
        """
        if not record.done:
            raise ServingError(409, f"run {record.run_id!r} is {record.status}; cancel it first")
        self._forget(record)
        if self.board is not None:
            self.board.forget(record.run_id)

    def discard(self, record: RunRecord) -> None:
        """Drop a run that was added but refused before it started (another replica's
        run holds its thread): no trace is kept; local waiters on it wake."""
        self._runs.pop(record.run_id, None)
        if record.thread_id is not None and self._active.get(record.thread_id) is record:
            del self._active[record.thread_id]
        record.finish("error")

    def lookup(self, run_id: str) -> RunRecord | None:
        """The record of a run this process knows of, whoever's it is."""
        return self._runs.get(run_id)

    def running_ids(self) -> list[str]:
        """The runs this process hosts that have not ended."""
        return [run_id for run_id, record in self._runs.items() if not record.done]

    def add(self, record: RunRecord) -> None:
        self._prune()
        self._runs[record.run_id] = record
        if record.thread_id is not None:
            self._active[record.thread_id] = record

    def ended(self, record: RunRecord) -> None:
        """The run has ended: a thread's run is kept for reads (``retention_s``, at most
        ``max_finished`` of them), and so is a stateless background run (its stream is
        all a client can read of it: ``GET /runs/{run_id}/stream``); any other
        stateless run cannot be addressed any more."""
        if record.thread_id is None and record.frames is None:
            self._runs.pop(record.run_id, None)
            return
        if record.thread_id is not None and self._active.get(record.thread_id) is record:
            del self._active[record.thread_id]
        self._finished.append(record)
        self._finished_frames += record.frames_bytes
        for old in self._finished:
            if self._finished_frames <= self._finished_replay_bytes:
                break
            self._finished_frames -= old.drop_frames()

    def active(self, thread_id: str) -> RunRecord | None:
        return self._active.get(thread_id)

    def get(self, run_id: str, tenant: str, thread_id: str | None = None) -> RunRecord | None:
        record = self._runs.get(run_id)
        if record is None or record.tenant != tenant or (thread_id is not None and record.thread_id != thread_id):
            return None
        return record

    def of_tenant(self, tenant: str) -> list[RunRecord]:
        """The tenant's runs this process knows of (``POST /runs/cancel`` by status)."""
        return [r for r in self._runs.values() if r.tenant == tenant]

    def of_thread(self, thread_id: str, tenant: str) -> list[RunRecord]:
        found = [r for r in self._runs.values() if r.thread_id == thread_id and r.tenant == tenant]
        return sorted(found, key=lambda r: r.created_at, reverse=True)

    def start_background(
        self, record: RunRecord, frames: AsyncGenerator[str, None], close: Callable[[], Awaitable[None]]
    ) -> None:
        """Pump ``frames`` into the record from a task of its own.

        Args:
            record: the run's record; it keeps the frames.
            frames: the run's SSE frames; closed when the pump ends.
            close: closes the run's own (already started) event source: called if the
                pump is cancelled before its first step (server shutdown), when
                closing ``frames`` would not reach it.
        """
        record.frames = []
        record.replay_bytes = self._replay_bytes
        board = self.board

        if board is not None:
            board.mark_background(record)

        def keep(frame: str) -> None:
            record.append(frame)
            if board is not None:
                board.frame(record, record.dropped + len(record.frames) - 1, frame)  # type: ignore[arg-type]

        async def pump() -> None:
            try:
                async with aclosing(self.relay(record, frames)) as relayed:  # type: ignore[type-var]
                    async for frame in relayed:
                        keep(frame)
            except asyncio.CancelledError:
                if board is not None:
                    # Server shutdown: followers on other replicas are told why it ended.
                    keep(_shutdown_frame(record.dropped + len(record.frames or ())))
                raise
            finally:
                if board is not None:
                    board.pumped(record)

        task = asyncio.get_running_loop().create_task(pump())
        self._tasks[task] = close
        task.add_done_callback(self._pumped)
        if board is not None:
            # Also when the pump was cancelled before its first step (its `finally`
            # never ran): the run's end, written when `close` ends it, is not held back.
            task.add_done_callback(lambda _: board.pumped(record))

    def _pumped(self, task: asyncio.Task[None]) -> None:
        close = self._tasks.pop(task, None)
        if not task.cancelled():
            if (error := task.exception()) is not None:
                log.error("background run failed", exc_info=error)
            return
        if close is not None:
            # Closing an event source that has ended already does nothing; one that the
            # cancelled pump never reached runs its clean-up now.
            closing = asyncio.get_running_loop().create_task(close())  # type: ignore[arg-type]
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _prune(self) -> None:
        horizon = time.monotonic() - self._retention_s
        finished = self._finished
        while finished and (len(finished) > self._max_finished or (finished[0].ended_at or 0) < horizon):
            old = finished.popleft()
            self._finished_frames -= old.drop_frames()
            self._runs.pop(old.run_id, None)

    async def aclose(self) -> None:
        """Cancel background runs (server shutdown) and wait for their clean-up."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
