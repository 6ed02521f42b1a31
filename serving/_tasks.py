"""Deadlines for runs streamed in the request's task, and background runs.

`with_deadline` bounds a run that streams in the request's own task (see
`serving.sse` for why cancellation is edge-triggered ``Task.cancel()``): when the
deadline passes while the task waits on the run, the task is cancelled once and the
run's own clean-up runs to the end; if the task is elsewhere (sending a frame), the
run is stopped at its next step. Either way the consumer gets `RunDeadlineError`.

`detached` pumps a source from a task of its own, for runs that must outlive the
request that started them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

__all__ = ["RunCancelledError", "RunDeadlineError", "RunGuard", "detached", "guarded", "with_deadline"]

T = TypeVar("T")

_END: Any = object()

# The event loop keeps only weak references to tasks; a cancelled pump still cleaning
# up must not be collected half-way.
_PUMPS: set[asyncio.Task[None]] = set()


class RunDeadlineError(Exception):
    """A run went past its deadline and was cancelled.

    Attributes:
        deadline_s: the deadline it had.
    """

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        super().__init__(f"the run exceeded its deadline of {deadline_s:g}s and was cancelled")


class RunCancelledError(Exception):
    """A run was cancelled on request (``POST .../cancel``)."""


class RunGuard:
    """Stops one run from outside (its deadline, a cancel request), whatever task
    the run is consumed from; see `guarded`."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None
        self._inside = False
        self._fired = False

    def stop(self, error: BaseException) -> None:
        """Stop the run; its consumer gets ``error``. Only the first stop counts."""
        if self.error is not None:
            return
        self.error = error
        if self._inside and self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()


async def guarded(source: AsyncIterator[T], guard: RunGuard, deadline_s: float | None = None) -> AsyncIterator[T]:
    """Iterate ``source`` until ``guard`` stops it (or ``deadline_s`` passes:
    `RunDeadlineError`); then raise the guard's error after the items produced before
    it. The stop cancels whichever task is waiting for the next item. ``source`` is
    closed when this iterator is."""
    handle = (
        asyncio.get_running_loop().call_later(deadline_s, guard.stop, RunDeadlineError(deadline_s))
        if deadline_s is not None
        else None
    )
    try:
        async with aclosing(source) as items:  # type: ignore[type-var]
            iterator = aiter(items)
            while True:
                # Also before the first item: a run stopped before its source started
                # (a cancel right after create) never starts it.
                if guard.error is not None:
                    raise guard.error
                # The task that waits for this item: one may read ahead of another
                # (a response waiting to name its backend), each is the one stopped.
                task = asyncio.current_task()
                assert task is not None
                guard._task = task
                guard._inside = True
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if guard._fired:
                        guard._fired = False
                        task.uncancel()
                        assert guard.error is not None
                        raise guard.error from None
                    raise
                finally:
                    guard._inside = False
                yield item
    finally:
        if handle is not None:
            handle.cancel()


def with_deadline(source: AsyncIterator[T], deadline_s: float | None) -> AsyncIterator[T]:
    """`guarded` with only a deadline."""
    return guarded(source, RunGuard(), deadline_s)


async def detached(source: AsyncIterator[T], *, deadline_s: float | None = None, buffer: int = 64) -> AsyncIterator[T]:
    """Iterate ``source`` from a separate task; closing this iterator cancels it.

    Args:
        source: an async generator; it is closed (``aclose``) inside the task.
        deadline_s: cancel the source after this long; the consumer then gets
            `RunDeadlineError` (after the items produced before it).
        buffer: items the task may run ahead of the consumer (backpressure beyond).
    """
    queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue(maxsize=buffer)

    async def pump() -> None:
        timeout = asyncio.timeout(deadline_s)
        try:
            async with timeout:
                async with aclosing(source) as items:  # type: ignore[type-var]
                    async for item in items:
                        await queue.put((item, None))
        except TimeoutError as exc:
            # Ours only if the deadline fired; a TimeoutError from the source is its own.
            await queue.put((_END, RunDeadlineError(deadline_s or 0) if timeout.expired() else exc))
            return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which re-raises it
            await queue.put((_END, exc))
            return
        await queue.put((_END, None))

    task = asyncio.get_running_loop().create_task(pump())
    _PUMPS.add(task)
    task.add_done_callback(_PUMPS.discard)
    try:
        while True:
            item, error = await queue.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        if not task.done():
            task.cancel()
        # Not awaited: under a cancel scope the await would be cancelled at once; the
        # task finishes its clean-up on its own. Retrieve its outcome to keep the
        # loop from logging "exception never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
