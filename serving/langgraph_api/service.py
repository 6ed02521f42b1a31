"""Assistants, threads and runs over the graph registry and the checkpointer.

One assistant per registered graph (id = graph id, or its system-assistant UUID). A
thread is a record in `ThreadStore` plus checkpoints in the LangGraph checkpointer; a
run streams the graph's v2 parts as LangGraph Server SSE events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

import orjson
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, StateSnapshot
from langchain_core.messages import AIMessage, AIMessageChunk
from pydantic import BaseModel

from gateway import BackendResponseError, BackendUnavailableError
from graphs import GraphRegistry, OutputBlockedError, RegisteredGraph, RunContext
from serving._tasks import RunCancelledError, RunDeadlineError, guarded
from serving.langgraph_api.runs import RunRecord, RunRegistry, RunStatus
from serving.audit import AuditLog, tool_call_sink
from serving.auth import Principal
from serving.errors import ServingError
from serving.guardrails import Guardrails, OutputGuard, message_texts
from serving.limits import RunSlots
from serving.tracing import NO_TRACING, NoTracing, Tracing
from serving.observability import ServingMetrics, set_run_id
from serving.langgraph_api.protocol import AssistantSearch, RunCreate, ThreadCreate, ThreadSearch, assistant_uuid
from serving.threads import ThreadRecord, ThreadStatus, ThreadStore

__all__ = ["LangGraphService", "dumps", "frame", "sse_frames", "stop_error"]

log = logging.getLogger(__name__)

# Client stream mode -> LangGraph stream mode (and SSE event name, the same except
# "messages-tuple", whose events are named "messages" on the wire).
_LIB_MODE = {"messages-tuple": "messages"}
_STARTED = datetime.now(UTC).isoformat()


def _default(value: Any) -> Any:
    if isinstance(value, Interrupt):
        return {"value": value.value, "id": value.id}
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    return repr(value)


def dumps(value: Any) -> str:
    """JSON for the wire: LangChain messages as their ``model_dump()``, interrupts as
    ``{"value", "id"}``."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_PASSTHROUGH_DATACLASS).decode()


def frame(name: str, data: Any, index: int) -> str:
    """One SSE event. ``data`` is compact JSON, so it never spans lines."""
    return f"event: {name}\ndata: {dumps(data)}\nid: {index}\n\n"


def stop_error(exc: RunDeadlineError | RunCancelledError) -> dict[str, str]:
    """The ``error`` event data of a run stopped by its deadline or a cancel."""
    kind = "DeadlineExceeded" if isinstance(exc, RunDeadlineError) else "RunCancelled"
    return {"error": kind, "message": str(exc)}


async def sse_frames(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[str]:
    """A run's events as SSE frames with ids 0, 1, ...; a stopped run ends with an
    ``error`` event."""
    index = -1
    async with aclosing(events) as stream:
        try:
            async for name, data in stream:
                index += 1
                yield frame(name, data, index)
        except (RunDeadlineError, RunCancelledError) as exc:
            yield frame("error", stop_error(exc), index + 1)


_SERVER_CONTEXT = frozenset(
    {"request_id", "output_policy", "tenant", "allowed_collections", "allowed_tools", "approvals", "on_tool_call"}
)
"""Run-context fields the server sets; a request cannot."""


def _checked_message(message: Any, guard: OutputGuard) -> Any:
    """A ``messages`` event's AI message with its text checked: a streamed message's
    chunks are held back and released by the guard, its last chunk flushes it."""
    if not isinstance(message, AIMessage) or not isinstance(message.content, str):
        return message
    key = message.id
    text = guard.feed(key, message.content)
    last = not isinstance(message, AIMessageChunk) or message.chunk_position == "last"
    if last or message.response_metadata.get("finish_reason"):
        text += guard.flush(key)
    return message if text == message.content else message.model_copy(update={"content": text})


def _interrupts(interrupts: Any) -> list[dict[str, Any]]:
    return [{"value": i.value, "id": i.id} for i in interrupts or ()]


class LangGraphService:
    """The LangGraph Server API's operations, independent of HTTP."""

    def __init__(
        self,
        graphs: GraphRegistry,
        threads: ThreadStore,
        checkpointer: BaseCheckpointSaver[Any],
        slots: RunSlots,
        metrics: ServingMetrics,
        audit: AuditLog,
        guardrails: Guardrails,
        tracing: Tracing | NoTracing = NO_TRACING,
    ) -> None:
        self._tracing = tracing
        self._guardrails = guardrails
        self._audit = audit
        self._metrics = metrics
        self._graphs = graphs
        self._threads = threads
        self._checkpointer = checkpointer
        self._slots = slots
        self._runs = RunRegistry()
        # Stateless runs whose thread is deleted at the end keep their checkpoints in
        # memory: nothing about them needs to survive the run.
        self._scratch = InMemorySaver()
        self._scratch_graphs = {e.graph_id: e.graph.copy(update={"checkpointer": self._scratch}) for e in graphs}

    # ---- assistants ------------------------------------------------------------------

    def _assistant(self, entry: RegisteredGraph) -> dict[str, Any]:
        return {
            "assistant_id": assistant_uuid(entry.graph_id),
            "graph_id": entry.graph_id,
            "name": entry.graph_id,
            "description": entry.spec.description or None,
            "config": {},
            "context": {},
            "metadata": {"created_by": "system", "model": entry.spec.model},
            "version": 1,
            "created_at": _STARTED,
            "updated_at": _STARTED,
        }

    def resolve(self, assistant_id: str, principal: Principal) -> RegisteredGraph:
        """The graph behind an assistant id (graph id or system-assistant UUID).

        Raises:
            ServingError: 404 naming the tenant's assistants; 403 for a graph the
                tenant may not use.
        """
        for entry in self._graphs:
            if assistant_id in (entry.graph_id, assistant_uuid(entry.graph_id)):
                if not principal.settings.allows_graph(entry.graph_id):
                    raise ServingError(403, f"tenant {principal.tenant!r} may not use graph {entry.graph_id!r}")
                return entry
        allowed = [g for g in self._graphs.ids() if principal.settings.allows_graph(g)]
        raise ServingError(404, f"assistant {assistant_id!r} not found; graphs: {', '.join(allowed)}")

    def search_assistants(self, query: AssistantSearch, principal: Principal) -> list[dict[str, Any]]:
        found = [
            self._assistant(entry)
            for entry in self._graphs
            if principal.settings.allows_graph(entry.graph_id)
            and (query.graph_id is None or entry.graph_id == query.graph_id)
            and (query.name is None or query.name.lower() in entry.graph_id.lower())
        ]
        if query.metadata:
            found = [a for a in found if all(a["metadata"].get(k) == v for k, v in query.metadata.items())]
        return found[query.offset : query.offset + query.limit]

    def get_assistant(self, assistant_id: str, principal: Principal) -> dict[str, Any]:
        return self._assistant(self.resolve(assistant_id, principal))

    # ---- threads ---------------------------------------------------------------------

    def _threaded(self, graph_id: str | None) -> Pregel[Any, Any, Any, Any] | None:
        if graph_id is None or graph_id not in self._graphs:
            return None
        return self._graphs.get(graph_id).threaded

    async def _snapshot(self, record: ThreadRecord, checkpoint_id: str | None = None) -> StateSnapshot | None:
        graph = self._threaded(record.graph_id)
        if graph is None:
            return None
        configurable = {"thread_id": record.thread_id}
        if checkpoint_id is not None:
            configurable.update(checkpoint_ns="", checkpoint_id=checkpoint_id)
        snapshot = await graph.aget_state({"configurable": configurable})
        return snapshot if snapshot.created_at is not None else None

    async def _thread_json(self, record: ThreadRecord) -> dict[str, Any]:
        snapshot = await self._snapshot(record)
        interrupts = {task.id: _interrupts(task.interrupts) for task in snapshot.tasks if task.interrupts} if snapshot else {}
        return {
            "thread_id": record.thread_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "metadata": record.metadata,
            "status": record.status,
            "values": snapshot.values if snapshot else None,
            "interrupts": interrupts,
            "config": {},
        }

    async def _record(self, thread_id: str, principal: Principal) -> ThreadRecord:
        record = await self._threads.get(thread_id, tenant=principal.tenant)
        if record is None:  # also another tenant's thread: 404, never 403
            raise ServingError(404, f"thread {thread_id!r} not found")
        return record

    async def create_thread(self, body: ThreadCreate, principal: Principal) -> dict[str, Any]:
        record, created = await self._threads.create(
            tenant=principal.tenant,
            thread_id=body.thread_id,
            metadata=body.metadata,
            graph_id=(body.metadata or {}).get("graph_id"),
        )
        if record is None or (not created and body.if_exists == "raise"):
            raise ServingError(409, f"thread {body.thread_id!r} already exists")
        return await self._thread_json(record)

    async def get_thread(self, thread_id: str, principal: Principal) -> dict[str, Any]:
        return await self._thread_json(await self._record(thread_id, principal))

    async def search_threads(self, query: ThreadSearch, principal: Principal) -> list[dict[str, Any]]:
        records = await self._threads.search(
            tenant=principal.tenant, metadata=query.metadata, status=query.status, limit=query.limit, offset=query.offset
        )
        return [await self._thread_json(record) for record in records]

    def _state_json(self, snapshot: StateSnapshot) -> dict[str, Any]:
        def checkpoint(config: Any) -> dict[str, Any] | None:
            if not config:
                return None
            configurable = config["configurable"]
            return {
                "thread_id": configurable.get("thread_id"),
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": configurable.get("checkpoint_id"),
                "checkpoint_map": configurable.get("checkpoint_map"),
            }

        return {
            "values": snapshot.values,
            "next": list(snapshot.next),
            "tasks": [
                {
                    "id": task.id,
                    "name": task.name,
                    "path": list(task.path),
                    "error": str(task.error) if task.error else None,
                    "interrupts": _interrupts(task.interrupts),
                    "checkpoint": None,
                    "state": None,
                    "result": task.result,
                }
                for task in snapshot.tasks
            ],
            "checkpoint": checkpoint(snapshot.config),
            "parent_checkpoint": checkpoint(snapshot.parent_config),
            "metadata": snapshot.metadata,
            "created_at": snapshot.created_at,
            "interrupts": _interrupts(snapshot.interrupts),
        }

    async def thread_state(
        self, thread_id: str, principal: Principal, checkpoint_id: str | None = None
    ) -> dict[str, Any]:
        """The thread's latest state, or its state at ``checkpoint_id``.

        Raises:
            ServingError: 404 for an unknown thread or checkpoint.
        """
        snapshot = await self._snapshot(await self._record(thread_id, principal), checkpoint_id)
        if snapshot is None and checkpoint_id is not None:
            raise ServingError(404, f"checkpoint {checkpoint_id!r} not found on thread {thread_id!r}")
        if snapshot is None:
            empty: dict[str, Any] = {"values": {}, "next": [], "tasks": [], "checkpoint": None}
            return {**empty, "parent_checkpoint": None, "metadata": None, "created_at": None, "interrupts": []}
        return self._state_json(snapshot)

    async def thread_history(
        self, thread_id: str, limit: int, principal: Principal, before: str | None = None
    ) -> list[dict[str, Any]]:
        """States newest first, at most ``limit``, older than checkpoint ``before`` if given."""
        record = await self._record(thread_id, principal)
        graph = self._threaded(record.graph_id)
        if graph is None:
            return []
        config = {"configurable": {"thread_id": thread_id}}
        older = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": before}} if before else None
        history = graph.aget_state_history(config, limit=limit, before=older)
        return [self._state_json(snapshot) async for snapshot in history]

    # ---- runs ------------------------------------------------------------------------

    async def start_run(
        self, thread_id: str | None, body: RunCreate, request_id: str, principal: Principal, deadline_s: float | None = None
    ) -> tuple[RunRecord, AsyncIterator[tuple[str, Any]]]:
        """Check the run can start, then return its record and its events ``(event
        name, data)``, starting with ``metadata``. The events are consumed in the
        caller's task; past ``deadline_s``, or when the run is cancelled, they end
        with `RunDeadlineError` / `RunCancelledError`.

        Raises:
            ServingError: unknown assistant (404), missing thread (404), a thread with
                a run in progress under ``multitask_strategy: reject`` (409), an
                unsupported strategy (400).
        """
        entry = self.resolve(body.assistant_id, principal)
        self._guardrails.check_input(message_texts((body.input or {}).get("messages") or []), principal, param="input")
        if entry.threaded is None:
            raise ServingError(503, "threads are not available: no checkpointer configured")
        if body.multitask_strategy == "rollback":
            raise ServingError(400, "multitask_strategy 'rollback' is not supported; use reject, interrupt or enqueue")
        stateless = thread_id is None
        if stateless and body.command and "resume" in body.command:
            raise ServingError(400, "command.resume answers an interrupt on a thread: use POST /threads/{thread_id}/runs")
        if stateless:
            thread_id = str(uuid.uuid4())
            if body.on_completion == "keep":
                await self._threads.create(tenant=principal.tenant, thread_id=thread_id, graph_id=entry.graph_id)
        else:
            assert thread_id is not None
            record = await self._threads.get(thread_id, tenant=principal.tenant)
            if record is None:
                if body.if_not_exists != "create":
                    raise ServingError(404, f"thread {thread_id!r} not found")
                created, _ = await self._threads.create(tenant=principal.tenant, thread_id=thread_id, graph_id=entry.graph_id)
                if created is None:  # the id is another tenant's thread
                    raise ServingError(404, f"thread {thread_id!r} not found")
                record = created
            if body.command and "resume" in body.command and record.status != "interrupted":
                # Answered already (a second resume of one interrupt), or never asked.
                raise ServingError(
                    409, f"thread {thread_id!r} has no interrupt waiting for an answer (its status is {record.status!r})"
                )
            await self._make_way(thread_id, body.multitask_strategy, deadline_s)
        release = self._slots.acquire(principal)
        keep = not stateless or body.on_completion == "keep"
        run = RunRecord(
            run_id=str(uuid.uuid4()),
            thread_id=None if stateless else thread_id,
            assistant_id=assistant_uuid(entry.graph_id),
            tenant=principal.tenant,
            multitask_strategy=body.multitask_strategy,
            metadata=dict(body.metadata or {}),
        )
        self._runs.add(run)
        events = self._run(entry, thread_id, run, body, request_id, keep=keep, release=release, principal=principal)
        return run, guarded(events, run.guard, deadline_s)

    async def _make_way(self, thread_id: str, strategy: str, deadline_s: float | None) -> None:
        """Apply the multitask strategy to the thread's run in progress, if any."""
        while (active := self._runs.active(thread_id)) is not None:
            if strategy == "reject":
                raise ServingError(
                    409,
                    f"thread {thread_id!r} already has a run in progress ({active.run_id}); "
                    "multitask_strategy interrupt or enqueue would wait for it",
                )
            if strategy == "interrupt":
                active.guard.stop(RunCancelledError("interrupted by a newer run on this thread"))
            try:
                await asyncio.wait_for(active.wait(), deadline_s)
            except TimeoutError:
                raise ServingError(409, f"thread {thread_id!r} is still busy with run {active.run_id}") from None

    def run_record(self, thread_id: str, run_id: str, principal: Principal) -> RunRecord:
        """Raises ServingError 404 for an unknown run (or another tenant's)."""
        record = self._runs.get(run_id, principal.tenant, thread_id)
        if record is None:
            raise ServingError(404, f"run {run_id!r} not found on thread {thread_id!r}")
        return record

    def thread_runs(self, thread_id: str, principal: Principal) -> list[dict[str, Any]]:
        return [r.json() for r in self._runs.of_thread(thread_id, principal.tenant)]

    def start_background(self, run: RunRecord, events: AsyncIterator[tuple[str, Any]]) -> None:
        """Run on in a task of the server's, keeping the frames for `follow`."""
        self._runs.start_background(run, sse_frames(events), on_end=lambda: None)

    async def aclose(self) -> None:
        await self._runs.aclose()

    async def _run(
        self,
        entry: RegisteredGraph,
        thread_id: str,
        run: RunRecord,
        body: RunCreate,
        request_id: str,
        *,
        keep: bool,
        release: Callable[[], None],
        principal: Principal,
    ) -> AsyncIterator[tuple[str, Any]]:
        graph = entry.threaded if keep else self._scratch_graphs[entry.graph_id]
        assert graph is not None
        config: dict[str, Any] = dict(body.config or {})
        configurable = {**config.get("configurable", {}), "thread_id": thread_id}
        if body.checkpoint:
            configurable.update({k: v for k, v in body.checkpoint.items() if k != "thread_id" and v is not None})
        if body.checkpoint_id:
            configurable["checkpoint_id"] = body.checkpoint_id
        config["configurable"] = configurable
        assistant_id = assistant_uuid(entry.graph_id)
        run_id = run.run_id
        config["metadata"] = {
            **config.get("metadata", {}),
            **(body.metadata or {}),
            "run_id": run_id,
            "thread_id": thread_id,
            "graph_id": entry.graph_id,
            "assistant_id": assistant_id,
            "run_attempt": 1,
        }
        graph_input: Any = Command(**body.command) if body.command else body.input
        context_fields = {f.name for f in dataclasses.fields(RunContext)}
        guard = OutputGuard(self._guardrails.output_policy(principal))
        context = RunContext(
            **{k: v for k, v in (body.context or {}).items() if k in context_fields and k not in _SERVER_CONTEXT},
            request_id=request_id,
            tenant=principal.tenant,
            allowed_collections=tuple(principal.settings.collections),
            allowed_tools=tuple(principal.settings.tools),
            approvals=keep,  # a thread can be resumed with the answer
            on_tool_call=tool_call_sink(
                self._audit, self._metrics.tool_calls, request_id=request_id, graph=entry.graph_id,
                tenant=principal.tenant, key_id=principal.key_id, run_id=run.run_id,
            ),
            output_policy=guard.policy,
        )
        modes = body.modes()
        if keep:
            await self._threads.update(thread_id, status="busy", graph_id=entry.graph_id)
            await self._threads.set_metadata(thread_id, {"graph_id": entry.graph_id, "assistant_id": assistant_id})
        status: ThreadStatus = "error"
        outcome = "error"
        set_run_id(run_id)  # the request's log lines from here on carry it
        span = self._tracing.start_run(
            "langgraph",
            entry.graph_id,
            **{
                "switchyard.protocol": "langgraph",
                "switchyard.request_id": request_id,
                "switchyard.run_id": run_id,
                "switchyard.thread_id": thread_id if keep else None,
                "switchyard.tenant": principal.tenant,
            },
        )
        if span.callbacks:
            config["callbacks"] = span.callbacks
        error: BaseException | None = None
        self._metrics.runs_in_flight.inc()
        run.set_status("running")
        run_status: RunStatus = "error"
        try:
            yield "metadata", {"run_id": run_id, "attempt": 1}
            stream = graph.astream(
                graph_input,
                config,
                context=context,
                stream_mode=[_LIB_MODE.get(m, m) for m in modes],
                subgraphs=body.stream_subgraphs,
                version="v2",
            )
            async with aclosing(stream) as parts:
                async for part in parts:
                    kind = part["type"]
                    name = "messages" if kind == "messages" else kind
                    if part["ns"]:
                        name = f"{name}|{'|'.join(part['ns'])}"
                    data = part["data"]
                    if kind == "values" and part.get("interrupts"):
                        data = {**data, "__interrupt__": _interrupts(part["interrupts"])}
                    elif kind == "messages":
                        data = list(data)
                        if guard.active:
                            data[0] = _checked_message(data[0], guard)
                    yield name, data
            status = "idle"
            if keep:  # a stateless run's thread is deleted below: no status to keep
                snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
                status = "interrupted" if snapshot.next else "idle"
            outcome = "ok"
            run_status = "success"
        except OutputBlockedError as exc:
            # Closing the graph's stream (leaving the loop) stopped the run.
            outcome, status = "blocked", "idle"
            self._metrics.output_checks.labels("langgraph", "blocked").inc()
            self._audit.append(
                "output_blocked", request_id=request_id, kind="langgraph", target=entry.graph_id, term=guard.blocked,
                run_id=run_id, tenant=principal.tenant, key_id=principal.key_id,
            )
            yield "error", {"error": "OutputBlocked", "message": str(exc)}
        except Exception as exc:  # boundary: a failed run is an error event, not a broken stream
            error = exc
            log.warning("run %s on thread %s failed: %r", run_id, thread_id, exc)
            if isinstance(exc, (BackendUnavailableError, BackendResponseError)):
                self._metrics.backend_errors.labels(exc.backend_id, type(exc).__name__).inc()
            yield "error", {"error": exc.__class__.__name__, "message": str(exc)}
        except BaseException:
            status = "idle"  # cancelled (client gone, deadline): the thread stays usable
            outcome = "cancelled"
            run_status = "timeout" if isinstance(run.guard.error, RunDeadlineError) else "interrupted"
            raise
        finally:
            if guard.redactions and not guard.blocked:
                self._metrics.output_checks.labels("langgraph", "redacted").inc()
            span.set(**{"switchyard.thread_status": status if keep else None})
            span.end(outcome, error)
            self._metrics.runs_in_flight.dec()
            self._metrics.runs.labels("langgraph", entry.graph_id, outcome).inc()
            self._audit.append(
                "run", request_id=request_id, kind="langgraph", target=entry.graph_id, outcome=outcome,
                run_id=run_id, thread_id=thread_id if keep else None, thread_status=status,
                tenant=principal.tenant, key_id=principal.key_id,
            )
            release()
            try:
                if keep:
                    await self._threads.update(thread_id, status=status)
                else:
                    await self._scratch.adelete_thread(thread_id)
            finally:
                self._runs.ended(run)
                run.finish(run_status)
