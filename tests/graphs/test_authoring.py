"""Follows docs/authoring-graphs.md step by step in a fresh project directory: scaffold,
register, list, draw, run the scaffolded test, ask, and call it through the API."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway import Backend
from tests.conftest import REPO, SWITCHYARD, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llm]


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


def test_the_authoring_walkthrough(local_backend: Backend, workdir: Path) -> None:
    shutil.copytree(REPO / "config", workdir / "config")

    # 1. Scaffold.
    created = _run(workdir, str(SWITCHYARD), "graphs", "new", "summarize")
    assert (workdir / "my_graphs/summarize.py").is_file()
    assert (workdir / "my_graphs/test_summarize.py").is_file()
    assert "path: my_graphs/summarize.py:make_graph" in created.stdout

    # 2. Write the graph: change its prompt.
    module = workdir / "my_graphs/summarize.py"
    module.write_text(
        module.read_text().replace(
            'SYSTEM_PROMPT = "You are a concise assistant. Answer in at most two sentences."',
            "SYSTEM_PROMPT = \"Summarize the user's text in one sentence.\"",
        )
    )

    # 3. Register it, as printed.
    config_file = workdir / "config/switchyard.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["graphs"]["summarize"] = {
        "path": "my_graphs/summarize.py:make_graph",
        "model": "chat-default",
        "description": "One-sentence summaries.",
    }
    config_file.write_text(yaml.safe_dump(config))
    listed = _run(workdir, str(SWITCHYARD), "graphs", "list").stdout
    assert "summarize\tmodel=chat-default\tmy_graphs/summarize.py:make_graph\tOne-sentence summaries." in listed
    drawn = _run(workdir, str(SWITCHYARD), "graphs", "draw", "summarize").stdout
    assert "__start__ --> answer;" in drawn and "answer --> __end__;" in drawn

    # 4. Test it: the scaffolded test passes against the real model.
    # With Switchyard's pytest settings (markers, asyncio), as in the project directory.
    tested = _run(
        workdir, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
        "--rootdir", str(workdir), "my_graphs/test_summarize.py",
    )
    assert "1 passed" in tested.stdout

    # 5. Use it: the CLI streams an answer, and the API serves it as a model id.
    asked = _run(workdir, str(SWITCHYARD), "ask", "summarize", "LangGraph models agents as state machines.")
    assert asked.stdout.strip()
    handle = start_server(workdir, {"gateway": {"models_file": "config/models.yaml"}, "graphs": config["graphs"]}, cwd=workdir)
    try:
        models = httpx.get(handle.url + "/v1/models").json()["data"]
        assert {"id": "summarize", "object": "model", "created": 0, "owned_by": "switchyard-graph"} in models
        answer = httpx.post(
            handle.url + "/v1/chat/completions",
            json={"model": "summarize", "max_tokens": 30, "messages": [{"role": "user", "content": "Ships sail."}]},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
    finally:
        stop_server(handle)
