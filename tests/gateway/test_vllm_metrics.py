"""The vLLM ``/metrics`` scraper, against a fake vLLM metrics endpoint.

vLLM needs a GPU, so the ``/metrics`` bodies are recorded text served by a local HTTP
server (a fake third-party service, STYLE.md case 3). The bodies in ``data/`` were
produced by prometheus_client (the library vLLM exports with) from vLLM's own metric
definitions: ``vllm_metrics_v1.txt`` and ``vllm_metrics_v1_later.txt`` as vLLM
0.10's V1 engine core declares them (``vllm/v1/metrics/loggers.py``, two
data-parallel engines, ``_created`` series, the process, python_gc and http metrics
of its API server), the later one after 8 more requests; ``vllm_metrics_v0.txt`` as
the V0 engine before 0.9 (``vllm/engine/metrics.py``: ``model_name`` label only,
``vllm:gpu_cache_usage_perc``, created series disabled).

Staleness is checked with a settable clock (STYLE.md case 4); the running loop with
conditions awaited under a generous bound, never a timed assertion.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.registry import Backend
from gateway.vllm_metrics import (
    STALE_AFTER_INTERVALS,
    LoadScraper,
    VllmLoad,
    VllmMetricsError,
    load_score,
    parse_vllm_metrics,
)
from tests.fakes.openai_backend import free_port

DATA = Path(__file__).parent / "data"
V1 = (DATA / "vllm_metrics_v1.txt").read_text()
V1_LATER = (DATA / "vllm_metrics_v1_later.txt").read_text()
V0 = (DATA / "vllm_metrics_v0.txt").read_text()
MODEL = "Qwen/Qwen2.5-7B-Instruct-AWQ"

# The numbers in the recorded bodies (engine 0 + engine 1).
V1_TTFT_SUM = 12.084875594807523 + 10.319499309528233
V1_LATER_TTFT_SUM = 13.950488650820489 + 11.05387469079341
GARBAGE = "<html><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass
class FakeVllm:
    """What the fake endpoint answers; tests change it between scrapes."""

    base_url: str
    bodies: list[str] = field(default_factory=lambda: [V1])
    """Answered in turn; the last one is repeated."""
    status: int = 200
    stall: threading.Event | None = None
    """When set to an unset event, requests wait for it (a hung server)."""
    trickle: threading.Event | None = None
    """When set to an unset event, the body comes a byte at a time until it is set."""
    authorization: list[str | None] = field(default_factory=list)
    """The ``Authorization`` header of each request received, in order."""

    @property
    def requests(self) -> int:
        return len(self.authorization)


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(base_url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the library's name
            if self.path != "/metrics":
                self.send_error(404)
                return
            fake.authorization.append(self.headers.get("Authorization"))
            if fake.stall is not None:
                fake.stall.wait(30)
            body = (fake.bodies.pop(0) if len(fake.bodies) > 1 else fake.bodies[0]).encode()
            if fake.trickle is not None:
                self._trickle(body, fake.trickle)
                return
            self.send_response(fake.status)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up on a stalled answer

        def _trickle(self, body: bytes, stop: threading.Event) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                for i in range(len(body)):
                    if stop.wait(0.02):
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        for event in (fake.stall, fake.trickle):
            if event is not None:
                event.set()
        server.shutdown()
        server.server_close()
        thread.join()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _backend(base_url: str, **fields: object) -> Backend:
    return Backend.model_validate(
        {
            "id": "gpu",
            "kind": "vllm",
            "base_url": base_url,
            "model": MODEL,
            "capabilities": {"context_window": 32768},
            **fields,
        }
    )


async def _until(condition: Callable[[], bool], what: str, bound_s: float = 30.0) -> None:
    """Wait for a condition the running loop brings about (a bound, not a timing check)."""
    async with asyncio.timeout(bound_s):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


# --- parsing ---------------------------------------------------------------------


def test_a_v1_body_sums_its_engines() -> None:
    load = parse_vllm_metrics(V1, scraped_at=5.0)
    assert load.running == 3 + 2
    assert load.waiting == 1 + 0
    assert load.kv_cache_usage == pytest.approx((0.4125 + 0.2875) / 2)  # a share: averaged
    assert load.ttft_count == 40 + 35
    assert load.ttft_sum_s == pytest.approx(V1_TTFT_SUM)
    assert load.ttft_mean_s is None  # one body has no interval
    assert load.scraped_at == 5.0
    assert load_score(load) == 6.0


def test_an_older_release_reports_kv_cache_as_gpu_cache_usage_perc() -> None:
    assert "vllm:kv_cache_usage_perc" not in V0 and "engine=" not in V0
    load = parse_vllm_metrics(V0)
    assert (load.running, load.waiting, load.ttft_count) == (7, 2, 22)
    assert load.kv_cache_usage == pytest.approx(0.83)
    assert load.ttft_sum_s == pytest.approx(10.270997884501979)


def test_the_new_kv_cache_name_wins_when_both_are_exported() -> None:
    # vLLM 0.9 exports both; 0.10 too with --show-hidden-metrics-for-version.
    text = (
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine="0"} 0.9\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    )
    assert parse_vllm_metrics(text).kv_cache_usage == pytest.approx(0.25)


def test_the_served_model_filter_keeps_its_own_samples() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 4.0\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 9.0\n'
        "vllm:num_requests_running 1.0\n"  # unlabelled: kept by any filter
    )
    assert parse_vllm_metrics(text).running == 14
    assert parse_vllm_metrics(text, model_name="a").running == 5
    assert parse_vllm_metrics(text, model_name="nobody").running == 1


def test_missing_metrics_are_none_not_errors() -> None:
    # The process and python_gc part of the recorded body: no vllm:* metric at all.
    head = V1[: V1.index("# HELP vllm:")]
    assert "process_resident_memory_bytes" in head and "python_gc_collections_total" in head
    load = parse_vllm_metrics(head)
    assert (load.running, load.waiting, load.kv_cache_usage, load.ttft_sum_s, load.ttft_count) == (None,) * 5
    assert load_score(load) == 0.0
    assert parse_vllm_metrics("").running is None


def test_nan_samples_are_skipped() -> None:
    text = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} NaN\n'
    assert parse_vllm_metrics(text).kv_cache_usage is None


@pytest.mark.parametrize("body", [GARBAGE, '{"detail": "Not Found"}', "vllm:num_requests_running three"])
def test_garbage_is_a_clear_error(body: str) -> None:
    with pytest.raises(VllmMetricsError, match="not Prometheus text"):
        parse_vllm_metrics(body)


def test_the_error_quotes_a_long_line_only_in_part() -> None:
    page = "<html>" + "x" * 100_000 + "</html>"
    with pytest.raises(VllmMetricsError) as caught:
        parse_vllm_metrics(page)
    assert "<html>xxx" in caught.value.reason and len(caught.value.reason) <= 200


# --- scraping ----------------------------------------------------------------------


async def test_a_scrape_reads_the_served_body(fake_vllm: FakeVllm) -> None:
    clock = Clock()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, clock=clock)
    try:
        assert scraper.load("gpu") is None  # never scraped
        await scraper.scrape_once()
    finally:
        await scraper.aclose()
    load = scraper.load("gpu")
    assert load is not None
    assert (load.running, load.waiting, load.ttft_count) == (5, 1, 75)
    assert load.ttft_sum_s == pytest.approx(V1_TTFT_SUM)
    assert load.scraped_at == clock.now
    assert scraper.snapshot() == {"gpu": load}
    assert scraper.failures == {"gpu": 0} and scraper.failure("gpu") is None
    assert fake_vllm.authorization == [None]  # no api_key_env: no key sent


async def test_ttft_mean_is_the_histogram_delta_between_two_scrapes(fake_vllm: FakeVllm) -> None:
    fake_vllm.bodies = [V1, V1_LATER, V1]  # the last: counters went down (vLLM restarted)
    clock = Clock()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, clock=clock)
    try:
        await scraper.scrape_once()
        first = scraper.load("gpu")
        assert first is not None and first.ttft_mean_s is None  # one scrape: no interval yet
        clock.now += 5
        await scraper.scrape_once()
        later = scraper.load("gpu")
        assert later is not None
        assert (later.running, later.waiting, later.ttft_count) == (11, 6, 83)
        assert later.kv_cache_usage == pytest.approx(0.65)
        assert later.ttft_mean_s == pytest.approx((V1_LATER_TTFT_SUM - V1_TTFT_SUM) / (83 - 75))
        assert later.ttft_mean_s is not None and 0.05 < later.ttft_mean_s < 0.6  # the recorded range
        clock.now += 5
        await scraper.scrape_once()
        restarted = scraper.load("gpu")
        assert restarted is not None and restarted.ttft_count == 75 and restarted.ttft_mean_s is None
        # Restarted and already past the old count: the sum gives it away.
        fake_vllm.bodies = [
            (
                "# TYPE vllm:time_to_first_token_seconds histogram\n"
                'vllm:time_to_first_token_seconds_sum{engine="0"} 1.5\n'
                'vllm:time_to_first_token_seconds_count{engine="0"} 90.0\n'
            )
        ]
        clock.now += 5
        await scraper.scrape_once()
        again = scraper.load("gpu")
        assert again is not None and again.ttft_count == 90 and again.ttft_mean_s is None
    finally:
        await scraper.aclose()


async def test_a_failing_backend_keeps_its_last_load_for_three_intervals(
    fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, clock=clock)
    caplog.set_level(logging.INFO, logger="gateway.vllm_metrics")
    try:
        await scraper.scrape_once()
        good = scraper.load("gpu")
        assert good is not None

        fake_vllm.status, fake_vllm.bodies = 500, ["Internal Server Error"]
        for _ in range(STALE_AFTER_INTERVALS):
            clock.now += 5
            await scraper.scrape_once()  # never raises
            assert scraper.load("gpu") == good  # still young enough to count
        assert scraper.failures["gpu"] == STALE_AFTER_INTERVALS
        assert "answered 500 Internal Server Error" in (scraper.failure("gpu") or "")
        clock.now += 0.001
        assert scraper.load("gpu") is None and scraper.snapshot() == {}  # stale

        fake_vllm.status, fake_vllm.bodies = 200, [GARBAGE]
        clock.now += 5
        await scraper.scrape_once()
        assert scraper.load("gpu") is None
        assert "not Prometheus text" in (scraper.failure("gpu") or "")

        fake_vllm.bodies = [V1_LATER]
        clock.now += 5
        await scraper.scrape_once()
        recovered = scraper.load("gpu")
        assert recovered is not None and recovered.running == 11 and scraper.failure("gpu") is None
        # Since the last good scrape, 8 more requests: still a mean over them.
        assert recovered.ttft_mean_s == pytest.approx((V1_LATER_TTFT_SUM - V1_TTFT_SUM) / 8)
        assert scraper.failures["gpu"] == STALE_AFTER_INTERVALS + 1
    finally:
        await scraper.aclose()
    # One line per change of state, not one per failed scrape.
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.vllm_metrics"]
    assert len(lines) == 3, lines
    assert "answered 500" in lines[0] and "not Prometheus text" in lines[1] and "readable again" in lines[2]


async def test_a_backend_that_is_down_is_no_load() -> None:
    backend = _backend(f"http://127.0.0.1:{free_port()}/v1")  # nothing listens
    scraper = LoadScraper(lambda: [backend], interval_s=5)
    try:
        await scraper.scrape_once()
    finally:
        await scraper.aclose()
    assert scraper.load("gpu") is None
    assert scraper.failures == {"gpu": 1}
    assert "cannot reach http://127.0.0.1" in (scraper.failure("gpu") or "")


async def test_a_hung_backend_times_out(fake_vllm: FakeVllm) -> None:
    fake_vllm.stall = threading.Event()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, timeout_s=0.2)
    try:
        await scraper.scrape_once()
    finally:
        fake_vllm.stall.set()
        await scraper.aclose()
    assert scraper.load("gpu") is None
    assert scraper.failure("gpu") == f"no answer from {backend.root_url}/metrics in 0.2s"


async def test_a_trickling_answer_times_out_as_a_whole(fake_vllm: FakeVllm) -> None:
    # Every read gets a byte well within the timeout; the whole body never arrives.
    fake_vllm.trickle = threading.Event()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, timeout_s=0.5)
    try:
        async with asyncio.timeout(30):  # the bug this catches would hang for minutes
            await scraper.scrape_once()
    finally:
        fake_vllm.trickle.set()
        await scraper.aclose()
    assert scraper.load("gpu") is None
    assert scraper.failure("gpu") == f"no answer from {backend.root_url}/metrics in 0.5s"


async def test_the_bearer_key_is_sent_when_the_backend_has_one(
    fake_vllm: FakeVllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_TEST_VLLM_KEY", "sk-test-123")
    backend = _backend(fake_vllm.base_url, api_key_env="SWITCHYARD_TEST_VLLM_KEY")
    scraper = LoadScraper(lambda: [backend], interval_s=5)
    try:
        await scraper.scrape_once()
    finally:
        await scraper.aclose()
    assert fake_vllm.authorization == ["Bearer sk-test-123"]
    assert scraper.load("gpu") is not None


async def test_only_vllm_backends_are_scraped_and_removed_ones_are_forgotten(fake_vllm: FakeVllm) -> None:
    gpu = _backend(fake_vllm.base_url)
    local = Backend.model_validate(
        {"id": "local", "kind": "llamacpp", "base_url": fake_vllm.base_url, "model": "m",
         "capabilities": {"context_window": 2048}}
    )  # fmt: skip
    current = [gpu, local]
    scraper = LoadScraper(lambda: current, interval_s=5)
    try:
        await scraper.scrape_once()
        assert fake_vllm.requests == 1  # the vllm backend only
        assert set(scraper.snapshot()) == {"gpu"} and scraper.load("local") is None
        current = [local]  # a reloaded registry without it
        await scraper.scrape_once()
    finally:
        await scraper.aclose()
    assert fake_vllm.requests == 1
    assert scraper.load("gpu") is None and scraper.failures == {}


async def test_match_model_name_uses_the_served_name(fake_vllm: FakeVllm) -> None:
    backend = _backend(fake_vllm.base_url, launch={"model": MODEL, "served_model_name": "other"})
    matching = LoadScraper(lambda: [backend], interval_s=5, match_model_name=True)
    everything = LoadScraper(lambda: [backend], interval_s=5)
    try:
        await matching.scrape_once()
        await everything.scrape_once()
    finally:
        await matching.aclose()
        await everything.aclose()
    other, total = matching.load("gpu"), everything.load("gpu")
    assert other is not None and other.running is None  # vLLM labelled them with MODEL
    assert total is not None and total.running == 5


# --- the background loop ---------------------------------------------------------------


async def test_the_loop_survives_failures_and_closes_cleanly(
    fake_vllm: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.vllm_metrics")
    fake_vllm.status, fake_vllm.bodies = 500, ["engine dead"]
    backend = _backend(fake_vllm.base_url)
    calls = 0

    def backends() -> list[Backend]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("registry being swapped")  # a bad round, not the end
        return [backend]

    scraper = LoadScraper(backends, interval_s=0.05, timeout_s=1)
    await scraper.start()
    try:
        await _until(lambda: scraper.failures.get("gpu", 0) >= 3, "three failed scrapes")
        fake_vllm.status, fake_vllm.bodies = 200, [GARBAGE]
        await _until(lambda: "not Prometheus" in (scraper.failure("gpu") or ""), "garbage seen")
        fake_vllm.bodies = [V1]
        await _until(lambda: scraper.load("gpu") is not None, "a good scrape after the failures")
        with pytest.raises(RuntimeError, match="already started"):
            await scraper.start()
    finally:
        await scraper.aclose()
    await scraper.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await scraper.start()
    requests = fake_vllm.requests
    await asyncio.sleep(0.2)  # four intervals: a loop still running would have asked again
    assert fake_vllm.requests == requests
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.vllm_metrics"]
    assert sum("answered 500" in m for m in messages) == 1, messages
    assert sum("round failed" in m for m in messages) == 1, messages


async def test_aclose_while_a_scrape_hangs(fake_vllm: FakeVllm) -> None:
    fake_vllm.stall = threading.Event()
    backend = _backend(fake_vllm.base_url)
    scraper = LoadScraper(lambda: [backend], interval_s=5, timeout_s=20)
    await scraper.start()
    try:
        await _until(lambda: fake_vllm.requests == 1, "the scrape reached the server")
    finally:
        await scraper.aclose()  # cancels the hung request; does not wait 20 s for it
    assert scraper.load("gpu") is None


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        LoadScraper(list, interval_s=0)


def test_a_load_is_frozen() -> None:
    load = VllmLoad(running=1, waiting=0, kv_cache_usage=None, ttft_sum_s=None, ttft_count=None, scraped_at=0.0)
    with pytest.raises(AttributeError):
        load.running = 2  # type: ignore[misc]
