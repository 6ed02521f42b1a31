"""The local llama.cpp backend's process management, with the real binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway import Backend, LocalBackendError, load_registry
from gateway.local import find_model_file, launch_command, start_backend, status_backend, stop_backend
from tests.conftest import REPO, SWITCHYARD
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.llm]


def _backend(port: int, **launch: object) -> Backend:
    base = load_registry(REPO / "config/models.yaml").backends["local"]
    assert base.launch is not None
    return base.model_copy(
        update={"base_url": f"http://127.0.0.1:{port}/v1", "launch": base.launch.model_copy(update=launch)}
    )


def test_model_file_comes_from_the_installed_wheel() -> None:
    backend = _backend(8081)
    assert backend.launch is not None
    path = find_model_file(backend.launch)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "site-packages" in str(path)
    with pytest.raises(LocalBackendError, match="not installed"):
        find_model_file(backend.launch.model_copy(update={"model_package": "no_such_model_pkg"}))


def test_launch_command_carries_the_documented_flags(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    command = launch_command(_backend(9123), binary)
    joined = " ".join(command)
    for flag in ("--alias smollm2-135m-instruct", "--port 9123", "--ctx-size 8192", "--parallel 4",
                 "--threads 2", "--cache-ram 256", "--metrics", "--no-webui", "--jinja", "--chat-template-file"):
        assert flag in joined, flag
    template = Path(command[command.index("--chat-template-file") + 1])
    assert template.is_file() and "tool_call" in template.read_text()


def test_start_is_idempotent_and_status_reports(local_backend: Backend, tmp_path: Path) -> None:
    again = start_backend(local_backend, tmp_path)  # already answering: nothing started
    assert again.healthy and not again.started_here
    assert status_backend(local_backend, tmp_path).healthy


def test_start_stop_cycle_and_cli(tmp_path: Path) -> None:
    port = free_port()
    backend = _backend(port)
    status = start_backend(backend, tmp_path)
    try:
        assert status.healthy and status.started_here and status.pid
        assert (tmp_path / "run" / "backend-local.pid").read_text() == str(status.pid)
        env = {**os.environ, "SWITCHYARD_LOCAL_BACKEND_PORT": str(port), "SWITCHYARD_DATA_DIR": str(tmp_path)}
        shown = subprocess.run([str(SWITCHYARD), "backend", "status"], env=env, cwd=REPO, capture_output=True, text=True)
        assert shown.returncode == 0 and f"ready at http://127.0.0.1:{port} (pid {status.pid})" in shown.stdout
        stopped = subprocess.run([str(SWITCHYARD), "backend", "stop"], env=env, cwd=REPO, capture_output=True, text=True)
        assert "local: stopped" in stopped.stdout
        assert not status_backend(backend, tmp_path).healthy
        after = subprocess.run([str(SWITCHYARD), "backend", "status"], env=env, cwd=REPO, capture_output=True, text=True)
        assert after.returncode == 1 and "local: stopped" in after.stdout
    finally:
        stop_backend(backend, tmp_path)


def test_a_backend_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    backend = _backend(free_port(), extra_args=("--no-such-flag",))
    with pytest.raises(LocalBackendError, match="exited during start-up") as error:
        start_backend(backend, tmp_path)
    assert "no-such-flag" in str(error.value)  # the end of llama-server's own log
    assert not (tmp_path / "run" / "backend-local.pid").exists()
