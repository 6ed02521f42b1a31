"""``switchyard graphs list|draw|new`` and ``switchyard ask`` through the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from gateway import Backend
from tests.conftest import REPO, SWITCHYARD
from tests.fakes.openai_backend import free_port


def _run(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120
    )


def test_graphs_list_shows_the_chat_graph() -> None:
    result = _run("graphs", "list")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^chat\tmodel=chat-default\tgraphs\.chat:make_graph\t", result.stdout, re.MULTILINE)


def test_graphs_draw_is_mermaid_naming_the_nodes() -> None:
    result = _run("graphs", "draw", "chat")
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    body = lines[lines.index("graph TD;") :]  # after the optional front matter
    nodes = {m.group(1) for line in body if (m := re.match(r"^([A-Za-z_][\w]*)(\(|\[)", line))}
    edges = [re.fullmatch(r"([\w]+) --> ([\w]+);", line) for line in body if "-->" in line]
    assert nodes == {"__start__", "call_model", "__end__"}
    assert all(edges) and {(e.group(1), e.group(2)) for e in edges if e} == {
        ("__start__", "call_model"),
        ("call_model", "__end__"),
    }


def test_unknown_graph_and_bad_config_fail_with_a_clear_message(tmp_path: Path) -> None:
    unknown = _run("graphs", "draw", "nope")
    assert unknown.returncode == 1 and "unknown graph 'nope'; registered: agent, chat, graphrag, rag" in unknown.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {port: high}\n")
    result = _run("--config", str(bad), "graphs", "list")
    assert result.returncode == 1
    assert "server.port: Input should be a valid integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_graphs_new_refuses_bad_names_and_overwrites(tmp_path: Path) -> None:
    assert _run("graphs", "new", "Bad-Name", cwd=tmp_path).returncode == 1
    assert _run("graphs", "new", "summarize", cwd=tmp_path).returncode == 0
    again = _run("graphs", "new", "summarize", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr


@pytest.mark.llm
def test_ask_streams_an_answer(local_backend: Backend) -> None:
    result = _run("ask", "chat", "What is the capital of France?", "--max-tokens", "20")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert re.search(r"\[(stop|length); \d+ prompt \+ \d+ completion tokens\]", result.stderr)


def test_ask_with_the_backend_down_says_so(tmp_path: Path) -> None:
    result = _run("ask", "chat", "hi", env={"SWITCHYARD_LOCAL_BACKEND_PORT": str(free_port())})
    assert result.returncode == 1
    assert "model backend 'local' is unavailable" in result.stderr and "Traceback" not in result.stderr
