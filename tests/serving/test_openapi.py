"""The OpenAPI schema is valid and documents every operation's success and error
responses (it is how clients and fuzzers learn the API)."""

from __future__ import annotations

import httpx
import pytest
from openapi_spec_validator import validate

from tests.conftest import ServerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

OPEN = {"/healthz", "/readyz", "/ok"}
STREAMS = {"/v1/chat/completions", "/threads/{thread_id}/runs/stream", "/runs/stream", "/threads/{thread_id}/runs/{run_id}/stream"}


def test_schema_is_valid_and_complete(server: ServerHandle) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    validate(schema)
    operations = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]
    assert {path for path, _, _ in operations} >= {
        "/v1/models", "/v1/chat/completions", "/assistants/search", "/assistants/{assistant_id}", "/threads",
        "/threads/search", "/threads/{thread_id}", "/threads/{thread_id}/state", "/threads/{thread_id}/history",
        "/threads/{thread_id}/runs/stream", "/threads/{thread_id}/runs/wait", "/runs/stream", "/runs/wait",
        "/healthz", "/readyz", "/metrics", "/ok", "/info", "/threads/{thread_id}/runs",
        "/threads/{thread_id}/runs/{run_id}", "/threads/{thread_id}/runs/{run_id}/stream",
        "/threads/{thread_id}/runs/{run_id}/join", "/threads/{thread_id}/runs/{run_id}/cancel",
        "/v1/collections", "/v1/collections/{name}/documents", "/v1/collections/{name}/documents/{doc_id}",
        "/v1/collections/{name}/search",
    }
    for path, method, op in operations:
        responses = op["responses"]
        assert any(code.startswith("2") for code in responses), (method, path)
        if path not in OPEN:
            assert "401" in responses, (method, path)
        if path in STREAMS and method != "get" or path.endswith("/stream"):
            assert "text/event-stream" in responses["200"]["content"], path
        if path.startswith(("/threads", "/runs", "/assistants")) and path != "/threads/search":
            assert {"404", "429"} <= set(responses), (method, path)
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "404", "429", "502", "503", "504"} <= set(chat)
    thread = schema["paths"]["/threads/{thread_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert thread["schema"]["$ref"].endswith("/Thread")
