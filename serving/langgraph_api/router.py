"""Routes of the LangGraph Server API; the work is in `LangGraphService`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response

from serving._tasks import RunDeadlineError
from serving.deps import DeadlineDep, PrincipalDep, RequestIdDep, require_key
from serving.langgraph_api.protocol import (
    Assistant,
    AssistantSearch,
    Detail,
    HistoryRequest,
    Info,
    Ok,
    RunCreate,
    Thread,
    ThreadCreate,
    ThreadSearch,
    ThreadState,
)
from serving.langgraph_api.service import LangGraphService, dumps
from serving.sse import EventStream

__all__ = ["open_router", "router"]

async def _deadline_in_state(request: Request, deadline_s: DeadlineDep) -> None:
    request.state.deadline_s = deadline_s


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Detail, "description": description}
    for status, description in {
        400: "Invalid request (names the field)",
        401: "Missing or invalid API key",
        403: "The tenant may not use this graph",
        404: "Unknown assistant or thread (another tenant's thread is 404 too)",
        409: "Thread exists, or has a run in progress",
        413: "Request body too large",
        429: "Rate or concurrency limit (see Retry-After)",
    }.items()
}
_STREAM = {
    200: {
        "description": "Server-sent events: `metadata` first, then one event per stream part, `error` on failure",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

router = APIRouter(tags=["langgraph"], dependencies=[require_key, Depends(_deadline_in_state)], responses=_ERRORS)


async def _service(request: Request) -> LangGraphService:
    service: LangGraphService = request.app.state.langgraph_service
    return service


ServiceDep = Annotated[LangGraphService, Depends(_service)]


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


@router.get("/assistants/{assistant_id}", response_model=Assistant)
async def get_assistant(assistant_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json(service.get_assistant(assistant_id, principal))


@router.post("/threads", response_model=Thread)
async def create_thread(service: ServiceDep, principal: PrincipalDep, body: ThreadCreate | None = None) -> Response:
    return _json(await service.create_thread(body or ThreadCreate(), principal))


@router.post("/threads/search", response_model=list[Thread])
async def search_threads(service: ServiceDep, principal: PrincipalDep, body: ThreadSearch | None = None) -> Response:
    return _json(await service.search_threads(body or ThreadSearch(), principal))


@router.get("/threads/{thread_id}", response_model=Thread)
async def get_thread(thread_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json(await service.get_thread(thread_id, principal))


@router.get("/threads/{thread_id}/state", response_model=ThreadState)
async def get_thread_state(thread_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    return _json(await service.thread_state(thread_id, principal))


@router.get("/threads/{thread_id}/state/{checkpoint_id}", response_model=ThreadState)
async def get_thread_state_at(thread_id: str, checkpoint_id: str, service: ServiceDep, principal: PrincipalDep) -> Response:
    """The thread's state at one checkpoint (from its history)."""
    return _json(await service.thread_state(thread_id, principal, checkpoint_id))


@router.post("/threads/{thread_id}/history", response_model=list[ThreadState])
async def get_thread_history(
    thread_id: str, service: ServiceDep, principal: PrincipalDep, body: HistoryRequest | None = None
) -> Response:
    """States newest first; ``before`` (a checkpoint id or ``{checkpoint_id}``) pages back."""
    query = body or HistoryRequest()
    before = query.before.get("checkpoint_id") if isinstance(query.before, dict) else query.before
    return _json(await service.thread_history(thread_id, query.limit, principal, before))


def _location(thread_id: str | None, run_id: str) -> str:
    # Not ".../stream": the SDKs read the run id from this header with a greedy pattern.
    return f"/threads/{thread_id}/runs/{run_id}" if thread_id else f"/runs/{run_id}"


_SHUTDOWN_FAREWELL = (
    "event: error\ndata: "
    + dumps({"error": "ServerShutdown", "message": "the server is shutting down; the run was cancelled"})
    + "\n\n"
)


def _deadline_error(exc: RunDeadlineError) -> dict[str, str]:
    return {"error": "DeadlineExceeded", "message": str(exc)}


def frame(name: str, data: Any, index: int) -> str:
    """One SSE event. ``data`` is compact JSON, so it never spans lines."""
    return f"event: {name}\ndata: {dumps(data)}\nid: {index}\n\n"


async def _sse(first: tuple[str, Any], events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[str]:
    index = 0
    async with aclosing(events) as stream:
        yield frame(first[0], first[1], 0)
        try:
            async for name, data in stream:
                index += 1
                yield frame(name, data, index)
        except RunDeadlineError as exc:
            yield frame("error", _deadline_error(exc), index + 1)


async def _stream(
    service: LangGraphService, thread_id: str | None, body: RunCreate, request_id: str, request: Request
) -> EventStream:
    principal, deadline_s = request.state.principal, request.state.deadline_s
    run_id, thread, events = await service.start_run(thread_id, body, request_id, principal, deadline_s)
    # Start the run now (its first event is `metadata`): a started run always finishes
    # its clean-up (thread status, run slot), even if the response never gets sent.
    first = await anext(events)
    server = request.app.state.platform.settings.server
    return EventStream(
        _sse(first, events),
        headers={"Content-Location": _location(thread, run_id)},
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
    run_id, thread, events = await service.start_run(thread_id, values_only, request_id, principal, deadline_s)
    result: Any = None
    async with aclosing(events) as stream:
        try:
            async for name, data in stream:
                if name == "values":
                    result = data
                elif name == "error":
                    result = {"__error__": data}
        except RunDeadlineError as exc:
            result = {"__error__": _deadline_error(exc)}
    return _json(result, headers={"Content-Location": _location(thread, run_id)})


RunBody = Annotated[RunCreate, Body()]


@router.post("/threads/{thread_id}/runs/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def stream_thread_run(thread_id: str, body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> EventStream:
    """Run a graph on a thread; events stream as SSE (``metadata`` first)."""
    return await _stream(service, thread_id, body, request_id, request)


@router.post("/runs/stream", response_class=EventStream, status_code=200, responses=_STREAM)
async def stream_stateless_run(body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> EventStream:
    """Run a graph on a temporary thread, deleted afterwards (unless ``on_completion: keep``)."""
    return await _stream(service, None, body, request_id, request)


@router.post("/threads/{thread_id}/runs/wait", response_model=dict[str, Any])
async def wait_thread_run(
    thread_id: str, body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request
) -> Response:
    """Run a graph on a thread; answer with its final state values."""
    return await _wait(service, thread_id, body, request_id, request)


@router.post("/runs/wait", response_model=dict[str, Any])
async def wait_stateless_run(body: RunBody, service: ServiceDep, request_id: RequestIdDep, request: Request) -> Response:
    """Run a graph on a temporary thread; answer with its final state values."""
    return await _wait(service, None, body, request_id, request)
