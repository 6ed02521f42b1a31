"""Rate-limit buckets shared by every replica through Redis (``state.redis_url``).

The same token bucket as `serving.limits.RateLimiter` (``burst`` tokens per API key,
refilled at ``requests_per_s``, 429 with ``Retry-After`` when empty), kept in one Redis
hash per key id (``switchyard:ratelimit:<key id>``: tokens and when they were counted)
and taken by a Lua script, so a read-refill-take is atomic across replicas. The script
reads Redis's clock (``TIME``, kept in integer microseconds), not the replicas', and
gives each bucket a TTL of the time it takes to refill completely (a bucket left alone
that long is full, which is what a missing bucket means), so idle keys cost no memory;
the TTL is at most 30 days, so only a limit slower than ``burst`` requests per 30 days
finds an idle bucket full before it would have refilled.

At most ``max_connections`` (64) checks talk to Redis at once; more wait for a
connection (within ``timeout_s``) instead of failing: a burst of requests is not an
outage. One that found no free connection in time, or too late for Redis to answer
within ``timeout_s`` (Redis answers, but slower than the requests come), is checked
against this replica's own bucket, without counting a store error.

Redis unreachable, failing or slower than ``timeout_s`` (0.25 s): the request is
checked against this replica's own bucket (`serving.limits.RateLimiter`) instead, the
failure is counted in ``switchyard_rate_limit_store_errors_total``, and the outage is
logged once (and its end once). Redis is tried again at most every ``retry_s`` during
an outage, so a Redis that hangs does not add its timeout to every request; when it
answers, buckets are shared again. A limiter never answers 500 because of Redis.

Without ``state.redis_url`` each replica counts its own buckets (N replicas let a key
through up to N times as fast).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from serving.auth import Principal
from serving.limits import RateLimiter, rate_limited
from serving.observability import ServingMetrics
from serving.settings import ConfigError

__all__ = ["KEY_PREFIX", "RedisRateLimiter", "open_rate_limiter"]

log = logging.getLogger(__name__)

KEY_PREFIX = "switchyard:ratelimit:"

# KEYS[1] the bucket; ARGV: burst, requests_per_s, TTL in ms. Returns {1, "0"} when a
# token was taken, {0, "<seconds until one is there>"} when the bucket is empty. Numbers
# go back as strings: Redis turns a Lua number reply into an integer. Time is kept in
# integer microseconds (exact in a Lua double until the year 2255) and tokens with six
# decimals: `tostring` would keep 14 significant digits, 0.1 ms of a Unix time in seconds.
_TAKE = """
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated_us')
local tokens = tonumber(state[1])
local updated = tonumber(state[2])
if tokens == nil or updated == nil then
  tokens = burst
  updated = now
end
tokens = math.min(burst, tokens + math.max(0, now - updated) / 1000000 * rate)
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'updated_us', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {allowed, tostring(wait)}
"""
_MAX_TTL_MS = 30 * 86_400_000
"""A bucket's TTL is the time it takes to refill (plus a second), at most 30 days: only
a limit slower than ``burst`` requests per 30 days finds its bucket full again early."""


class RedisRateLimiter:
    """`serving.limits.RateLimiter`'s buckets in Redis; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        metrics: ServingMetrics | None = None,
        timeout_s: float = 0.25,
        retry_s: float = 1.0,
        fallback: RateLimiter | None = None,
        max_connections: int = 64,
    ) -> None:
        """Args:
        url: ``redis://host:port/db``.
        metrics: where store errors are counted (``rate_limit_store_errors``).
        timeout_s: the longest a check waits for Redis before it uses this replica's bucket.
        retry_s: during an outage, how often Redis is tried again.
        fallback: this replica's buckets (a new `RateLimiter` by default).
        max_connections: checks talking to Redis at once (more wait their turn).
        """
        self.url = url
        # A blocking pool: at max_connections the plain pool raises MaxConnectionsError,
        # which would look like an outage. The semaphore below keeps checks from even
        # asking the pool for more, so that waiting for a turn is told apart from a Redis
        # that does not answer.
        pool = redis.BlockingConnectionPool.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # no retries: a slow answer falls back at once
            max_connections=max_connections,
            timeout=timeout_s,
        )
        self._client = redis.Redis(connection_pool=pool)
        self._turns = asyncio.Semaphore(max_connections)
        self._script = self._client.register_script(_TAKE)
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self.fallback = fallback or RateLimiter()
        self._down_since: float | None = None
        self._next_try = 0.0

    @property
    def shared(self) -> bool:
        """Whether the last check used Redis (False during an outage)."""
        return self._down_since is None

    async def check(self, principal: Principal) -> None:
        """Take a token for this key from its shared bucket (this replica's during an
        outage of Redis).

        Raises:
            ServingError: 429 with ``retry_after_s`` when the bucket is empty.
        """
        now = time.monotonic()
        if self._down_since is not None and now < self._next_try:
            self.fallback.take(principal)
            return
        limits = principal.settings.limits
        ttl_ms = min(_MAX_TTL_MS, math.ceil(limits.burst / limits.requests_per_s * 1000) + 1000)
        has_turn = False
        turn_at = 0.0
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._turns.acquire()
                has_turn, turn_at = True, time.monotonic()
                allowed, wait = await self._script(
                    keys=[KEY_PREFIX + principal.key_id], args=[limits.burst, repr(limits.requests_per_s), ttl_ms]
                )
        except (RedisError, OSError, TimeoutError, NoScriptError) as exc:
            now = time.monotonic()
            if has_turn and not (isinstance(exc, TimeoutError) and now - turn_at < self._timeout_s / 2):
                self._failed(exc, now)
            else:
                # Waited (most of) its timeout for a turn, so Redis had no fair chance to
                # answer: it serves the checks ahead, just not this fast; not an outage.
                log.debug("rate-limit store %s busy: this check used the local bucket", self.safe_url())
            self.fallback.take(principal)
            return
        finally:
            if has_turn:
                self._turns.release()
        if self._down_since is not None:
            # Measured now, not at the start of this check: another check may have
            # marked the outage while this one waited for Redis.
            log.warning("rate-limit store %s answers again after %.1f s: buckets are shared again",
                        self.safe_url(), max(0.0, time.monotonic() - self._down_since))
            self._down_since = None
        if not int(allowed):
            raise rate_limited(principal, float(wait))

    def _failed(self, exc: BaseException, now: float) -> None:
        if self._metrics is not None:
            self._metrics.rate_limit_store_errors.inc()
        self._next_try = now + self._retry_s
        if self._down_since is None:
            self._down_since = now
            log.error(
                "rate-limit store %s failed (%s: %s): each replica counts its own buckets until it answers",
                self.safe_url(), type(exc).__name__, exc or "timed out",
            )

    def safe_url(self) -> str:
        """The URL without a password."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}" if rest else self.url

    async def aclose(self) -> None:
        await self._client.aclose()


def open_rate_limiter(redis_url: str | None, metrics: ServingMetrics | None = None) -> RateLimiter | RedisRateLimiter:
    """The app's limiter: shared through Redis when ``state.redis_url`` is set (connected
    at the first check), else this replica's own buckets.

    Raises:
        ConfigError: ``state.redis_url`` is not a Redis URL.
    """
    if redis_url is None:
        return RateLimiter()
    try:
        limiter = RedisRateLimiter(redis_url, metrics=metrics)
    except ValueError as exc:
        raise ConfigError("state", [f"state.redis_url: {exc}"]) from None
    log.info("rate-limit buckets shared through %s", limiter.safe_url())
    return limiter
