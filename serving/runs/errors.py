"""What a client is told when a run fails after it started (an SSE ``error`` event,
``runs/wait``'s ``__error__``, a failed task in a thread's state).

A known failure (the output check, a deadline, a cancel, the model backend, the
thread store, a refused request, a graph or knowledge error) keeps its own message,
written for clients, under a stable type. Anything else is a bug or a library's
internal error whose text means nothing to a client and may reveal internals (``'str'
object has no attribute 'get_next_version'``): the client gets ``InternalError`` and
a generic message naming the request and run ids, and the server log gets the whole
exception under the same ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway import GatewayError
from graphs import GraphError, OutputBlockedError
from knowledge import KnowledgeError
from serving._tasks import RunCancelledError, RunDeadlineError
from serving.errors import RequestError, ServingError, to_api_error
from serving.observability import current_request_id
from serving.threads import ThreadStoreError

__all__ = ["ClientError", "client_error"]

log = logging.getLogger(__name__)

_KNOWN = (GatewayError, GraphError, KnowledgeError, RequestError, ServingError, ThreadStoreError)
"""Error roots whose messages are written for clients (`serving.errors.to_api_error`
maps them)."""


_BY_STATUS = {400: "InvalidRequest", 403: "PermissionDenied", 404: "NotFound", 409: "Conflict", 429: "RateLimited",
              503: "Unavailable", 504: "DeadlineExceeded"}
"""`ServingError` statuses as types (a refusal raised inside a run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientError:
    """An error as a client sees it."""

    type: str
    """Stable, CamelCase (LangGraph Server's ``error`` field): ``OutputBlocked``,
    ``DeadlineExceeded``, ``RunCancelled``, ``BackendUnavailable``, ``BackendError``,
    ``ThreadStoreUnavailable``, ``InvalidRequest``..., ``InternalError``."""
    message: str
    """Meant for the client; never an unexpected exception's own text."""

    def json(self) -> dict[str, str]:
        """The LangGraph wire shape: ``{"error", "message"}``."""
        return {"error": self.type, "message": self.message}


def _camel(code: str) -> str:
    return "".join(word.capitalize() for word in code.split("_"))


def client_error(exc: BaseException, *, run_id: str | None = None, log_unexpected: bool = True) -> ClientError:
    """The client's view of ``exc``; an unexpected one is logged here with its
    traceback (callers log known ones as they see fit).

    Args:
        run_id: named in the generic message, with the request id, so that the
            operator can find the log line.
        log_unexpected: False for an error read back from a thread's state (it was
            logged when its run failed).
    """
    if isinstance(exc, OutputBlockedError):
        return ClientError(type="OutputBlocked", message=str(exc))
    if isinstance(exc, RunDeadlineError):
        return ClientError(type="DeadlineExceeded", message=str(exc))
    if isinstance(exc, RunCancelledError):
        return ClientError(type="RunCancelled", message=str(exc))
    if isinstance(exc, ServingError):
        kind = _BY_STATUS.get(exc.status) or ("ServerError" if exc.status >= 500 else "InvalidRequest")
        return ClientError(type=kind, message=str(exc))
    if isinstance(exc, _KNOWN):
        error = to_api_error(exc)
        if error.code != "internal_error":
            code = error.code or error.type
            if code == "invalid_value" or error.type == "invalid_request_error" and error.code is None:
                code = "invalid_request"
            return ClientError(type=_camel(code), message=error.message)
    request_id = current_request_id()
    if not log_unexpected:
        return ClientError(type="InternalError", message="internal error; the server log of the run that failed has the detail")
    log.error("run %s failed with an unexpected error (request %s)", run_id or "-", request_id, exc_info=exc)
    where = f"request id {request_id}" + (f", run id {run_id}" if run_id else "")
    return ClientError(type="InternalError", message=f"internal error; quote {where} when reporting it")
