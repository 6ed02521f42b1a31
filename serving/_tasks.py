"""Running a graph in a task of its own, so a client disconnect cancels it cleanly.

The SSE response streams inside an anyio cancel scope, and anyio cancellation is
level-triggered: once the client is gone, every ``await`` in that scope is cancelled
again. LangGraph cancels its node tasks on the way out and then awaits them; under
the scope that await is cut short and the node (and its open request to the model
backend) goes on generating. Measured here: the backend kept generating for minutes
after the client left. Pumping the graph's stream from a plain asyncio task, and
cancelling that task with ``Task.cancel()`` (edge-triggered), lets LangGraph's own
clean-up run to the end: the backend request is closed within a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

__all__ = ["RunDeadlineError", "detached"]

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
