"""The network layer under the gateway's httpx pools: plain asyncio streams.

httpcore's default network backend goes through anyio, which on every socket read
detects the running async library (sniffio) and opens a cancel scope for the read
timeout. A token arrives in its own read, so that was paid per token: at 50
concurrent streams it was about 15% of the server's CPU, more than parsing HTTP
itself (profile in docs/performance.md). This backend reads with `asyncio`
streams and an `asyncio.timeout` per read. HTTP parsing, pooling, keep-alive and the
exception mapping stay httpcore's and httpx's.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

__all__ = ["pooled_transport"]

_SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no data within {timeout}s") from None
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout(f"could not send within {timeout}s") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            self._writer.close()
            raise httpcore.ConnectTimeout(f"TLS handshake took over {timeout}s") from None
        except (OSError, ssl.SSLError) as exc:
            self._writer.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # An idle pooled connection that has data or an EOF waiting is not reusable.
            # asyncio reads eagerly, so look at the reader, not only the socket.
            return self._reader.at_eof() or self._writer.is_closing() or self._reader.exception() is not None
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        return None


class _AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[_SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None, limit=1 << 20
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} within {timeout}s") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock: socket.socket = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)  # type: ignore[arg-type]
        return _Stream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[_SocketOption] | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection to {path} within {timeout}s") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return _Stream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _Transport(httpx.AsyncHTTPTransport):
    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        # httpx builds its httpcore pool without a way to pass the network backend;
        # build the same pool (no proxy, HTTP/1.1) with ours.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_AsyncioBackend(),
        )


def pooled_transport(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    """An httpx transport (HTTP/1.1, pooled, keep-alive) over asyncio streams."""
    return _Transport(limits)
