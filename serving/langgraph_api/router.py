"""Routes of the LangGraph Server API; the work is in `LangGraphService`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response

from serving._tasks import RunCancelledError, RunDeadlineError
from serving.errors import ServingError
from serving.deps import DeadlineDep, PrincipalDep, RequestIdDep, require_key
from serving.langgraph_api.bodies import JsonBodyRoute
from serving.langgraph_api.protocol import (
    Assistant,
    AssistantCount,
    AssistantSearch,
    Detail,
    HistoryRequest,
    Info,
    Ok,
    THREAD_ID_PATTERN,
    MAX_BATCH,
    Run,
    RunBatchItem,
    RunCreate,
    RunsCancel,
    SearchedThread,
    StateCheckpointRequest,
    StatePatch,
    StateUpdate,
    Thread,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadPrune,
    ThreadPruned,
    ThreadSearch,
    ThreadState,
)
from serving.langgraph_api.service import (
    LangGraphService,
    dumps,
    join_events,
    stop_error,
    thread_event_id,
    thread_events,
)
from serving.runs import RunRecord, served_by
from serving.shared.runs import SharedRun
from serving.sse import SSE_EVENT_SCHEMA, EventStream, cancel_on_disconnect, read_ahead
from serving.sse import cancel_on_disconnect as _disconnect_cancels  # `join_run` has a parameter of that name

__all__ = ["open_router", "router"]

async def _deadline_in_state(request: Request, deadline_s: DeadlineDep) -> None:
    request.state.deadline_s = deadline_s


_ERRORS: dict[int | str, dict[str, Any]] = {
    # JSON whatever the route's own media type (an event stream's errors come before it).
    status: {"description": description, "content": {"application/json": {"schema": Detail.model_json_schema()}}}
    for status, description in {
        400: "Refused: an unsupported option, or the input filter",
        401: "Missing or invalid API key",
        403: "The tenant may not use this graph (or collection)",
        404: "Unknown assistant or thread (another tenant's thread is 404 too)",
        409: "Thread exists, or has a run in progress",
        413: "Request body too large",
        422: "Invalid request (names the field)",
        429: "Rate or concurrency limit (see Retry-After)",
    }.items()
}
_STREAM = {
    200: {
        "description": "Server-sent events: `metadata` first, then one event per stream part, `error` on failure",
        "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
    }
}

# Bodies are JSON whatever their label (Agent Chat UI's proxy sends text/plain): see `bodies`.
router = APIRouter(
    tags=["langgraph"], dependencies=[require_key, Depends(_deadline_in_state)], responses=_ERRORS, route_class=JsonBodyRoute
)


async def _service(request: Request) -> LangGraphService:
    service: LangGraphService = request.app.state.langgraph_service
    return service


ServiceDep = Annotated[LangGraphService, Depends(_service)]
ThreadIdPath = Annotated[str, Path(pattern=THREAD_ID_PATTERN, description="A thread id (a UUID, or a plain name)")]


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(value), status_code=status, media_type="application/json", headers=headers)


open_router = APIRouter(tags=["langgraph"])
"""Routes that need no key: LangGraph Server's liveness probe (like ``/healthz``)."""


@open_router.get("/ok", response_model=Ok)
async def ok() -> dict[str, bool]:
    """Liveness, as LangGraph Server answers it."""
    return {"ok": True}


@router.get("/info", response_model=Info)
async def info() -> dict[str, Any]:
    """Server information (Agent Chat UI checks it answers)."""
    return {"version": "switchyard-0.1.0", "flags": {"assistants": True, "crons": False, "langsmith": False}}


@router.post("/assistants/search", response_model=list[Assistant])
async def search_assistants(service: ServiceDep, principal: PrincipalDep, body: AssistantSearch | None = None) -> Response:
    """One assistant per registered graph the caller may use."""
    return _json(service.search_assistants(body or AssistantSearch(), principal))


@router.post("/assistants/count", response_model=int)
async def count_assistants(service: ServiceDep, principal: PrincipalDep, body: AssistantCount | None = None) -> Response:
    """How many assistants ``/assistants/search`` finds with these filters."""
    return _json(service.count_assistants(body or AssistantCount(), principal))


@router.get("/assistants/{assistant_id}", response_model=Assistant)
async def get_assistant(assistant_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json(service.get_assistant(assistant_id, principal))


@router.post("/threads", response_model=Thread)
async def create_thread(service: ServiceDep, principal: PrincipalDep, body: ThreadCreate | None = None) -> Response:
    return _json(await service.create_thread(body or ThreadCreate(), principal))


@router.post("/threads/search", response_model=list[SearchedThread])
async def search_threads(service: ServiceDep, principal: PrincipalDep, body: ThreadSearch | None = None) -> Response:
    return _json(await service.search_threads(body or ThreadSearch(), principal))


@router.post("/threads/count", response_model=int)
async def count_threads(service: ServiceDep, principal: PrincipalDep, body: ThreadCount | None = None) -> Response:
    """How many of the tenant's threads ``/threads/search`` finds with these filters."""
    return _json(await service.count_threads(body or ThreadCount(), principal))


@router.post("/threads/prune", response_model=ThreadPruned)
async def prune_threads(body: ThreadPrune, service: ServiceDep, principal: PrincipalDep) -> Response:
    """``delete`` the threads (as ``DELETE /threads/{id}``), or ``keep_latest``: keep
    each thread with only its latest checkpoint per namespace (409 naming a thread with
    a run in progress; nothing pruned). Another tenant's and unknown ids are skipped
    and not counted."""
    return _json({"pruned_count": await service.prune_threads(body, principal)})


@router.get("/threads/{thread_id}", response_model=Thread)
async def get_thread(thread_id: ThreadIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json(await service.get_thread(thread_id, principal))


@router.patch(
    "/threads/{thread_id}",
    response_model=Thread,
    responses={204: {"description": "Updated (with `Prefer: return=minimal`)"}},
)
async def patch_thread(
    thread_id: ThreadIdPath,
    body: ThreadPatch,
    service: ServiceDep,
    principal: PrincipalDep,
    prefer: Annotated[str | None, Header()] = None,
) -> Response:
    """Merge ``metadata`` into the thread's; ``ttl`` is refused (400)."""
    thread = await service.patch_thread(thread_id, body, principal)
    if prefer is not None and "return=minimal" in prefer.replace(" ", "").lower():
        return Response(status_code=204)
    return _json(thread)


@router.delete("/threads/{thread_id}", status_code=204, response_class=Response, responses={204: {"description": "Deleted"}})
async def delete_thread(thread_id: ThreadIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Delete the thread and its checkpoints; a run in progress is cancelled first."""
    await service.delete_thread(thread_id, principal)
    return Response(status_code=204)


@router.post("/threads/{thread_id}/copy", response_model=Thread)
async def copy_thread(thread_id: ThreadIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    """A new thread with the same graph and metadata and a copy of every checkpoint."""
    return _json(await service.copy_thread(thread_id, principal))


SubgraphsQuery = Annotated[bool, Query(description="Give each subgraph task its subgraph's state")]


@router.get("/threads/{thread_id}/state", response_model=ThreadState)
async def get_thread_state(
    thread_id: ThreadIdPath, service: ServiceDep, principal: PrincipalDep, subgraphs: SubgraphsQuery = False
) -> Response:
    return _json(await service.thread_state(thread_id, principal, subgraphs=subgraphs))


@router.post("/threads/{thread_id}/state", response_model=dict[str, Any])
async def update_thread_state(thread_id: ThreadIdPath, body: StateUpdate, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Write ``values`` to the state as node ``as_node``; answers the new ``checkpoint``."""
    return _json(await service.update_state(thread_id, body, principal))


@router.patch("/threads/{thread_id}/state", status_code=204, response_class=Response, responses={204: {"description": "Patched"}})
async def patch_thread_state(thread_id: ThreadIdPath, body: StatePatch, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Merge ``metadata`` into the latest checkpoint's metadata."""
    await service.patch_state(thread_id, body, principal)
    return Response(status_code=204)


@router.post("/threads/{thread_id}/state/checkpoint", response_model=ThreadState)
async def get_thread_state_at_checkpoint(
    thread_id: ThreadIdPath, body: StateCheckpointRequest, service: ServiceDep, principal: PrincipalDep
) -> Response:
    """The thread's state at ``checkpoint`` (``checkpoint_id``, ``checkpoint_ns``)."""
    ref = body.checkpoint
    return _json(
        await service.thread_state(
            thread_id, principal, ref.checkpoint_id, checkpoint_ns=ref.checkpoint_ns, subgraphs=body.subgraphs
        )
    )


@router.get("/threads/{thread_id}/state/{checkpoint_id}", response_model=ThreadState)
async def get_thread_state_at(
    thread_id: ThreadIdPath, checkpoint_id: str, service: ServiceDep, principal: PrincipalDep, subgraphs: SubgraphsQuery = False
) -> Response:
    """The thread's state at one checkpoint (from its history)."""
    return _json(await service.thread_state(thread_id, principal, checkpoint_id, subgraphs=subgraphs))


@router.post("/threads/{thread_id}/history", response_model=list[ThreadState])
async def get_thread_history(
    thread_id: ThreadIdPath, service: ServiceDep, principal: PrincipalDep, body: HistoryRequest | None = None
) -> Response:
    """States newest first; ``before`` (a checkpoint id or ``{checkpoint_id}``) pages back;
    ``metadata`` filters on checkpoint metadata, ``checkpoint`` picks a subgraph's
    namespace, ``select`` the fields of each state."""
    query = body or HistoryRequest()
    before = query.before.get("checkpoint_id") if isinstance(query.before, dict) else query.before
    return _json(
        await service.thread_history(
            thread_id, query.limit, principal, before, metadata=query.metadata, checkpoint=query.checkpoint, select=query.select
        )
    )


def _location(thread_id: str | None, run_id: str) -> str:
    # Not ".../stream": the SDKs read the run id from this header with a greedy pattern.
    return f"/threads/{quote(thread_id)}/runs/{run_id}" if thread_id else f"/runs/{run_id}"


_SHUTDOWN_FAREWELL = (
    "event: error\ndata: "
    + dumps({"error": "ServerShutdown", "message": "the server is shutting down; the run was cancelled"})
    + "\n\n"
)


async def _stream(
    service: LangGraphService, thread_id: str | None, body: RunCreate, request_id: str, request: Request
) -> EventStream:
    principal, deadline_s = request.state.principal, request.state.deadline_s
    # The run starts here (its first event is `metadata`); from now on its events
    # hold what it took, and closing them (the response always does) gives it back.
    started = await service.start_run(thread_id, body, request_id, principal, deadline_s)
    run = started.record
    headers = {"Content-Location": _location(run.thread_id, run.run_id)}
    frames: AsyncIterator[str]
    close = None
    if body.stream_resumable or body.on_disconnect == "continue":
        # The run belongs to the server now: a client that leaves can come back.
        await service.start_background(started)
        frames = run.follow()
        if run.thread_id is not None:
            headers["Location"] = f"/threads/{quote(run.thread_id)}/runs/{run.run_id}/stream"
    else:
        frames = service.relay(started)  # its thread's streams get the frames too
        close = started.events.aclose
    server = request.app.state.platform.settings.server
    try:
        # The response starts once the backend that answers is known (the header names
        # it, after any fallback), or the run has ended, or a keep-alive interval passed.
        async with cancel_on_disconnect(request.receive):
            frames = await read_ahead(frames, lambda: started.routing.backend is not None, server.keepalive_s)
    except BaseException:
        await (close or frames.aclose)()  # type: ignore[attr-defined]
        raise
    headers.update(served_by(started.routing))
    return EventStream(
        frames,
        close=close,
        headers=headers,
        keepalive_s=server.keepalive_s,
        drain=request.app.state.drain,
        grace_s=server.shutdown_grace_s,
        farewell=_SHUTDOWN_FAREWELL,
    )


async def _wait(
    service: LangGraphService, thread_id: str | None, body: RunCreate, request_id: str, request: Request
) -> Response:
    values_only = body.model_copy(update={"stream_mode": "values"})
    principal, deadline_s = request.state.principal, request.state.deadline_s
    result: Any = None
    async with cancel_on_disconnect(request.receive):
        started = await service.start_run(thread_id, values_only, request_id, principal, deadline_s)
        # The events closed whatever happens (closing `observed` before its first
        # step would not reach them).
        async with aclosing(started.events), aclosing(service.observed(started)) as stream:  # type: ignore[type-var]
            try:
                async for name, data in stream:
                    if name == "values":
                        result = data
                    elif name == "error":
                        result = {"__error__": data}
            except (RunDeadlineError, RunCancelledError) as exc:
                result = {"__error__": stop_error(exc, started.record.run_id)}
    return _json(
        result,
        headers={"Content-Location": _location(started.record.thread_id, started.record.run_id), **served_by(started.routing)},
    )


RunBody = Annotated[RunCreate, Body()]


@router.post("/threads/{thread_id}/runs/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def stream_thread_run(thread_id: ThreadIdPath, body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> EventStream:
    """Run a graph on a thread; events stream as SSE (``metadata`` first)."""
    return await _stream(service, thread_id, body, request_id, request)


@router.post("/runs/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def stream_stateless_run(body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> EventStream:
    """Run a graph on a temporary thread, deleted afterwards (unless ``on_completion: keep``)."""
    return await _stream(service, None, body, request_id, request)


@router.post("/threads/{thread_id}/runs/wait", response_model=dict[str, Any])
async def wait_thread_run(
    thread_id: ThreadIdPath, body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request
) -> Response:
    """Run a graph on a thread; answer with its final state values."""
    return await _wait(service, thread_id, body, request_id, request)


@router.post("/runs/wait", response_model=dict[str, Any])
async def wait_stateless_run(body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> Response:
    """Run a graph on a temporary thread; answer with its final state values."""
    return await _wait(service, None, body, request_id, request)


@router.post("/threads/{thread_id}/runs", response_model=Run)
async def create_background_run(
    thread_id: ThreadIdPath, body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request
) -> Response:
    """Start a run on a thread in the background; follow it with ``.../stream`` or ``.../join``."""
    principal, deadline_s = request.state.principal, request.state.deadline_s
    async with cancel_on_disconnect(request.receive):
        started = await service.start_run(thread_id, body, request_id, principal, deadline_s)
    await service.start_background(started)
    run = started.record
    return _json(run.json(), headers={"Content-Location": _location(run.thread_id, run.run_id)})


@router.post("/runs", response_model=Run)
async def create_stateless_background_run(
    body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request
) -> Response:
    """Start a run on a temporary thread in the background (``thread_id`` null)."""
    principal, deadline_s = request.state.principal, request.state.deadline_s
    async with cancel_on_disconnect(request.receive):
        started = await service.start_run(None, body, request_id, principal, deadline_s)
    await service.start_background(started)
    run = started.record
    return _json(run.json(), headers={"Content-Location": _location(run.thread_id, run.run_id)})


@router.post("/runs/batch", response_model=list[Run])
async def create_batch(
    body: Annotated[list[RunBatchItem], Body(max_length=MAX_BATCH)],
    service: ServiceDep,
    request_id: RequestIdDep,
    request: Request,
) -> Response:
    """Start background runs, each on its ``thread_id`` or stateless. Every item is
    checked before any starts (an error names the item's index); if one fails to
    start, the ones started are cancelled and the error names it."""
    principal, deadline_s = request.state.principal, request.state.deadline_s
    return _json(await service.start_batch(body, request_id, principal, deadline_s))


RunStatusName = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


@router.get("/threads/{thread_id}/runs", response_model=list[Run])
async def list_runs(
    thread_id: ThreadIdPath,
    service: ServiceDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    status: RunStatusName | None = None,
) -> Response:
    """The thread's runs, newest first (with replicas: every replica's)."""
    await service.get_thread(thread_id, principal)  # 404 for an unknown thread
    return _json(await service.thread_runs(thread_id, principal, limit=limit, offset=offset, status=status))


@router.get("/threads/{thread_id}/runs/{run_id}", response_model=Run)
async def get_run(thread_id: ThreadIdPath, run_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json((await service.find_run(thread_id, run_id, principal)).json())


@router.delete(
    "/threads/{thread_id}/runs/{run_id}", status_code=204, response_class=Response, responses={204: {"description": "Deleted"}}
)
async def delete_run(thread_id: ThreadIdPath, run_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Forget a finished run (409 while it is not finished)."""
    await service.delete_run(thread_id, run_id, principal)
    return Response(status_code=204)


_THREAD_FAREWELL = (
    "event: error\ndata: "
    + dumps({"error": "ServerShutdown", "message": "the server is shutting down; reconnect with Last-Event-ID"})
    + "\n\n"
)


@router.get("/threads/{thread_id}/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def join_thread_stream(
    thread_id: ThreadIdPath,
    service: ServiceDep,
    principal: PrincipalDep,
    request: Request,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    stream_mode: Annotated[
        list[str] | None,
        Query(description="run_modes (all, the default), lifecycle, state_update, or run stream modes; repeatable"),
    ] = None,
) -> EventStream:
    """The thread's stream: the events of its runs from now on (runs started later
    too), each run ending with ``end``; ids ``<run_id>:<index>``, so ``Last-Event-ID``
    first replays what background runs kept after it. Ends when the client leaves,
    the thread is deleted, or the server drains; a client too slow to keep up gets an
    ``error`` event and is disconnected."""
    events = thread_events(stream_mode)
    after = thread_event_id(last_event_id)
    server = request.app.state.platform.settings.server
    # Watching starts here; the response stops it (`close`), however it ends.
    frames, close = await service.thread_stream(thread_id, principal, after, events)
    return EventStream(
        frames,
        close=close,
        keepalive_s=server.keepalive_s,
        drain=request.app.state.drain,
        grace_s=server.shutdown_grace_s,
        farewell=_THREAD_FAREWELL,
    )


LastEventId = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="Resume after this event id (-1 or none: from the run's first event)"),
]
StreamModeQuery = Annotated[
    list[str] | None,
    Query(description="Send only these modes' events (repeat the parameter for several), plus metadata, error and end"),
]
CancelOnDisconnect = Annotated[
    bool, Query(description="Cancel the run if this client leaves before it ends (the SDKs send 1 or 0)")
]


def _run_event_id(value: str | None) -> int:
    """A run stream's ``Last-Event-ID`` as the id after which to send (-1: all).

    Raises:
        ServingError: 400 for anything but an event id or -1.
    """
    value = (value or "").strip()
    if not value or value == "-1":  # -1: from the start, what the JS SDK's useStream sends to rejoin
        return -1
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise ServingError(400, "Last-Event-ID must be an event id (a non-negative integer, or -1 for all)")
    return int(value)


async def _cancel_if_left(frames: AsyncIterator[str], run: RunRecord | SharedRun, service: LangGraphService) -> AsyncIterator[str]:
    """``frames``; if the stream stops before they end (the client left, or the server
    is shutting down), the run is cancelled."""
    ended = False
    async with aclosing(frames):  # type: ignore[type-var]
        try:
            async for item in frames:
                yield item
            ended = True
        finally:
            if not ended and not run.done:
                await _cancel_left(service, run)


async def _cancel_left(service: LangGraphService, run: RunRecord | SharedRun) -> None:
    reason = "the client that joined with cancel_on_disconnect left"
    if isinstance(run, RunRecord):
        run.guard.stop(RunCancelledError(reason))
        return
    # Another replica's run: asked through the board, from a task of its own (this
    # one may be cancelled, and the request must still go out).
    task = asyncio.get_running_loop().create_task(service.cancel(run, reason))
    _LEFT.add(task)
    task.add_done_callback(_LEFT.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


_LEFT: set[asyncio.Task[None]] = set()


def _join(
    service: LangGraphService,
    run: RunRecord | SharedRun,
    request: Request,
    last_event_id: str | None,
    stream_mode: list[str] | None,
    cancel: bool,
) -> EventStream:
    events = join_events(stream_mode)
    frames = service.follow(run, _run_event_id(last_event_id), events)
    server = request.app.state.platform.settings.server
    return EventStream(
        _cancel_if_left(frames, run, service) if cancel else frames,
        keepalive_s=server.keepalive_s,
        drain=request.app.state.drain,
        grace_s=server.shutdown_grace_s,
        farewell=_SHUTDOWN_FAREWELL,
    )


@router.get("/threads/{thread_id}/runs/{run_id}/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def join_run_stream(
    thread_id: ThreadIdPath,
    run_id: str,
    service: ServiceDep,
    principal: PrincipalDep,
    request: Request,
    last_event_id: LastEventId = None,
    stream_mode: StreamModeQuery = None,
    cancel_on_disconnect: CancelOnDisconnect = False,
) -> EventStream:
    """Join a background or resumable run's stream: the events after
    ``Last-Event-ID`` (all of them without it), then live ones until the run ends;
    ``stream_mode`` filters them (event ids stay the run's own)."""
    run = await service.find_run(thread_id, run_id, principal)
    return _join(service, run, request, last_event_id, stream_mode, cancel_on_disconnect)


@router.get("/runs/{run_id}/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def join_stateless_run_stream(
    run_id: str,
    service: ServiceDep,
    principal: PrincipalDep,
    request: Request,
    last_event_id: LastEventId = None,
    stream_mode: StreamModeQuery = None,
    cancel_on_disconnect: CancelOnDisconnect = False,
) -> EventStream:
    """Join a stateless background run's stream (``POST /runs``), as for a thread's run."""
    run = await service.find_stateless_run(run_id, principal)
    return _join(service, run, request, last_event_id, stream_mode, cancel_on_disconnect)


@router.get("/threads/{thread_id}/runs/{run_id}/join", response_model=dict[str, Any])
async def join_run(
    thread_id: ThreadIdPath,
    run_id: str,
    service: ServiceDep,
    principal: PrincipalDep,
    request: Request,
    cancel_on_disconnect: CancelOnDisconnect = False,
) -> Response:
    """Wait for the run to end; answer with the thread's values."""
    run = await service.find_run(thread_id, run_id, principal)
    if cancel_on_disconnect:
        ended = False
        try:
            async with _disconnect_cancels(request.receive):
                await service.join(run)
            ended = True
        finally:
            if not ended and not run.done:  # the client left (or the server is stopping)
                await _cancel_left(service, run)
    else:
        await service.join(run)
    state = await service.thread_state(thread_id, principal)
    return _json(state["values"])


CancelReason = Annotated[
    str | None,
    Query(max_length=500, pattern=r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$", description="Why (in the run's error event; no control characters)"),
]


@router.post(
    "/runs/cancel",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Cancellation requested"}},
)
async def cancel_runs(
    body: RunsCancel,
    service: ServiceDep,
    principal: PrincipalDep,
    action: Literal["interrupt", "rollback"] = "interrupt",
) -> Response:
    """Cancel the tenant's runs: ``run_ids`` (on ``thread_id`` if given; 404 naming
    the ones not found, and then none is cancelled), or every run in ``status``
    (``pending``, ``running``, ``all``; on ``thread_id`` if given)."""
    if action != "interrupt":
        raise ServingError(400, "cancel action 'rollback' is not supported; use interrupt")
    await service.cancel_runs(body, principal)
    return Response(status_code=204)


@router.post(
    "/threads/{thread_id}/runs/{run_id}/cancel",
    status_code=202,
    response_model=None,
    response_class=Response,
    responses={202: {"description": "Cancellation requested"}, 204: {"description": "Cancelled (with wait=true)"}},
)
async def cancel_run(
    thread_id: ThreadIdPath,
    run_id: str,
    service: ServiceDep,
    principal: PrincipalDep,
    wait: bool = False,
    action: Literal["interrupt", "rollback"] = "interrupt",
    reason: CancelReason = None,
) -> Response:
    """Cancel a run in progress (``action=interrupt``: what it saved stays); a
    ``reason`` is carried into the run's ``error`` event."""
    if action != "interrupt":
        raise ServingError(400, "cancel action 'rollback' is not supported; use interrupt")
    run = await service.find_run(thread_id, run_id, principal)
    await service.cancel(run, f"cancelled on request: {reason}" if reason else "cancelled on request", wait=wait)
    return Response(status_code=204 if wait else 202)
