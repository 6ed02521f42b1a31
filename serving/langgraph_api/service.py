"""Assistants, threads and runs over the graph registry and the checkpointer.

One assistant per registered graph (id = graph id, or its system-assistant UUID). A
thread is a record in `ThreadStore` plus checkpoints in the LangGraph checkpointer; a
run streams the graph's v2 parts as LangGraph Server SSE events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

import orjson
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.constants import END
from langgraph.errors import InvalidUpdateError
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore
from langgraph.types import Command, Interrupt, StateSnapshot
from langgraph.types import StateUpdate as GraphUpdate
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from pydantic import BaseModel

from gateway import CapabilityError, RouteScope
from graphs import CLIENT_CONTEXT_FIELDS, GraphRegistry, OutputBlockedError, RegisteredGraph
from serving._tasks import RunCancelledError, RunDeadlineError
from serving.auth import Principal
from serving.errors import RequestError, ServingError
from serving.guardrails import OutputGuard, checked_for_reading
from serving.langgraph_api.modes import (
    MESSAGE_EVENTS,
    GuardStreams,
    MessagesMode,
    breakpoints,
    checked_event,
    checked_whole,
    graph_parts,
    refuse_unsupported,
)
from serving.langgraph_api.protocol import (
    AssistantCount,
    AssistantSearch,
    CheckpointRef,
    RunBatchItem,
    RunCommand,
    RunCreate,
    RunsCancel,
    StatePatch,
    StateUpdate,
    StreamModeName,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadPrune,
    ThreadSearch,
    assistant_uuid,
    extract_path,
)
from serving.store import tenant_graph
from serving.runs import (
    ActiveRun, ClientError, RunChecks, RunHost, RunPlan, RunRecord, client_error, parse_sampling, run_messages,
)
from serving.runs.registry import CONTROL_EVENTS, end_frame, event_mode
from serving.shared.runs import SharedRun
from serving.threads import ThreadRecord, ThreadStatus, ThreadStore
from tools.executor import ToolCallRecord, args_hash

__all__ = [
    "LangGraphService",
    "StartedRun",
    "dumps",
    "frame",
    "frame_without_id",
    "join_events",
    "sse_frames",
    "stop_error",
    "thread_event_id",
    "thread_events",
]

log = logging.getLogger(__name__)

# Client stream mode -> the LangGraph stream mode it needs (the same but for these;
# None: none, `events` come from astream_events). "messages-tuple" events are named
# "messages" on the wire; "messages" events are the three in `MESSAGE_EVENTS`.
_LIB_MODE: dict[str, str | None] = {"messages-tuple": "messages", "events": None}
_STARTED = datetime.now(UTC).isoformat()
_JOIN_MODES: dict[str, frozenset[str]] = {
    **{mode: frozenset({mode}) for mode in get_args(StreamModeName)},
    "messages-tuple": frozenset({"messages"}),
    "messages": frozenset({"messages", *MESSAGE_EVENTS}),
}
"""``stream_mode`` values a joined stream accepts -> the event names they keep:
``messages-tuple`` its wire name ``messages``; ``messages`` that name too (as it
always has) and the ``messages/*`` events, which only a run that asked for mode
``messages`` sends."""


def join_events(stream_mode: list[str] | None) -> frozenset[str] | None:
    """The event names a joined stream keeps for its ``stream_mode`` query parameter
    (``None``: all of them). Empty values are no filter: ``langgraph-sdk`` sends
    ``stream_mode=`` when given none. A value that is a JSON array is its modes (the
    JS SDK 2.0 sends a list of modes so: ``stream_mode=["values","updates"]``).

    Raises:
        ServingError: 422 naming an unknown mode, or a JSON array of anything but strings.
    """
    modes: list[str] = []
    for value in stream_mode or []:
        if value.startswith("["):
            try:
                listed = orjson.loads(value)
            except orjson.JSONDecodeError:
                listed = None
            if not isinstance(listed, list) or not all(isinstance(mode, str) for mode in listed):
                raise ServingError(422, f"stream_mode {value[:100]!r} is neither a mode nor a JSON array of modes")
            modes.extend(listed)
        else:
            modes.append(value)
    stream_mode = [mode for mode in modes if mode]
    if not stream_mode:
        return None
    unknown = [mode for mode in stream_mode if mode not in _JOIN_MODES]
    if unknown:
        raise ServingError(
            422, f"unknown stream_mode {', '.join(map(repr, unknown))}; one of: {', '.join(_JOIN_MODES)}"
        )
    return frozenset().union(*(_JOIN_MODES[mode] for mode in stream_mode))


def _default(value: Any) -> Any:
    if isinstance(value, BaseException):
        # Never an exception's own text (`repr` would send it): its client JSON. A
        # run's events map theirs first (`_EventErrors`, logged there with the ids).
        return client_error(value, log_unexpected=False).json()
    if isinstance(value, Interrupt):
        return {"value": value.value, "id": value.id}
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    return repr(value)


class _Unread:
    """A thread's state not read yet (``None`` is a thread with no state)."""


_UNREAD = _Unread()

_VALUES_PAGE = 100
"""Threads a ``values`` filter reads the state of per page of the store's candidates."""


def dumps(value: Any) -> str:
    """JSON for the wire: LangChain messages as their ``model_dump()``, interrupts as
    ``{"value", "id"}``."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_PASSTHROUGH_DATACLASS).decode()


def frame(name: str, data: Any, index: int) -> str:
    """One SSE event. ``data`` is compact JSON, so it never spans lines."""
    return f"event: {name}\ndata: {dumps(data)}\nid: {index}\n\n"


def stop_error(exc: BaseException, run_id: str | None = None) -> dict[str, str]:
    """The ``error`` event data of a run stopped by its deadline or a cancel, or of a
    failure that escaped the run (`serving.runs.client_error`: never an unexpected
    exception's own text)."""
    return client_error(exc, run_id=run_id).json()


async def sse_frames(
    events: AsyncIterator[tuple[str, Any]], first: tuple[str, Any] | None = None, *, run_id: str | None = None
) -> AsyncIterator[str]:
    """A run's events (after ``first``, already taken from them) as SSE frames with
    ids 0, 1, ...; a stopped run ends with an ``error`` event. Closes ``events``."""
    index = -1
    async with aclosing(events) as stream:
        try:
            if first is not None:
                index += 1
                yield frame(*first, index)
            async for name, data in stream:
                index += 1
                yield frame(name, data, index)
        except Exception as exc:  # boundary: after the headers, an error is an event
            yield frame("error", stop_error(exc, run_id), index + 1)


_THREAD_MODES: dict[str, frozenset[str] | None] = {
    "run_modes": None,
    "lifecycle": frozenset(),
    "state_update": frozenset({"values"}),
}
"""The thread stream's own ``stream_mode`` values (``langgraph_sdk.schema.ThreadStreamMode``)
-> the run events they keep: ``run_modes`` all of them (the SDK's default),
``lifecycle`` only ``metadata``/``error``/``end``, ``state_update`` the ``values``."""

_SPECIAL_NODES = frozenset({"__end__", "__input__", "__copy__"})
"""``as_node`` values LangGraph's ``update_state`` takes besides the graph's nodes."""


def thread_events(stream_mode: list[str] | None) -> frozenset[str] | None:
    """The event names a thread stream keeps (``None``: all): the thread modes in
    `_THREAD_MODES`, and any run stream mode (`join_events`).

    Raises:
        ServingError: 422 naming an unknown mode.
    """
    modes = [mode for mode in stream_mode or [] if mode]
    if not modes or "run_modes" in modes:
        return None
    kept: frozenset[str] = frozenset()
    for mode in modes:
        kept |= _THREAD_MODES.get(mode) or frozenset()
    rest = [mode for mode in modes if mode not in _THREAD_MODES]
    if rest:
        try:
            kept |= join_events(rest) or frozenset()
        except ServingError as exc:
            raise ServingError(422, f"{exc}, or a thread stream mode: {', '.join(_THREAD_MODES)}") from None
    return kept


def thread_event_id(value: str | None) -> tuple[str, int | None] | None:
    """A thread stream's ``Last-Event-ID`` (``<run_id>:<index>`` or ``<run_id>:end``)
    as ``(run_id, index)``, index None for ``end``.

    Raises:
        ServingError: 400 for anything else.
    """
    value = (value or "").strip()
    if not value or value == "-1":  # -1: from the start (what useStream sends to rejoin)
        return None
    run_id, _, index = value.rpartition(":")
    if (
        run_id
        and len(run_id) <= 64
        and run_id.isascii()
        and ":" not in run_id
        and (index == "end" or (index.isascii() and index.isdigit() and len(index) <= 18))
    ):
        return run_id, None if index == "end" else int(index)
    raise ServingError(400, "Last-Event-ID must be a thread stream event id (<run_id>:<index> or <run_id>:end)")


def _thread_frame(run_id: str, index: int, item: str) -> str:
    """A run's frame with its thread-stream id (the run's own ``id:`` line is last)."""
    return f"{item[: item.rindex(chr(10) + 'id: ')]}\nid: {run_id}:{index}\n\n"


def frame_without_id(name: str, data: Any) -> str:
    """An SSE event with no id (a client resuming after it resumes from the event before)."""
    return f"event: {name}\ndata: {dumps(data)}\n\n"


@contextlib.contextmanager
def _batch_item(index: int) -> Iterator[None]:
    """Name the batch item an error is about (``param`` ``<index>.<field>``)."""
    try:
        yield
    except ServingError as exc:
        raise ServingError(exc.status, f"{index}: {exc}", retry_after_s=exc.retry_after_s, limit=exc.limit) from exc
    except RequestError as exc:
        raise RequestError(str(exc), param=f"{index}.{exc.param}" if exc.param else str(index), code=exc.code) from exc
    except CapabilityError as exc:
        raise CapabilityError(exc.backend_id, exc.capability, f"{index}.{exc.param}", str(exc)) from exc


@dataclass(frozen=True, slots=True)
class _Prepared:
    graph_input: Any
    model_params: dict[str, Any]
    collection: str | None
    resolve: bool = False
    """``command.goto: "__end__"``: the run ends the thread's pending tasks and runs
    nothing (see `_resolves`)."""


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A run that has started (see `LangGraphService.start_run`)."""

    record: RunRecord
    first: tuple[str, Any]
    """Its first event, ``metadata``."""
    events: AsyncGenerator[tuple[str, Any], None]
    """The rest; closing them ends the run and gives back what it holds."""
    routing: RouteScope
    """Its routing: the backends that served its model calls are recorded here."""


def _checked_message(message: Any, guard: OutputGuard) -> Any:
    """A ``messages`` event's message with its texts checked. A streamed AI message's
    text and tool-call arguments are held back and released by the guard (one stream
    each), its last chunk flushes them; any other message is checked whole.

    Raises:
        OutputBlockedError: the message holds a blocked term.
    """
    if not isinstance(message, AIMessage) or not isinstance(message.content, str):
        return guard.check_value(message)
    key = message.id
    text = guard.feed(key, message.content)
    last = not isinstance(message, AIMessageChunk) or message.chunk_position == "last"
    last = last or bool(message.response_metadata.get("finish_reason"))
    if last:
        text += guard.flush(key)
    if not isinstance(message, AIMessageChunk):
        # Whole: its text went through the stream guard above; the rest is checked whole.
        rest = guard.check_value(message.model_copy(update={"content": ""}))
        return rest.model_copy(update={"content": text})
    calls = [
        {**chunk, "args": guard.feed((key, "args", chunk.get("index")), chunk.get("args") or "")}
        for chunk in message.tool_call_chunks
    ]
    if last:
        for stream in guard.pending():
            if isinstance(stream, tuple) and stream[0] == key:
                rest = guard.flush(stream)
                same = next((c for c in calls if c.get("index") == stream[2]), None)
                if same is not None:
                    same["args"] += rest
                elif rest:
                    calls.append({"name": None, "args": rest, "id": None, "index": stream[2], "type": "tool_call_chunk"})
    if not calls and not message.tool_call_chunks and not message.additional_kwargs:
        return message if text == message.content else message.model_copy(update={"content": text})
    # Rebuilt, so that the parsed ``tool_calls`` come from the checked arguments.
    data = message.model_dump(exclude={"tool_calls", "invalid_tool_calls"})
    data.update(content=text, tool_call_chunks=calls, additional_kwargs=guard.check_value(message.additional_kwargs))
    return AIMessageChunk(**data)


_ERROR_MODES = frozenset({"tasks", "debug", "checkpoints"})
"""Stream modes whose events carry a failed task's exception object (in ``error``)."""

_STORED_ERROR = ClientError(type="InternalError", message="internal error; the server log of the run that failed has the detail")
"""A failed task's error read back from a checkpoint (LangGraph stores its text)."""


class _EventErrors:
    """Exceptions found in one run's events (LangGraph puts a failed task's exception
    object in ``error`` of ``tasks``, ``debug`` and ``checkpoints`` events) as their
    `client_error` JSON, never their own text. Each is logged once, however many
    events repeat it, and the run's final ``error`` event reuses the same JSON."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self._seen: dict[int, tuple[BaseException, dict[str, str]]] = {}

    def json(self, exc: BaseException) -> dict[str, str]:
        known = self._seen.get(id(exc))
        if known is None:  # the exception is kept, so its id is not reused meanwhile
            known = self._seen[id(exc)] = (exc, client_error(exc, run_id=self._run_id).json())
        return known[1]

    def seen(self, exc: BaseException) -> dict[str, str] | None:
        known = self._seen.get(id(exc))
        return known[1] if known is not None else None

    def value(self, value: Any) -> Any:
        """``value`` with each exception in it mapped (the same object if it has none)."""
        if isinstance(value, BaseException):
            return self.json(value)
        if isinstance(value, dict):
            items = {key: self.value(item) for key, item in value.items()}
            if isinstance(items.get("error"), str) and items["error"] and "name" in items and "id" in items:
                # A task failed in an earlier run, read back from the checkpoint: its
                # exception is stored as its text (a ``repr``), already logged.
                items["error"] = _STORED_ERROR.json()
            return items if any(items[k] is not value[k] for k in value) else value
        if isinstance(value, (list, tuple, set, frozenset)):
            mapped = [self.value(item) for item in value]
            if all(new is old for new, old in zip(mapped, value, strict=True)):
                return value
            return mapped if not isinstance(value, tuple) else tuple(mapped)
        return value


def _resolves(command: RunCommand) -> bool:
    """Whether ``command`` is ``{"goto": "__end__"}`` alone: what Agent Chat UI's "Mark as
    Resolved" sends for an interrupted thread. LangGraph itself would ignore the goto
    (no channel leads to END) and ask the same question again; here nothing runs: the
    thread's pending tasks end, and the open tool calls are answered as refused
    (`LangGraphService._resolve`)."""
    goto = command.goto
    targets = [goto] if isinstance(goto, str) else list(goto or ())
    return targets == [END] and command.update is None and "resume" not in command.model_fields_set


_RESOLVED = "a person marked the request resolved (command.goto '__end__'); the call was not run"


def _unanswered_calls(values: Any) -> list[dict[str, Any]]:
    """The tool calls of the state's last AI message that no tool message answers."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list):
        return []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            return [call for call in message.tool_calls if call.get("id") and call["id"] not in answered]
    return []


async def _state_parts(
    graph: Pregel[Any, Any, Any, Any], config: dict[str, Any], stream_mode: Sequence[str]
) -> AsyncIterator[dict[str, Any]]:
    """A resolve's stream (``command.goto: "__end__"``): the thread's state once, as the
    ``values`` part a run that ran nothing would end with; no other part."""
    if "values" not in stream_mode:
        return
    snapshot = await graph.aget_state(config)
    yield {"type": "values", "ns": (), "data": snapshot.values, "interrupts": ()}


def _plain_node(graph: Pregel[Any, Any, Any, Any], preferred: Sequence[str]) -> str | None:
    """A node to write a state update as: the interrupted one if it has no conditional
    edges, else another such node (an update as a node runs its edges' routers, which
    read the state a graph's own run would hand them, not ours); None if none."""
    builder = getattr(graph, "builder", None)
    branches: Mapping[str, Any] = getattr(builder, "branches", None) or {}
    nodes = [n for n in graph.nodes if not n.startswith("__")]
    for name in [*preferred, *nodes]:
        if name in graph.nodes and not name.startswith("__") and not branches.get(name):
            return name
    return None


def _task_error(error: Any) -> str | None:
    """A failed task's error read back from the state: its client message (an
    unexpected exception's text stays in the server log)."""
    if not error:
        return None
    if not isinstance(error, BaseException):
        return _STORED_ERROR.message
    return client_error(error, log_unexpected=False).message


def _interrupts(interrupts: Any) -> list[dict[str, Any]]:
    return [{"value": i.value, "id": i.id} for i in interrupts or ()]


class LangGraphService:
    """The LangGraph Server API's operations, independent of HTTP."""

    def __init__(
        self,
        graphs: GraphRegistry,
        threads: ThreadStore,
        checkpointer: BaseCheckpointSaver[Any],
        host: RunHost,
        checks: RunChecks,
        *,
        max_history_bytes: int = 8 << 20,
        delete_wait_s: float = 30.0,
        store: BaseStore | None = None,
    ) -> None:
        """Args:
            delete_wait_s: how long a thread delete waits for the thread's cancelled
                run to end before it gives up (409, nothing deleted).
            store: the server's LangGraph store; each run's nodes get their tenant's
                view of it as ``runtime.store`` (`serving.store.tenant_graph`).
        """
        self._host = host
        self._store = store
        self._delete_wait_s = delete_wait_s
        self._checks = checks
        self._graphs = graphs
        self._threads = threads
        self._checkpointer = checkpointer
        self._max_history_bytes = max_history_bytes
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
        found = self._assistants_matching(query, principal)
        return found[query.offset : query.offset + query.limit]

    def count_assistants(self, query: AssistantCount, principal: Principal) -> int:
        return len(self._assistants_matching(query, principal))

    def _assistants_matching(self, query: AssistantSearch | AssistantCount, principal: Principal) -> list[dict[str, Any]]:
        found = [
            self._assistant(entry)
            for entry in self._graphs
            if principal.settings.allows_graph(entry.graph_id)
            and (query.graph_id is None or entry.graph_id == query.graph_id)
            and (query.name is None or query.name.lower() in entry.graph_id.lower())
        ]
        if query.metadata:
            found = [a for a in found if all(a["metadata"].get(k) == v for k, v in query.metadata.items())]
        return found

    def get_assistant(self, assistant_id: str, principal: Principal) -> dict[str, Any]:
        return self._assistant(self.resolve(assistant_id, principal))

    # ---- threads ---------------------------------------------------------------------

    def _threaded(self, graph_id: str | None) -> Pregel[Any, Any, Any, Any] | None:
        if graph_id is None or graph_id not in self._graphs:
            return None
        return self._graphs.get(graph_id).threaded

    async def _snapshot(
        self, record: ThreadRecord, checkpoint_id: str | None = None, *, checkpoint_ns: str = "", subgraphs: bool = False
    ) -> StateSnapshot | None:
        graph = self._threaded(record.graph_id)
        if graph is None:
            return None
        configurable = {"thread_id": record.thread_id}
        if checkpoint_id is not None or checkpoint_ns:
            configurable["checkpoint_ns"] = checkpoint_ns
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        try:
            snapshot = await graph.aget_state({"configurable": configurable}, subgraphs=subgraphs)
        except ValueError as exc:  # LangGraph: "Subgraph ... not found" for an unknown namespace
            raise ServingError(404, f"checkpoint_ns {checkpoint_ns!r} not found on thread {record.thread_id!r}: {exc}") from None
        return snapshot if snapshot.created_at is not None else None

    async def _thread_json(
        self,
        record: ThreadRecord,
        principal: Principal,
        *,
        select: Sequence[str] | None = None,
        extract: Mapping[str, str] | None = None,
        snapshot: StateSnapshot | None | _Unread = _UNREAD,
    ) -> dict[str, Any]:
        """A thread as the reader may see it: only the ``select`` fields if given, with
        ``extracted`` when ``extract`` names paths. Its state (``values``,
        ``interrupts``) is read from the checkpointer only when an answer needs it,
        unless the caller has read it already (``snapshot``)."""
        roots = {extract_path(path)[0] for path in (extract or {}).values()}
        wanted = set(select) | roots if select is not None else None
        needs_state = wanted is None or bool(wanted & {"values", "interrupts"})
        if isinstance(snapshot, _Unread):
            snapshot = await self._snapshot(record) if needs_state else None
        interrupts = {task.id: _interrupts(task.interrupts) for task in snapshot.tasks if task.interrupts} if snapshot else {}
        policy = self._host.output_policy(principal)
        thread: dict[str, Any] = {
            "thread_id": record.thread_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "metadata": record.metadata,
            "status": record.status,
            "values": checked_for_reading(snapshot.values, policy) if snapshot else None,
            "interrupts": checked_for_reading(interrupts, policy),
            "config": {},
        }
        extracted = None
        if extract:
            whole = orjson.loads(dumps(thread))  # paths walk the JSON the client would see
            extracted = {alias: self._extracted(whole, path) for alias, path in extract.items()}
        if select is not None:
            thread = {name: value for name, value in thread.items() if name in select}
        if extracted is not None:
            thread["extracted"] = extracted
        return thread

    @staticmethod
    def _extracted(thread: dict[str, Any], path: str) -> Any:
        """The value at an ``extract`` path in a thread's JSON; None where it leads nowhere."""
        root, steps = extract_path(path)
        value: Any = thread[root]
        for step in steps:
            if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
                value = value[step]
            elif isinstance(step, str) and isinstance(value, dict) and step in value:
                value = value[step]
            else:
                return None
        return value

    @staticmethod
    def _contains(value: Any, wanted: Any) -> bool:
        """JSON containment, as PostgreSQL's ``@>``: objects hold every wanted key with a
        value that contains the wanted one, arrays hold an item containing each wanted
        item, scalars are equal (``1`` equals ``1.0``, ``true`` is not ``1``)."""
        contains = LangGraphService._contains
        if isinstance(wanted, dict):
            return isinstance(value, dict) and all(k in value and contains(value[k], v) for k, v in wanted.items())
        if isinstance(wanted, list):
            return isinstance(value, list) and all(any(contains(item, w) for item in value) for w in wanted)
        if isinstance(wanted, bool) or isinstance(value, bool):
            return isinstance(wanted, bool) and isinstance(value, bool) and wanted == value
        if isinstance(value, (dict, list)):
            return False
        return bool(value == wanted)

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
            graph_id=graph_id if isinstance(graph_id := (body.metadata or {}).get("graph_id"), str) else None,
        )
        if record is None or (not created and body.if_exists == "raise"):
            raise ServingError(409, f"thread {body.thread_id!r} already exists")
        return await self._thread_json(record, principal)

    async def get_thread(self, thread_id: str, principal: Principal) -> dict[str, Any]:
        return await self._thread_json(await self._record(thread_id, principal), principal)

    def _store_pages(
        self, query: ThreadSearch | ThreadCount, principal: Principal
    ) -> Callable[[int, int], Awaitable[list[ThreadRecord]]]:
        """``page(limit, offset)``: the tenant's records the store's own filters find."""
        filters: dict[str, Any] = {"tenant": principal.tenant, "metadata": query.metadata, "status": query.status}
        if isinstance(query, ThreadSearch):
            filters.update(ids=query.ids or None, sort_by=query.sort_by or "created_at", sort_order=query.sort_order or "desc")

        async def page(limit: int, offset: int) -> list[ThreadRecord]:
            try:
                return await self._threads.search(**filters, limit=limit, offset=offset)
            except ValueError as exc:  # the store's whitelist of orders (the protocol checks them first)
                raise ServingError(422, str(exc)) from None

        return page

    async def _with_values(
        self, query: ThreadSearch | ThreadCount, principal: Principal, values: dict[str, Any]
    ) -> AsyncIterator[tuple[ThreadRecord, StateSnapshot | None]]:
        """The threads the query finds whose latest values (as the reader sees them)
        contain ``values``, in the store's order, with their state: the store's
        candidates are read a page of `_VALUES_PAGE` at a time, so no more than a page
        of states is held at once and pages of results never repeat or skip one."""
        page = self._store_pages(query, principal)
        policy = self._host.output_policy(principal)
        start = 0
        while True:
            candidates = await page(_VALUES_PAGE, start)
            start += len(candidates)
            for record in candidates:
                snapshot = await self._snapshot(record)
                seen = orjson.loads(dumps(checked_for_reading(snapshot.values, policy))) if snapshot else None
                if self._contains(seen, values):
                    yield record, snapshot
            if len(candidates) < _VALUES_PAGE:
                return

    async def search_threads(self, query: ThreadSearch, principal: Principal) -> list[dict[str, Any]]:
        """The tenant's threads the filters find, one page (``limit`` after ``offset``).

        Raises:
            ServingError: 422 for an order the store does not know.
        """
        found: list[tuple[ThreadRecord, StateSnapshot | None | _Unread]] = []
        if not query.values:
            found = [(record, _UNREAD) for record in await self._store_pages(query, principal)(query.limit, query.offset)]
        else:
            skipped = 0
            async with aclosing(self._with_values(query, principal, query.values)) as matches:
                async for match in matches:
                    if skipped < query.offset:
                        skipped += 1
                        continue
                    found.append(match)
                    if len(found) >= query.limit:
                        break
        return [
            await self._thread_json(record, principal, select=query.select, extract=query.extract, snapshot=snapshot)
            for record, snapshot in found
        ]

    async def count_threads(self, query: ThreadCount, principal: Principal) -> int:
        """The tenant's threads ``search_threads`` would find, all pages."""
        if query.values:
            total = 0
            async with aclosing(self._with_values(query, principal, query.values)) as matches:
                async for _ in matches:
                    total += 1
            return total
        page = self._store_pages(query, principal)
        total, size = 0, 1000
        while True:
            records = await page(size, total)
            total += len(records)
            if len(records) < size:
                return total

    def _state_json(self, snapshot: StateSnapshot, principal: Principal) -> dict[str, Any]:
        """A state as the reader may see it: its texts checked against the reader's
        output policy (the stored state is left as the graph wrote it), a failed
        task's error as a client message."""
        state = self._raw_state_json(snapshot)
        policy = self._host.output_policy(principal)
        if policy is not None:  # what the graph wrote; ids, checkpoints and metadata are the server's or the client's
            state["values"] = checked_for_reading(state["values"], policy)
            state["interrupts"] = checked_for_reading(state["interrupts"], policy)
            self._check_tasks(state["tasks"], policy)
        return state

    def _check_tasks(self, tasks: list[dict[str, Any]], policy: Any) -> None:
        for task in tasks:
            task["result"] = checked_for_reading(task["result"], policy)
            task["interrupts"] = checked_for_reading(task["interrupts"], policy)
            if (sub := task.get("state")) is not None:  # a subgraph's state (``subgraphs``)
                sub["values"] = checked_for_reading(sub["values"], policy)
                sub["interrupts"] = checked_for_reading(sub["interrupts"], policy)
                self._check_tasks(sub["tasks"], policy)

    def _raw_state_json(self, snapshot: StateSnapshot) -> dict[str, Any]:
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
                    "error": _task_error(task.error),
                    "interrupts": _interrupts(task.interrupts),
                    # A subgraph's task: its state (asked with ``subgraphs``) or where it is.
                    "checkpoint": checkpoint(task.state) if isinstance(task.state, dict) else None,
                    "state": self._raw_state_json(task.state) if isinstance(task.state, StateSnapshot) else None,
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
        self,
        thread_id: str,
        principal: Principal,
        checkpoint_id: str | None = None,
        *,
        checkpoint_ns: str = "",
        subgraphs: bool = False,
    ) -> dict[str, Any]:
        """The thread's latest state, or its state at ``checkpoint_id`` (in the subgraph
        namespace ``checkpoint_ns``); with ``subgraphs``, each subgraph task carries its
        subgraph's state.

        Raises:
            ServingError: 404 for an unknown thread, checkpoint or namespace.
        """
        record = await self._record(thread_id, principal)
        snapshot = await self._snapshot(record, checkpoint_id, checkpoint_ns=checkpoint_ns, subgraphs=subgraphs)
        if snapshot is None and (checkpoint_id is not None or checkpoint_ns):
            where = f"checkpoint {checkpoint_id!r}" if checkpoint_id is not None else f"checkpoint_ns {checkpoint_ns!r}"
            raise ServingError(404, f"{where} not found on thread {thread_id!r}")
        if snapshot is None:
            empty: dict[str, Any] = {"values": {}, "next": [], "tasks": [], "checkpoint": None}
            return {**empty, "parent_checkpoint": None, "metadata": None, "created_at": None, "interrupts": []}
        return self._state_json(snapshot, principal)

    async def thread_history(
        self,
        thread_id: str,
        limit: int,
        principal: Principal,
        before: str | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        checkpoint: CheckpointRef | None = None,
        select: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """States newest first, at most ``limit``, older than checkpoint ``before`` if
        given: those whose checkpoint metadata has the ``metadata`` keys and values, in
        ``checkpoint``'s namespace (only its checkpoint when it has a
        ``checkpoint_id``), with only the ``select`` fields (``values.<key>``: that
        key of the values). A namespace with no checkpoints has an empty history.

        Raises:
            ServingError: 404 for an unknown thread.
        """
        record = await self._record(thread_id, principal)
        graph = self._threaded(record.graph_id)
        if graph is None:
            return []
        namespace = checkpoint.checkpoint_ns if checkpoint is not None else ""
        configurable: dict[str, Any] = {"thread_id": thread_id}
        if checkpoint is not None:
            configurable["checkpoint_ns"] = namespace
            if checkpoint.checkpoint_id:
                configurable["checkpoint_id"] = checkpoint.checkpoint_id
        older = {"configurable": {"thread_id": thread_id, "checkpoint_ns": namespace, "checkpoint_id": before}} if before else None
        states: list[dict[str, Any]] = []
        size = 0
        history = graph.aget_state_history({"configurable": configurable}, filter=metadata or None, limit=limit, before=older)
        async with aclosing(history):
            while True:
                try:
                    snapshot = await anext(history)
                except StopAsyncIteration:
                    break
                except ValueError as exc:  # LangGraph: "Subgraph ... not found" for a namespace it cannot read
                    if not namespace:
                        raise
                    raise ServingError(404, f"checkpoint_ns {namespace!r} not found on thread {thread_id!r}: {exc}") from None
                state = self._selected_state(self._state_json(snapshot, principal), select)
                size += len(dumps(state))
                if states and size > self._max_history_bytes:
                    break  # paged by size too: the client asks again with `before`
                states.append(state)
        return states

    @staticmethod
    def _selected_state(state: dict[str, Any], select: Sequence[str] | None) -> dict[str, Any]:
        """Only the ``select`` fields of a state; ``values.<key>`` keeps that key of its
        values (and ``values`` itself, holding the selected keys it has)."""
        if select is None:
            return state
        keys = [name.removeprefix("values.") for name in select if name.startswith("values.")]
        chosen = {name: value for name, value in state.items() if name in select}
        if keys and "values" not in select:
            values = state["values"]
            chosen["values"] = {key: values[key] for key in keys if key in values} if isinstance(values, dict) else values
        return chosen

    # ---- thread operations -----------------------------------------------------------

    async def patch_thread(self, thread_id: str, body: ThreadPatch, principal: Principal) -> dict[str, Any]:
        """Merge ``metadata`` into the thread's (top-level keys replaced).

        Raises:
            ServingError: 404 for an unknown thread; 400 for ``ttl`` (not supported).
        """
        if body.ttl is not None:
            raise ServingError(400, "ttl is not supported: threads are kept until they are deleted")
        await self._record(thread_id, principal)
        if body.metadata:
            await self._threads.set_metadata(thread_id, body.metadata)
        # Read again: a delete in between is a 404, not a thread that no longer exists.
        return await self.get_thread(thread_id, principal)

    async def delete_thread(self, thread_id: str, principal: Principal) -> None:
        """Delete the thread's checkpoints, then its record; a run in progress is
        cancelled first and waited for (at most ``delete_wait_s``).

        The rule against a run recreating a half-deleted thread: the delete holds the
        thread's ``delete`` claim from before it cancels the run until the record is
        gone, and a run is admitted only where it takes the thread (after its
        multitask strategy, before its first write), with no await in between; a run
        started meanwhile is refused (409) before it writes anything, so no checkpoint
        is written once the delete has started.

        Raises:
            ServingError: 404 for an unknown thread; 409 when the run has not ended
                within ``delete_wait_s`` (nothing was deleted) or another operation
                holds the thread.
        """
        await self._record(thread_id, principal)
        runs = self._host.runs
        with runs.claim(thread_id, "delete"):
            if (active := runs.active(thread_id)) is not None:
                active.guard.stop(RunCancelledError("the thread is being deleted"))
                try:
                    await asyncio.wait_for(active.wait(), self._delete_wait_s)
                except TimeoutError:
                    raise ServingError(
                        409, f"thread {thread_id!r}: run {active.run_id} has not ended yet; nothing was deleted, try again"
                    ) from None
            elif runs.board is not None and (shared := await runs.board.active_on(thread_id)) is not None:
                # Another replica's run (thread claims are per replica; the run is asked
                # to stop through the board and waited for the same way).
                await runs.board.request_cancel(shared.run_id, "the thread is being deleted")
                if not await runs.board.wait_ended(shared.run_id, self._delete_wait_s):
                    raise ServingError(
                        409, f"thread {thread_id!r}: run {shared.run_id} (on replica {shared.replica_id}) has not "
                        "ended yet; nothing was deleted, try again"
                    )
            # Checkpoints first: a failure leaves the record, and deleting again finishes.
            await self._checkpointer.adelete_thread(thread_id)
            await self._threads.delete(thread_id)
        runs.forget_thread(thread_id)

    async def prune_threads(self, body: ThreadPrune, principal: Principal) -> int:
        """``POST /threads/prune``: the tenant's threads of ``thread_ids`` (others and
        unknown ones skipped, not counted, never named).

        ``delete``: each as `delete_thread` does, one after the other. ``keep_latest``:
        every thread's ``update`` claim is taken first (so no run starts meanwhile),
        then the checkpointer keeps only each namespace's latest checkpoint; the thread
        and its state stay.

        Returns:
            How many threads were deleted or pruned.

        Raises:
            ServingError: 409 (``keep_latest``) naming a thread with a run in progress
                or another operation on it (nothing pruned), or one whose graph uses a
                ``DeltaChannel``; 409 (``delete``) naming a thread whose run did not end
                in time (the threads before it are deleted; pruning again finishes).
        """
        owned = [t for t in dict.fromkeys(body.thread_ids) if await self._threads.get(t, tenant=principal.tenant)]
        if body.strategy == "delete":
            deleted = 0
            for thread_id in owned:
                try:
                    await self.delete_thread(thread_id, principal)
                except ServingError as exc:
                    if exc.status == 404:  # deleted meanwhile
                        continue
                    raise ServingError(exc.status, f"{exc}; {deleted} thread(s) before it were deleted") from None
                deleted += 1
            return deleted
        runs = self._host.runs
        with contextlib.ExitStack() as claims:
            for thread_id in owned:  # no await: all claimed, or a 409 and none
                claims.enter_context(runs.claim(thread_id, "update"))
            try:
                await self._checkpointer.aprune(owned, strategy="keep_latest")
            except NotImplementedError as exc:
                raise ServingError(409, f"thread_ids: {exc}; nothing was pruned") from None
        return len(owned)

    def _thread_graph(self, record: ThreadRecord, principal: Principal) -> tuple[str, Pregel[Any, Any, Any, Any]]:
        """The graph a thread's state belongs to.

        Raises:
            ServingError: 409 for a thread that has no graph yet; 403 for a graph the
                tenant may not use.
        """
        graph = self._threaded(record.graph_id)
        if record.graph_id is None or graph is None:
            what = "no graph yet" if record.graph_id is None else f"graph {record.graph_id!r}, which is not registered"
            raise ServingError(
                409,
                f"thread {record.thread_id!r} has {what}: start a run on it first "
                "(or create it with metadata.graph_id)",
            )
        if not principal.settings.allows_graph(record.graph_id):
            raise ServingError(403, f"tenant {principal.tenant!r} may not use graph {record.graph_id!r}")
        return record.graph_id, graph

    async def update_state(self, thread_id: str, body: StateUpdate, principal: Principal) -> dict[str, Any]:
        """Write ``values`` to the thread's state as node ``as_node`` (LangGraph's
        ``update_state``); the thread's status then says whether it waits at an
        interrupt. Messages in ``values`` go through the input filter like a run's.

        Returns:
            ``{"checkpoint": {thread_id, checkpoint_ns, checkpoint_id}}``, the new checkpoint.

        Raises:
            ServingError: 404 unknown thread or checkpoint; 409 a run in progress, or no
                graph yet; 422 ``as_node`` naming no node, or values the graph refuses.
            RequestError: a message of ``values.messages`` the input filter refuses.
        """
        record = await self._record(thread_id, principal)
        graph_id, graph = self._thread_graph(record, principal)
        values: Any = body.values
        if values is not None and "messages" in values:
            messages = run_messages(values["messages"], param="values.messages")
            self._checks.messages(messages, principal, param="values.messages")
            values = {**values, "messages": messages}
        if body.as_node is not None and body.as_node not in graph.nodes and body.as_node not in _SPECIAL_NODES:
            nodes = sorted(set(graph.nodes) - {"__start__"})
            raise ServingError(
                422, f"as_node: graph {graph_id!r} has no node {body.as_node!r}; its nodes: {', '.join(nodes)}"
            )
        ref = body.checkpoint
        checkpoint_id = body.checkpoint_id or (ref.checkpoint_id if ref is not None else None)
        configurable: dict[str, Any] = {"thread_id": thread_id}
        if checkpoint_id is not None or (ref is not None and ref.checkpoint_ns):
            configurable["checkpoint_ns"] = ref.checkpoint_ns if ref is not None else ""
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
            if await self._checkpointer.aget_tuple({"configurable": configurable}) is None:
                raise ServingError(404, f"checkpoint {checkpoint_id!r} not found on thread {thread_id!r}")
        await self._refuse_if_shared_run(thread_id)
        with self._host.runs.claim(thread_id, "update"):
            try:
                config = await graph.aupdate_state({"configurable": configurable}, values, as_node=body.as_node)
            except (InvalidUpdateError, ValueError) as exc:
                # What the graph says of the update: no node to infer, an unknown
                # namespace, values that are not its state's.
                raise ServingError(422, f"values: graph {graph_id!r} cannot take this update: {exc}") from None
            snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
            await self._threads.update(thread_id, status="interrupted" if snapshot.interrupts else "idle")
        written = config["configurable"]
        return {
            "checkpoint": {
                "thread_id": written.get("thread_id", thread_id),
                "checkpoint_ns": written.get("checkpoint_ns", ""),
                "checkpoint_id": written.get("checkpoint_id"),
                **({"checkpoint_map": written["checkpoint_map"]} if written.get("checkpoint_map") else {}),
            }
        }

    async def patch_state(self, thread_id: str, body: StatePatch, principal: Principal) -> None:
        """Merge ``metadata`` into the latest checkpoint's metadata (the checkpoint is
        rewritten in place, with its parent and values unchanged).

        Raises:
            ServingError: 404 unknown thread; 409 a run in progress, or no state yet.
        """
        await self._record(thread_id, principal)
        await self._refuse_if_shared_run(thread_id)
        with self._host.runs.claim(thread_id, "update"):
            latest = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            saved = await self._checkpointer.aget_tuple(latest)
            if saved is None:
                raise ServingError(409, f"thread {thread_id!r} has no state yet: nothing to patch")
            parent = saved.parent_config or latest
            metadata: Any = {**saved.metadata, **body.metadata}
            await self._checkpointer.aput(parent, saved.checkpoint, metadata, {})

    async def copy_thread(self, thread_id: str, principal: Principal) -> dict[str, Any]:
        """A new thread (new id; same tenant, graph and metadata) holding a copy of
        every checkpoint of this one.

        Raises:
            ServingError: 404 unknown thread; 409 while it is being deleted.
        """
        record = await self._record(thread_id, principal)
        with self._host.runs.claim(thread_id, "copy"):
            copied, _ = await self._threads.create(
                tenant=principal.tenant, thread_id=str(uuid.uuid4()), metadata=record.metadata, graph_id=record.graph_id
            )
            assert copied is not None  # a new UUID
            try:
                await self._checkpointer.acopy_thread(thread_id, copied.thread_id)
                snapshot = await self._snapshot(copied)
                status: ThreadStatus = "error" if record.status == "error" else "idle"
                if snapshot is not None and snapshot.interrupts:
                    status = "interrupted"
                if status != "idle":
                    await self._threads.update(copied.thread_id, status=status)
            except BaseException:
                # No half copy: its checkpoints (the copy is one unit) and record go.
                await self._checkpointer.adelete_thread(copied.thread_id)
                await self._threads.delete(copied.thread_id)
                raise
        return await self.get_thread(copied.thread_id, principal)

    async def thread_stream(
        self, thread_id: str, principal: Principal, after: tuple[str, int | None] | None, events: frozenset[str] | None
    ) -> tuple[AsyncIterator[str], Callable[[], Awaitable[None]]]:
        """The thread's stream (``GET /threads/{id}/stream``): the events of its runs
        as they happen, from now on (foreground and background runs alike), each run
        ended by an ``end`` event. Event ids are ``<run_id>:<index>`` (the run's own
        index; ``<run_id>:end`` for its end), so ``after`` (the client's
        ``Last-Event-ID``) first replays what background runs kept after that event:
        the rest of that run and every later run of the thread.

        Args:
            after: ``(run_id, index)`` of the last event the client has (index None:
                that run's ``end``).
            events: the event names to send (`thread_events`), plus the control events.

        Returns:
            The frames, and the call that stops watching the thread (the response
            makes it, however it ends). Watching starts here, before the response
            does: a client that has the headers misses nothing after them.

        Raises:
            ServingError: 404 for an unknown thread (before the stream starts).
        """
        await self._record(thread_id, principal)
        runs = self._host.runs
        sent: dict[str, int] = {}
        """Per run, the highest index sent (live frames at or below it are repeats)."""
        ended: set[str] = set()

        def wanted(item: str) -> bool:
            mode = event_mode(item)
            return events is None or mode is None or mode in events or mode in CONTROL_EVENTS

        # Watched from before the replay is read (no await in between): nothing falls
        # between the two, and what is in both is sent once.
        watcher = runs.watch(thread_id)
        try:
            replay = self._thread_replay(thread_id, principal.tenant, after, sent, ended, wanted) if after else []
        except BaseException:
            runs.unwatch(watcher)
            raise

        async def frames() -> AsyncIterator[str]:
            for item in replay:
                yield item
            while (got := await watcher.next()) is not None:
                run_id, index, item = got
                if index is None:
                    if run_id not in ended:
                        ended.add(run_id)
                        yield item
                elif index > sent.get(run_id, -1):
                    sent[run_id] = index
                    if wanted(item):
                        yield _thread_frame(run_id, index, item)
            if watcher.overflowed:
                yield frame_without_id(
                    "error",
                    {
                        "error": "SlowConsumer",
                        "message": "this stream fell too far behind the thread's runs and was closed; "
                        "reconnect with Last-Event-ID",
                    },
                )

        async def close() -> None:
            runs.unwatch(watcher)

        return frames(), close

    def _thread_replay(
        self,
        thread_id: str,
        tenant: str,
        after: tuple[str, int | None],
        sent: dict[str, int],
        ended: set[str],
        wanted: Any,
    ) -> list[str]:
        run_id, index = after
        runs = sorted(self._host.runs.of_thread(thread_id, tenant), key=lambda r: r.created_at)
        start = next((i for i, r in enumerate(runs) if r.run_id == run_id), None)
        if start is None:
            return [f": run {run_id} is no longer known here; live events follow\n\n"]
        out: list[str] = []
        for position, run in enumerate(runs[start:]):
            first = position == 0
            if first and index is None:  # the client had its end
                ended.add(run.run_id)
                continue
            after_index = index if first and index is not None else -1
            if run.frames is None:
                out.append(f": the events of run {run.run_id} were not kept (it was not started resumable)\n\n")
                continue
            missing, kept = run.kept(after_index)
            if missing:
                out.append(f": {missing} earlier events of run {run.run_id} are no longer kept\n\n")
            number = max(after_index + 1, run.dropped)
            for item in kept:
                if wanted(item):
                    out.append(_thread_frame(run.run_id, number, item))
                number += 1
            sent[run.run_id] = number - 1
            if run.stream_closed:
                ended.add(run.run_id)
                out.append(end_frame(run.run_id))
        return out

    # ---- runs ------------------------------------------------------------------------

    def _prepare(self, entry: RegisteredGraph, body: RunCreate, principal: Principal) -> _Prepared:
        """Check a run request before it touches anything (no await): the graph, the
        sampling parameters against the backend's contract, every message the run
        would hand a model against the input filter, and the command's targets.

        Raises:
            RequestError: naming the field that is wrong.
            CapabilityError, ServingError: from `RunChecks`.
        """
        context = body.context or {}
        ignored = sorted(set(context) - CLIENT_CONTEXT_FIELDS)
        if ignored:
            log.info("run ignores context fields it does not take from clients: %s", ", ".join(map(str, ignored)))
        model_params = parse_sampling(context.get("model_params"), param="context.model_params")
        collection = context.get("collection")
        if collection is not None and not isinstance(collection, str):
            raise RequestError("context.collection must be a collection name", param="context.collection")
        self._checks.graph(entry.graph_id, principal, model_params)
        graph_input: Any = body.input
        if body.input is not None and "messages" in body.input:
            messages = run_messages(body.input["messages"], param="input.messages")
            self._checks.messages(messages, principal, param="input.messages")
            graph_input = {**body.input, "messages": messages}
            try:
                # The new messages alone past every context window: refused before the run.
                self._checks.graph(entry.graph_id, principal, model_params, messages)
            except CapabilityError as exc:
                raise CapabilityError(
                    exc.backend_id, exc.capability, f"input.{exc.param}", str(exc), needed=exc.needed
                ) from None
        resolve = False
        if body.command is not None:
            graph_input = self._command(entry, body.command, principal)
            resolve = _resolves(body.command)
            if resolve:
                graph_input = None
        return _Prepared(graph_input=graph_input, model_params=model_params, collection=collection, resolve=resolve)

    async def _resolve(
        self, graph: Pregel[Any, Any, Any, Any], config: dict[str, Any], run: ActiveRun, thread_id: str
    ) -> None:
        """``command.goto: "__end__"``: end the thread's pending tasks without running
        anything, and answer the last AI message's open tool calls with a refused
        ToolMessage each (as `tools.executor` answers a rejected call), so that the
        next turn hands the model no unanswered call (strict chat templates refuse
        one) and the thread's ``next`` is empty.

        In LangGraph's terms: clear the tasks (``update_state(None, as_node=END)``),
        write the answers as a node (the interrupted one if it routes by no condition),
        and clear again the tasks that write scheduled (one checkpoint each).
        """
        snapshot = await graph.aget_state(config)
        if not snapshot.interrupts:  # another run resolved it since `start_run` looked
            log.info("run %s on thread %s: command.goto __end__ found nothing pending", run.plan.run_id, thread_id)
            return
        calls = _unanswered_calls(snapshot.values)
        if calls and not isinstance(graph.channels.get("messages"), BinaryOperatorAggregate):
            # Written without a reducer, the answers would replace the conversation.
            log.warning(
                "run %s on thread %s: command.goto __end__ leaves %d tool call(s) unanswered: "
                "the graph's messages channel has no reducer", run.plan.run_id, thread_id, len(calls),
            )
            calls = []
        interrupted = [task.name for task in snapshot.tasks if task.interrupts]
        node = _plain_node(graph, interrupted) if calls else None
        steps: list[list[GraphUpdate]] = [[GraphUpdate(None, END)]]
        if node is not None:
            answers = [
                ToolMessage(
                    f"Refused: {_RESOLVED}",
                    tool_call_id=call["id"],
                    name=call["name"],
                    status="error",
                    artifact={"decision": "refused", "reason": _RESOLVED},
                )
                for call in calls
            ]
            steps += [[GraphUpdate({"messages": answers}, node)], [GraphUpdate(None, END)]]
        await graph.abulk_update_state(config, steps)
        # Ending the tasks also applies the writes of tasks that finished beside the
        # interrupted one, which can schedule more: end those too (nothing ever runs).
        for attempt in range(4):
            if not (await graph.aget_state(config)).next:
                break
            if attempt == 3:
                log.warning("run %s on thread %s: command.goto __end__ left tasks pending", run.plan.run_id, thread_id)
                break
            await graph.aupdate_state(config, None, as_node=END)
        sink = run.context().on_tool_call
        for call in calls if node is not None else ():
            if sink is not None:
                sink(ToolCallRecord(
                    call_id=call["id"], tool=call["name"], args_hash=args_hash(call.get("args")),
                    decision="refused", reason=_RESOLVED,
                ))
        log.info(
            "run %s on thread %s: resolved by a person (command.goto __end__), nothing run; tool calls answered as "
            "refused: %s", run.plan.run_id, thread_id, ", ".join(c["id"] for c in calls) if node is not None else "none",
        )
        if calls and node is None:
            log.warning("thread %s: no node to write the refused tool calls as; left unanswered", thread_id)

    def _command(self, entry: RegisteredGraph, command: RunCommand, principal: Principal) -> Command[Any]:
        update: Any = command.update
        if isinstance(update, dict) and "messages" in update:
            messages = run_messages(update["messages"], param="command.update.messages")
            self._checks.messages(messages, principal, param="command.update.messages")
            update = {**update, "messages": messages}
        elif isinstance(update, list):
            checked = []
            for index, (key, value) in enumerate(update):
                if key == "messages":
                    value = run_messages(value, param=f"command.update.{index}.1")
                    self._checks.messages(value, principal, param=f"command.update.{index}.1")
                checked.append((key, value))
            update = checked
        goto = command.goto
        targets = [goto] if isinstance(goto, str) else list(goto or ())
        if END in targets and not _resolves(command):
            raise RequestError(
                f"command.goto {END!r} ends the thread's pending tasks (Agent Chat UI's \"Mark as Resolved\") and "
                "takes no other target, update or resume",
                param="command.goto",
            )
        nodes = set(entry.graph.nodes) - {"__start__"}
        for target in targets:
            if target not in nodes and target != END:
                raise RequestError(
                    f"command.goto: graph {entry.graph_id!r} has no node {target!r}; its nodes: {', '.join(sorted(nodes))}",
                    param="command.goto",
                )
        fields: dict[str, Any] = {"update": update, "goto": goto or ()}
        if "resume" in command.model_fields_set:
            fields["resume"] = command.resume
        return Command(**fields)

    def _checked(self, thread_id: str | None, body: RunCreate, principal: Principal) -> tuple[RegisteredGraph, _Prepared]:
        """`start_run`'s checks that need no await (see `_prepare`)."""
        entry = self.resolve(body.assistant_id, principal)
        if entry.threaded is None:
            raise ServingError(503, "threads are not available: no checkpointer configured")
        if body.multitask_strategy == "rollback":
            raise ServingError(400, "multitask_strategy 'rollback' is not supported; use reject, interrupt or enqueue")
        resume = body.command is not None and "resume" in body.command.model_fields_set
        if thread_id is None and resume:
            raise ServingError(400, "command.resume answers an interrupt on a thread: use POST /threads/{thread_id}/runs")
        if body.command is not None and _resolves(body.command):
            if thread_id is None:
                raise ServingError(400, f"command.goto {END!r} ends a thread's pending tasks: use POST /threads/{{thread_id}}/runs")
            # `{}` is what useStream's submit({}, {command}) sends: no input.
            if body.input or body.checkpoint or body.checkpoint_id:
                field = "input" if body.input else "checkpoint"
                raise RequestError(
                    f"command.goto {END!r} takes no input/checkpoint: it ends the pending tasks at the thread's "
                    f"head and runs nothing (got {field})",
                    param=field,
                )
        return entry, self._prepare(entry, body, principal)

    @staticmethod
    def _nothing_to_resolve(thread_id: str, status: str) -> ServingError:
        return ServingError(
            409,
            f"thread {thread_id!r} has nothing to resolve: command.goto {END!r} ends an interrupt waiting for "
            f"an answer, and none is (its status is {status!r})",
        )

    async def check_run(self, thread_id: str | None, body: RunCreate, principal: Principal) -> None:
        """What `start_run` checks before it takes or writes anything (a batch checks
        every run before it starts any); reads the thread, writes nothing.

        Raises:
            ServingError, RequestError, CapabilityError: as `start_run` would.
        """
        self._checked(thread_id, body, principal)
        if thread_id is None:
            return
        record = await self._threads.get(thread_id, tenant=principal.tenant)
        if record is None and body.if_not_exists != "create":
            raise ServingError(404, f"thread {thread_id!r} not found")
        resume = body.command is not None and "resume" in body.command.model_fields_set
        if record is not None and resume and record.status != "interrupted":
            raise ServingError(
                409, f"thread {thread_id!r} has no interrupt waiting for an answer (its status is {record.status!r})"
            )
        if body.command is not None and _resolves(body.command) and (record is None or record.status != "interrupted"):
            raise self._nothing_to_resolve(thread_id, record.status if record is not None else "new")

    async def start_run(
        self, thread_id: str | None, body: RunCreate, request_id: str, principal: Principal, deadline_s: float | None = None
    ) -> StartedRun:
        """Check the run, then start it: on return it holds its run slot, its record and
        its thread, and its first event (``metadata``) is out. The caller must close
        ``events`` (they give everything back when closed, whatever their state); they
        are consumed in the caller's task (or a background task), and past
        ``deadline_s``, or when the run is cancelled, they end with
        `RunDeadlineError` / `RunCancelledError`.

        Raises:
            ServingError: unknown assistant (404), missing thread (404), a thread with
                a run in progress under ``multitask_strategy: reject`` (409), an
                unsupported strategy (400), a run-slot limit (429).
            RequestError: a malformed part of the request (400), naming it.
        """
        entry, prepared = self._checked(thread_id, body, principal)
        stateless = thread_id is None
        resume = body.command is not None and "resume" in body.command.model_fields_set
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
                runs = self._host.runs
                runs.refuse_if_deleting(thread_id)
                created, new = await self._threads.create(tenant=principal.tenant, thread_id=thread_id, graph_id=entry.graph_id)
                if created is None:  # the id is another tenant's thread
                    raise ServingError(404, f"thread {thread_id!r} not found")
                if new and runs.deleting(thread_id):
                    # A delete of this id began while the record was being created: the
                    # record may have outlived it, so it goes, and the run does not start.
                    await self._threads.delete(thread_id)
                    runs.refuse_if_deleting(thread_id)
                record = created
            if resume and record.status != "interrupted":
                # Answered already (a second resume of one interrupt), or never asked.
                raise ServingError(
                    409, f"thread {thread_id!r} has no interrupt waiting for an answer (its status is {record.status!r})"
                )
            if prepared.resolve and record.status != "interrupted":
                raise self._nothing_to_resolve(thread_id, record.status)
        keep = not stateless or body.on_completion == "keep"
        graph = entry.threaded if keep else self._scratch_graphs[entry.graph_id]
        graph = tenant_graph(graph, self._store, principal.tenant)
        assert graph is not None
        if prepared.resolve:
            # The checkpoint, not only the record: nothing pending means nothing to end
            # (and LangGraph would refuse a run with no input on a thread with no state).
            snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
            if not snapshot.interrupts:
                raise self._nothing_to_resolve(thread_id, "interrupted, but its state has no pending interrupt")
        run_record = RunRecord(
            run_id=str(uuid.uuid4()),
            thread_id=thread_id if keep else None,  # a kept stateless run names the thread it made
            assistant_id=assistant_uuid(entry.graph_id),
            tenant=principal.tenant,
            multitask_strategy=body.multitask_strategy,
            metadata=dict(body.metadata or {}),
        )

        async def thread_status() -> ThreadStatus:
            snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
            return "interrupted" if snapshot.interrupts else "idle"

        plan = RunPlan(
            protocol="langgraph",
            kind="graph",
            target=entry.graph_id,
            principal=principal,
            request_id=request_id,
            run_id=run_record.run_id,
            deadline_s=deadline_s,
            model_params=prepared.model_params,
            collection=prepared.collection,
            thread_id=thread_id if keep else None,
            thread_metadata={"graph_id": entry.graph_id, "assistant_id": run_record.assistant_id} if keep else None,
            thread_status=thread_status if keep else None,
            record=run_record,
            approvals=keep,  # a kept thread can be resumed with the answer
            # Sticky on the thread; a run whose state is not kept, on its request.
            routing=RouteScope(key=thread_id if keep else request_id),
        )
        events = self._run(graph, plan, body, prepared, thread_id, keep=keep)
        try:
            first = await anext(events)
        except BaseException:
            await events.aclose()
            raise
        assert plan.routing is not None
        return StartedRun(record=run_record, first=first, events=events, routing=plan.routing)

    def run_record(self, thread_id: str, run_id: str, principal: Principal) -> RunRecord:
        """A run this replica hosts (or hosted).

        Raises:
            ServingError: 404 for an unknown run (or another tenant's).
        """
        record = self._host.runs.get(run_id, principal.tenant, thread_id)
        if record is None:
            raise ServingError(404, f"run {run_id!r} not found on thread {thread_id!r}")
        return record

    async def find_run(self, thread_id: str, run_id: str, principal: Principal) -> RunRecord | SharedRun:
        """A run on the thread: this replica's record, else (replicas) the shared one
        of the replica that hosts it.

        Raises:
            ServingError: 404 for an unknown run (or another tenant's).
        """
        record = self._host.runs.get(run_id, principal.tenant, thread_id)
        if record is not None:
            return record
        board = self._host.runs.board
        shared = await board.get(run_id) if board is not None else None
        if shared is None or shared.tenant != principal.tenant or shared.thread_id != thread_id:
            raise ServingError(404, f"run {run_id!r} not found on thread {thread_id!r}")
        return shared

    def stateless_run(self, run_id: str, principal: Principal) -> RunRecord:
        """A stateless run (one with no thread of its own) this replica hosts.

        Raises:
            ServingError: 404 for an unknown run, another tenant's, or a thread's run
                (joined at ``/threads/{thread_id}/runs/{run_id}``).
        """
        record = self._host.runs.get(run_id, principal.tenant)
        if record is None or record.thread_id is not None:
            raise ServingError(404, f"stateless run {run_id!r} not found")
        return record

    async def find_stateless_run(self, run_id: str, principal: Principal) -> RunRecord | SharedRun:
        """`stateless_run`, else (replicas) the shared record of another replica's."""
        try:
            return self.stateless_run(run_id, principal)
        except ServingError:
            board = self._host.runs.board
            shared = await board.get(run_id) if board is not None else None
            if shared is None or shared.tenant != principal.tenant or shared.thread_id is not None:
                raise
            return shared

    async def thread_runs(
        self, thread_id: str, principal: Principal, *, limit: int = 10, offset: int = 0, status: str | None = None
    ) -> list[dict[str, Any]]:
        """The thread's runs, newest first, ``status`` only if given: this replica's,
        and (replicas) every other replica's."""
        found: list[RunRecord | SharedRun] = list(self._host.runs.of_thread(thread_id, principal.tenant))
        board = self._host.runs.board
        if board is not None:
            local = {r.run_id for r in found}
            found += [r for r in await board.of_thread(thread_id, principal.tenant) if r.run_id not in local]
            found.sort(key=lambda r: r.created_at, reverse=True)
        found = [r for r in found if status is None or r.status == status]
        return [r.json() for r in found[offset : offset + limit]]

    async def cancel(self, run: RunRecord | SharedRun, reason: str, *, wait: bool = False) -> None:
        """Cancel a run wherever it runs (``action=interrupt``: what it saved stays);
        with ``wait``, until it has ended (a remote run: at most ``delete_wait_s``).

        Raises:
            ServingError: 409 when ``wait`` and another replica's run has not ended in time.
        """
        if isinstance(run, RunRecord):
            if not run.done:
                run.guard.stop(RunCancelledError(reason))
                if wait:
                    await run.wait()
            return
        board = self._host.runs.board
        assert board is not None
        if run.done or not await board.request_cancel(run.run_id, reason):
            return
        if wait and not await board.wait_ended(run.run_id, self._delete_wait_s):
            raise ServingError(
                409, f"run {run.run_id!r} (on replica {run.replica_id}) has not ended yet; the cancel stays requested"
            )

    async def join(self, run: RunRecord | SharedRun) -> None:
        """Wait for a run to end, wherever it runs."""
        if isinstance(run, RunRecord):
            await run.wait()
            return
        board = self._host.runs.board
        assert board is not None
        await board.wait_ended(run.run_id, None)

    def follow(self, run: RunRecord | SharedRun, after: int, events: frozenset[str] | None) -> AsyncIterator[str]:
        """A background run's frames after ``after``, then live ones until it ends.

        Raises:
            ServingError: 409 for a run that was not started resumable.
        """
        if isinstance(run, RunRecord):
            if run.frames is None:
                raise ServingError(409, f"run {run.run_id!r} was not started resumable; its stream cannot be joined")
            return run.follow(after, events)
        board = self._host.runs.board
        assert board is not None
        if not run.background:
            raise ServingError(409, f"run {run.run_id!r} was not started resumable; its stream cannot be joined")
        return board.follow(run.run_id, after, events)

    async def reaped_thread(self, thread_id: str, tenant: str) -> None:
        """The thread's run was ended by a sweeper (its replica died): its status as a
        cancelled run leaves it (``interrupted`` when its checkpoint waits at an
        interrupt, else ``idle``)."""
        record = await self._threads.get(thread_id, tenant=tenant)
        if record is None:
            return
        graph = self._threaded(record.graph_id)
        status: ThreadStatus = "idle"
        if graph is not None:
            snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
            status = "interrupted" if snapshot.interrupts else "idle"
        await self._threads.update(thread_id, status=status)

    async def _refuse_if_shared_run(self, thread_id: str) -> None:
        """Raises ServingError 409 while another replica runs the thread (replicas)."""
        board = self._host.runs.board
        if board is not None and (active := await board.active_on(thread_id)) is not None:
            if self._host.runs.lookup(active.run_id) is None:
                raise ServingError(
                    409, f"thread {thread_id!r} has a run in progress ({active.run_id}, on replica {active.replica_id})"
                )

    async def cancel_runs(self, body: RunsCancel, principal: Principal) -> None:
        """``POST /runs/cancel``: cancel the tenant's runs named by ``run_ids`` (on
        ``thread_id`` if given), or all its runs in ``status`` (on ``thread_id`` if
        given); with both, those of ``run_ids`` in ``status``. A run that has ended
        already is left as it is.

        Raises:
            ServingError: 422 with neither ``run_ids`` nor ``status``; 404 for an
                unknown ``thread_id``, or naming the ``run_ids`` not found (another
                tenant's included) and then nothing is cancelled.
        """
        if body.run_ids is None and body.status is None:
            raise ServingError(422, "run_ids or status is required")
        runs = self._host.runs
        board = runs.board
        if body.thread_id is not None:
            await self._record(body.thread_id, principal)
        chosen: list[RunRecord | SharedRun]
        if body.run_ids is not None:
            found: dict[str, RunRecord | SharedRun | None] = {}
            for run_id in dict.fromkeys(body.run_ids):
                record: RunRecord | SharedRun | None = runs.get(run_id, principal.tenant, body.thread_id)
                if record is None and board is not None:
                    shared = await board.get(run_id)
                    if shared is not None and shared.tenant == principal.tenant and (
                        body.thread_id is None or shared.thread_id == body.thread_id
                    ):
                        record = shared
                found[run_id] = record
            if missing := [run_id for run_id, record in found.items() if record is None]:
                where = f" on thread {body.thread_id!r}" if body.thread_id is not None else ""
                more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
                raise ServingError(
                    404, f"run_ids: run(s) not found{where}: {', '.join(missing[:10])}{more}; none was cancelled"
                )
            chosen = [record for record in found.values() if record is not None]
        else:
            chosen = list(runs.of_tenant(principal.tenant))
            if board is not None:
                local = {r.run_id for r in chosen}
                chosen += [r for r in await board.of_tenant(principal.tenant) if r.run_id not in local]
            if body.thread_id is not None:
                chosen = [r for r in chosen if r.thread_id == body.thread_id]
        for record in chosen:
            if not record.done and body.status in (None, "all", record.status):
                await self.cancel(record, "cancelled on request")

    async def delete_run(self, thread_id: str, run_id: str, principal: Principal) -> None:
        """Forget a finished run (wherever it ran).

        Raises:
            ServingError: 404 unknown run; 409 a run not finished.
        """
        run = await self.find_run(thread_id, run_id, principal)
        if isinstance(run, RunRecord):
            self._host.runs.delete(run)
            return
        if not run.done:
            raise ServingError(409, f"run {run_id!r} is {run.status}; cancel it first")
        board = self._host.runs.board
        assert board is not None
        board.forget(run_id)
        await board.flushed(run_id, 10.0)

    def relay(self, started: StartedRun) -> AsyncIterator[str]:
        """A foreground run's SSE frames, also handed to its thread's streams."""
        record = started.record
        return self._host.runs.relay(record, sse_frames(started.events, started.first, run_id=record.run_id))

    async def observed(self, started: StartedRun) -> AsyncIterator[tuple[str, Any]]:
        """A run's events after ``metadata`` (``runs/wait``), also handed to its
        thread's streams as frames (rendered only while someone watches). Closes them."""
        runs, record = self._host.runs, started.record
        index = 0

        def publish(name: str, data: Any) -> None:
            nonlocal index
            if runs.watched(record.thread_id):
                runs.publish(record, index, frame(name, data, index))
            index += 1

        try:
            publish(*started.first)
            async with aclosing(started.events) as events:
                try:
                    async for name, data in events:
                        publish(name, data)
                        yield name, data
                except Exception as exc:
                    publish("error", stop_error(exc, record.run_id))
                    raise
        finally:
            runs.close_stream(record)

    async def start_batch(
        self, items: list[RunBatchItem], request_id: str, principal: Principal, deadline_s: float | None = None
    ) -> list[dict[str, Any]]:
        """Start background runs (``POST /runs/batch``): every item is checked before
        any starts; then they start in order. If one fails to start (a thread busy
        under ``reject``, a run-slot limit), the runs already started are cancelled
        and waited for (at most ``delete_wait_s``), and the error names the item: the
        batch starts whole or not at all (a cancelled run may have saved a checkpoint
        before it stopped, as any cancelled run does).

        Raises:
            ServingError, RequestError, CapabilityError: the first item refused, its
                index in the message (``param`` ``<index>.<field>``).
        """
        for index, item in enumerate(items):
            with _batch_item(index):
                await self.check_run(item.thread_id, item, principal)
        started: list[RunRecord] = []
        try:
            for index, item in enumerate(items):
                with _batch_item(index):
                    run = await self.start_run(item.thread_id, item, request_id, principal, deadline_s)
                await self.start_background(run)
                started.append(run.record)
        except BaseException:
            for record in started:
                record.guard.stop(RunCancelledError("another run of its batch could not start"))
            if started:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in started)), self._delete_wait_s)
            raise
        return [record.json() for record in started]

    async def start_background(self, started: StartedRun) -> None:
        """Run on in a task of the server's, keeping the frames for `follow` (replicas:
        on the board too, marked before this returns, so any replica can join it)."""
        runs = self._host.runs
        runs.start_background(
            started.record, sse_frames(started.events, started.first, run_id=started.record.run_id), started.events.aclose
        )
        if runs.board is not None:
            await runs.board.flushed(started.record.run_id, 10.0)

    async def aclose(self) -> None:
        await self._host.aclose()

    async def _run(
        self,
        graph: Pregel[Any, Any, Any, Any],
        plan: RunPlan,
        body: RunCreate,
        prepared: _Prepared,
        thread_id: str,
        *,
        keep: bool,
    ) -> AsyncGenerator[tuple[str, Any], None]:
        # Checked before the run takes anything (raised by the first `anext`).
        refuse_unsupported(body.webhook, body.after_seconds, body.feedback_keys)
        stops = {
            "interrupt_before": breakpoints(body.interrupt_before, graph, field="interrupt_before"),
            "interrupt_after": breakpoints(body.interrupt_after, graph, field="interrupt_after"),
        }
        config: dict[str, Any] = body.config.as_config() if body.config is not None else {}
        configurable = {**config.get("configurable", {}), "thread_id": thread_id}
        if body.checkpoint:
            configurable.update({k: v for k, v in body.checkpoint.items() if k != "thread_id" and v is not None})
        if body.checkpoint_id:
            configurable["checkpoint_id"] = body.checkpoint_id
        config["configurable"] = configurable
        config["metadata"] = {
            **config.get("metadata", {}),
            **(body.metadata or {}),
            "run_id": plan.run_id,
            "thread_id": thread_id,
            "graph_id": plan.target,
            "assistant_id": assistant_uuid(plan.target),
            "run_attempt": 1,
        }
        modes = body.modes()
        lib_modes = [m for m in dict.fromkeys(_LIB_MODE.get(m, m) for m in modes) if m is not None]
        # A kept thread's status after the run: interrupted if the graph stopped at an
        # interrupt, which the root graph reports as an `__interrupt__` update (a
        # subgraph's included); watched here so that no checkpoint read is needed
        # (and asked for when only `events` are: the graph streams some mode).
        watch = "updates" not in lib_modes and (keep or not lib_modes)
        tuples = "messages-tuple" in modes
        messages = MessagesMode() if "messages" in modes else None
        interrupted = False
        try:
            async with self._host.open(plan) as run:
                if run.span.callbacks:
                    config["callbacks"] = run.span.callbacks
                config = run.config(config)
                yield "metadata", {"run_id": plan.run_id, "attempt": 1}
                errors = _EventErrors(plan.run_id)
                try:
                    if prepared.resolve:
                        # Nothing runs: the graph is never invoked (the thread's tasks
                        # are ended by `_resolve`), and the run sends the state as it is.
                        await self._resolve(graph, config, run, thread_id)
                        stream = _state_parts(graph, config, lib_modes)
                    else:
                        stream = graph_parts(
                            graph,
                            prepared.graph_input,
                            config,
                            context=run.context(),
                            stream_mode=[*lib_modes, "updates"] if watch else lib_modes,
                            subgraphs=body.stream_subgraphs,
                            events="events" in modes,
                            **stops,
                        )
                    guard = run.guard
                    event_streams = GuardStreams(guard)
                    async with aclosing(run.events(stream)) as parts:
                        async for part in parts:
                            kind = part["type"]
                            if kind == "updates" and not part["ns"] and "__interrupt__" in part["data"]:
                                interrupted = interrupted or bool(part["data"]["__interrupt__"])
                            if watch and kind == "updates":
                                continue
                            if kind == "events":
                                event = errors.value(part["data"])
                                if event.get("event") == "on_chat_model_stream":
                                    run.token()
                                # Chunks stream-checked apart from the `messages` modes'.
                                yield "events", checked_event(event, event_streams, _checked_message) if guard.active else event
                                continue
                            name = kind
                            if part["ns"]:
                                name = f"{name}|{'|'.join(part['ns'])}"
                            data = part["data"]
                            if kind == "values" and part.get("interrupts"):
                                data = {**data, "__interrupt__": _interrupts(part["interrupts"])}
                            elif kind in _ERROR_MODES:
                                data = errors.value(data)
                            if kind == "messages":
                                run.token()
                                message, metadata = data
                                if guard.active:  # the message; its metadata is the server's
                                    message = _checked_message(message, guard)
                                if tuples:
                                    yield name, [message, metadata]
                                if messages is not None:  # LangGraph Server's: no `|ns` on these
                                    check = (lambda whole: checked_whole(whole, guard)) if guard.active else None
                                    for event_name, payload in messages.add(message, metadata, check):
                                        yield event_name, payload
                                continue
                            if guard.active:
                                # State, updates, custom events: whatever the graph sends
                                # leaves the server here (citations, tool results, arguments).
                                data = guard.check_value(data)
                            yield name, data
                    await run.stage("streamed")
                    if keep:
                        # Waiting for an answer only if a task asked (static
                        # breakpoints report an empty `__interrupt__`).
                        run.thread_status = "interrupted" if interrupted else "idle"
                except OutputBlockedError as exc:
                    # Closing the graph's stream (leaving the loop) stopped the run.
                    run.blocked()
                    run.thread_status = "idle"
                    yield "error", client_error(exc).json()
                except (RunDeadlineError, RunCancelledError):
                    raise
                except Exception as exc:  # boundary: a failed run is an error event, not a broken stream
                    run.fail(exc)
                    # A known failure keeps its message; an unexpected one is logged
                    # whole and the client gets a generic message naming the ids
                    # (once: a task's error already sent in an event is not logged again).
                    if (sent := errors.seen(exc)) is not None:
                        yield "error", sent
                    else:
                        error = client_error(exc, run_id=plan.run_id)
                        if error.type != "InternalError":
                            log.warning("run %s on thread %s failed: %s: %s", plan.run_id, thread_id, error.type, error.message)
                        yield "error", error.json()
        finally:
            if not keep:  # in memory: nothing to wait for
                await self._scratch.adelete_thread(thread_id)
