"""Rate-limit buckets shared through Redis (issue 17, item 2): two replicas take from one
bucket per key (the burst across both is the burst, not twice it); Redis killed
mid-test: each replica falls back to its own buckets, counts
``switchyard_rate_limit_store_errors_total``, logs once, never answers 500; Redis back:
shared again. Real Redis (Debian's ``redis-server``, `tests.redis`), real apps."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis

from serving.auth import Principal, TenantLimits, TenantSettings
from serving.errors import ServingError
from serving.observability import ServingMetrics
from serving.settings import ConfigError
from serving.shared.ratelimit import KEY_PREFIX, RedisRateLimiter, open_rate_limiter
from tests.redis import RedisServer
from tests.serving.test_shared_keys import admin_key, cli, running, shared_config

pytestmark = [pytest.mark.integration]

BURST = 5


def _principal(key_id: str, *, burst: int = BURST, per_s: float = 0.01) -> Principal:
    limits = TenantLimits(requests_per_s=per_s, burst=burst)
    return Principal(tenant="acme", key_id=key_id, settings=TenantSettings(limits=limits))


async def _allowed(limiter: RedisRateLimiter, principal: Principal) -> bool:
    try:
        await limiter.check(principal)
    except ServingError as exc:
        assert exc.status == 429 and exc.limit == "rate" and exc.retry_after_s and exc.retry_after_s > 0
        return False
    return True


async def test_two_replicas_share_one_bucket(redis_url: str) -> None:
    """Alternating between two limiters, a key gets its burst once, not twice; another
    key has its own bucket; the bucket has a TTL."""
    a, b = RedisRateLimiter(redis_url), RedisRateLimiter(redis_url)
    try:
        principal = _principal("k1")
        outcomes = [await _allowed(a if i % 2 else b, principal) for i in range(2 * BURST)]
        assert outcomes == [True] * BURST + [False] * BURST
        assert await _allowed(a, _principal("k2"))
        ttl_ms = redis.Redis.from_url(redis_url).pttl(KEY_PREFIX + "k1")
        assert 0 < ttl_ms <= (BURST / 0.01 + 1) * 1000
        # Refill at Redis's clock: 20 tokens/s gives a token back within 0.1 s.
        fast = _principal("k3", burst=1, per_s=20)
        assert await _allowed(a, fast)
        assert not await _allowed(b, fast)
        await asyncio.sleep(0.1)
        assert await _allowed(b, fast)
        assert a.shared and b.shared
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_burst_of_checks_waits_for_connections(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """200 checks at once on a healthy Redis, more than the pool's connections: they wait
    their turn instead of failing, so no store error, no outage logged, and each key's
    bucket gives exactly its burst."""
    metrics = ServingMetrics()
    limiter = RedisRateLimiter(redis_url, metrics=metrics, timeout_s=2.0, max_connections=8)
    caplog.set_level(logging.WARNING, logger="serving.shared.ratelimit")
    try:
        principals = [_principal(f"burst{i}", burst=30) for i in range(4)]
        outcomes = await asyncio.gather(*(_allowed(limiter, principals[i % 4]) for i in range(200)))
        assert metrics.rate_limit_store_errors._value.get() == 0
        assert limiter.shared
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        for i in range(4):
            assert sum(outcomes[j] for j in range(i, 200, 4)) == 30  # 50 checks per key, burst 30
        # The local buckets were not used: a fresh limiter over the same Redis sees them empty.
        other = RedisRateLimiter(redis_url)
        try:
            assert not await _allowed(other, principals[0])
        finally:
            await other.aclose()
    finally:
        await limiter.aclose()


async def test_recovery_logs_how_long_the_outage_lasted(caplog: pytest.LogCaptureFixture) -> None:
    """The outage's length in the recovery log is measured when Redis answers again."""
    server = RedisServer().start()
    limiter = RedisRateLimiter(server.url, retry_s=0.1)
    caplog.set_level(logging.WARNING, logger="serving.shared.ratelimit")
    try:
        server.stop()
        assert await _allowed(limiter, _principal("k1"))
        assert not limiter.shared
        await asyncio.sleep(0.3)
        server.start()
        await asyncio.sleep(0.2)
        assert await _allowed(limiter, _principal("k1"))
        assert limiter.shared
        message = next(r.getMessage() for r in caplog.records if "answers again" in r.getMessage())
        seconds = float(message.split("after ")[1].split(" s")[0])
        assert seconds >= 0.4, message
    finally:
        await limiter.aclose()
        server.close()


async def test_bucket_time_in_microseconds_and_ttl_of_a_slow_refill(redis_url: str) -> None:
    """The bucket keeps Redis's time in integer microseconds; a limit that takes days to
    refill keeps its bucket that long (not reset after 24 h)."""
    limiter = RedisRateLimiter(redis_url)
    control = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        slow = _principal("slow", burst=5, per_s=1e-5)  # 5 tokens refill in 500,000 s (5.8 days)
        assert await _allowed(limiter, slow)
        bucket = control.hgetall(KEY_PREFIX + "slow")
        seconds, micros = control.time()
        assert bucket["updated_us"].isdigit()
        assert abs(int(bucket["updated_us"]) - (seconds * 1_000_000 + micros)) < 5_000_000
        assert float(bucket["tokens"]) == pytest.approx(4.0, abs=1e-3)
        assert control.pttl(KEY_PREFIX + "slow") > 5 * 86_400_000
    finally:
        control.close()
        await limiter.aclose()


async def test_redis_down_falls_back_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Redis killed: checks go to this replica's bucket (no error but 429), each failure
    counted, the outage logged once; Redis back: shared again by itself."""
    server = RedisServer().start()
    metrics = ServingMetrics()
    limiter = RedisRateLimiter(server.url, metrics=metrics, retry_s=0.2)
    try:
        principal = _principal("k1")
        assert await _allowed(limiter, principal)
        server.stop()
        caplog.set_level(logging.WARNING, logger="serving.shared.ratelimit")
        outcomes = []
        for _ in range(2 * BURST):
            outcomes.append(await _allowed(limiter, principal))
            await asyncio.sleep(0.05)
        # This replica's own bucket: a full burst of its own, then 429.
        assert outcomes == [True] * BURST + [False] * BURST
        assert not limiter.shared
        errors = metrics.rate_limit_store_errors._value.get()
        assert errors >= 2  # retried every retry_s, each failure counted
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
        server.start()
        await asyncio.sleep(0.25)  # past retry_s
        fresh = _principal("k2")
        assert await _allowed(limiter, fresh)
        assert limiter.shared
        assert redis.Redis.from_url(server.url).exists(KEY_PREFIX + "k2")
        assert any("answers again" in r.getMessage() for r in caplog.records)
    finally:
        await limiter.aclose()
        server.close()


async def test_slow_redis_times_out_to_the_local_bucket(redis_url: str) -> None:
    """A Redis that does not answer (every client paused) costs a check at most the
    timeout: it falls back, counted, instead of waiting."""
    metrics = ServingMetrics()
    limiter = RedisRateLimiter(redis_url, metrics=metrics, timeout_s=0.25)
    control = redis.Redis.from_url(redis_url)
    try:
        assert await _allowed(limiter, _principal("k1"))  # connected
        control.execute_command("CLIENT", "PAUSE", 2000, "ALL")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await _allowed(limiter, _principal("k1"))
        assert loop.time() - started < 1.0
        assert metrics.rate_limit_store_errors._value.get() == 1
        assert not limiter.shared
    finally:
        control.execute_command("CLIENT", "UNPAUSE")
        control.close()
        await limiter.aclose()


async def test_apps_share_the_burst_and_survive_redis_loss(
    tmp_path: Path, postgres_dsn: str, fake_backend_url: str
) -> None:
    """Two apps over one Redis: a key's burst across both is the burst; Redis killed:
    200s and 429s only (no 500), the store errors counted on /metrics; Redis back: one
    bucket again."""
    server = RedisServer().start()
    tenants = {
        "acme": {"limits": {"requests_per_s": 0.01, "burst": BURST}},
        "ops": {"admin": True, "limits": {"requests_per_s": 1000, "burst": 1000}},
    }
    state = {"redis_url": server.url}
    config_a = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url, state=state, auth={"tenants": tenants})
    config_b = shared_config(tmp_path, "B", postgres_dsn, fake_backend_url, state=state, auth={"tenants": tenants})
    admin = admin_key(config_a)
    key = cli(config_a, "create", "--tenant", "acme").stdout.strip()
    try:
        async with AsyncExitStack() as stack:
            _, a = await stack.enter_async_context(running(config_a))
            _, b = await stack.enter_async_context(running(config_b))
            headers = {"Authorization": f"Bearer {key}"}
            statuses = [(await (a if i % 2 else b).get("/v1/models", headers=headers)).status_code for i in range(2 * BURST)]
            assert statuses == [200] * BURST + [429] * BURST
            refused = await a.get("/v1/models", headers=headers)
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1

            server.stop()
            during = [(await (a if i % 2 else b).get("/v1/models", headers=headers)).status_code for i in range(2 * BURST)]
            # Each replica's own bucket now: a burst each, then 429; never a 500.
            assert set(during) <= {200, 429} and during.count(200) == 2 * BURST
            scraped = (await a.get("/metrics", headers={"x-api-key": admin})).text
            line = next(l for l in scraped.splitlines() if l.startswith("switchyard_rate_limit_store_errors_total"))
            assert float(line.split()[-1]) >= 1

            server.start()
            await asyncio.sleep(1.2)  # past the limiter's retry interval
            back = [(await (a if i % 2 else b).get("/v1/models", headers=headers)).status_code for i in range(2 * BURST)]
            # Redis lost its data: a fresh shared bucket, one burst across both.
            assert back == [200] * BURST + [429] * BURST
    finally:
        server.close()


def test_a_bad_redis_url_is_a_config_error() -> None:
    """``state.redis_url`` that is not a Redis URL stops the start, naming the setting."""
    with pytest.raises(ConfigError, match=r"state\.redis_url: .*redis://"):
        open_rate_limiter("http://127.0.0.1:6379")
