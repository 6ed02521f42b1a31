"""The SSE response both protocols use, streaming from the request's own task.

Each event is sent from the task that handles the request: no queue and no task
between the graph and the socket. Two small tasks per stream run beside it: one
waits for the client's ``http.disconnect``, one sends a keep-alive comment when the
stream has been quiet for ``keepalive_s``.

Cancellation is edge-triggered (``Task.cancel()``), never an anyio cancel scope.
anyio cancellation is level-triggered: every ``await`` in a cancelled scope is
cancelled again, so LangGraph's own clean-up (it cancels its node tasks, then awaits
them) would be cut short and the node's open request to the model backend would go
on generating; measured here, for minutes. With one ``CancelledError`` delivered to
the request task, the graph's clean-up runs to the end and closes the backend request.
The body iterator is always closed (``aclose``) before the response returns, so every
clean-up step of the protocol layer (run slot, thread status, audit) runs at once.

Why a stream ends early, and what the client sees:

- the client went away: nothing more is sent;
- the server is shutting down (`Drain`): the stream may go on for ``grace_s``, then it
  is cancelled and ends with the protocol's ``farewell`` event.

Before a response starts (a whole answer, ``stream: false``; or the wait for a
stream's first chunk), `cancel_on_disconnect` does the same for a block of the
handler: a client that leaves cancels the work once, and the handler gets
`ClientDisconnectedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["SSE_EVENT_SCHEMA", "ClientDisconnectedError", "Drain", "EventStream", "cancel_on_disconnect", "read_ahead"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_KEEPALIVE = b": keep-alive\n\n"

SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One server-sent event (OpenAPI before 3.2: the schema of each event)",
    "properties": {
        "event": {"type": "string", "description": "The event name"},
        "data": {"type": "string", "description": "JSON text"},
        "id": {"type": "string", "description": "The event id, for Last-Event-ID"},
    },
    "required": ["data"],
}
"""What an event stream's response documents, for clients and schema checkers."""


class ClientDisconnectedError(Exception):
    """The client closed the connection before the response started."""


@asynccontextmanager
async def cancel_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Cancel the current task once if the client disconnects inside the block; the
    block then raises `ClientDisconnectedError`.

    For handlers whose work runs before the response starts. The request body must
    already have been read (FastAPI has, for a JSON body): the next message on
    ``receive`` is then ``http.disconnect``.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    # The watcher only runs while the block is suspended, and is cancelled before
    # the block's task runs anything else: it cannot cancel code after the block.
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientDisconnectedError("the client closed the connection") from None
    finally:
        watcher.cancel()


class Drain:
    """The server's shutdown signal, for responses that outlive a normal request.

    ``begin()`` may be called from a signal handler: it hands over to the event loop
    bound with ``bind()``.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callbacks: set[Callable[[], None]] = set()
        self.draining = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def begin(self) -> None:
        """Start draining (idempotent, safe from a signal handler)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        if self.draining:
            return
        self.draining = True
        for callback in list(self._callbacks):
            callback()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` in the loop when draining begins (now, if it has);
        returns the unsubscribe function."""
        if self.draining:
            callback()
            return lambda: None
        self._callbacks.add(callback)
        return lambda: self._callbacks.discard(callback)


class EventStream(Response):
    """A ``text/event-stream`` response over an iterator of ready-made SSE frames
    (``str`` or ``bytes``, each ending with a blank line)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[str | bytes],
        *,
        keepalive_s: float = 15.0,
        drain: Drain | None = None,
        grace_s: float = 0.0,
        farewell: str | None = None,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Args:
            close: closes the source ``content`` was made from, when that source has
                already started and closing an unstarted ``content`` would not reach
                it (a run that holds a slot before its first frame is sent).
        """
        self._close = close
        self.body_iterator = content
        self.status_code = status_code
        self.background = None
        self._keepalive_s = keepalive_s
        self._drain = drain
        self._grace_s = grace_s
        self._farewell = farewell.encode() if farewell else None
        self.init_headers({"cache-control": "no-store", "x-accel-buffering": "no", **(headers or {})})
        self._stopped: str | None = None  # "disconnect" | "shutdown": why we cancelled the stream
        self._sending = False
        self._quiet_since = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        closing = False

        def stop(reason: str) -> None:
            if self._stopped is None and not closing and not task.done():
                self._stopped = reason
                task.cancel()

        helpers: list[asyncio.Task[None]] = []
        grace: list[asyncio.TimerHandle] = []
        unsubscribe: Callable[[], None] = lambda: None  # noqa: E731
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            self._quiet_since = loop.time()
            helpers.append(loop.create_task(self._watch_disconnect(receive, stop)))
            if self._keepalive_s > 0:
                helpers.append(loop.create_task(self._keepalive(send)))
            if self._drain is not None:
                unsubscribe = self._drain.subscribe(lambda: grace.append(loop.call_later(self._grace_s, stop, "shutdown")))
            async for frame in self.body_iterator:
                self._sending = True
                await send({"type": "http.response.body", "body": frame if isinstance(frame, bytes) else frame.encode(), "more_body": True})
                self._sending = False
                self._quiet_since = loop.time()
        except asyncio.CancelledError:
            if self._stopped is None:
                raise  # not ours (the server is being forced down): let it through
            task.uncancel()
        finally:
            closing = True
            unsubscribe()
            for handle in grace:
                handle.cancel()
            for helper in helpers:
                helper.cancel()
            closer: Any = getattr(self.body_iterator, "aclose", None)
            try:
                if closer is not None:
                    await closer()
            finally:
                if self._close is not None:
                    await self._close()
        if self._stopped == "disconnect":
            return
        if self._stopped == "shutdown" and self._farewell:
            await send({"type": "http.response.body", "body": self._farewell, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Receive, stop: Callable[[str], None]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stop("disconnect")
                return

    async def _keepalive(self, send: Send) -> None:
        # Comments keep proxies from closing a stream that is quiet (a slow tool, a
        # long prefill). Sent only between whole frames.
        loop = asyncio.get_running_loop()
        while True:
            wait = self._quiet_since + self._keepalive_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if not self._sending:
                self._quiet_since = loop.time()
                await send({"type": "http.response.body", "body": _KEEPALIVE, "more_body": True})
            else:
                await asyncio.sleep(self._keepalive_s / 10)


async def _next(source: AsyncIterator[T]) -> T:
    return await anext(source)


async def read_ahead(
    source: AsyncIterator[T], ready: Callable[[], bool], limit_s: float
) -> AsyncIterator[T]:
    """Read ``source`` ahead until ``ready()`` holds, it ends, or ``limit_s`` passes;
    then an iterator over the items read and the rest of ``source``.

    For a response whose headers depend on what the stream finds out (which backend
    answered). Each item is read by a task of its own, so the wait can end without
    cancelling the read in progress; the returned iterator picks that read up.
    Closing the returned iterator closes ``source``; so does an error or a
    cancellation here (the caller's cancellation ends the pending read too).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    buffered: list[T] = []
    pending: asyncio.Future[T] | None = None
    ended = False
    try:
        while not ready():
            if pending is None:
                pending = asyncio.ensure_future(_next(source))
            done, _ = await asyncio.wait({pending}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                break
            item, pending = pending, None
            try:
                buffered.append(item.result())
            except StopAsyncIteration:
                ended = True
                break
    except BaseException:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()
        raise

    async def rest() -> AsyncIterator[T]:
        try:
            for item in buffered:
                yield item
            if ended:
                return
            if pending is not None:
                try:
                    yield await pending
                except StopAsyncIteration:
                    return
            async for item in source:
                yield item
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            closer = getattr(source, "aclose", None)
            if closer is not None:
                await closer()

    return rest()
