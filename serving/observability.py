"""Request ids, structured logs and Prometheus metrics for the server.

Every request gets an ``x-request-id`` (the client's, if it sent a sane one, else a
new one). It is echoed on the response, kept in a context variable for the duration
of the request, and stamped on every log record emitted while handling it.

Log lines cannot be forged by what clients send: the text format escapes control
characters and line separators in every message (a ``model`` of ``"x\nFAKE"`` is
logged as ``x\\nFAKE`` on one line), and the JSON format escapes them inside its strings.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "REQUEST_ID_HEADER",
    "RequestIdMiddleware",
    "ServingMetrics",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "current_request_id",
    "escape_controls",
    "set_run_id",
]

REQUEST_ID_HEADER = "x-request-id"
_UNAUDITED = frozenset({"/healthz", "/readyz", "/ok", "/metrics"})
"""Probes and scrapes: frequent, anonymous, and not decisions worth auditing."""
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("switchyard_request_id", default="-")
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def current_request_id() -> str:
    """The request id of the request being handled (``-`` outside a request)."""
    return _REQUEST_ID.get()


class RequestIdMiddleware:
    """Pure ASGI middleware (no response buffering, so streams and disconnects pass
    through untouched) that assigns the request id and echoes it as a header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if _SANE_ID.match(candidate):
                    request_id = candidate
                break
        if not request_id:
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = _REQUEST_ID.set(request_id)
        header = (b"x-request-id", request_id.encode("latin-1"))
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _REQUEST_ID.reset(token)
            app_state = getattr(scope.get("app"), "state", None)
            metrics: ServingMetrics | None = getattr(app_state, "metrics", None)
            route = getattr(scope.get("route"), "path", "unmatched")
            elapsed = time.perf_counter() - started
            if metrics is not None:
                metrics.requests.labels(scope["method"], route, str(status)).observe(elapsed)
            audit = getattr(app_state, "audit", None)
            if audit is not None and route not in _UNAUDITED:
                principal = scope["state"].get("principal")
                audit.append(
                    "request",
                    request_id=request_id,
                    method=scope["method"],
                    route=route,
                    status=status,
                    tenant=getattr(principal, "tenant", None),
                    key_id=getattr(principal, "key_id", None),
                    ms=round(elapsed * 1000, 1),
                )


_RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("switchyard_run_id", default="-")

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 control characters and Unicode line/paragraph separators: what a log
reader (or ``str.splitlines``) could take for the end of a line."""
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029]")
"""What ``json.dumps(ensure_ascii=False)`` leaves raw but splits lines for some readers."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group(0)
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """``text`` on one line: control characters and line separators as escapes
    (``\\n``, ``\\x1b``, ``\\u2028``)."""
    return _CONTROLS.sub(_escaped, text)


def set_run_id(run_id: str) -> None:
    """Stamp ``run_id`` on the log records of the current task (and tasks it starts)."""
    _RUN_ID.set(run_id)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _REQUEST_ID.get()
        record.run_id = _RUN_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, request and run ids, message,
    and the exception if any, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "run_id": getattr(record, "run_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", json.dumps(entry, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """The text format: a record's first line starts with its time, and nothing a
    client sent can start a line of its own. Control characters in the message are
    escaped (`escape_controls`); a traceback or stack keeps its line breaks, but each
    of its lines is escaped too and indented by two spaces (an exception's message
    may quote a request value)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if "\n" not in text and not _CONTROLS.search(text):
            return text
        first, *rest = text.split("\n")
        return "\n".join([escape_controls(first), *("  " + escape_controls(line) for line in rest)])


def configure_logging(level: str, log_file: str | None = None, *, fmt: str = "text") -> None:
    """Log to stderr and, if given, to a file under the data directory: text lines
    (time, level, logger, [request id], message) or JSON objects (``fmt="json"``),
    each with the request id and the run id."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    formatter: logging.Formatter = (
        JsonFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
    )
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_switchyard", False):
            root.removeHandler(old)
    for handler in handlers:
        handler._switchyard = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class ServingMetrics:
    """The server's Prometheus metrics, in a registry of its own (one per app, so
    several apps in one process, as in tests, do not collide).

    ``kind`` is ``graph`` or ``alias`` (OpenAI endpoint) or ``langgraph`` (LangGraph
    API); ``target`` is the graph id or model alias.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Histogram(
            "switchyard_request_duration_seconds",
            "HTTP requests, from arrival to the last byte of the response.",
            ["method", "route", "status"],
            buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
            registry=self.registry,
        )
        self.runs_in_flight = Gauge(
            "switchyard_runs_in_flight", "Runs being generated now.", registry=self.registry
        )
        self.runs = Counter(
            "switchyard_runs",
            "Finished runs by kind, target, outcome (ok, error, cancelled) and the backend that served "
            "their last model call (none: no model answered).",
            ["kind", "target", "outcome", "backend"], registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "switchyard_time_to_first_token_seconds",
            "From request to the first answer event, by kind, target (the graph id or alias the run served) and "
            "the backend that produced it.",
            ["kind", "target", "backend"],
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "switchyard_output_tokens", "Completion tokens generated, by kind and target.",
            ["kind", "target"], registry=self.registry,
        )
        self.tokens_per_second = Histogram(
            "switchyard_output_tokens_per_second",
            "Completion tokens per second of a run (first token to last).",
            ["kind"],
            buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000),
            registry=self.registry,
        )
        self.rejections = Counter(
            "switchyard_rejections", "Requests refused by a limit (rate, key_runs, server_runs, body_size).",
            ["reason"], registry=self.registry,
        )
        self.tool_calls = Counter(
            "switchyard_tool_calls", "Tool-call attempts by tool and decision (executed, refused, timed_out, failed).",
            ["tool", "decision"], registry=self.registry,
        )
        self.retrieval_hits = Histogram(
            "switchyard_retrieval_hits",
            "Results per knowledge search, by source (vectors: chunks of the knowledge base, any mode; graph: "
            "facts of the knowledge graph's retrieval). The le=\"0.0\" bucket counts searches that found nothing.",
            ["source"],
            buckets=(0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50),
            registry=self.registry,
        )
        for source in ("vectors", "graph"):
            # Exported (at zero) before the first search: the empty-search share reads
            # 0/0, not "no data", and the dashboard's series exist from the start.
            self.retrieval_hits.labels(source)
        self.output_checks = Counter(
            "switchyard_output_checks", "Answers changed by the output check, by kind and action (redacted, blocked).",
            ["kind", "action"], registry=self.registry,
        )
        self.backend_errors = Counter(
            "switchyard_backend_errors", "Failed calls to model backends, by backend and error.",
            ["backend", "error"], registry=self.registry,
        )
        self.rate_limit_store_errors = Counter(
            "switchyard_rate_limit_store_errors",
            "Rate-limit checks the shared store (Redis) failed or was too slow to answer; "
            "the limiter fell back to this replica's own buckets.",
            registry=self.registry,
        )
        self.replica_runs_reaped = Counter(
            "switchyard_replica_runs_reaped",
            "Runs of replicas whose lease expired (dead replicas) ended by this replica.",
            registry=self.registry,
        )
        self.audit_head = Gauge(
            "switchyard_audit_head_seq",
            "Sequence number of the audit log's last record (its hash is in the server log).",
            registry=self.registry,
        )

    def observe_retrieval(self, collection: str, source: str, hits: int) -> None:
        """A `knowledge.SearchObserver`: one search's number of results. The collection
        is not a label: tenants name collections (an upload creates one), so its values
        are not bounded."""
        self.retrieval_hits.labels(source).observe(hits)

    def watch_gateway(
        self, gateway: Any, reloads: Callable[[], Mapping[str, int]] | None = None, scraper: Any = None
    ) -> None:
        """Export the gateway's state at each scrape: breakers, retries, who served,
        registry reloads, and the vLLM backends' load (`GatewayCollector`)."""
        self.registry.register(GatewayCollector(gateway, reloads, scraper))


_BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class GatewayCollector(Collector):
    """The model gateway's counters and states, read when Prometheus scrapes."""

    def __init__(self, gateway: Any, reloads: Callable[[], Mapping[str, int]] | None = None, scraper: Any = None) -> None:
        self._gateway = gateway
        self._reloads = reloads
        self._scraper = scraper

    def describe(self) -> list[Metric]:
        return []  # collected fresh each scrape (backends come and go with reloads)

    def collect(self) -> Iterator[Metric]:
        gateway = self._gateway
        state = GaugeMetricFamily(
            "switchyard_backend_breaker_state",
            "Circuit breaker of each backend: 0 closed, 1 half-open (one probe request), 2 open (no traffic).",
            labels=["backend"],
        )
        states = gateway.breakers.states()
        for backend_id in gateway.registry.backends:
            state.add_metric([backend_id], _BREAKER_VALUE[states.get(backend_id, "closed")])
        yield state
        transitions = CounterMetricFamily(
            "switchyard_backend_breaker_transitions",
            "Circuit breaker transitions, by backend and the state entered.",
            labels=["backend", "state"],
        )
        for (backend_id, entered), count in sorted(gateway.breakers.transitions.items()):
            transitions.add_metric([backend_id, entered], count)
        yield transitions
        retries = CounterMetricFamily(
            "switchyard_gateway_retries",
            "Model calls passed on to the next backend after a failure before the first token, by alias and the backend that failed.",
            labels=["alias", "backend"],
        )
        for (alias, backend_id), count in sorted(gateway.retries.items()):
            retries.add_metric([alias, backend_id], count)
        yield retries
        served = CounterMetricFamily(
            "switchyard_gateway_served",
            "Model calls answered (a first token or a whole answer), by alias and backend.",
            labels=["alias", "backend"],
        )
        for (alias, backend_id), count in sorted(gateway.served.items()):
            served.add_metric([alias, backend_id], count)
        yield served
        if self._scraper is not None:
            yield from self._vllm(self._scraper)
        if self._reloads is not None:
            reloads = CounterMetricFamily(
                "switchyard_model_registry_reloads", "Model registry reloads by outcome (ok, refused).", labels=["outcome"]
            )
            for outcome, count in sorted(self._reloads().items()):
                reloads.add_metric([outcome], count)
            yield reloads

    @staticmethod
    def _vllm(scraper: Any) -> Iterator[Metric]:
        """The last fresh ``/metrics`` scrape of each vLLM backend, and failed scrapes."""
        families = {
            "running": GaugeMetricFamily(
                "switchyard_backend_running_requests", "Requests a vLLM backend is generating (its last scrape).", labels=["backend"]
            ),
            "waiting": GaugeMetricFamily(
                "switchyard_backend_waiting_requests", "Requests queued in a vLLM backend (its last scrape).", labels=["backend"]
            ),
            "kv_cache_usage": GaugeMetricFamily(
                "switchyard_backend_kv_cache_usage", "KV-cache share in use on a vLLM backend, 0 to 1 (its last scrape).", labels=["backend"]
            ),
            "ttft_mean_s": GaugeMetricFamily(
                "switchyard_backend_time_to_first_token_mean_seconds",
                "Mean time to first token a vLLM backend reports between its last two scrapes.",
                labels=["backend"],
            ),
        }
        for backend_id, load in sorted(scraper.snapshot().items()):
            for field, family in families.items():
                value = getattr(load, field)
                if value is not None:
                    family.add_metric([backend_id], float(value))
        yield from families.values()
        failures = CounterMetricFamily(
            "switchyard_backend_scrape_failures", "Failed /metrics scrapes of vLLM backends.", labels=["backend"]
        )
        for backend_id, count in sorted(scraper.failures.items()):
            failures.add_metric([backend_id], count)
        yield failures
