"""Request limits: body size, a token bucket per API key, concurrent runs per key and
per server.

Over a limit the server answers at once (413, 429 with ``Retry-After``) and stays
responsive: nothing here waits for capacity.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from serving.auth import Principal
from serving.errors import ServingError
from serving.observability import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimit", "RateLimiter", "RunSlots", "rate_limited"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


def rate_limited(principal: Principal, wait_s: float) -> ServingError:
    """The 429 of an empty bucket (one wording for this replica's buckets and Redis's)."""
    limits = principal.settings.limits
    return ServingError(
        429, f"rate limit of key {principal.key_id}: {limits.requests_per_s:g} requests/s, burst {limits.burst}",
        retry_after_s=wait_s,
        limit="rate",
    )


@dataclass(slots=True)
class RateLimiter:
    """One token bucket per key, in this replica: ``burst`` tokens, refilled at
    ``requests_per_s``. With several replicas and no Redis, each counts its own
    (`serving.shared.ratelimit.RedisRateLimiter` shares them)."""

    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    async def check(self, principal: Principal) -> None:
        """Take a token for this key (`take`); async like the shared limiter's.

        Raises:
            ServingError: 429 with ``retry_after_s`` when the bucket is empty.
        """
        self.take(principal)

    async def aclose(self) -> None:
        """Nothing to close."""

    def take(self, principal: Principal) -> None:
        """Take a token for this key.

        Raises:
            ServingError: 429 with ``retry_after_s`` when the bucket is empty.
        """
        limits = principal.settings.limits
        now = time.monotonic()
        bucket = self._buckets.get(principal.key_id)
        if bucket is None:
            bucket = self._buckets[principal.key_id] = _Bucket(tokens=float(limits.burst), updated=now)
        bucket.tokens = min(float(limits.burst), bucket.tokens + (now - bucket.updated) * limits.requests_per_s)
        bucket.updated = now
        if bucket.tokens < 1:
            raise rate_limited(principal, (1 - bucket.tokens) / limits.requests_per_s)
        bucket.tokens -= 1


@dataclass(slots=True)
class RunSlots:
    """Counts runs in progress, per key and in all; refuses a run past either limit."""

    server_max: int
    _per_key: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    @contextmanager
    def hold(self, principal: Principal) -> Iterator[None]:
        """Hold a run slot for the duration of the ``with`` block.

        Raises:
            ServingError: 429 when the key or the server is at its limit.
        """
        release = self.acquire(principal)
        try:
            yield
        finally:
            release()

    def acquire(self, principal: Principal) -> Callable[[], None]:
        """Take a run slot; call the returned function (once or more) to give it back.

        Raises:
            ServingError: 429 when the key or the server is at its limit.
        """
        key_max = principal.settings.limits.max_concurrent_runs
        held = self._per_key.get(principal.key_id, 0)
        if self._total >= self.server_max:
            raise ServingError(
                429, f"the server is at its limit of {self.server_max} concurrent runs", retry_after_s=1, limit="server_runs"
            )
        if held >= key_max:
            raise ServingError(
                429, f"key {principal.key_id} is at its limit of {key_max} concurrent runs", retry_after_s=1, limit="key_runs"
            )
        self._per_key[principal.key_id] = held + 1
        self._total += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._total -= 1
            remaining = self._per_key[principal.key_id] - 1
            if remaining:
                self._per_key[principal.key_id] = remaining
            else:
                del self._per_key[principal.key_id]

        return release


class BodySizeLimit:
    """Pure ASGI middleware: a request body over ``max_bytes`` gets 413, whether it
    announces its length or arrives chunked."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: Scope, send: Send) -> None:
        metrics = getattr(getattr(scope.get("app"), "state", None), "metrics", None)
        if metrics is not None:
            metrics.rejections.labels("body_size").inc()
        message = f"request body larger than {self.max_bytes} bytes"
        path = scope.get("path", "")
        if path == "/v1" or path.startswith("/v1/"):
            # The OpenAI error shape on its routes (as `serving.errors` answers there,
            # and as their OpenAPI description says); the LangGraph shape elsewhere.
            error = {"message": message, "type": "invalid_request_error", "param": None, "code": "request_too_large"}
            body = json.dumps({"error": error}).encode()
        else:
            body = json.dumps({"detail": message}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                await self._refuse(scope, send)
                return
            await self.app(scope, receive, send)
            return
        if headers.get(b"transfer-encoding", b"").lower() != b"chunked":
            await self.app(scope, receive, send)
            return
        # A chunked body announces no length: read it here, up to the limit, and hand
        # it on (the app's own body parser would turn an abort into a 400).
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                buffered.append(message)
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, send)
                return
            buffered.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)


