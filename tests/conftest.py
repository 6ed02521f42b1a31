"""Fixtures that start real local services: the llama.cpp model server, a scripted
failure backend, and Switchyard itself as a subprocess on free loopback ports.

A service that fails to start fails the tests that need it; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from gateway import Backend, load_registry
from gateway.local import start_backend, stop_backend
from tests.fakes.openai_backend import free_port, run_fake_backend
from tests.redis import redis_server, redis_url  # noqa: F401 - fixtures (a real Redis server)

REPO = Path(__file__).resolve().parents[1]
SWITCHYARD = Path(sys.executable).with_name("switchyard")


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """The real llama-server with SmolLM2, on a free port, for the whole session.

    Sets ``SWITCHYARD_LOCAL_BACKEND_PORT`` (read by ``config/models.yaml``) for the
    session, so the CLI and servers the tests start find it; restored afterwards.
    """
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWITCHYARD_LOCAL_BACKEND_PORT", str(port))
        backend = load_registry(REPO / "config/models.yaml").backends["local"]
        data_dir = tmp_path_factory.mktemp("backend-data")
        start_backend(backend, data_dir)
        try:
            yield backend
        finally:
            stop_backend(backend, data_dir)


@pytest.fixture(scope="session")
def fake_backend_url() -> Iterator[str]:
    """FAKE scripted backend for failure injection (see tests/fakes)."""
    with run_fake_backend() as url:
        yield url


def _fake(url: str, served: str) -> dict[str, object]:
    return {
        "kind": "vllm",
        "base_url": url,
        "model": served,
        "timeouts": {"connect_s": 2, "read_s": 10},
        "capabilities": {"context_window": 4096, "tools": True, "json_schema": True},
    }


def write_models_file(path: Path, local: Backend | None, fake_url: str, *, chat_default: str = "local") -> Path:
    """A registry with the real local backend, the fake's behaviours and a dead port."""
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    backends: dict[str, object] = {
        "fake-ok": _fake(fake_url, "fake-ok"),
        "fake-break": {**_fake(fake_url, "fake-break"), "breaker": {"failures": 1000}},
        # Failing on purpose for every request: their breakers never open here, so each
        # failure keeps its own status (breakers are tested in tests/gateway).
        "fake-500": {**_fake(fake_url, "fake-500"), "breaker": {"failures": 1000}},
        "down": {**_fake(f"http://127.0.0.1:{free_port()}/v1", "nothing"), "timeouts": {"connect_s": 1, "read_s": 2}},
        "fake-plain": {**_fake(fake_url, "fake-ok"), "capabilities": {"context_window": 1024}},
    }
    if local is not None:
        backends["local"] = {**source["backends"]["local"], "base_url": local.base_url}
    aliases = {name: name for name in ("fake-ok", "fake-break", "fake-500", "down", "fake-plain")}
    aliases["chat-default"] = chat_default
    path.write_text(yaml.safe_dump({"backends": backends, "aliases": aliases}))
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHandle:
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path
    config: Path

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "switchyard.log"


def start_server(
    tmp: Path,
    config: dict[str, object],
    *,
    wait_ready: bool = True,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    dev: bool = True,
) -> ServerHandle:
    """Run ``switchyard serve`` with ``config`` on a free port (``--dev`` unless told
    otherwise); wait for /readyz (or only /healthz)."""
    port = free_port()
    data_dir = tmp / "data"
    config_file = tmp / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(data_dir), **config}))
    with (tmp / "server.out").open("wb") as output:
        process = subprocess.Popen(
            [str(SWITCHYARD), "serve", "--config", str(config_file), "--port", str(port), *(["--dev"] if dev else [])],
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    probe = "/readyz" if wait_ready else "/healthz"
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"switchyard serve exited {process.returncode}:\n{(tmp / 'server.out').read_text()}")
        try:
            if httpx.get(url + probe, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"switchyard serve not ready:\n{(tmp / 'server.out').read_text()}")
        time.sleep(0.1)
    return ServerHandle(url=url, process=process, data_dir=data_dir, config=config_file)


def create_key(config: Path, tenant: str) -> str:
    """A new API key for ``tenant``, made by ``switchyard keys create`` (only its hash
    is stored, in the config's data directory)."""
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "keys", "create", "--tenant", tenant],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def stop_server(handle: ServerHandle) -> None:
    handle.process.terminate()
    try:
        handle.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        handle.process.kill()
        handle.process.wait()


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[ServerHandle]:
    """Switchyard over the real local model, plus graphs wired to the fake's failures."""
    tmp = tmp_path_factory.mktemp("server")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
                "chat-broken": {"path": "graphs.chat:make_graph", "model": "fake-break"},
                "chat-failing": {"path": "graphs.chat:make_graph", "model": "fake-500"},
                "chat-fake": {"path": "graphs.chat:make_graph", "model": "fake-ok"},
                "crash": {"path": "tests.fakes.graphs:make_crashing_graph", "model": "fake-ok"},
                "confirm": {"path": "tests.fakes.graphs:make_confirm_graph", "model": "chat-default"},
            },
        },
    )
    try:
        yield handle
    finally:
        stop_server(handle)


@pytest.fixture(scope="session")
def down_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    """Switchyard whose graphs' backend is a closed port: never ready."""
    tmp = tmp_path_factory.mktemp("down-server")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="down")
    handle = start_server(
        tmp,
        {"gateway": {"models_file": str(models)}, "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}}},
        wait_ready=False,
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def _as_postgres(*command: str) -> list[str]:
    # PostgreSQL refuses to run as root; CI and these machines run tests as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server (Debian's package; `.ci/run` installs it) on a free
    loopback port, for the session. Yields the DSN of its ``postgres`` database."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert binaries, "PostgreSQL is not installed (apt-get install postgresql; .ci/run does it)"
    bindir = binaries[-1].parent
    data = Path(tempfile.mkdtemp(prefix="switchyard-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        _as_postgres(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
        check=True, capture_output=True,
    )
    port = free_port()
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    subprocess.run(
        _as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "server.log"), "-w", "start"),
        check=True, capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"), capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres: str) -> Iterator[str]:
    """A fresh database for one test, dropped afterwards."""
    import psycopg  # noqa: PLC0415 - only the tests that use PostgreSQL need it

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(postgres, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A temporary project directory, removed afterwards."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
