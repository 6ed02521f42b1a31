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

__all__ = ["RunDeadlineError", "detached", "with_deadline"]

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


async def with_deadline(source: AsyncIterator[T], deadline_s: float | None) -> AsyncIterator[T]:
    """Iterate ``source`` in the current task; past ``deadline_s``, stop it and raise
    `RunDeadlineError` (after the items produced before it). ``source`` is closed
    when this iterator is."""
    if deadline_s is None:
        async with aclosing(source) as items:  # type: ignore[type-var]
            async for item in items:
                yield item
        return
    task = asyncio.current_task()
    assert task is not None
    inside = expired = fired = False

    def expire() -> None:
        nonlocal expired, fired
        expired = True
        if inside and not task.done():
            fired = True
            task.cancel()

    handle = asyncio.get_running_loop().call_later(deadline_s, expire)
    try:
        async with aclosing(source) as items:  # type: ignore[type-var]
            iterator = aiter(items)
            while True:
                if expired:
                    raise RunDeadlineError(deadline_s)
                inside = True
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if fired:
                        fired = False
                        task.uncancel()
                        raise RunDeadlineError(deadline_s) from None
                    raise
                finally:
                    inside = False
                yield item
    finally:
        handle.cancel()


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
