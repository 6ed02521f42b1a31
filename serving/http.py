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
  no more than the limit, so nothing past it is buffered. Past it: ``431``. Counting
  restarts at the end of each request, so the next request on a kept-alive connection
  is counted from its first byte (one pipelined behind another in the same piece of
  data has that piece, at most ``max_header_bytes``, uncounted).
- **Header count**: at most ``max_headers`` header fields, trailers of a chunked body
  included: ``431``.
- **Chunked framing and trailers**: after the head, the bytes fed to the parser minus
  the body bytes it delivers are framing: chunk-size lines, chunk extensions and
  trailers. httptools buffers a trailer's value until it ends, and none of these
  bytes reach the application, so its body-size limit never sees them. Two bounds,
  with the parser fed at most the room left (at least 8 KiB at a time, the most
  either is overshot by; framing in the piece of data where the head ends counts as
  head). The first bounds what the parser buffers (a trailer); the second, the
  parsing a client may cause per byte of body:

  - a run of framing with no body in between (trailers, one chunk-size line or its
    extensions) may take at most ``max_header_bytes``;
  - a request's framing in all may take ``max_header_bytes`` or an eighth of the body
    delivered so far, whichever is more. Framing grows with the body (a chunk of
    1 KiB costs 7 bytes of framing, so a 10 MB upload in 1 KiB chunks carries 70 KiB,
    more than the default ``max_header_bytes``), so a fixed bound would refuse
    legitimate uploads; an eighth still refuses a client that sends framing and
    almost no body (chunks of a few bytes).

  Past either: ``431`` if no response has started (the application sees a
  disconnect), else the connection is closed.
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
from collections.abc import Callable
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
    """Request line plus header fields, in bytes (431 beyond); also a chunked body's
    trailers, and its framing in all unless an eighth of the body is more."""
    max_headers: int
    """Header fields per request, trailers included (431 beyond)."""
    header_timeout_s: float
    """Time to send a request's whole head (408 beyond)."""
    body_timeout_s: float
    """Time to send a request's whole body, from the end of its head (408 beyond)."""
    linger_s: float = 1.0
    """After a refusal: how long the client's further bytes are read and dropped."""
    cors_headers: Callable[[str], list[tuple[str, str]]] | None = None
    """The CORS headers of an answer to a request from this origin (none for an origin
    not allowed); ``None``: CORS is off. A refusal here is sent before any middleware,
    so it adds them itself when the request's ``Origin`` arrived before the refusal:
    a browser app then reads the 431 or 408 instead of reporting a CORS failure."""


_MIN_PIECE = 8192
"""After the head, the parser is fed at least this much at a time (so a client that
has used up nearly all its framing room cannot make it parse byte by byte): the most
a limit on framing is overshot by."""
_BODY_OVERHEAD_DIVISOR = 8
"""A request's chunk framing may reach an eighth of its body when that is more than
``max_header_bytes``."""


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
        """Header fields of the current request, trailers included."""
        self._body_bytes = 0
        """Body bytes of the current request delivered through on_body."""
        self._overhead = 0
        """Bytes of the current request after its head that were not body (framing)."""
        self._run = 0
        """Framing bytes since the last piece that delivered body bytes."""
        self._piece_completed = False
        self._upgraded = False
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
        limit = self.limits.max_header_bytes
        while data:
            if self._in_head:
                # Feed the parser only what fits; if the head does not end within
                # it, refuse without ever buffering the rest.
                room = limit - self._head_bytes
                if room <= 0:
                    self._refuse(431, f"request head larger than {limit} bytes")
                    return
                piece, data = data[:room], data[room:]
                self._head_bytes += len(piece)
                self._feed(piece)
            else:
                # After the head: what is fed minus what reaches on_body is framing
                # (chunk-size lines, extensions, trailers). A run of it is fed no
                # more than the room left (or _MIN_PIECE), so the parser never
                # buffers much more than the limit.
                run_room = limit - self._run
                total_room = self._overhead_allowed() - self._overhead
                if run_room <= 0 or total_room <= 0:
                    self._refuse_current(431, self._framing_excess())
                    return
                size = max(min(run_room, total_room), _MIN_PIECE)
                piece, data = data[:size], data[size:]
                body_before = self._body_bytes
                self._piece_completed = False
                self._feed(piece)
                if not self._piece_completed:
                    overhead = len(piece) - (self._body_bytes - body_before)
                    self._overhead += overhead
                    self._run = overhead if self._body_bytes > body_before else self._run + overhead
            if self._refused or self._upgraded or self.transport.is_closing():
                return
        if self._in_head and self._head_bytes >= limit:
            self._refuse(431, f"request head larger than {limit} bytes")
            return
        if not self._in_head and (self._run > limit or self._overhead > self._overhead_allowed()):
            self._refuse_current(431, self._framing_excess())
            return
        if self._body_pending and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timeout)

    def _feed(self, piece: bytes) -> None:
        super().data_received(piece)

    def _overhead_allowed(self) -> int:
        """Framing a request's body may carry in all: the head's limit, or an eighth
        of the body delivered so far if more (chunks of 1 KiB cost 7 bytes each)."""
        return max(self.limits.max_header_bytes, self._body_bytes // _BODY_OVERHEAD_DIVISOR)

    def _framing_excess(self) -> str:
        limit = self.limits.max_header_bytes
        if self._run >= limit:
            return f"chunked trailers or framing larger than {limit} bytes"
        return f"chunked framing larger than {self._overhead_allowed()} bytes for {self._body_bytes} bytes of body"

    def send_400_response(self, msg: str) -> None:
        if self._refused:
            return  # the parser stopped because we refused the request: answered already
        self._cancel_timers()
        super().send_400_response(msg)

    def handle_websocket_upgrade(self) -> None:
        # The connection is no longer ours to time: the WebSocket protocol has it.
        self._body_pending = False
        self._upgraded = True
        self._cancel_timers()
        super().handle_websocket_upgrade()

    def _unsupported_upgrade_warning(self) -> None:
        self._upgraded = True  # the parser stopped at the upgrade: feed it no more
        super()._unsupported_upgrade_warning()

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._begun = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1  # trailers count too: the count is reset per request
        if self._head_fields > self.limits.max_headers:
            reason = f"more than {self.limits.max_headers} header fields"
            if self._in_head:
                self._refuse(431, reason)
            else:
                self._refuse_current(431, reason + " (trailers included)")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._begun = False
        self._head_bytes = 0
        self._body_bytes = self._overhead = self._run = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_pending = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        # The next request's head is counted from its first byte (when it starts in
        # a later piece than this request's end).
        self._in_head = True
        self._head_bytes = self._head_fields = 0
        self._body_bytes = self._overhead = self._run = 0
        self._piece_completed = True
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

    def _refuse_current(self, status: int, reason: str) -> None:
        """Refuse the request whose body is being read: ``status`` if no response to
        it (or to an earlier request) is under way, else just close."""
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started or self.pipeline:
                self._refused = True
                self._cancel_timers()
                log.warning("closed a connection from %s: %s", self._peer(), reason)
                self.transport.close()
                return
        self._refuse(status, reason, force=True)

    def _cors_headers(self) -> list[tuple[bytes, bytes]]:
        """The refused request's CORS headers, if its ``Origin`` is known and allowed."""
        if self.limits.cors_headers is None or not self.headers:
            return []
        origin = next((value for name, value in self.headers if name == b"origin"), None)
        if origin is None:
            return []
        # The parser has checked the value's characters; only an allowed origin is echoed.
        pairs = self.limits.cors_headers(origin.decode("latin-1"))
        return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in pairs]

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
        for name, value in [*self.server_state.default_headers, *self._cors_headers()]:
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
