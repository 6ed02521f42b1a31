"""What the server tells people without a key, and what clients can write into its
log (issue 11, finding 9a): with keys on, the API description needs a key (its HTML
pages are off unless ``server.public_api_docs``); ``/readyz`` says why a backend is
not ready without its address; request values cannot forge log lines; ``--dev``
(no keys) refuses a non-loopback host unless ``--allow-remote-dev``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD, ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e]

_LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def _config(tmp: Path, fake_backend_url: str, **server: object) -> dict[str, object]:
    # The graph's backend is a closed port: /readyz has a reason to give.
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="down")
    return {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "down"}},
        "auth": {"tenants": {"acme": {}}},
        **({"server": server} if server else {}),
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[tuple[ServerHandle, str]]:
    tmp = tmp_path_factory.mktemp("leaks")
    handle = start_server(tmp, _config(tmp, fake_backend_url), wait_ready=False, dev=False)
    try:
        yield handle, create_key(handle.config, "acme")
    finally:
        stop_server(handle)


def test_the_api_description_needs_a_key(secured: tuple[ServerHandle, str]) -> None:
    server, key = secured
    assert httpx.get(server.url + "/openapi.json").status_code == 401
    schema = httpx.get(server.url + "/openapi.json", headers={"x-api-key": key})
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]
    assert "/openapi.json" not in schema.json()["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + page).status_code == 404, page
        assert httpx.get(server.url + page, headers={"x-api-key": key}).status_code == 404, page


def test_the_api_description_can_be_published(tmp_path: Path, fake_backend_url: str) -> None:
    server = start_server(tmp_path, _config(tmp_path, fake_backend_url, public_api_docs=True), wait_ready=False, dev=False)
    try:
        assert httpx.get(server.url + "/openapi.json").status_code == 200
        assert httpx.get(server.url + "/docs").status_code == 200
        assert httpx.get(server.url + "/redoc").status_code == 200
        assert httpx.get(server.url + "/v1/models").status_code == 401  # the API itself still needs a key
    finally:
        stop_server(server)


def test_readiness_gives_reasons_without_addresses(secured: tuple[ServerHandle, str]) -> None:
    server, _ = secured
    ready = httpx.get(server.url + "/readyz")
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "not ready" and body["threads"] == "ok"
    assert body["backends"]["down"].startswith("cannot reach the backend")  # still says why
    backend = yaml.safe_load((server.config.parent / "models.yaml").read_text())["backends"]["down"]["base_url"]
    port = backend.rsplit(":", 1)[1].split("/")[0]
    assert "127.0.0.1" not in ready.text and "://" not in ready.text and port not in ready.text, ready.text
    assert backend.split("/v1")[0] in server.log_file.read_text()  # the operator's log has the address


def test_request_values_cannot_forge_log_lines(secured: tuple[ServerHandle, str]) -> None:
    server, key = secured
    headers = {"Authorization": f"Bearer {key}"}
    forged = {"model": "x\nFAKE LOG LINE", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=forged, headers=headers).status_code == 404
    fields = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "a\r\nFAKE FIELD LINE\u2028b": 1}
    httpx.post(server.url + "/v1/chat/completions", json=fields, headers=headers)
    log = server.log_file.read_text()
    assert "model=x\\nFAKE LOG LINE" in log  # logged, escaped, on its own line
    assert "a\\r\\nFAKE FIELD LINE\\u2028b" in log
    for line in log.splitlines():  # splitlines also splits on \u2028
        assert "FAKE" not in line or _LINE_START.match(line), line
        assert not line.startswith("FAKE"), line


def test_json_logs_escape_line_separators(tmp_path: Path, fake_backend_url: str) -> None:
    config = {**_config(tmp_path, fake_backend_url), "log_format": "json"}
    server = start_server(tmp_path, config, wait_ready=False)  # --dev: no key needed
    try:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "a\u2028FAKE\x85LINE": 1}
        httpx.post(server.url + "/v1/chat/completions", json=body)
    finally:
        stop_server(server)
    lines = server.log_file.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one whole record
    assert any("a\u2028FAKE\x85LINE" in r["message"] for r in records)


def _serve(tmp: Path, fake_backend_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **_config(tmp, fake_backend_url)}))
    return subprocess.run(
        [str(SWITCHYARD), "serve", "--config", str(config), "--port", str(free_port()), *args],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=60, check=False,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_dev_mode_refuses_a_non_loopback_host(tmp_path: Path, fake_backend_url: str, host: str) -> None:
    # Refused before anything binds (so no test server listens beyond loopback).
    refused = _serve(tmp_path, fake_backend_url, "--dev", "--host", host)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "--allow-remote-dev" in refused.stderr and "loopback" in refused.stderr
    from_env = _serve(tmp_path, fake_backend_url, "--host", host, env={"SWITCHYARD_SERVER__DEV": "true"})
    assert from_env.returncode == 1 and "--allow-remote-dev" in from_env.stderr


def test_dev_mode_on_a_remote_host_warns_when_allowed(tmp_path: Path, fake_backend_url: str) -> None:
    # 192.0.2.10 (TEST-NET-1) is on no interface here: the warning comes before the
    # bind, which then fails, so nothing listens beyond loopback.
    allowed = _serve(tmp_path, fake_backend_url, "--dev", "--host", "192.0.2.10", "--allow-remote-dev")
    assert "WARNING: --dev on 192.0.2.10: API keys are OFF" in allowed.stderr, allowed.stderr
    assert "--allow-remote-dev" not in allowed.stderr  # not refused
