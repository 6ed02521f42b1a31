"""Replicas for tests: N ``switchyard serve`` processes sharing one PostgreSQL (threads,
checkpoints, run records, keys, promotions) and, when given, one Redis (rate limits).

Each replica has its own data directory, its own free loopback port and its own
``state.replica_id`` ("A", "B", ...), reads the same config file, and runs with keys
on (not ``--dev``). Heartbeat and lease are short (0.5 s / 2.5 s) so that a killed
replica's runs end within seconds. Keys are created with the CLI against the shared
database (`create_key`).

    replicas = start_replicas(tmp, dsn=postgres_dsn, redis_url=redis_url, models_file=models)
    try:
        key = create_key(replicas[0], "acme")
        ...
    finally:
        stop_replicas(replicas)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import REPO, SWITCHYARD
from tests.fakes.openai_backend import free_port

__all__ = ["TENANTS", "Replica", "create_key", "start_replicas", "stop_replicas"]

TENANTS: dict[str, dict[str, Any]] = {
    "acme": {},
    "globex": {},
    "ops": {"admin": True},
}
"""The tenants of the default config: two ordinary ones and an admin (``/admin/...``)."""

_STATE = {"heartbeat_s": 0.5, "lease_s": 2.5, "reload_s": 0.5}


@dataclass(slots=True, kw_only=True)
class Replica:
    """One running ``switchyard serve`` process."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_file: Path
    """The server's log (``<data_dir>/logs/switchyard.log``)."""
    config: Path
    """The config file (shared by the replicas)."""
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    """The environment it runs with (its data directory and replica id)."""
    output: Path | None = None
    """Its stdout and stderr."""

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (the server drains), then kill -9 if it has not exited in 40 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Start it again (after `kill` or `stop`) on the same port, data directory and
        replica id, and wait until it is ready."""
        assert self.process.poll() is not None, f"replica {self.name} is still running"
        port = self.url.rsplit(":", 1)[1]
        assert self.output is not None
        with self.output.open("ab") as out:
            self.process = subprocess.Popen(
                [str(SWITCHYARD), "serve", "--config", str(self.config), "--host", "127.0.0.1", "--port", port],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=self.env,
            )
        _wait_ready(self)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``switchyard --config <config> ARGS`` with this replica's environment."""
        return subprocess.run(
            [str(SWITCHYARD), "--config", str(self.config), *args],
            capture_output=True, text=True, cwd=REPO, env=self.env, check=False, timeout=60,
        )


def create_key(replica: Replica, tenant: str) -> str:
    """A new API key for ``tenant``, created by ``switchyard keys create`` run as
    ``replica`` would (the key goes to the shared database)."""
    result = replica.cli("keys", "create", "--tenant", tenant)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def start_replicas(
    tmp: Path,
    *,
    dsn: str,
    redis_url: str | None,
    models_file: Path,
    count: int = 2,
    config: Path | None = None,
    env: dict[str, str] | None = None,
    state: dict[str, Any] | None = None,
) -> list[Replica]:
    """Start ``count`` replicas together and wait until each answers ``/readyz``.

    Args:
        tmp: a directory for the config, the data directories and the outputs.
        dsn: the shared PostgreSQL database (threads and state).
        redis_url: the shared Redis (rate limits), or None for per-replica buckets.
        models_file: the model registry every replica reads.
        config: a YAML file merged over the default config (graphs: ``chat`` over
            ``chat-default``; tenants `TENANTS`).
        env: more environment for every replica (and `Replica.cli`).
        state: more of the ``state`` section (default heartbeat 0.5 s, lease 2.5 s).

    Raises:
        RuntimeError: a replica exited or was not ready within 90 s (all are stopped).
    """
    settings: dict[str, Any] = {
        "data_dir": str(tmp / "data-shared"),
        "gateway": {"models_file": str(models_file)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "auth": {"tenants": TENANTS},
        "threads": {"postgres_dsn": dsn},
        "state": {**_STATE, **({"redis_url": redis_url} if redis_url else {}), **(state or {})},
        "server": {"shutdown_grace_s": 5},
    }
    if config is not None:
        settings = _merge(settings, yaml.safe_load(config.read_text()) or {})
    config_file = tmp / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    replicas: list[Replica] = []
    try:
        for number in range(count):
            name = chr(ord("A") + number)
            data_dir = tmp / f"data-{name}"
            port = free_port()
            replica_env = {
                **os.environ,
                **(env or {}),
                "SWITCHYARD_DATA_DIR": str(data_dir),
                "SWITCHYARD_STATE__REPLICA_ID": name,
            }
            output = tmp / f"replica-{name}.out"
            with output.open("wb") as out:
                process = subprocess.Popen(
                    [str(SWITCHYARD), "serve", "--config", str(config_file), "--host", "127.0.0.1", "--port", str(port)],
                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=replica_env,
                )
            replicas.append(Replica(
                name=name, url=f"http://127.0.0.1:{port}", process=process, log_file=data_dir / "logs" / "switchyard.log",
                config=config_file, data_dir=data_dir, env=replica_env, output=output,
            ))
        # All at once, on a fresh database too: set-ups are serialised by the database
        # (serving.store.postgres_setup_lock, the run board's schema lock).
        for replica in replicas:
            _wait_ready(replica)
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def _wait_ready(replica: Replica, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if replica.process.poll() is not None:
            text = replica.output.read_text(errors="replace") if replica.output else ""
            raise RuntimeError(f"replica {replica.name} exited {replica.process.returncode}:\n{text[-4000:]}")
        try:
            if httpx.get(replica.url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            text = replica.output.read_text(errors="replace") if replica.output else ""
            raise RuntimeError(f"replica {replica.name} not ready in {timeout_s:g}s:\n{text[-4000:]}")
        time.sleep(0.1)


def stop_replicas(replicas: list[Replica]) -> None:
    """SIGTERM every replica at once, then wait for each (kill -9 after 40 s)."""
    for replica in replicas:
        if replica.process.poll() is None:
            replica.process.terminate()
    for replica in replicas:
        replica.stop()
