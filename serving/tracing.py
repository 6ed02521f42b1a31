"""OpenTelemetry tracing: a span per HTTP request, per run, per graph node, per model
call and per tool call, exported over OTLP/HTTP when ``tracing.otlp_endpoint`` is set.

Off by default, and then free: `open_tracing` returns `NO_TRACING`, whose runs carry
no callbacks, no middleware is installed and the OpenTelemetry SDK is never imported.

When on:

- `TracingMiddleware` opens a ``SERVER`` span per request (probes and scrapes
  excepted), continuing the caller's trace from its W3C ``traceparent`` header, and
  makes it the current context for the request's task and the tasks it starts (a
  background run's span is a child of the request that started it).
- `Tracing.start_run` opens the run's span (``run <target>``) under it; the run's
  `RunSpan.callbacks` go into the graph's config, and `_GraphSpans` turns LangChain's
  callback events into child spans: ``node <name>`` for each LangGraph node,
  ``chat <model>`` for each model call (``CLIENT``, with the GenAI semantic
  conventions' request and usage attributes), ``tool <name>`` and
  ``retrieve <name>``. LangChain's internal runnables get no span: their children
  attach to the nearest span above them.
- `RunSpan.end` closes whatever the run left open (a cancelled run's node and model
  spans end with an error status), so spans never leak.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from serving.settings import TracingSettings

__all__ = ["NO_TRACING", "NoTracing", "RunSpan", "Tracing", "TracingMiddleware", "open_tracing"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

_UNTRACED = frozenset({"/healthz", "/readyz", "/ok", "/metrics"})


class RunSpan:
    """One run's span. The no-op base is what runs get when tracing is off."""

    callbacks: list[BaseCallbackHandler] = []
    """Handlers for the graph's ``config["callbacks"]`` (none when off)."""

    def set(self, **attributes: Any) -> None:
        """Add attributes (``None`` values are skipped)."""

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        """End the span with the run's outcome (``ok``, ``error``, ``cancelled``)."""


class NoTracing:
    enabled = False
    _OFF = RunSpan()

    def start_run(self, kind: str, target: str, **attributes: Any) -> RunSpan:
        return self._OFF

    def shutdown(self) -> None:
        pass


NO_TRACING = NoTracing()


def open_tracing(settings: TracingSettings) -> Tracing | NoTracing:
    """`Tracing` exporting to ``settings.otlp_endpoint``, or `NO_TRACING` without one."""
    if not settings.otlp_endpoint:
        return NO_TRACING
    return Tracing(settings)


class Tracing:
    """The tracer provider, its OTLP exporter and the run spans."""

    enabled = True

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        assert settings.otlp_endpoint
        endpoint = settings.otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        self.endpoint = endpoint
        # A provider of our own, not the global one: two apps in one process (tests)
        # keep their exporters apart, and nothing else in the process is affected.
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(settings.headers), timeout=settings.export_timeout_s)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer: Tracer = self._provider.get_tracer("switchyard")
        log.info("tracing: exporting spans over OTLP/HTTP to %s", endpoint)

    def start_run(self, kind: str, target: str, **attributes: Any) -> RunSpan:
        """Open a run's span, a child of the current context (the request's span)."""
        return _LiveRunSpan(self.tracer, kind, target, attributes)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (server shutdown)."""
        self._provider.shutdown()


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, (str, bool, int, float)) else str(value)
    return out


class _LiveRunSpan(RunSpan):
    def __init__(self, tracer: Tracer, kind: str, target: str, attributes: Mapping[str, Any]) -> None:
        from opentelemetry import trace

        self._span = tracer.start_span(
            f"run {target}",
            attributes=_clean({"switchyard.run.kind": kind, "switchyard.run.target": target, **attributes}),
        )
        self._graph = _GraphSpans(tracer, trace.set_span_in_context(self._span))
        self.callbacks = [self._graph]

    def set(self, **attributes: Any) -> None:
        self._span.set_attributes(_clean(attributes))

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._graph.close_all(outcome)
        self._span.set_attribute("switchyard.run.outcome", outcome)
        if error is not None and isinstance(error, Exception):
            self._span.record_exception(error)
        if outcome != "ok":
            self._span.set_status(Status(StatusCode.ERROR, outcome))
        self._span.end()


class _GraphSpans(BaseCallbackHandler):
    """LangChain callback events of one run, as spans under the run's span."""

    run_inline = True  # called in the event loop, in order; no thread pool hop

    def __init__(self, tracer: Tracer, root: Any) -> None:
        self._tracer = tracer
        self._root = root  # the run span's context
        self._open: dict[UUID, Span] = {}
        self._parents: dict[UUID, Any] = {}
        """Every live LangChain run id -> the context its children's spans go under."""

    # ---- bookkeeping ---------------------------------------------------------------

    def _parent(self, parent_run_id: UUID | None) -> Any:
        if parent_run_id is None:
            return self._root
        return self._parents.get(parent_run_id, self._root)

    def _start(self, run_id: UUID, parent_run_id: UUID | None, name: str, kind: Any, attributes: Mapping[str, Any]) -> None:
        from opentelemetry import trace

        span = self._tracer.start_span(name, context=self._parent(parent_run_id), kind=kind, attributes=_clean(attributes))
        self._open[run_id] = span
        self._parents[run_id] = trace.set_span_in_context(span)

    def _pass_through(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        self._parents[run_id] = self._parent(parent_run_id)

    def _end(self, run_id: UUID, error: BaseException | None = None, **attributes: Any) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._parents.pop(run_id, None)
        span = self._open.pop(run_id, None)
        if span is None:
            return
        if attributes:
            span.set_attributes(_clean(attributes))
        if error is not None:
            if isinstance(error, Exception):
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()

    def close_all(self, outcome: str) -> None:
        """End the spans the run left open (it was cancelled or failed mid-node)."""
        from opentelemetry.trace import Status, StatusCode

        for span in reversed(list(self._open.values())):
            span.set_status(Status(StatusCode.ERROR, f"run ended: {outcome}"))
            span.end()
        self._open.clear()
        self._parents.clear()

    # ---- chains: graph nodes -------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from opentelemetry.trace import SpanKind

        name = kwargs.get("name") or (serialized or {}).get("name")
        node = (metadata or {}).get("langgraph_node")
        if node is not None and name == node and parent_run_id is not None:
            attributes = {
                "langgraph.node": node,
                "langgraph.step": (metadata or {}).get("langgraph_step"),
                "langgraph.checkpoint_ns": (metadata or {}).get("langgraph_checkpoint_ns"),
            }
            self._start(run_id, parent_run_id, f"node {node}", SpanKind.INTERNAL, attributes)
        else:
            self._pass_through(run_id, parent_run_id)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        from langgraph.errors import GraphBubbleUp

        # An interrupt travels as an exception; it is a pause, not a failure.
        self._end(run_id, None if isinstance(error, GraphBubbleUp) else error)

    # ---- model calls -----------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(run_id, parent_run_id, metadata, kwargs.get("invocation_params") or {})

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(run_id, parent_run_id, metadata, kwargs.get("invocation_params") or {})

    def _model_start(
        self, run_id: UUID, parent_run_id: UUID | None, metadata: Mapping[str, Any] | None, params: Mapping[str, Any]
    ) -> None:
        from opentelemetry.trace import SpanKind

        meta = metadata or {}
        model = meta.get("ls_model_name") or params.get("model") or "model"
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": meta.get("ls_provider"),
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": meta.get("ls_max_tokens") or params.get("max_tokens"),
            "gen_ai.request.temperature": meta.get("ls_temperature") or params.get("temperature"),
        }
        self._start(run_id, parent_run_id, f"chat {model}", SpanKind.CLIENT, attributes)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        usage: Mapping[str, Any] = {}
        finish = None
        generations = getattr(response, "generations", None) or []
        if generations and generations[0]:
            first = generations[0][0]
            message = getattr(first, "message", None)
            usage = getattr(message, "usage_metadata", None) or {}
            info = getattr(first, "generation_info", None) or {}
            finish = info.get("finish_reason") or (getattr(message, "response_metadata", None) or {}).get("finish_reason")
        self._end(
            run_id,
            **{
                "gen_ai.usage.input_tokens": usage.get("input_tokens"),
                "gen_ai.usage.output_tokens": usage.get("output_tokens"),
                "gen_ai.response.finish_reasons": finish,
            },
        )

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error)

    # ---- tools and retrievers ------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        from opentelemetry.trace import SpanKind

        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        self._start(run_id, parent_run_id, f"tool {name}", SpanKind.INTERNAL, {"gen_ai.tool.name": name})

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error)

    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        from opentelemetry.trace import SpanKind

        name = kwargs.get("name") or (serialized or {}).get("name") or "retriever"
        self._start(run_id, parent_run_id, f"retrieve {name}", SpanKind.INTERNAL, {})

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, **{"switchyard.retrieval.documents": len(documents or ())})

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error)


class TracingMiddleware:
    """Pure ASGI middleware: a ``SERVER`` span per request, continuing the caller's
    W3C trace context, current for the request's task while the app handles it."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app = app
        self._tracer = tracing.tracer
        self._propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _UNTRACED:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in (b"traceparent", b"tracestate")}
        parent = self._propagator.extract(carrier)
        method = scope["method"]
        span = self._tracer.start_span(
            f"{method} {scope['path']}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        )
        request_id = scope.get("state", {}).get("request_id")
        if request_id:
            span.set_attribute("switchyard.request_id", request_id)
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        token = context.attach(trace.set_span_in_context(span, parent))
        try:
            await self.app(scope, receive, send_status)
        finally:
            context.detach(token)
            route = getattr(scope.get("route"), "path", None)
            if route:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            span.set_attribute("switchyard.duration_ms", round((time.perf_counter() - started) * 1000, 1))
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
