"""The scripted benchmark backend (``bench/scripted_backend.py``) as a subprocess for tests.

It is the benchmark floor, not a test fake: an OpenAI-compatible server that streams a fixed
number of tokens at a fixed pace. Tests that need load or faults (kill -9 mid-stream, restart
on the same port) run it as its own process so it can really die.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.fakes.openai_backend import free_port

__all__ = [
    "ScriptedBackend",
    "chat_config",
    "running_scripted_backend",
    "error_log_lines",
    "failed_requests",
    "server_errors",
    "start_scripted_backend",
    "write_scripted_models_file",
]

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "scripted_backend.py"
SERVED_MODEL = "scripted"
"""The name the backend serves (and Switchyard's registry sends)."""
ALIAS = "chat-default"
"""The alias that points at it in the models file `write_scripted_models_file` writes."""


@dataclass(slots=True, kw_only=True)
class ScriptedBackend:
    """A running ``bench/scripted_backend.py`` process."""

    port: int
    delay_ms: float
    tokens: int
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``…/v1``) for a models file."""
        return self.root_url + "/v1"

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (graceful), then kill -9 after 5 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Start it again on the same port (after `kill` or `stop`)."""
        assert self.process.poll() is not None, "still running"
        self.process = _spawn(self.port, self.delay_ms, self.tokens, self.log)
        _wait_healthy(self)


def _spawn(port: int, delay_ms: float, tokens: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), "--port", str(port), "--delay-ms", str(delay_ms),
             "--tokens", str(tokens), "--model", SERVED_MODEL],
            cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
        )


def _wait_healthy(backend: ScriptedBackend, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if backend.process.poll() is not None:
            raise RuntimeError(f"scripted backend exited {backend.process.returncode}:\n{backend.log.read_text()}")
        try:
            if httpx.get(backend.root_url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            backend.kill()
            raise RuntimeError(f"scripted backend not healthy:\n{backend.log.read_text()}")
        time.sleep(0.05)


def start_scripted_backend(tmp: Path, *, delay_ms: float = 10, tokens: int = 64) -> ScriptedBackend:
    """Start the backend on a free loopback port and wait for ``GET /health``."""
    port = free_port()
    log = tmp / f"scripted-{port}.log"
    backend = ScriptedBackend(port=port, delay_ms=delay_ms, tokens=tokens, log=log,
                              process=_spawn(port, delay_ms, tokens, log))
    _wait_healthy(backend)
    return backend


@contextmanager
def running_scripted_backend(tmp: Path, *, delay_ms: float = 10, tokens: int = 64) -> Iterator[ScriptedBackend]:
    """`start_scripted_backend`, stopped (or killed) on exit."""
    backend = start_scripted_backend(tmp, delay_ms=delay_ms, tokens=tokens)
    try:
        yield backend
    finally:
        backend.stop()


def write_scripted_models_file(path: Path, backend: ScriptedBackend) -> Path:
    """A registry with one vLLM-kind backend (the scripted one) and `ALIAS` pointing at it."""
    path.write_text(yaml.safe_dump({
        "backends": {
            "scripted": {
                "kind": "vllm",
                "base_url": backend.base_url,
                "model": SERVED_MODEL,
                "timeouts": {"connect_s": 2, "read_s": 10},
                "capabilities": {"context_window": 4096, "tools": False, "json_schema": False},
            },
        },
        "aliases": {ALIAS: "scripted"},
    }))
    return path


def failed_requests(audit_file: Path, *, allowed: frozenset[int] = frozenset()) -> list[str]:
    """API requests the server answered with a 5xx status not in ``allowed``, from its audit
    log (one record per request)."""
    found: list[str] = []
    if audit_file.is_file():
        for line in audit_file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill -9
            status = int(record.get("status", 0)) if record.get("type") == "request" else 0
            if status >= 500 and status not in allowed:
                found.append(f"audit: {record.get('method')} {record.get('route')} -> {status} "
                             f"(request id {record.get('request_id')})")
    return found


def error_log_lines(log_file: Path) -> list[str]:
    """ERROR and CRITICAL lines, and tracebacks, in the server's log."""
    found: list[str] = []
    if log_file.is_file():
        for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                found.append("log: " + line[:300])
    return found


def server_errors(log_file: Path, audit_file: Path) -> list[str]:
    """What the server itself recorded as failing: `failed_requests` and `error_log_lines`."""
    return failed_requests(audit_file) + error_log_lines(log_file)


def chat_config(models_file: Path, *, postgres_dsn: str | None = None,
                server: dict[str, object] | None = None) -> dict[str, object]:
    """A `tests.conftest.start_server` config: the ``chat`` graph over `ALIAS`, threads in
    SQLite (the data directory) or in PostgreSQL."""
    config: dict[str, object] = {
        "gateway": {"models_file": str(models_file)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": ALIAS}},
    }
    if postgres_dsn is not None:
        config["threads"] = {"postgres_dsn": postgres_dsn}
    if server:
        config["server"] = server
    return config
