"""DeepEval works with no network and writes nothing into the working directory.

The judge runs in a fresh Python process (so DeepEval is imported there for the first
time, after `eval.judge.configure_deepeval`) whose proxy variables point at a local TCP
listener that records every connection: any request leaving the machine (telemetry,
an update check, Confident AI) would reach it. Loopback is exempt (``NO_PROXY``), so the
scripted judge on 127.0.0.1 answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.judge_backend import EXPECTED, run_judge_backend, write_judge_models_file
from tests.fakes.openai_backend import free_port

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, json, os, sys
from pathlib import Path

from eval.judge import Judge, configure_deepeval, tool_correctness

configure_deepeval(Path(sys.argv[1]))
if sys.argv[3] == "control":
    # The proxy is really in the way of anything going out: this request must reach it.
    import httpx
    try:
        httpx.get("http://example.com/", timeout=5)
    except httpx.HTTPError:
        pass
    sys.exit(0)

import deepeval  # the whole package, with its import-time hooks
from eval.datasets import Case
from eval.runner import CaseOutput
from gateway import ModelGateway, load_registry


async def main():
    gateway = ModelGateway(load_registry(Path(sys.argv[2])))
    try:
        judge = Judge.for_model(gateway.chat_model("judge-ok"), "judge-ok")
        case = Case(id="c", input="What is the spring tidal range?", expected_facts=["5.8 metres"])
        output = CaseOutput(answer="It is 5.8 metres [1].", contexts=["The spring tidal range is 5.8 metres."])
        return await judge.score(case, output)
    finally:
        await gateway.aclose()


values, errors = asyncio.run(main())
tools = tool_correctness([{"name": "calculator", "args": {"expression": "2+2"}}],
                         [{"name": "calculator", "args": {"expression": "2+2"}}])
print(json.dumps({"values": values, "errors": errors, "tools": tools,
                  "dotenv": os.environ.get("SWITCHYARD_DOTENV_PROBE"),
                  "confident_key": os.environ.get("CONFIDENT_API_KEY")}))
"""


class ConnectionRecorder:
    """A TCP listener that records the first line of every connection, then closes it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    head = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    head = "(nothing sent)"
                self.seen.append(head or "(nothing sent)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


@pytest.fixture
def recorder() -> Iterator[ConnectionRecorder]:
    recorder = ConnectionRecorder()
    yield recorder
    recorder.close()


def _run(tmp: Path, recorder: ConnectionRecorder, models: Path, mode: str) -> subprocess.CompletedProcess[str]:
    cwd = tmp / "cwd"
    home = tmp / "home"
    cwd.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    # A .env DeepEval would load into the environment if dotenv were on.
    (cwd / ".env").write_text("SWITCHYARD_DOTENV_PROBE=loaded\n")
    proxy = f"http://127.0.0.1:{recorder.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPEVAL_", "CONFIDENT_", "ENABLE_DEEPEVAL"))}
    env.update({
        "HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "ALL_PROXY": proxy,
        "http_proxy": proxy, "https_proxy": proxy, "all_proxy": proxy,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        # A key DeepEval would use to upload to Confident AI; configure_deepeval drops it.
        "CONFIDENT_API_KEY": "confident_us_not-a-real-key",
    })
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp / "work"), str(models), mode],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False,
    )


def test_deepeval_makes_no_outside_connection_and_no_files_in_cwd(tmp_path: Path, recorder: ConnectionRecorder) -> None:
    with run_judge_backend() as url:
        models = write_judge_models_file(tmp_path / "models.yaml", url, free_port())
        result = _run(tmp_path, recorder, models, "judge")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["values"] == EXPECTED
    assert report["errors"] == {}
    assert report["tools"] == 1.0
    assert report["dotenv"] is None
    assert report["confident_key"] is None
    assert recorder.seen == []
    # DeepEval's directory is under the work dir; none in the cwd or the home directory.
    assert sorted(p.name for p in (tmp_path / "cwd").iterdir()) == [".env"]
    assert not (tmp_path / "home" / ".deepeval").exists()
    assert (tmp_path / "work" / ".deepeval").is_dir()


def test_the_proxy_catches_what_goes_out(tmp_path: Path, recorder: ConnectionRecorder) -> None:
    """The control: the same process set-up does send an outside request to the recorder."""
    result = _run(tmp_path, recorder, tmp_path / "unused.yaml", "control")
    assert result.returncode == 0, result.stderr
    assert recorder.seen and "example.com" in recorder.seen[0]
