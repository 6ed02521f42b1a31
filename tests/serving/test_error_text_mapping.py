"""`serving.runs.client_error`: the stable type and client message of each known
failure, and the generic message (logged whole) of an unexpected one. The e2e side is
tests/serving/test_error_text.py."""

from __future__ import annotations

import logging

import pytest

from gateway import BackendResponseError, BackendUnavailableError
from graphs import OutputBlockedError
from knowledge import CollectionNotAllowedError
from serving._tasks import RunCancelledError, RunDeadlineError
from serving.errors import RequestError, ServingError
from serving.runs import client_error
from serving.threads import ThreadStoreError


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OutputBlockedError("secret"), "OutputBlocked"),
        (RunDeadlineError(2), "DeadlineExceeded"),
        (RunCancelledError("cancelled on request"), "RunCancelled"),
        (BackendUnavailableError("local", "connection refused"), "BackendUnavailable"),
        (BackendResponseError("local", 500, "boom"), "BackendError"),
        (ThreadStoreError("update", "timed out"), "ThreadStoreUnavailable"),
        (CollectionNotAllowedError("hr", "acme"), "CollectionNotAllowed"),
        (RequestError("input refused", param="messages", code="content_blocked"), "ContentBlocked"),
        (RequestError("a tool message needs tool_call_id"), "InvalidRequest"),
        (ServingError(409, "thread 't' is busy"), "Conflict"),
        (ServingError(503, "threads are not available"), "Unavailable"),
    ],
)
def test_a_known_error_keeps_its_message_under_a_stable_type(error: Exception, kind: str) -> None:
    client = client_error(error, run_id="run-1")
    assert client.type == kind
    assert client.message == str(error)
    assert "secret" not in client.message  # the blocked term is never repeated


def test_an_unexpected_error_is_generic_for_the_client_and_whole_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    try:
        "".get_next_version()  # type: ignore[attr-defined]
    except AttributeError as exc:
        error = exc
    with caplog.at_level(logging.ERROR, logger="serving.runs.errors"):
        client = client_error(error, run_id="run-7")
    assert client.json() == {"error": "InternalError", "message": client.message}
    assert "run-7" in client.message and "get_next_version" not in client.message
    record = next(r for r in caplog.records if r.name == "serving.runs.errors")
    assert "run-7" in record.getMessage() and record.exc_info is not None and record.exc_info[1] is error


def test_an_error_read_back_from_a_thread_is_not_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="serving.runs.errors"):
        client = client_error(KeyError("internal"), log_unexpected=False)
    assert client.type == "InternalError" and "internal'" not in client.message
    assert not [r for r in caplog.records if r.name == "serving.runs.errors"]
