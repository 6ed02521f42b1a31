"""The run host: one run's lifecycle, the same for both protocols.

A protocol service (OpenAI chat completions, the LangGraph Server API) checks its
request (`serving.runs.checks`), describes the run as a `RunPlan`, and runs it inside
``async with host.open(plan) as run``. Everything a run takes is taken inside that
block's exit stack, each piece registered for release the moment it is taken:

- the multitask strategy applied to the thread's run in progress (LangGraph),
- a run slot (per key and per server: 429 past either),
- the run record, so other requests can cancel or join it,
- the span, the in-flight gauge, the ``run`` audit record and the run metrics,
- the thread's ``busy`` status and its final status (``idle``, ``interrupted``,
  ``error``), written even when the run is cancelled while it ends,
- the run context: request id, tenant lists, output policy, tool audit sink, and the
  run's `graphs.RunBudget`, which the server counts and a client cannot write.

A cancellation at any await point (client gone, deadline, ``POST .../cancel``, server
shutdown) unwinds that stack: nothing stays held. The services only translate
requests in and events out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from gateway import ROUTE_SCOPE, BackendResponseError, BackendUnavailableError, RouteScope
from graphs import OutputBlockedError, OutputPolicy, RunBudget, RunContext
from serving._tasks import RunCancelledError, RunDeadlineError, RunGuard, guarded
from serving.audit import AuditLog, tool_call_sink
from serving.auth import Principal
from serving.errors import ServingError
from serving.guardrails import Guardrails, OutputGuard
from serving.limits import RunSlots
from serving.observability import ServingMetrics, set_run_id
from serving.runs.registry import RunRecord, RunRegistry, RunStatus
from serving.threads import ThreadStatus, ThreadStore
from serving.tracing import NO_TRACING, NoTracing, RunSpan, Tracing

__all__ = ["ActiveRun", "BACKEND_HEADER", "RunHook", "RunHost", "RunPlan", "STAGES", "served_by"]

BACKEND_HEADER = "x-switchyard-backend"
"""The response header naming the backend that produced an answer's tokens."""
ROUTE_HEADER = "x-switchyard-route"
"""The response header naming the route that chose a ``model: auto`` request's graph."""


def served_by(routing: RouteScope) -> dict[str, str]:
    """The response headers naming who served a run: its backend (once a model
    answered) and the route that chose its graph (if one did)."""
    headers = {BACKEND_HEADER: routing.backend} if routing.backend else {}
    if routing.route:
        headers[ROUTE_HEADER] = routing.route
    return headers

log = logging.getLogger(__name__)

T = TypeVar("T")

RunHook = Callable[[str], Awaitable[None]]
"""Awaited at each of `STAGES` (tests inject cancellations there)."""

STAGES = ("make_way", "acquired", "admitted", "thread_busy", "running", "streamed", "ending")
"""The await points of a run's set-up and tear-down, in order."""

Outcome = Literal["ok", "blocked", "error", "cancelled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """What the host needs to run one checked request."""

    protocol: Literal["openai", "langgraph"]
    kind: Literal["graph", "alias"]
    target: str
    """The graph id or model alias."""
    principal: Principal
    request_id: str
    run_id: str
    deadline_s: float | None = None
    model_params: Mapping[str, Any] = field(default_factory=dict)
    """Checked sampling parameters, bound onto the graph's model calls."""
    collection: str | None = None
    thread_id: str | None = None
    """The thread the run keeps its state on (``busy`` while it runs); None for a
    run whose state is not kept."""
    thread_metadata: Mapping[str, Any] | None = None
    """Merged into the thread's metadata when the run starts."""
    thread_status: Callable[[], Awaitable[ThreadStatus]] | None = None
    """Reads the thread's status from its checkpoint (``interrupted`` or ``idle``), for
    a run that ends without saying (cancelled, deadline)."""
    record: RunRecord | None = None
    """The run's record (LangGraph API): registered when the run starts (after the
    multitask strategy has made way), finished when it ends."""
    approvals: bool = False
    """Whether the run can pause for a person's approval (a kept thread can)."""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    """More span attributes."""
    routing: RouteScope | None = None
    """The run's routing, when the caller wants to read it (the backend that served,
    for a response header); default: one keyed by the thread id, else the request id."""


class ActiveRun:
    """A run in progress, as the protocol service sees it."""

    def __init__(self, plan: RunPlan, host: RunHost, span: RunSpan, guard: OutputGuard) -> None:
        self.plan = plan
        self.span = span
        self.guard = guard
        """The output check on the wire (the graph's nodes get its policy)."""
        self.budget = RunBudget()
        self.started = time.perf_counter()
        self.first_at = 0.0
        self._ttft_counted = False
        self.tokens = 0
        """Completion tokens, when the protocol counts them."""
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.thread_status: ThreadStatus | None = None
        """Set by the service when the run ends normally; else read at the end."""
        self.run_status: RunStatus = "error"
        self.refused = False
        """Refused by another replica's run on its thread before it started: it leaves
        no record, audit record or run metric (as a refusal on this replica)."""
        self._host = host
        self._stop = plan.record.guard if plan.record is not None else RunGuard()
        self.routing = plan.routing or RouteScope(key=plan.thread_id or plan.request_id)
        """Which backend the gateway picks for the run's model calls (sticky on the
        thread, else the request), and which ones served it."""

    @property
    def metric_kind(self) -> str:
        return "langgraph" if self.plan.protocol == "langgraph" else self.plan.kind

    def config(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """``config`` (a LangChain run config) with the run's routing in
        ``configurable``, where the gateway's routed chat model finds it."""
        config = dict(config or {})
        config["configurable"] = {**(config.get("configurable") or {}), ROUTE_SCOPE: self.routing}
        return config

    def context(self) -> RunContext:
        """The graph's run context: per-request facts, server-set lists and budget."""
        plan, principal = self.plan, self.plan.principal
        host = self._host
        return RunContext(
            request_id=plan.request_id,
            model_params=dict(plan.model_params),
            collection=plan.collection,
            tenant=principal.tenant,
            allowed_collections=tuple(principal.settings.collections),
            allowed_tools=tuple(principal.settings.tools),
            approvals=plan.approvals,
            on_tool_call=tool_call_sink(
                host.audit, host.metrics.tool_calls, request_id=plan.request_id, graph=plan.target,
                tenant=principal.tenant, key_id=principal.key_id, run_id=plan.run_id,
            ),
            output_policy=self.guard.policy,
            budget=self.budget,
        )

    def events(self, source: AsyncIterator[T]) -> AsyncIterator[T]:
        """``source``, stopped by the run's deadline (counted from here: set-up takes
        milliseconds) or a cancel (`RunDeadlineError`, `RunCancelledError`)."""
        return guarded(source, self._stop, self.plan.deadline_s)

    async def stage(self, name: str) -> None:
        """A named await point of the service's inside the run (`STAGES`)."""
        await self._host.at(name)

    def token(self) -> None:
        """The first token was sent (time to first token)."""
        if not self.first_at:
            self.first_at = time.perf_counter()
            if self.routing.backend is not None:
                self._count_first_token()
            # Else the first payload went out before any model answered (a retrieval
            # graph's citations): timed now, counted when the run ends, under the
            # backend that served it.

    def _count_first_token(self) -> None:
        """Count the run's time to first token (once), under the backend that served
        it so far (``none``: no model answered)."""
        if self.first_at and not self._ttft_counted:
            self._ttft_counted = True
            # The target is a configured graph id or alias (unknown models are
            # refused before a run opens; `model: auto` runs as the graph it chose).
            self._host.metrics.time_to_first_token.labels(
                self.metric_kind, self.plan.target, self.routing.backend or "none"
            ).observe(self.first_at - self.started)

    def fail(self, error: BaseException) -> None:
        """The run failed; the service reports it in-band (the block exits normally)."""
        self.outcome, self.error, self.thread_status, self.run_status = "error", error, "error", "error"
        self._host.count_backend_error(error)

    def blocked(self) -> None:
        """The output check stopped the answer."""
        self.outcome, self.run_status = "blocked", "error"

    def _ended_by(self, exc: BaseException) -> None:
        if self.outcome is not None:
            return  # failed or blocked already, then closed while reporting it
        if isinstance(exc, OutputBlockedError):
            self.blocked()
        elif isinstance(exc, RunDeadlineError):
            self.outcome, self.run_status = "cancelled", "timeout"
        elif isinstance(exc, RunCancelledError) or not isinstance(exc, Exception):
            self.outcome, self.run_status = "cancelled", "interrupted"
        else:
            self.fail(exc)
        self.error = self.error or exc

    def _ended(self) -> None:
        if self.outcome is None and self.guard.blocked:
            self.blocked()
        elif self.outcome is None:
            self.outcome, self.run_status = "ok", "success"


class RunHost:
    """Runs' set-up and tear-down; see the module docstring."""

    def __init__(
        self,
        *,
        threads: ThreadStore | None,
        slots: RunSlots,
        metrics: ServingMetrics,
        audit: AuditLog,
        guardrails: Guardrails,
        tracing: Tracing | NoTracing = NO_TRACING,
        runs: RunRegistry | None = None,
        hook: RunHook | None = None,
    ) -> None:
        self.threads = threads
        self.slots = slots
        self.metrics = metrics
        self.audit = audit
        self.runs = runs or RunRegistry()
        self._guardrails = guardrails
        self._tracing = tracing
        self._hook = hook
        self._settling: set[asyncio.Task[None]] = set()

    def output_policy(self, principal: Principal) -> OutputPolicy | None:
        """The caller's output policy (for reads of stored state; runs get theirs in
        `ActiveRun.guard`)."""
        return self._guardrails.output_policy(principal)

    async def at(self, stage: str) -> None:
        if self._hook is not None:
            await self._hook(stage)

    @asynccontextmanager
    async def open(self, plan: RunPlan) -> AsyncIterator[ActiveRun]:
        """Run ``plan``: take what it needs, yield the `ActiveRun`, give it all back.

        Raises:
            ServingError: 409 when the thread has a run in progress and the strategy
                is ``reject`` (or waiting for it outlasts the deadline); 429 past a
                run-slot limit.
        """
        async with AsyncExitStack() as stack:
            record = plan.record
            await self.at("make_way")
            if record is not None and record.thread_id is not None:
                if self.runs.board is not None:
                    # Another replica's run on the thread is waited for holding no slot.
                    await self.runs.board.make_way(record, deadline_s=plan.deadline_s)
                await self._make_way(record, plan.deadline_s)
                # A thread being deleted (or its state updated) takes no new run.
                self.runs.admit(record)
            # From here to the registration below nothing awaits: no other run can
            # take the thread (nor a delete claim it) in between.
            stack.callback(self.slots.acquire(plan.principal))
            run = ActiveRun(plan, self, self._start_span(plan), OutputGuard(self._guardrails.output_policy(plan.principal)))
            board = self.runs.board
            if record is not None:
                self.runs.add(record)
                if board is None:
                    record.set_status("running")
                else:
                    # Unwound after `_end_record`: the answer waits for the end's write.
                    stack.push_async_callback(self._end_written, record, run)
                stack.callback(self._end_record, record, run)
            self.metrics.runs_in_flight.inc()
            stack.callback(self._finish, run)
            try:
                await self.at("acquired")
                if record is not None and board is not None:
                    # Across replicas: the row's insert is the admission (one active
                    # run per thread), awaited here, inside the stack: a refusal or a
                    # cancel unwinds what was taken, and the row goes with the record.
                    try:
                        await board.admit(record, deadline_s=plan.deadline_s)
                    except BaseException as exc:
                        if isinstance(exc, ServingError):
                            run.refused = True
                        raise
                    record.set_status("running")
                if plan.thread_id is not None and self.threads is not None:
                    stack.push_async_callback(self._settle_thread, plan.thread_id, run)
                    await self.at("admitted")
                    # One write: busy, the graph, and its ids in the thread's metadata.
                    await self.threads.update(
                        plan.thread_id, status="busy", graph_id=plan.target, metadata=plan.thread_metadata
                    )
                    await self.at("thread_busy")
                set_run_id(plan.run_id)  # the request's log lines from here on carry it
                await self.at("running")
                yield run
            except BaseException as exc:
                run._ended_by(exc)  # before the stack unwinds: its callbacks record how
                raise
            run._ended()

    async def _make_way(self, record: RunRecord, deadline_s: float | None) -> None:
        """Apply the multitask strategy to the thread's run in progress, if any."""
        thread_id = record.thread_id
        assert thread_id is not None
        while (active := self.runs.active(thread_id)) is not None:
            if record.multitask_strategy == "reject":
                raise ServingError(
                    409,
                    f"thread {thread_id!r} already has a run in progress ({active.run_id}); "
                    "multitask_strategy interrupt or enqueue would wait for it",
                )
            if record.multitask_strategy == "interrupt":
                active.guard.stop(RunCancelledError("interrupted by a newer run on this thread"))
            try:
                await asyncio.wait_for(active.wait(), deadline_s)
            except TimeoutError:
                raise ServingError(409, f"thread {thread_id!r} is still busy with run {active.run_id}") from None

    def _start_span(self, plan: RunPlan) -> RunSpan:
        return self._tracing.start_run(
            plan.kind if plan.protocol == "openai" else "langgraph",
            plan.target,
            **{
                "switchyard.protocol": plan.protocol,
                "switchyard.request_id": plan.request_id,
                "switchyard.run_id": plan.run_id,
                "switchyard.thread_id": plan.thread_id,
                "switchyard.tenant": plan.principal.tenant,
                **plan.attributes,
            },
        )

    async def _settle_thread(self, thread_id: str, run: ActiveRun) -> None:
        """Write the thread's final status, even if this task is cancelled meanwhile."""
        try:
            await self.at("ending")
        finally:
            task = asyncio.get_running_loop().create_task(self._write_status(thread_id, run))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            await asyncio.shield(task)

    async def _write_status(self, thread_id: str, run: ActiveRun) -> None:
        assert self.threads is not None
        status = run.thread_status
        if status is None and run.plan.thread_status is not None:
            try:
                status = await run.plan.thread_status()
            except Exception as exc:  # boundary: the status must still be written
                log.warning("could not read the state of thread %s: %r", thread_id, exc)
        status = status or "idle"
        try:
            await self.threads.update(thread_id, status=status)
        except Exception as exc:  # boundary: the run is over whatever the store says
            log.error("could not set thread %s to %s: %r", thread_id, status, exc)
            return
        run.thread_status = status

    async def _end_written(self, record: RunRecord, run: ActiveRun) -> None:
        """Wait (bounded) for the run's end on the run board before the request
        answers: the client's next run on the thread may go through another replica,
        which would refuse it (``reject``) while the row still says ``running``."""
        board = self.runs.board
        if board is not None and not run.refused:
            await board.end_written(record.run_id)

    def _end_record(self, record: RunRecord, run: ActiveRun) -> None:
        if run.refused:
            self.runs.discard(record)
            return
        if run.routing.backend is not None:
            record.metadata["switchyard_backend"] = run.routing.backend
        self.runs.ended(record)
        record.finish(run.run_status)
        if self.runs.board is not None:
            self.runs.board.ended(record)

    def count_backend_error(self, error: BaseException) -> None:
        if isinstance(error, (BackendUnavailableError, BackendResponseError)):
            self.metrics.backend_errors.labels(error.backend_id, type(error).__name__).inc()

    def _finish(self, run: ActiveRun) -> None:
        """Metrics, audit records and the span of a run that has ended."""
        plan, principal = run.plan, run.plan.principal
        outcome = run.outcome or "error"
        kind = run.metric_kind
        self.metrics.runs_in_flight.dec()
        if run.refused:
            run.span.end("error", run.error)
            return
        backend = run.routing.backend or "none"
        self.metrics.runs.labels(kind, plan.target, outcome, backend).inc()
        run._count_first_token()
        if run.tokens:
            self.metrics.output_tokens.labels(kind, plan.target).inc(run.tokens)
            if run.first_at and (seconds := time.perf_counter() - run.first_at) > 0:
                self.metrics.tokens_per_second.labels(kind).observe(run.tokens / seconds)
        guard = run.guard
        if guard.blocked:
            self.metrics.output_checks.labels(kind, "blocked").inc()
            self.audit.append(
                "output_blocked", request_id=plan.request_id, kind=kind, target=plan.target, term=guard.blocked,
                run_id=plan.run_id, tenant=principal.tenant, key_id=principal.key_id,
            )
        elif guard.redactions:
            self.metrics.output_checks.labels(kind, "redacted").inc()
        self.audit.append(
            "run", request_id=plan.request_id, kind=kind, target=plan.target, outcome=outcome, tokens=run.tokens,
            backend=run.routing.backend,
            run_id=plan.run_id, thread_id=plan.thread_id, thread_status=run.thread_status,
            tenant=principal.tenant, key_id=principal.key_id,
        )
        run.span.set(**{
            "gen_ai.usage.output_tokens": run.tokens,
            "switchyard.ttft_ms": round((run.first_at - run.started) * 1000, 1) if run.first_at else None,
            "switchyard.thread_status": run.thread_status,
            "switchyard.backend": run.routing.backend,
        })
        run.span.end(outcome, run.error)

    async def aclose(self) -> None:
        """Cancel background runs (server shutdown) and wait for their clean-up."""
        await self.runs.aclose()
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
