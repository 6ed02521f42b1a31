"""How loaded each vLLM backend is, read from its Prometheus ``/metrics``.

vLLM exports its scheduler's state on ``GET /metrics`` (Prometheus text, one sample
per engine of a data-parallel server)::

    vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct-AWQ"} 3.0
    vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct-AWQ"} 1.0
    vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct-AWQ"} 0.41
    vllm:time_to_first_token_seconds_sum{...} 12.08
    vllm:time_to_first_token_seconds_count{...} 40.0

`parse_vllm_metrics` turns one such body into a `VllmLoad`; `LoadScraper` scrapes
every ``kind: vllm`` backend of the registry on an interval in one background task,
keeps the last good load of each, and forgets it when it is too old to steer traffic
(`STALE_AFTER_INTERVALS`). ``balance: least_loaded`` compares `load_score`.

Metric names are vLLM's own (``vllm/v1/metrics/loggers.py``; V0 in
``vllm/engine/metrics.py``). vLLM 0.9 renamed ``vllm:gpu_cache_usage_perc`` to
``vllm:kv_cache_usage_perc`` and 0.10 hides the old name; both are read, the new
one first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.errors import GatewayError
from gateway.registry import Backend, VllmLaunch

__all__ = [
    "STALE_AFTER_INTERVALS",
    "LoadScraper",
    "VllmLoad",
    "VllmMetricsError",
    "load_score",
    "parse_vllm_metrics",
]

logger = logging.getLogger(__name__)

STALE_AFTER_INTERVALS = 3
"""A load older than this many scrape intervals is no load at all: a backend whose
``/metrics`` stopped answering may be down or overloaded, and its last numbers (often
"idle") must not keep drawing traffic to it."""

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_CACHE = "vllm:kv_cache_usage_perc"
_KV_CACHE_OLD = "vllm:gpu_cache_usage_perc"  # vLLM < 0.9 (deprecated in 0.9, hidden in 0.10)
_TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
_TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
_WANTED = frozenset({_RUNNING, _WAITING, _KV_CACHE, _KV_CACHE_OLD, _TTFT_SUM, _TTFT_COUNT})

# vLLM's body is about 75 kB per engine; anything far larger is not vLLM's /metrics.
_MAX_BODY_BYTES = 8 * 1024 * 1024


class VllmMetricsError(GatewayError):
    """A ``/metrics`` body that is not Prometheus text (an HTML error page, JSON...).

    Attributes:
        reason: what the Prometheus parser objected to.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"not Prometheus text: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmLoad:
    """One backend's load at one scrape, summed over its engines.

    A metric the server did not export is ``None`` (an older vLLM, or an engine that
    has not started yet), never an error and never a guessed zero.
    """

    running: int | None
    """Requests in the running batch (``vllm:num_requests_running``), all engines."""
    waiting: int | None
    """Requests queued for a batch slot (``vllm:num_requests_waiting``), all engines."""
    kv_cache_usage: float | None
    """KV-cache use from 0 to 1 (``vllm:kv_cache_usage_perc``, before vLLM 0.9
    ``vllm:gpu_cache_usage_perc``). With several engines, their mean: each engine
    has its own cache of the same size, so the mean is the share of all of it in use."""
    ttft_sum_s: float | None
    """Seconds to first token summed over every request since vLLM started
    (``vllm:time_to_first_token_seconds_sum``): a counter, useful as a delta."""
    ttft_count: int | None
    """Requests that got their first token since vLLM started
    (``vllm:time_to_first_token_seconds_count``)."""
    scraped_at: float
    """``time.monotonic()`` when the body was received (the scraper's clock)."""
    ttft_mean_s: float | None = None
    """Mean time to first token of the requests that got one since the previous
    good scrape of this backend (the histogram's sum and count deltas). ``None``
    from `parse_vllm_metrics` alone, after the first scrape, when no request got
    its first token in between, and when the counters went down (vLLM restarted)."""


def load_score(load: VllmLoad) -> float:
    """The number ``balance: least_loaded`` compares: running plus waiting requests.

    Lower is less loaded. Both count what the backend must finish before a new
    request's first token; KV-cache usage is not added because a full cache shows up
    as waiting requests anyway. A metric the server did not export counts as 0, so
    callers should only compare backends with a current load (`LoadScraper.load`
    is ``None`` for the others).
    """
    return float((load.running or 0) + (load.waiting or 0))


def parse_vllm_metrics(text: str, *, model_name: str | None = None, scraped_at: float | None = None) -> VllmLoad:
    """Read one vLLM ``/metrics`` body.

    Every label set of a metric is summed (one per engine of a data-parallel server),
    except KV-cache usage, which is averaged (see `VllmLoad.kv_cache_usage`). Other
    metrics (``process_*``, ``python_gc_*``, the ``_created`` timestamps, other
    histograms) are ignored; samples that are NaN or infinite are skipped.

    Args:
        text: the body, Prometheus text exposition format.
        model_name: keep only samples whose ``model_name`` label equals this (the
            served model name); samples without the label are kept. ``None``: all.
        scraped_at: the monotonic time to record; default ``time.monotonic()``.

    Returns:
        The load; metrics the body lacks are ``None``.

    Raises:
        VllmMetricsError: ``text`` is not Prometheus text.
    """
    values: dict[str, list[float]] = {name: [] for name in _WANTED}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in _WANTED or not math.isfinite(sample.value):
                    continue
                if model_name is not None and sample.labels.get("model_name", model_name) != model_name:
                    continue
                values[sample.name].append(sample.value)
    except ValueError as exc:  # the parser's only error for malformed text
        # It quotes the offending line, which can be a whole one-line HTML page.
        raise VllmMetricsError(str(exc)[:200] or "malformed line") from None

    def total(name: str) -> float | None:
        return math.fsum(values[name]) if values[name] else None

    def count(name: str) -> int | None:
        value = total(name)
        return None if value is None else round(value)

    kv_samples = values[_KV_CACHE] or values[_KV_CACHE_OLD]
    return VllmLoad(
        running=count(_RUNNING),
        waiting=count(_WAITING),
        kv_cache_usage=math.fsum(kv_samples) / len(kv_samples) if kv_samples else None,
        ttft_sum_s=total(_TTFT_SUM),
        ttft_count=count(_TTFT_COUNT),
        scraped_at=time.monotonic() if scraped_at is None else scraped_at,
    )


def _ttft_mean(previous: VllmLoad | None, current: VllmLoad) -> float | None:
    if (
        previous is None
        or previous.ttft_sum_s is None
        or previous.ttft_count is None
        or current.ttft_sum_s is None
        or current.ttft_count is None
    ):
        return None
    requests = current.ttft_count - previous.ttft_count
    seconds = current.ttft_sum_s - previous.ttft_sum_s
    if requests <= 0 or seconds < 0:  # nothing new, or the counters restarted
        return None
    return seconds / requests


def _served_name(backend: Backend) -> str:
    # vLLM labels its metrics with --served-model-name, which `vllm_serve_command`
    # takes from the launch block or, by default, the backend's model.
    if isinstance(backend.launch, VllmLaunch) and backend.launch.served_model_name:
        return backend.launch.served_model_name
    return backend.model


class _ScrapeFailure(Exception):
    """One scrape failed; ``kind`` is the state logged once, ``detail`` the log line."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(detail)


@dataclass(slots=True)
class _BackendState:
    url: str
    load: VllmLoad | None = None
    failure: str | None = None
    """The kind of the current failure, ``None`` while scrapes succeed."""
    failure_detail: str | None = None
    failures: int = 0


class LoadScraper:
    """Scrapes every ``kind: vllm`` backend's ``/metrics`` on an interval.

    One asyncio task scrapes all current backends concurrently, then sleeps until
    the next interval. A failed scrape (refused, timeout, non-200 answer, a body that
    is not Prometheus text) never leaves the loop: it is counted in `failures`,
    logged once when a backend's failure changes (and once when it recovers), and
    the backend's last good load is kept until it is `STALE_AFTER_INTERVALS`
    intervals old, after which `load` answers ``None``.

    The backend list is asked for on every round, so a reloaded registry takes
    effect at the next scrape; backends that left it are forgotten.

    Use as ``async with LoadScraper(...) as scraper:``, or call `start` and
    `aclose`.
    """

    def __init__(
        self,
        backends: Callable[[], Iterable[Backend]],
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        match_model_name: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args:
            backends: returns the backends to consider now (e.g. the current
                registry's); only ``kind == "vllm"`` ones are scraped, at
                ``root_url + "/metrics"``, with ``Authorization: Bearer <key>``
                when the backend has ``api_key_env``.
            interval_s: time between the starts of two scrape rounds.
            timeout_s: limit for one backend's whole answer.
            match_model_name: count only samples labelled with the backend's served
                model name (for a server or proxy that exports several models).
                Off by default: one vLLM process serves one model, and a name that
                differs only in spelling would hide every metric.
            clock: monotonic seconds, for ``scraped_at`` and staleness (tests
                replace it).

        Raises:
            ValueError: ``interval_s`` or ``timeout_s`` is not positive.
        """
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s} and {timeout_s}")
        self._backends = backends
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._match_model_name = match_model_name
        self._clock = clock
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._states: dict[str, _BackendState] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the background task (its first round begins at once).

        Raises:
            RuntimeError: already started, or closed.
        """
        if self._closed:
            raise RuntimeError("this LoadScraper is closed")
        if self._task is not None:
            raise RuntimeError("this LoadScraper is already started")
        self._task = asyncio.create_task(self._run(), name="vllm-metrics-scraper")

    async def aclose(self) -> None:
        """Stop the task (waiting for it to end) and close the HTTP client. Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    # Our own cancel ends the task; a cancel of the caller goes on.
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
        finally:
            await self._client.aclose()

    def load(self, backend_id: str) -> VllmLoad | None:
        """The backend's current load: ``None`` if it was never scraped successfully,
        is not a scraped backend, or its last good scrape is older than
        `STALE_AFTER_INTERVALS` intervals."""
        state = self._states.get(backend_id)
        if state is None or state.load is None:
            return None
        if self._clock() - state.load.scraped_at > STALE_AFTER_INTERVALS * self.interval_s:
            return None
        return state.load

    def snapshot(self) -> dict[str, VllmLoad]:
        """Every backend's current load (as `load`: stale ones are left out), by id:
        what the metrics export reads."""
        loads = {backend_id: self.load(backend_id) for backend_id in self._states}
        return {backend_id: load for backend_id, load in loads.items() if load is not None}

    @property
    def failures(self) -> Mapping[str, int]:
        """Failed scrapes per backend id since it was first scraped at its current URL
        (a counter)."""
        return {backend_id: state.failures for backend_id, state in self._states.items()}

    def failure(self, backend_id: str) -> str | None:
        """Why the backend's last scrape failed (with its URL, for the operator), or
        ``None`` if it succeeded or never ran."""
        state = self._states.get(backend_id)
        return None if state is None else state.failure_detail

    async def scrape_once(self) -> None:
        """Scrape every current vLLM backend once, concurrently; a failed backend is
        recorded, not raised. Backends no longer listed are forgotten.

        Raises:
            Exception: whatever the ``backends`` callable raised.
        """
        backends = {backend.id: backend for backend in self._backends() if backend.kind == "vllm"}
        for gone in self._states.keys() - backends.keys():
            del self._states[gone]
        await asyncio.gather(*(self._scrape(backend) for backend in backends.values()))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.scrape_once()
            except Exception:  # the loop's boundary: a bad round must not end scraping
                logger.exception("vLLM metrics scrape round failed")
            await asyncio.sleep(max(0.0, started + self.interval_s - loop.time()))

    async def _scrape(self, backend: Backend) -> None:
        url = f"{backend.root_url}/metrics"
        state = self._states.get(backend.id)
        if state is None or state.url != url:  # new, or moved by a reload: start afresh
            state = self._states[backend.id] = _BackendState(url=url)
        try:
            text = await self._fetch(backend, url)
            scraped_at = self._clock()
            model_name = _served_name(backend) if self._match_model_name else None
            # ~10 ms of parsing for a two-engine body: kept off the event loop.
            try:
                load = await asyncio.to_thread(parse_vllm_metrics, text, model_name=model_name, scraped_at=scraped_at)
            except VllmMetricsError as exc:
                raise _ScrapeFailure("unparseable", f"{url} answered {exc}") from None
        except _ScrapeFailure as exc:
            self._failed(backend.id, state, exc.kind, exc.detail)
            return
        except Exception as exc:  # per-backend boundary: one backend cannot stop the others
            self._failed(backend.id, state, "error", f"{url}: {exc.__class__.__name__}: {exc}", exc)
            return
        state.load = dataclasses.replace(load, ttft_mean_s=_ttft_mean(state.load, load))
        if state.failure is not None:
            logger.info("vLLM metrics of backend %r readable again at %s", backend.id, url)
        state.failure = state.failure_detail = None

    async def _fetch(self, backend: Backend, url: str) -> str:
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key_env else {}
        try:
            async with asyncio.timeout(self.timeout_s):  # the whole answer, not each read
                async with self._client.stream("GET", url, headers=headers) as response:
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > _MAX_BODY_BYTES:
                            raise _ScrapeFailure("too large", f"{url} answered more than {_MAX_BODY_BYTES} bytes")
        except (TimeoutError, httpx.TimeoutException):
            raise _ScrapeFailure("timeout", f"no answer from {url} in {self.timeout_s:g}s") from None
        except httpx.HTTPError as exc:
            name = exc.__class__.__name__
            raise _ScrapeFailure(f"unreachable: {name}", f"cannot reach {url}: {name}") from None
        text = body.decode("utf-8", errors="replace")
        if response.status_code != 200:
            detail = " ".join(text[:200].split())
            raise _ScrapeFailure(
                f"status {response.status_code}", f"{url} answered {response.status_code} {detail}".strip()
            )
        return text

    def _failed(
        self, backend_id: str, state: _BackendState, kind: str, detail: str, error: Exception | None = None
    ) -> None:
        state.failures += 1
        state.failure_detail = detail
        if state.failure != kind:  # once per change, not once per interval
            logger.warning(
                "vLLM metrics of backend %r unavailable: %s (its last load counts until it is %g s old)",
                backend_id, detail, STALE_AFTER_INTERVALS * self.interval_s, exc_info=error,
            )  # fmt: skip
        state.failure = kind
