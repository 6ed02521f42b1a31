"""The official JavaScript SDK, ``@langchain/langgraph-sdk`` (the version pinned in
tests/js/package.json), against the real server (issue 12, Tests).

This file starts Switchyard with the graphs the Node tests need and runs each
``tests/js/*.test.mjs`` file with ``node --test``; a failing Node test fails its case
here with node's own report. The Node tests cover every ``Client`` method the SDK has
for assistants, threads, runs and store, ``streamResumable`` reconnects, and an
approval answered with a ``HumanResponse`` (what Agent Chat UI sends).

The graphs run on the FAKE scripted backend (tests/fakes), so every answer is
"Hello from the fake" and the agent's tool calls are scripted; the two graphs below
add what no registered graph has: custom events spread over time (so a client can
leave a run mid-way) and a subgraph that asks for a person's answer.

Node.js 20 or newer and ``npm`` must be on the PATH (``make test`` installs Debian's
packages when they are missing); ``npm ci`` runs here when tests/js/node_modules is
missing or older than the lock file."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import yaml
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from graphs import GraphDeps
from graphs.chat.state import ChatState
from tests.conftest import REPO, ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.graphs import PROBE_LOG_ENV

pytestmark = [pytest.mark.e2e]

JS = REPO / "tests" / "js"
NODE_MAJOR = 20
"""The oldest Node.js the pinned SDK runs on (its ``p-retry`` 7 needs 20)."""
# The default per-key rate limit (10 requests/s) is for production; these tests make
# requests as fast as node sends them, and keep a few runs going at once.
_LIMITS = {"requests_per_s": 10_000, "burst": 10_000, "max_concurrent_runs": 64}
TENANTS = {"acme": {"graphs": ["*"], "limits": _LIMITS}, "globex": {"graphs": ["chat", "ticker"], "limits": _LIMITS}}


# ---- graphs the Node tests run (loaded by the server from this module) ----------------


class TickerState(TypedDict, total=False):
    """A conversation and how many ticks to send."""

    messages: Annotated[list[AnyMessage], add_messages]
    ticks: int
    answer_first: bool
    """The model answers before the ticks (so the backend is known and the response
    starts at once: the server holds it until then, see ``read_ahead``), and the ticks
    keep a run going that a client is already reading: Agent Chat UI's Cancel and
    reload (tests/js/agent_chat_ui.test.mjs)."""


def make_ticker_graph(deps: GraphDeps) -> StateGraph[TickerState]:
    """Sends ``ticks`` custom events ``{"tick": i}`` a few milliseconds apart (so a
    client can leave and come back while the run goes on), then answers with the
    model (or the other way round with ``answer_first``). Nothing here is timed by a
    test: the pauses only keep the run going."""

    async def tick(state: TickerState) -> dict[str, Any]:
        write = get_stream_writer()
        for index in range(state.get("ticks", 0)):
            write({"tick": index})
            await asyncio.sleep(0.03)
        return {}

    async def answer(state: TickerState) -> dict[str, Any]:
        reply = await deps.model.ainvoke(state.get("messages") or [("user", "Hi")])
        return {"messages": [reply]}

    def first(state: TickerState) -> str:
        return "answer" if state.get("answer_first") else "tick"

    def after_tick(state: TickerState) -> str:
        return END if state.get("answer_first") else "answer"

    def after_answer(state: TickerState) -> str:
        return "tick" if state.get("answer_first") else END

    builder = StateGraph(TickerState)
    builder.add_node("tick", tick)
    builder.add_node("answer", answer)
    builder.add_conditional_edges(START, first, ["tick", "answer"])
    builder.add_conditional_edges("tick", after_tick, ["answer", END])
    builder.add_conditional_edges("answer", after_answer, ["tick", END])
    return builder


def make_nested_graph(deps: GraphDeps) -> StateGraph[ChatState]:
    """A parent whose one node, ``inner``, is a subgraph: the model drafts an answer,
    then ``review`` asks for a person's answer with ``interrupt`` ("yes" keeps the
    draft, anything else replaces it)."""

    async def draft(state: ChatState) -> dict[str, Any]:
        reply = await deps.model.ainvoke(state["messages"])
        return {"messages": [reply]}

    def review(state: ChatState) -> dict[str, Any]:
        decision = interrupt({"question": "Keep this draft?", "draft": state["messages"][-1].content})
        return {} if decision == "yes" else {"messages": [AIMessage("Dropped.")]}

    inner = StateGraph(ChatState)
    inner.add_node("draft", draft)
    inner.add_node("review", review)
    inner.add_edge(START, "draft")
    inner.add_edge("draft", "review")
    inner.add_edge("review", END)

    parent = StateGraph(ChatState)
    parent.add_node("inner", inner.compile())
    parent.add_edge(START, "inner")
    parent.add_edge("inner", END)
    return parent


# ---- Node.js and the SDK ---------------------------------------------------------------


def _node() -> str:
    node = shutil.which("node")
    assert node, "Node.js is not installed: `make node` (part of `make test`) installs Debian's nodejs and npm"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(version.lstrip("v").split(".")[0])
    assert major >= NODE_MAJOR, (
        f"Node.js {version} is too old: @langchain/langgraph-sdk needs Node.js {NODE_MAJOR} or newer "
        "(Debian bookworm's nodejs is 18; install 20+ from https://deb.nodesource.com or a newer Debian)"
    )
    return node


@pytest.fixture(scope="module")
def node() -> str:
    """The ``node`` binary, with tests/js/node_modules installed from the lock file."""
    binary = _node()
    installed = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        npm = shutil.which("npm")
        assert npm, "npm is not installed: `make node` (part of `make test`) installs it"
        result = subprocess.run(
            [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=JS, capture_output=True, text=True,
            timeout=600, check=False,
        )
        assert result.returncode == 0, f"npm ci failed in {JS}:\n{result.stdout}\n{result.stderr}"
    return binary


# ---- the server ------------------------------------------------------------------------


class JsServer(TypedDict):
    server: ServerHandle
    keys: dict[str, str]
    probe_log: Path


@pytest.fixture(scope="module")
def js_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[JsServer]:
    tmp = tmp_path_factory.mktemp("js-sdk")
    probe_log = tmp / "probe.log"
    probe_log.write_text("")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    registry = yaml.safe_load(models.read_text())
    registry["backends"]["fake-tools"] = {**registry["backends"]["fake-ok"], "model": "fake-tools"}
    registry["aliases"]["fake-tools"] = "fake-tools"
    models.write_text(yaml.safe_dump(registry))
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"},
            "agent": {"path": "tests.fakes.graphs:make_probe_agent", "model": "fake-tools",
                      "tools": ["probe", "calculator"]},
            "ticker": {"path": "tests.serving.test_js_sdk:make_ticker_graph", "model": "fake-ok"},
            "nested": {"path": "tests.serving.test_js_sdk:make_nested_graph", "model": "fake-ok"},
        },
        "tools": {"require_approval": ["probe"]},
        "auth": {"tenants": TENANTS},
        # agent_chat_ui.test.mjs drives the calls as Agent Chat UI's production proxy
        # sends them (text/plain bodies), which a server behind that proxy turns on.
        "server": {"proxy_text_bodies": True},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False, env={PROBE_LOG_ENV: str(probe_log)})
    try:
        yield {"server": handle, "keys": keys, "probe_log": probe_log}
    finally:
        stop_server(handle)


def _server_log_tail(server: ServerHandle, lines: int = 60) -> str:
    output = server.data_dir.parent / "server.out"
    return "\n".join(output.read_text(errors="replace").splitlines()[-lines:]) if output.exists() else ""


@pytest.mark.parametrize("test_file", sorted(p.name for p in JS.glob("*.test.mjs")))
def test_js_sdk(node: str, js_server: JsServer, test_file: str) -> None:
    """One ``tests/js`` file under ``node --test``; it passes only if every Node test in it does."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}  # the SDK reads LANGGRAPH_API_KEY
    env.update(
        SWITCHYARD_URL=js_server["server"].url,
        SWITCHYARD_KEY=js_server["keys"]["acme"],
        SWITCHYARD_OTHER_KEY=js_server["keys"]["globex"],
        SWITCHYARD_PROBE_LOG=str(js_server["probe_log"]),
        NO_COLOR="1",
    )
    result = subprocess.run(
        [node, "--test", "--test-reporter=spec", "--test-timeout=120000", test_file], cwd=JS, env=env, capture_output=True, text=True,
        timeout=900, check=False,
    )
    assert result.returncode == 0, (
        f"node --test {test_file} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
        f"--- server output (last lines) ---\n{_server_log_tail(js_server['server'])}"
    )
    assert re.search(r"^ℹ pass [1-9]", result.stdout, re.MULTILINE), f"no Node test passed in {test_file}:\n{result.stdout}"
