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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from serving._tasks import RunGuard

__all__ = ["CONTROL_EVENTS", "RunRecord", "RunRegistry", "RunStatus"]

log = logging.getLogger(__name__)

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


CONTROL_EVENTS = frozenset({"metadata", "error", "end"})
"""Events a joined stream sends whatever its ``stream_mode`` filter."""


def _event_mode(frame: str) -> str | None:
    """The stream mode of an SSE frame: its event name without a subgraph's ``|ns``
    (``None`` for a comment)."""
    if not frame.startswith("event: "):
        return None
    name = frame[7 : frame.find("\n")]
    return name.split("|", 1)[0]


def _now() -> str:
    return datetime.now(UTC).isoformat()


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
                mode = _event_mode(kept)
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
    ) -> None:
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

    def add(self, record: RunRecord) -> None:
        self._prune()
        self._runs[record.run_id] = record
        if record.thread_id is not None:
            self._active[record.thread_id] = record

    def ended(self, record: RunRecord) -> None:
        """The run has ended: a thread's run is kept for reads (``retention_s``, at most
        ``max_finished`` of them); a stateless one cannot be addressed any more."""
        if record.thread_id is None:
            self._runs.pop(record.run_id, None)
            return
        if self._active.get(record.thread_id) is record:
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

        async def pump() -> None:
            async with aclosing(frames):
                async for frame in frames:
                    record.append(frame)

        task = asyncio.get_running_loop().create_task(pump())
        self._tasks[task] = close
        task.add_done_callback(self._pumped)

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
