"""``switchyard serve`` owns the local backend it starts: two servers with their own
data directories, ports and backends run side by side, and each stops its backend on
SIGTERM without disturbing the other."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, ServerHandle, start_server, stop_server
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.llm]


def _serve(tmp: Path, backend_port: int) -> ServerHandle:
    tmp.mkdir()
    return start_server(
        tmp,
        {"gateway": {"models_file": str(REPO / "config/models.yaml")}},
        env={"SWITCHYARD_LOCAL_BACKEND_PORT": str(backend_port)},
    )


def _alive(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _ask(handle: ServerHandle) -> str:
    body = {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    response = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_two_servers_each_start_and_stop_their_own_backend(tmp_path: Path) -> None:
    port_a, port_b = free_port(), free_port()
    assert not _alive(port_a) and not _alive(port_b)
    first = _serve(tmp_path / "a", port_a)
    try:
        second = _serve(tmp_path / "b", port_b)
        try:
            assert _alive(port_a) and _alive(port_b)
            pid_a = (first.data_dir / "run/backend-local.pid").read_text()
            pid_b = (second.data_dir / "run/backend-local.pid").read_text()
            assert pid_a != pid_b
            assert _ask(first) and _ask(second)
            stop_server(first)
            assert first.process.returncode == 143  # exited on SIGTERM, after clean-up
            assert not _alive(port_a), "the first server's backend outlived it"
            assert not (first.data_dir / "run/backend-local.pid").exists()
            assert _alive(port_b) and _ask(second)  # the other server is untouched
        finally:
            stop_server(second)
        assert not _alive(port_b)
    finally:
        stop_server(first)
