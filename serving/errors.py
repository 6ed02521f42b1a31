"""The one place where errors become HTTP responses.

On ``/v1/*`` every error has the OpenAI shape ``{"error": {"message", "type", "param",
"code"}}`` with the status a client can act on. Nothing returns a bare 500 with a
stack trace: unexpected errors are logged with the request id and answered with a
generic message that names it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import BackendResponseError, BackendUnavailableError, CapabilityError, GatewayError, UnknownModelError
from graphs import GraphError, UnknownGraphError
from knowledge import (
    CollectionNotAllowedError,
    DocumentOwnershipError,
    EmbeddingError,
    InvalidCollectionNameError,
    InvalidDocumentIdError,
    KnowledgeError,
    UnknownCollectionError,
    VectorStoreError,
)
from knowledge.errors import (
    GraphNotFoundError,
    GraphStoreError,
    OntologyError,
    OntologyMismatchError,
    OntologyViolationError,
)
from serving._tasks import RunDeadlineError
from serving.observability import REQUEST_ID_HEADER, current_request_id
from serving.threads import ThreadStoreError
from serving.openai.protocol import ErrorBody, ErrorResponse
from serving.sse import ClientDisconnectedError

__all__ = [
    "ApiError",
    "RequestError",
    "ServingError",
    "UnexpectedErrors",
    "error_body",
    "install_error_handlers",
    "to_api_error",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiError:
    """An error as the API reports it."""

    status: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ServingError(Exception):
    """A request refused with a specific status (404 unknown thread, 409 busy, 429...).

    Attributes:
        status: the HTTP status.
        retry_after_s: for 429/503, when to try again (sent as ``Retry-After``).
    """

    def __init__(
        self, status: int, message: str, *, retry_after_s: float | None = None, limit: str | None = None
    ) -> None:
        self.status = status
        self.retry_after_s = retry_after_s
        self.limit = limit
        """Which limit refused it (``rate``, ``key_runs``, ``server_runs``), if one did."""
        super().__init__(message)


class RequestError(Exception):
    """A request the service refuses (400) for a reason the schema cannot express."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        self.param = param
        self.code = code
        super().__init__(message)


def to_api_error(exc: BaseException) -> ApiError:
    """Map an exception to its status and OpenAI error fields."""
    if isinstance(exc, (UnknownModelError, UnknownGraphError)):
        return ApiError(status=404, message=str(exc), type="invalid_request_error", param="model", code="model_not_found")
    if isinstance(exc, CapabilityError):
        return ApiError(status=400, message=str(exc), type="invalid_request_error", param=exc.param, code="unsupported_capability")
    if isinstance(exc, RunDeadlineError):
        return ApiError(status=504, message=str(exc), type="timeout", code="deadline_exceeded")
    if isinstance(exc, ServingError):
        kind = {429: "rate_limit_error", 504: "timeout"}.get(exc.status)
        kind = kind or ("invalid_request_error" if exc.status < 500 else "server_error")
        return ApiError(status=exc.status, message=str(exc), type=kind)
    if isinstance(exc, RequestError):
        return ApiError(status=400, message=str(exc), type="invalid_request_error", param=exc.param, code=exc.code)
    if isinstance(exc, BackendUnavailableError):
        return ApiError(status=503, message=str(exc), type="backend_unavailable", code="backend_unavailable")
    if isinstance(exc, BackendResponseError):
        if 400 <= exc.status < 500 and exc.status not in (401, 403, 429):
            # The backend refused the request itself (e.g. prompt longer than the context).
            return ApiError(status=400, message=str(exc), type="invalid_request_error", code="backend_rejected")
        return ApiError(status=502, message=str(exc), type="backend_error", code="backend_error")
    if isinstance(exc, CollectionNotAllowedError):
        return ApiError(status=403, message=str(exc), type="permission_error", param="collection", code="collection_not_allowed")
    if isinstance(exc, UnknownCollectionError):
        return ApiError(status=404, message=str(exc), type="invalid_request_error", param="collection", code="collection_not_found")
    if isinstance(exc, InvalidCollectionNameError):
        return ApiError(status=400, message=str(exc), type="invalid_request_error", param="collection", code="invalid_value")
    if isinstance(exc, DocumentOwnershipError):
        return ApiError(status=403, message=str(exc), type="permission_error", param="doc_id", code="document_not_owned")
    if isinstance(exc, InvalidDocumentIdError):
        return ApiError(status=422, message=str(exc), type="invalid_request_error", param="doc_id", code="invalid_value")
    if isinstance(exc, EmbeddingError):
        return ApiError(status=503, message=str(exc), type="backend_unavailable", code="embedder_unavailable")
    if isinstance(exc, VectorStoreError):
        return ApiError(status=503, message=str(exc), type="storage_unavailable", code="vector_store_unavailable")
    if isinstance(exc, GraphNotFoundError):
        # Not the list of graphs: a tenant may not know other tenants' collections.
        return ApiError(status=404, message=exc.unlisted(), type="invalid_request_error", param="collection", code="graph_not_found")
    if isinstance(exc, OntologyMismatchError):
        return ApiError(status=409, message=str(exc), type="invalid_request_error", param="ontology", code="ontology_mismatch")
    if isinstance(exc, (OntologyError, OntologyViolationError)):
        return ApiError(status=400, message=str(exc), type="invalid_request_error", param="ontology", code="invalid_ontology")
    if isinstance(exc, GraphStoreError):
        return ApiError(status=503, message=str(exc), type="storage_unavailable", code="graph_store_unavailable")
    if isinstance(exc, KnowledgeError):
        return ApiError(status=400, message=str(exc), type="invalid_request_error", code="knowledge_error")
    if isinstance(exc, ThreadStoreError):
        # The request failed; the store is usable again for the next one.
        return ApiError(status=503, message=str(exc), type="storage_unavailable", code="thread_store_unavailable")
    if isinstance(exc, GraphError):
        return ApiError(status=500, message=str(exc), type="graph_error", code="graph_error")
    log.error("unhandled error", exc_info=exc)
    return ApiError(
        status=500,
        message=f"internal error; quote request id {current_request_id()} when reporting it",
        type="internal_error",
        code="internal_error",
    )


def error_body(error: ApiError) -> ErrorResponse:
    return ErrorResponse(error=ErrorBody(message=error.message, type=error.type, param=error.param, code=error.code))


def _response(request: Request, error: ApiError) -> JSONResponse:
    # OpenAI routes get the OpenAI shape; the LangGraph API gets the LangGraph Server
    # (FastAPI) shape, {"detail": ...}, which langgraph-sdk turns into its messages.
    if request.url.path.startswith("/v1/") or request.url.path == "/v1":
        return JSONResponse(error_body(error).model_dump(), status_code=error.status)
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"  # the LangGraph shape has no field for it
    return JSONResponse({"detail": message}, status_code=error.status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    problems = []
    first_param = None
    for item in exc.errors():
        # A JSON syntax error's location is a character offset, not a field.
        loc = [] if item["type"] == "json_invalid" else [str(p) for p in item["loc"] if p != "body"]
        param = ".".join(loc) or None
        first_param = first_param or param
        problems.append(f"{param or 'body'}: {item['msg']}")
    return "; ".join(problems), first_param


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _leaf_routes(routes: Iterable[Any]) -> Iterator[Any]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI's included routers
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def _allowed_methods(request: Request) -> list[str]:
    """The methods of the routes that serve this path, for a 405's ``Allow``.

    Starlette names those of the first route whose path matched. Here several routes
    share a path (GET and POST ``/threads/{id}/runs``), and a static path wins over a
    template that also matches it (``POST /threads/search`` over ``GET
    /threads/{thread_id}``): the methods of the most specific matching routes."""
    found: dict[str, int] = {}
    routes = list(_leaf_routes(request.app.router.routes))
    for method in _METHODS:
        for route in routes:
            if getattr(route, "status_code", None) == 405:
                continue  # a route declared to refuse its method (405) does not allow it
            match, child = route.matches({**request.scope, "method": method})
            if match == Match.FULL:
                found[method] = len(child.get("path_params", {}))
                break
    fewest = min(found.values(), default=0)
    return [method for method, params in found.items() if params == fewest]


def _scope_request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", "-"))


def _unexpected(request: Request, exc: BaseException) -> JSONResponse:
    """The 500 answer to an error nothing handled (a bug): logged whole with the request
    id, the client told only to quote the id."""
    request_id = _scope_request_id(request.scope)
    log.error("unhandled error [%s]", request_id, exc_info=exc)
    error = ApiError(
        status=500,
        message=f"internal error; quote request id {request_id} when reporting it",
        type="internal_error",
        code="internal_error",
    )
    return _response(request, error)


class UnexpectedErrors:
    """Pure ASGI middleware that answers an error escaping the application with the
    500 JSON error, if no response has started.

    Starlette answers such errors in its outermost middleware, outside every
    middleware added to the app: that 500 would lack the CORS headers (a browser
    would report a CORS failure instead of the error) and the request id header.
    This sits just inside the CORS middleware, so the answer has both. An error after
    the response started propagates (the server closes the connection).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # boundary: an unhandled error is a 500 the client can read
            if started:
                raise
            await _unexpected(Request(scope, receive), exc)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into the OpenAI shape."""

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        # OpenAI answers a malformed request with 400; FastAPI (the LangGraph Server,
        # our collections API) with 422.
        openai_route = request.url.path.startswith("/v1/") and not request.url.path.startswith("/v1/collections")
        status = 400 if openai_route else 422
        error = ApiError(status=status, message=message, type="invalid_request_error", param=param, code="invalid_value")
        return _response(request, error)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        response = _response(request, ApiError(status=exc.status_code, message=str(exc.detail), type=kind))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route whose path matched; a
            # path served by several routes (GET and POST handlers) allows them all.
            if methods := _allowed_methods(request):
                response.headers["Allow"] = ", ".join(methods)
        return response

    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        response = _response(request, to_api_error(exc))
        if isinstance(exc, ServingError) and exc.retry_after_s is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        elif isinstance(exc, ThreadStoreError):
            response.headers["Retry-After"] = "1"
        if isinstance(exc, ServingError) and exc.limit is not None:
            request.app.state.metrics.rejections.labels(exc.limit).inc()
        return response

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The last resort, in Starlette's outermost middleware, for an error raised in
        # a middleware outside `UnexpectedErrors`: outside the request-id middleware,
        # so the id is taken from the scope, where that middleware left it, and set here.
        response = _unexpected(request, exc)
        response.headers[REQUEST_ID_HEADER] = _scope_request_id(request.scope)
        return response

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        # Nobody reads it; 499 (nginx's "client closed request") shows in the logs.
        log.info("client closed the connection before the answer; its run was cancelled")
        return Response(status_code=499)

    app.add_exception_handler(ClientDisconnectedError, on_client_gone)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    for domain in (GatewayError, GraphError, KnowledgeError, RequestError, ServingError, RunDeadlineError, ThreadStoreError):
        app.add_exception_handler(domain, on_domain_error)
    app.add_exception_handler(Exception, on_unexpected)
