"""Runs in progress and recently finished, for cancelling, joining and resuming.

A run streamed in its request's task has a `RunRecord` too, so that another request
can cancel it (``POST .../cancel``, ``multitask_strategy: interrupt``). A *background*
run (``POST /threads/{id}/runs``, or a stream with ``stream_resumable`` or
``on_disconnect: continue``) runs in a task of its own and keeps its SSE frames in
its record: any number of clients can join its stream and resume after event id N
(``Last-Event-ID``). Records live in memory for ``retention_s`` after the run ends;
threads and their checkpoints are what survives a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from serving._tasks import RunGuard

__all__ = ["RunRecord", "RunRegistry", "RunStatus"]

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


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
    """SSE frames of a background run, frame i carrying ``id: i``."""
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
        self._changed.set()

    async def follow(self, after: int = -1) -> AsyncIterator[str]:
        """The frames after event id ``after``, then new ones as they come, until the
        run has ended."""
        assert self.frames is not None
        index = after + 1
        while True:
            while index < len(self.frames):
                yield self.frames[index]
                index += 1
            if self.done:
                return
            self._changed.clear()
            if index < len(self.frames) or self.done:
                continue
            await self._changed.wait()


class RunRegistry:
    """The process's run records, by run id and by thread."""

    def __init__(self, *, retention_s: float = 3600.0, max_finished: int = 1000) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._active: dict[str, RunRecord] = {}
        self._finished: deque[RunRecord] = deque()
        """Finished runs kept for reads, oldest first (runs end in this order)."""
        self._retention_s = retention_s
        self._max_finished = max_finished
        self._tasks: set[asyncio.Task[None]] = set()

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

    def start_background(self, record: RunRecord, frames: AsyncIterator[str], on_end: Callable[[], None]) -> None:
        """Pump ``frames`` into the record from a task of its own."""
        record.frames = []

        async def pump() -> None:
            try:
                async for frame in frames:
                    record.append(frame)
            finally:
                on_end()

        task = asyncio.get_running_loop().create_task(pump())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _prune(self) -> None:
        horizon = time.monotonic() - self._retention_s
        finished = self._finished
        while finished and (len(finished) > self._max_finished or (finished[0].ended_at or 0) < horizon):
            self._runs.pop(finished.popleft().run_id, None)

    async def aclose(self) -> None:
        """Cancel background runs (server shutdown) and wait for their clean-up."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
