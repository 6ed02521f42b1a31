"""Dev mode's ``Host`` check (serving/app.py, `DevHostCheck`): with ``server.dev`` (no
keys) a page that re-points its own name at 127.0.0.1 (DNS rebinding) is same-origin
with the server, so only its ``Host`` header tells it apart. A real dev server refuses
a non-loopback ``Host`` with a 400 naming it; loopback names and addresses with any
port are served. ``allow_remote_dev`` adds the configured host (or, on a wildcard
interface, any IP address); with keys on there is no check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI

from serving.app import create_app
from serving.settings import load_settings
from tests.conftest import ServerHandle, start_server, stop_server, write_models_file


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("dev-host")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
    }
    handle = start_server(tmp, settings, dev=True)
    try:
        yield handle
    finally:
        stop_server(handle)


@pytest.mark.e2e
def test_a_dev_server_serves_loopback_hosts_only(dev_server: ServerHandle) -> None:
    port = dev_server.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=dev_server.url) as http:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"127.8.9.10:{port}", f"[::1]:{port}",
                     f"app.localhost:{port}", "LOCALHOST."):
            served = http.post("/assistants/search", json={}, headers={"host": host})
            assert served.status_code == 200, (host, served.text)
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", "10.0.0.5", "[::2]:80"):
            refused = http.post("/assistants/search", json={}, headers={"host": host})
            assert refused.status_code == 400, (host, refused.text)
            detail = refused.json()["detail"]
            assert repr(host) in detail and "dev mode" in detail, detail
            assert refused.headers.get("x-request-id"), "refused with a request id like any answer"
        # The OpenAI routes answer in their own error shape.
        openai = http.post("/v1/chat/completions", json={}, headers={"host": "attacker.example"})
        assert openai.status_code == 400 and openai.json()["error"]["code"] == "invalid_host", openai.text
        # Probes hold nothing: an orchestrator probing by the pod's address still gets them.
        assert http.get("/healthz", headers={"host": "10.0.0.5"}).status_code == 200


def _app(tmp_path: Path, server: dict[str, object]) -> FastAPI:
    """An app that is never started (no lifespan): the check answers before any route,
    and a request it lets through reaches the router (404 for an unknown path)."""
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({
        "backends": {"nowhere": {
            "kind": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "nothing", "capabilities": {"context_window": 2048},
        }},
        "aliases": {"chat-default": "nowhere"},
    }))
    body: dict[str, object] = {
        "data_dir": str(tmp_path / "data"),
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "server": server,
    }
    if not server.get("dev"):
        body["auth"] = {"tenants": {"acme": {"graphs": ["*"]}}}
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump(body))
    return create_app(load_settings(config))


async def _statuses(app: FastAPI, hosts: list[str]) -> dict[str, int]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return {host: (await client.get("/no-such-page", headers={"host": host})).status_code for host in hosts}


async def test_remote_dev_also_serves_the_configured_host(tmp_path: Path) -> None:
    app = _app(tmp_path, {"dev": True, "allow_remote_dev": True, "host": "10.1.2.3"})
    assert await _statuses(app, ["10.1.2.3:8000", "10.1.2.3", "localhost:8000", "10.1.2.4", "attacker.example"]) == {
        "10.1.2.3:8000": 404, "10.1.2.3": 404, "localhost:8000": 404, "10.1.2.4": 400, "attacker.example": 400,
    }
    named = _app(tmp_path, {"dev": True, "allow_remote_dev": True, "host": "devbox.lan"})
    assert await _statuses(named, ["devbox.lan:8000", "DevBox.lan", "other.lan"]) == {
        "devbox.lan:8000": 404, "DevBox.lan": 404, "other.lan": 400,
    }


async def test_remote_dev_on_every_interface_serves_addresses_not_names(tmp_path: Path) -> None:
    """On ``0.0.0.0`` the names clients use are unknown: any IP address is served (a
    rebinding page always sends a name), a name is not."""
    app = _app(tmp_path, {"dev": True, "allow_remote_dev": True, "host": "0.0.0.0"})
    assert await _statuses(app, ["192.168.1.20:8000", "[fd00::1]:8000", "localhost", "devbox.lan:8000"]) == {
        "192.168.1.20:8000": 404, "[fd00::1]:8000": 404, "localhost": 404, "devbox.lan:8000": 400,
    }


async def test_with_keys_any_host_is_served(tmp_path: Path) -> None:
    app = _app(tmp_path, {"dev": False})
    assert await _statuses(app, ["attacker.example", "10.0.0.5"]) == {"attacker.example": 404, "10.0.0.5": 404}
