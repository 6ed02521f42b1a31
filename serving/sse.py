"""The SSE response both protocols use.

sse-starlette streams inside a task group and, when the client goes away, cancels it,
leaving the body iterator suspended where it was. Its clean-up (closing the graph run,
releasing the run slot, recording the outcome) then waits for the garbage collector,
which may be never if a reference cycle holds it: a run slot leaked that way in the
tests. `EventStream` closes the iterator itself once the response is over, outside the
cancelled task group, so every clean-up step runs, in order, at once.

On shutdown (SIGTERM) a stream may go on for the grace period; one still running then
is cancelled and ends with the protocol's ``farewell`` error event, so clients know
why the answer stopped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream"]


class EventStream(EventSourceResponse):
    """``EventSourceResponse`` that always closes its body iterator when done, and on
    shutdown lets streams run for ``grace_s`` before cancelling them with ``farewell``."""

    def __init__(
        self, content: AsyncIterator[Any], *, grace_s: float = 0, farewell: str | None = None, **kwargs: Any
    ) -> None:
        self._finished = False
        self._farewell = farewell

        async def tracked() -> AsyncIterator[Any]:
            async for item in content:
                yield item
            self._finished = True

        self._content = content
        super().__init__(tracked(), shutdown_event=anyio.Event(), shutdown_grace_period=grace_s, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
            if self._shutdown_event is not None and self._shutdown_event.is_set() and not self._finished and self._farewell:
                try:
                    await send({"type": "http.response.body", "body": self._farewell.encode(), "more_body": False})
                except Exception:  # noqa: BLE001 - the connection may already be gone; nothing to tell
                    pass
        finally:
            for iterator in (self.body_iterator, self._content):
                closer: Any = getattr(iterator, "aclose", None)
                if closer is not None:
                    await closer()
