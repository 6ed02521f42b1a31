"""Connection limits under uvicorn's httptools protocol: header size and count,
and how long a client may take to send a request.

uvicorn 0.54's httptools protocol (``uvicorn/protocols/http/httptools_impl.py``) has
none of these: its only timer is ``timeout_keep_alive``, armed after a response and
cancelled by any byte received, so a client that trickles a request holds its
connection for ever, and httptools buffers a header's value until the header ends,
so one endless header grows the process without bound (``h11_max_incomplete_event_size``
applies only to the h11 protocol; ``limit_concurrency`` counts connections, not their
size). ASGI middleware runs only once the head is parsed, too late for either.

`limited_protocol` returns a subclass of uvicorn's ``HttpToolsProtocol``, given to
``uvicorn.Config(http=...)``, that adds, per connection:

- **Header size**: the request line and headers of a request may take at most
  ``max_header_bytes``; bytes are counted before they reach the parser, which is fed
  no more than the limit, so nothing past it is buffered. Past it: ``431``. (The
  head of a request pipelined behind another is counted from the read after the one
  in which it began: at most one socket read more.)
- **Header count**: at most ``max_headers`` header fields: ``431``.
- **Header time**: the head must be complete ``header_timeout_s`` after the connection
  opened (first request) or after the request's first byte (later requests on a
  kept-alive connection): ``408`` if a request had begun, else the connection is
  closed.
- **Body time**: the whole body must arrive within ``body_timeout_s`` of the end of
  the head, whether it stalls or trickles: ``408`` if the application has not
  answered yet (it then sees a disconnect), else the connection is closed (also
  when the application answered without reading the body and the client goes on
  sending it slowly).

A refusal answers with ``Connection: close``, then half-closes and discards what the
client still sends for up to ``linger_s`` (so a client busy sending can still read
the status instead of a reset), then closes.
"""

from __future__ import annotations

import asyncio
import http
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = ["ConnectionLimits", "LimitedHttpToolsProtocol", "limited_protocol"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """What one HTTP/1.1 connection may send (see the module docstring)."""

    max_header_bytes: int
    """Request line plus header fields, in bytes (431 beyond)."""
    max_headers: int
    """Header fields per request (431 beyond)."""
    header_timeout_s: float
    """Time to send a request's whole head (408 beyond)."""
    body_timeout_s: float
    """Time to send a request's whole body, from the end of its head (408 beyond)."""
    linger_s: float = 1.0
    """After a refusal: how long the client's further bytes are read and dropped."""


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `ConnectionLimits` (set by `limited_protocol`)."""

    limits: ClassVar[ConnectionLimits]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_head = True
        """Reading a request's line and headers (also before the first byte)."""
        self._head_bytes = 0
        self._head_fields = 0
        self._begun = False
        """The current request's first byte has arrived."""
        self._body_pending = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: drop what the client still sends
        if self._in_head:
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Feed the parser only what fits; if the head does not end within
                # it, refuse without ever buffering the rest.
                self._head_bytes += room
                if room:
                    super().data_received(data[:room])
                if self._refused or self.transport.is_closing():
                    return
                if self._in_head:
                    self._refuse(431, f"request head larger than {self.limits.max_header_bytes} bytes")
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        super().data_received(data)
        if self._body_pending and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timeout)

    def send_400_response(self, msg: str) -> None:
        if self._refused:
            return  # the parser stopped because we refused the request: answered already
        self._cancel_timers()
        super().send_400_response(msg)

    def handle_websocket_upgrade(self) -> None:
        # The connection is no longer ours to time: the WebSocket protocol has it.
        self._body_pending = False
        self._cancel_timers()
        super().handle_websocket_upgrade()

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._begun = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.limits.max_headers:
            self._refuse(431, f"more than {self.limits.max_headers} header fields")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._begun = False
        self._head_bytes = 0
        self._head_fields = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_pending = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_pending = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # Limits

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._begun and (self.cycle is None or self.cycle.response_complete):
            self._cancel_timers()
            self.transport.close()  # connected, never sent a byte
            return
        self._refuse(408, f"request head not complete within {self.limits.header_timeout_s:g} s")

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._body_pending:
            return
        cycle = self.cycle
        if cycle is not None:
            # The application may be waiting for the body: it gets a disconnect,
            # and anything it sends from now on is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                # A response is under way or sent (the app answered without the
                # body): no room for another status line.
                log.warning("closed a connection from %s: %s", self._peer(), self._body_late())
                self._cancel_timers()
                self.transport.close()
                return
        self._refuse(408, self._body_late(), force=True)

    def _body_late(self) -> str:
        return f"request body not complete within {self.limits.body_timeout_s:g} s"

    def _peer(self) -> str:
        return "%s:%d" % self.client if self.client else "?"

    def _refuse(self, status: int, reason: str, *, force: bool = False) -> None:
        """Answer ``status`` and close (after lingering), unless a response to an
        earlier request on this connection is still being written: then just close."""
        self._refused = True
        self._cancel_timers()
        log.warning("refused a request from %s: %s (%d)", self._peer(), reason, status)
        if self.transport.is_closing():
            return
        if not force and self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        body = reason.encode("ascii", "replace")
        head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        self.transport.write(b"".join([*head, body]))
        self.flow.resume_reading()  # drain the client's bytes while lingering
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(self.limits.linger_s, self.transport.close)
        else:
            self.transport.close()


def limited_protocol(limits: ConnectionLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``, bound to ``limits``."""
    return type("SwitchyardHttpProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
