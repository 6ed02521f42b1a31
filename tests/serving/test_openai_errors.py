"""Errors of the OpenAI API: status and OpenAI-shaped body for each case, before and
after streaming started. Failures a real model cannot produce on demand come from
the FAKE scripted backend (tests/fakes)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.conftest import ServerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

HELLO = [{"role": "user", "content": "hello"}]


def _post(server: ServerHandle, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30, **kwargs)  # type: ignore[arg-type]


def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert response.headers["x-request-id"]
    return body["error"]  # type: ignore[no-any-return]


def test_unknown_model_is_404_listing_models(server: ServerHandle) -> None:
    response = _post(server, {"model": "gpt-17", "messages": HELLO})
    assert response.status_code == 404
    error = _error(response)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "gpt-17" in str(error["message"]) and "chat-default" in str(error["message"])
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="gpt-17", messages=HELLO, stream=True  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HELLO}, "model"),
        ({"model": "chat", "messages": []}, "messages"),
        ({"model": "chat", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": "chat", "messages": HELLO, "temperature": 7}, "temperature"),
        ({"model": "chat", "messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "n": 2}, "n"),
        ({"model": "chat", "messages": HELLO, "max_tokens": 100000}, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
def test_bad_request_is_400_naming_the_field(server: ServerHandle, body: dict[str, object], param: str) -> None:
    for stream in (False, True):
        response = _post(server, {**body, "stream": stream})
        assert response.status_code == 400, response.text
        error = _error(response)
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param, error


def test_malformed_json_is_400(server: ServerHandle) -> None:
    response = httpx.post(
        server.url + "/v1/chat/completions", content=b'{"model": "chat", ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = _error(response)
    assert "JSON" in str(error["message"]) and error["param"] is None


def test_backend_down_is_503_before_streaming(down_server: ServerHandle) -> None:
    ready = httpx.get(down_server.url + "/readyz")
    assert ready.status_code == 503
    assert "cannot reach" in ready.json()["backends"]["down"]
    for model in ("chat", "chat-default"):
        for stream in (False, True):
            response = _post(down_server, {"model": model, "messages": HELLO, "stream": stream})
            assert response.status_code == 503, response.text
            error = _error(response)
            assert error["code"] == "backend_unavailable"
            assert "'down'" in str(error["message"])


def test_backend_error_status_is_502(server: ServerHandle) -> None:
    for model in ("chat-failing", "fake-500"):
        for stream in (False, True):
            response = _post(server, {"model": model, "messages": HELLO, "stream": stream})
            assert response.status_code == 502, response.text
            assert "scripted failure" in str(_error(response)["message"])


@pytest.mark.parametrize("model", ["chat-broken", "fake-break"])
def test_stream_broken_after_start_ends_with_error_event_then_done(server: ServerHandle, model: str) -> None:
    body = {"model": model, "messages": HELLO, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        payloads = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data:")]
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "backend_unavailable" and "fake-break" in error["message"]
    text = "".join(
        json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-2] if json.loads(p).get("choices")
    )
    assert text == "Hello from the"  # what arrived before the break was relayed, then the error
    # The official client surfaces the in-band error as an exception.
    with pytest.raises(openai.APIError):
        list(
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
                model=model, messages=HELLO, stream=True  # type: ignore[arg-type]
            )
        )


def test_unknown_route_is_an_openai_shaped_404(server: ServerHandle) -> None:
    response = httpx.get(server.url + "/v1/nowhere")
    assert response.status_code == 404
    assert _error(response)["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True])
def test_a_bug_is_a_500_naming_the_request_id_not_a_traceback(server: ServerHandle, stream: bool) -> None:
    response = _post(server, {"model": "crash", "messages": HELLO, "stream": stream}, headers={"x-request-id": f"bug-{stream}"})
    assert response.status_code == 500
    error = _error(response)
    assert error["code"] == "internal_error"
    assert "bug-" + str(stream) in str(error["message"])
    assert response.headers["x-request-id"] == f"bug-{stream}"
    assert "Traceback" not in response.text and "a bug in a node" not in response.text
    assert "a bug in a node" in server.log_file.read_text()  # the operator sees it


def test_capability_contract_refuses_over_http(server: ServerHandle) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    refused = _post(server, {"model": "fake-plain", "messages": HELLO, "tools": tools})
    assert refused.status_code == 400
    assert _error(refused)["param"] == "tools" and _error(refused)["code"] == "unsupported_capability"
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    refused = _post(server, {"model": "fake-plain", "messages": HELLO, "response_format": schema, "stream": True})
    assert refused.status_code == 400 and _error(refused)["param"] == "response_format"


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_backend_refusal_is_a_400(server: ServerHandle, model: str) -> None:
    # About 3,000 tokens (SmolLM2 reads "7 " as one token a byte) in 3,000 bytes, which
    # the gateway's estimate (bytes / 4, an undercount) lets through: longer than the
    # 2048 tokens a llama.cpp slot holds, so the backend itself refuses.
    dense = [{"role": "user", "content": "7 " * 1500}]
    # 19,000 bytes: past the window by the gateway's own estimate, refused before any call.
    long = [{"role": "user", "content": "lorem ipsum dolor sit amet " * 700}]
    for stream in (False, True):
        response = _post(server, {"model": model, "messages": dense, "max_tokens": 8, "stream": stream})
        assert response.status_code == 400, response.text
        error = _error(response)
        assert error["code"] == "backend_rejected" and "'local'" in str(error["message"])
        response = _post(server, {"model": model, "messages": long, "max_tokens": 8, "stream": stream})
        assert response.status_code == 400, response.text
        error = _error(response)
        assert error["code"] == "unsupported_capability" and error["param"] == "messages", error
        assert "2048 tokens" in str(error["message"]), error


def test_unsafe_request_id_is_replaced(server: ServerHandle) -> None:
    for unsafe in ("two words <script>", "x" * 300):
        response = httpx.get(server.url + "/v1/models", headers={"x-request-id": unsafe})
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
