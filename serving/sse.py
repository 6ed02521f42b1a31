"""The SSE response both protocols use.

sse-starlette streams inside a task group and, when the client goes away, cancels it,
leaving the body iterator suspended where it was. Its clean-up (closing the graph run,
releasing the run slot, recording the outcome) then waits for the garbage collector,
which may be never if a reference cycle holds it: a run slot leaked that way in the
tests. `EventStream` closes the iterator itself once the response is over, outside the
cancelled task group, so every clean-up step runs, in order, at once.
"""

from __future__ import annotations

from typing import Any

from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream"]


class EventStream(EventSourceResponse):
    """``EventSourceResponse`` that always closes its body iterator when done."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            closer: Any = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                await closer()
