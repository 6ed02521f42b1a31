"""CORS on the real server: a browser app on another origin can call the API.

Preflights are answered before authentication (they carry no key); actual cross-origin
requests still need a key, and their answers (a 401 too, and SSE streams) carry the
headers a browser needs to read them. ``--dev`` also allows the local origins.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

ALLOWED = "https://ui.example.com"
OTHER = "https://evil.example.net"
HI = {"messages": [{"role": "user", "content": "hi"}]}


def _config(tmp: Path, fake_backend_url: str, server: dict[str, object]) -> dict[str, object]:
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    return {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
        "auth": {"tenants": {"acme": {"graphs": ["*"], "models": ["*"]}}},
        "server": server,
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[tuple[ServerHandle, str]]:
    """Keys on; one allowed origin; a body must arrive within 1 s."""
    tmp = tmp_path_factory.mktemp("cors")
    config = _config(tmp, fake_backend_url, {"cors_origins": [ALLOWED], "body_timeout_s": 1})
    config_file = tmp / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **config}))
    key = create_key(config_file, "acme")
    handle = start_server(tmp, config, dev=False)
    try:
        yield handle, key
    finally:
        stop_server(handle)


def _preflight(url: str, origin: str, headers: str = "authorization, content-type") -> httpx.Response:
    return httpx.options(
        url + "/threads",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": headers},
    )


def _listed(value: str | None) -> set[str]:
    return {item.strip().lower() for item in (value or "").split(",") if item.strip()}


def test_preflight_from_an_allowed_origin_needs_no_key(secured: tuple[ServerHandle, str]) -> None:
    server, _ = secured
    sdk_headers = "authorization, x-api-key, content-type, last-event-id, x-request-id, x-stainless-os, x-stainless-retry-count"
    response = _preflight(server.url, ALLOWED, sdk_headers)
    assert response.status_code in (200, 204), response.text
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert {"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} <= {
        m.upper() for m in _listed(response.headers.get("access-control-allow-methods"))
    }
    assert _listed(sdk_headers) <= _listed(response.headers.get("access-control-allow-headers"))
    assert "access-control-allow-credentials" not in response.headers
    assert response.headers["x-request-id"]  # the request id's middleware is outside CORS


def test_preflight_from_another_origin_is_not_allowed(secured: tuple[ServerHandle, str]) -> None:
    server, _ = secured
    response = _preflight(server.url, OTHER)
    assert "access-control-allow-origin" not in response.headers
    assert response.status_code == 400  # refused by CORS, not by the key check (401) or routing (405)
    assert _preflight(server.url, ALLOWED).headers["access-control-allow-origin"] == ALLOWED


def test_cross_origin_requests_still_need_a_key(secured: tuple[ServerHandle, str]) -> None:
    server, key = secured
    created = httpx.post(server.url + "/threads", json={}, headers={"Origin": ALLOWED, "Authorization": f"Bearer {key}"})
    assert created.status_code == 200, created.text
    assert created.headers["access-control-allow-origin"] == ALLOWED
    assert {"x-request-id", "content-location", "location", "retry-after"} <= _listed(
        created.headers.get("access-control-expose-headers")
    )
    # Without a key: 401, readable by the browser app so it can say why.
    denied = httpx.post(server.url + "/threads", json={}, headers={"Origin": ALLOWED})
    assert denied.status_code == 401
    assert denied.headers["access-control-allow-origin"] == ALLOWED
    # Another origin gets the answer (the key decides) but no permission to read it.
    other = httpx.post(server.url + "/threads", json={}, headers={"Origin": OTHER, "x-api-key": key})
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


def test_a_streamed_run_carries_the_cors_headers(secured: tuple[ServerHandle, str]) -> None:
    server, key = secured
    headers = {"Origin": ALLOWED, "x-api-key": key}
    tid = httpx.post(server.url + "/threads", json={}, headers=headers).json()["thread_id"]
    body = {"assistant_id": "chat", "input": HI, "stream_mode": ["values"]}
    with httpx.stream("POST", f"{server.url}/threads/{tid}/runs/stream", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["access-control-allow-origin"] == ALLOWED
        assert "content-location" in _listed(response.headers.get("access-control-expose-headers"))
        events = [line for line in response.iter_lines() if line.startswith("event:")]
    assert "event: values" in [e.strip() for e in events]


def test_dev_allows_local_origins(tmp_path: Path, fake_backend_url: str) -> None:
    config = _config(tmp_path, fake_backend_url, {})
    del config["auth"]
    server = start_server(tmp_path, config, dev=True)
    try:
        for origin in ("http://localhost:3000", "http://127.0.0.1:5173"):
            response = _preflight(server.url, origin)
            assert response.status_code in (200, 204) and response.headers["access-control-allow-origin"] == origin
            created = httpx.post(server.url + "/threads", json={}, headers={"Origin": origin})
            assert created.status_code == 200 and created.headers["access-control-allow-origin"] == origin
        for origin in ("http://localhost.evil.example:3000", OTHER):
            assert "access-control-allow-origin" not in _preflight(server.url, origin).headers
    finally:
        stop_server(server)


def test_wildcard_with_credentials_is_refused_at_start(tmp_path: Path, fake_backend_url: str) -> None:
    config = _config(tmp_path, fake_backend_url, {"cors_origins": ["*"], "cors_allow_credentials": True})
    with pytest.raises(RuntimeError, match=r"exited") as error:
        server = start_server(tmp_path, config, dev=True, wait_ready=False)
        stop_server(server)  # not reached when refused
    assert "cors_origins '*' cannot be combined with cors_allow_credentials" in str(error.value)


def _raw(url: str, request: bytes, wait_s: float = 0) -> bytes:
    """Send ``request`` as is on a new connection; the answer's head."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n\r\n")[0].lower()


@pytest.mark.parametrize("origin", [ALLOWED, OTHER])
def test_the_connection_limits_refusals_carry_the_cors_headers(secured: tuple[ServerHandle, str], origin: str) -> None:
    """431 (too many header fields) and 408 (a body that does not arrive) are answered
    before any middleware; an allowed origin can still read them."""
    server, key = secured
    many = b"".join(b"x-filler-%d: 1\r\n" % i for i in range(150))
    head = b"POST /threads HTTP/1.1\r\nhost: x\r\norigin: %s\r\nx-api-key: %s\r\n" % (origin.encode(), key.encode())
    too_many = _raw(server.url, head + many + b"\r\n")
    slow_body = _raw(server.url, head + b"content-type: application/json\r\ncontent-length: 10\r\n\r\n{")
    assert too_many.startswith(b"http/1.1 431") and slow_body.startswith(b"http/1.1 408")
    for answer in (too_many, slow_body):
        if origin == ALLOWED:
            assert b"access-control-allow-origin: " + ALLOWED.encode() in answer
            assert b"access-control-expose-headers: " in answer and b"vary: origin" in answer
        else:
            assert b"access-control-allow-origin" not in answer


async def test_an_unexpected_error_is_a_500_a_browser_can_read(tmp_path: Path, fake_backend_url: str) -> None:
    """A bug's 500 passes through the CORS and request-id middleware (Starlette's own
    last-resort answer is outside both)."""
    from serving.app import create_app
    from serving.settings import load_settings

    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **_config(tmp_path, fake_backend_url, {"cors_origins": [ALLOWED]})}))
    app = create_app(load_settings(config))

    async def boom() -> None:
        raise RuntimeError("secret detail of a bug")

    app.add_api_route("/boom", boom)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/boom", headers={"Origin": ALLOWED, "x-request-id": "req-500"})
    assert response.status_code == 500
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert response.headers.get_list("x-request-id") == ["req-500"]
    assert "secret detail" not in response.text and "req-500" in response.text
