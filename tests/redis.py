"""A real Redis server for tests: Debian's ``redis-server`` on a free loopback port, in
a temporary directory, persisting nothing (``--save "" --appendonly no``).

``redis_url`` (one server for the session, emptied before each test) is registered in
``tests/conftest.py``; `RedisServer` starts one a test may stop and start again (an
outage)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.openai_backend import free_port

__all__ = ["RedisServer", "redis_server", "redis_url"]

REDIS_SERVER = "/usr/bin/redis-server"


class RedisServer:
    """One ``redis-server`` process; `stop` and `start` keep its port (and lose its data)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = Path(tempfile.mkdtemp(prefix="switchyard-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        assert Path(REDIS_SERVER).exists(), "redis-server is not installed (apt-get install redis-server; .ci/run does it)"
        log = (self._dir / "redis.log").open("ab")
        self._process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._dir),
             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        while not self._answers():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited {self._process.returncode}: {(self._dir / 'redis.log').read_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING within 10 s")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                connection.sendall(b"PING\r\n")
                return connection.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as connection:
            connection.sendall(b"FLUSHALL\r\n")
            assert connection.recv(16).startswith(b"+OK")

    def stop(self) -> None:
        """Kill it (SIGKILL: an outage, not a shutdown) and wait."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A Redis server for the session."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/0`` of the session's Redis, emptied for this test."""
    redis_server.flush()
    return redis_server.url
