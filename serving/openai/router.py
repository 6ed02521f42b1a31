"""Routes of the OpenAI-compatible API; the work is in `ChatCompletionService`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gateway import RouteScope
from serving.deps import ChatServiceDep, DeadlineDep, PrincipalDep, RequestIdDep, require_key
from serving.errors import error_body, to_api_error
from serving.openai.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ErrorResponse,
    ModelList,
)
from serving.runs import served_by
from serving.sse import SSE_EVENT_SCHEMA, EventStream, cancel_on_disconnect

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[require_key])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": description}
    for code, description in {
        400: "Invalid request, naming the field; or refused by the input filter or the backend",
        401: "Missing or invalid API key",
        403: "The tenant may not use this graph or model",
        404: "Unknown model (the message lists the valid ones)",
        413: "Request body too large",
        429: "Rate or concurrency limit (see Retry-After)",
        502: "The model backend failed",
        503: "The model backend is unavailable",
        504: "The run exceeded its deadline",
    }.items()
}


_SHUTDOWN_FAREWELL = (
    "data: "
    + ErrorResponse.model_validate(
        {"error": {"message": "the server is shutting down; the answer was cut short", "type": "server_error",
                   "code": "server_shutdown"}}
    ).model_dump_json()
    + "\n\ndata: [DONE]\n\n"
)


@router.get("/models", response_model=ModelList, responses={401: _ERRORS[401]})
async def list_models(service: ChatServiceDep, principal: PrincipalDep) -> ModelList:
    """The graphs and model aliases the caller may use; each id is a valid ``model``."""
    return service.models(principal)


async def _frames(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    # Headers are sent once the first payload is out: from then on an error can only
    # be reported in-band, as a final error event followed by [DONE].
    try:
        yield f"data: {first}\n\n"
        async for payload in rest:
            yield f"data: {payload}\n\n"
    except Exception as exc:
        error = to_api_error(exc)
        log.warning("stream failed after it started: %s", error.message)
        yield f"data: {error_body(error).model_dump_json()}\n\ndata: [DONE]\n\n"
    finally:
        await rest.aclose()


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={
        **_ERRORS,
        200: {
            "description": "The answer; with `stream: true`, server-sent `chat.completion.chunk` events then `[DONE]`",
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
        },
    },
)
async def chat_completions(
    body: ChatCompletionRequest,
    service: ChatServiceDep,
    request_id: RequestIdDep,
    principal: PrincipalDep,
    deadline_s: DeadlineDep,
    request: Request,
    response: Response,
) -> Any:
    """Run a graph, or relay to a model alias; ``stream: true`` answers over SSE.

    Every answer names the backend that produced it in ``x-switchyard-backend``."""
    log.info("chat completion model=%s stream=%s messages=%d", body.model, body.stream, len(body.messages))
    routing = RouteScope(key=request_id)  # stateless: sticky on the request
    if not body.stream:
        async with cancel_on_disconnect(request.receive):
            answer = await service.complete(body, request_id, principal, deadline_s, routing)
        # An alias's answer is the backend's JSON as it came (logprobs, reasoning,
        # usage details...), except what the output policy checks or removes (see
        # `_check_alias_answer`); only graph answers are built from our own models.
        if isinstance(answer, dict):
            return JSONResponse(answer, headers=served_by(routing))
        response.headers.update(served_by(routing))
        return answer
    stream = service.stream(body, request_id, principal, deadline_s, routing)
    try:
        # Pull the first payload before answering, so a bad request or a backend that
        # is down becomes a JSON error with its real status, not a 200 stream.
        async with cancel_on_disconnect(request.receive):  # a long prefill, a queue at the backend
            first = await anext(stream)
    except BaseException:
        await stream.aclose()
        raise
    server = request.app.state.platform.settings.server
    return EventStream(
        _frames(first, stream),
        headers=served_by(routing),  # the first payload is out: its backend is known
        close=stream.aclose,
        keepalive_s=server.keepalive_s,
        drain=request.app.state.drain,
        grace_s=server.shutdown_grace_s,
        farewell=_SHUTDOWN_FAREWELL,
    )


@router.post(
    "/embeddings",
    response_model=EmbeddingList,
    responses={code: _ERRORS[code] for code in (400, 401, 403, 404, 413, 429, 502, 503)},
)
async def create_embeddings(body: EmbeddingRequest, service: ChatServiceDep, principal: PrincipalDep) -> EmbeddingList:
    """Vectors from a model alias whose backend declares the ``embeddings`` capability."""
    log.info("embeddings model=%s", body.model)
    return await service.embeddings(body, principal)
