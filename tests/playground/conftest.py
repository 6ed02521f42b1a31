"""Fixtures of the playground's browser tests: Debian's chromium driven by Playwright for
Python, and the Switchyard servers the page is opened on.

The browser is ``/usr/bin/chromium`` (``make chromium``, part of ``make test``, installs
Debian's package); Playwright never downloads one. One browser serves the whole module;
every test gets a fresh context (its own localStorage), and a failing test leaves a
screenshot in ``test-artifacts/`` (repo root, ignored by git).

Two servers started once per module, and a third that one test stops
(``doomed_server``):

- ``playground_server`` (``--dev``, no keys): ``chat`` on the real local model (SmolLM2,
  answers capped at a few dozen tokens), ``agent`` on the FAKE scripted backend (its
  ``probe`` tool needs approval), and graphs defined here: ``echo`` (repeats the
  question, with citations and facts, so a hostile question becomes a hostile answer),
  ``slow`` and ``sleeper`` (runs that go on until stopped), ``offline`` (chat on a fake
  backend this module runs and can stop), ``broken`` (its backend drops the answer
  half-way) and ``crash`` (a node with a bug).
- ``keyed_server`` (keys on): ``chat`` on the fake, ``slow`` under a 2-second run
  deadline, and a tenant whose rate limit one request exhausts.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from gateway import Backend
from graphs import GraphDeps
from graphs.graphrag.state import GraphRagState
from tests.conftest import REPO, ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.graphs import PROBE_LOG_ENV
from tests.fakes.openai_backend import run_fake_backend

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's ``chromium`` package (``make chromium``)."""
NO_BROWSER_ENV = "SWITCHYARD_NO_BROWSER"
"""Set to ``1`` where no browser can be installed: then (and only then) a missing
chromium skips these tests instead of failing them."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""No sandbox (the tests run as root in CI containers), no GPU, and nothing that
reaches the network on its own (updates, sync, QUIC probes)."""
ARTIFACTS = REPO / "test-artifacts"
"""Screenshots: ``playground.png`` after an answer, and one per failing test (with
the page's console lines beside it)."""
TIMEOUT_MS = 20_000
"""Default wait of a Playwright expectation: page loads and fake-backend runs."""
MODEL_TIMEOUT_MS = 120_000
"""Wait for an answer of the real model (SmolLM2 on two busy CPU cores)."""
MODEL_MAX_TOKENS = 48
"""The real model's answers are capped (the local backend's ``default_max_tokens``):
enough tokens to watch them arrive one by one, few enough to keep the module quick."""
HOSTILE = '<img src=x onerror="window.__pwned=1">'
"""Markup that runs script if a page ever parses a server string as HTML."""
_LIMITS = {"requests_per_s": 10_000, "burst": 10_000, "max_concurrent_runs": 64}

# Recorded in every page before its own script runs: uncaught errors and CSP
# violations (a page that builds DOM from strings with `innerHTML`, or sets inline
# styles or handlers, trips the Content-Security-Policy and shows up here).
_WATCH_SCRIPT = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective} ${event.blockedURI} ${event.sourceFile}:${event.lineNumber}`);
});
"""


# ---- graphs the servers run (loaded by the servers from this module) -------------------


def make_echo_graph(deps: GraphDeps) -> StateGraph[GraphRagState]:
    """Answers "You said: <the question>" with one cited source and one graph fact
    whose title, heading, text, subject and object are the question too: whatever a
    client typed comes back as model output, citation and fact (no model is called)."""

    async def echo(state: GraphRagState) -> dict[str, Any]:
        question = str(state["messages"][-1].content)
        source = {
            "index": 1, "doc_id": "doc-echo", "chunk_id": "doc-echo:0", "title": question, "source": "echo.md",
            "heading": question, "text": f"The chunk says: {question}", "relevance": 0.9,
        }
        fact = {
            "text": f"{question} MENTIONS {question}", "subject": question, "relation": "MENTIONS", "object": question,
            "subject_type": "Thing", "object_type": "Thing", "hops": 1, "score": 0.8, "doc_id": "doc-echo",
            "doc_ids": ["doc-echo"], "chunk_ids": ["doc-echo:0"],
            "sources": [{"chunk_id": "doc-echo:0", "doc_id": "doc-echo", "text": source["text"], "title": question, "source": "echo.md"}],
        }
        return {"messages": [AIMessage(f"You said: {question} [1]")], "sources": [source], "facts": [fact]}

    builder = StateGraph(GraphRagState)
    builder.add_node("echo", echo)
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    return builder


def make_slow_graph(deps: GraphDeps) -> StateGraph[GraphRagState]:
    """Answers with the model, then goes on for a minute unless it is cancelled or its
    deadline passes. (The model call comes first because a stream's response starts
    once the backend that answers is known, or after ``server.keepalive_s``.)"""

    async def start(state: GraphRagState) -> dict[str, Any]:
        return {"messages": [await deps.model.ainvoke(state["messages"])]}

    async def wait(state: GraphRagState) -> dict[str, Any]:
        await asyncio.sleep(60)
        return {"messages": [AIMessage("Waited a minute.")]}

    builder = StateGraph(GraphRagState)
    builder.add_node("start", start)
    builder.add_node("wait", wait)
    builder.add_edge(START, "start")
    builder.add_edge("start", "wait")
    builder.add_edge("wait", END)
    return builder


def make_sleeper_graph(deps: GraphDeps) -> StateGraph[GraphRagState]:
    """Waits a minute before anything else (no model call first): its stream's response
    only starts after ``server.keepalive_s``, so for that long a client has no run id."""

    async def wait(state: GraphRagState) -> dict[str, Any]:
        await asyncio.sleep(60)
        return {"messages": [AIMessage("Waited a minute.")]}

    builder = StateGraph(GraphRagState)
    builder.add_node("wait", wait)
    builder.add_edge(START, "wait")
    builder.add_edge("wait", END)
    return builder


# ---- the browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        if os.environ.get(NO_BROWSER_ENV) == "1":
            pytest.skip(f"{CHROMIUM} is missing and {NO_BROWSER_ENV}=1 says no browser can be installed here")
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` (part of `make test`) installs Debian's chromium package")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Debian's chromium, headless. Playwright gives each launch a fresh temporary
    profile (user-data) directory and removes it at close."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
    try:
        yield browser
    finally:
        browser.close()


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Keep each phase's report on the test item, for `page`'s screenshot on failure."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@dataclass(slots=True)
class PageLog:
    """What the page's script said: uncaught errors (none are expected) and the
    console (saved beside a failing test's screenshot)."""

    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page in a fresh browser context (empty localStorage). Afterwards: a screenshot
    and the console's lines if the test failed, and an error if the page's script threw
    or broke its CSP."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    context.add_init_script(_WATCH_SCRIPT)
    page = context.new_page()
    log = PageLog()
    page.on("pageerror", lambda error: log.errors.append(f"{error.name}: {error.message}"))
    page.on("console", lambda message: log.console.append(f"{message.type}: {message.text}"))
    try:
        yield page
        failed = [r for r in request.node.stash.get(_REPORTS, {}).values() if r.failed]
        if failed:
            ARTIFACTS.mkdir(exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)
            page.screenshot(path=str(ARTIFACTS / f"playground-failed-{name}.png"), full_page=True)
            (ARTIFACTS / f"playground-failed-{name}.console.txt").write_text("\n".join(log.errors + log.console) + "\n")
        else:
            violations = page.evaluate("window.__cspViolations || []")
            assert not log.errors, f"the page's script threw: {log.errors}"
            assert not violations, f"the page broke its Content-Security-Policy: {violations}"
    finally:
        context.close()


# ---- the servers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Playground:
    """A running server and what the tests need to know about it."""

    server: ServerHandle
    assistants: dict[str, str]
    """Graph id -> assistant id (the value of its ``#graph-select`` option)."""
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant -> API key (keys on only)."""
    probe_log: Path | None = None
    """Lines the ``probe`` tool writes each time it really runs."""
    offline: ExitStack | None = None
    """Closing it stops the fake backend of the ``offline`` graph."""

    @property
    def url(self) -> str:
        return self.server.url

    def api(self, method: str, path: str, *, tenant: str | None = None, **kwargs: Any) -> Any:
        """One call to the server's API (with the tenant's key when keys are on)."""
        headers = {"x-api-key": self.keys[tenant]} if tenant else {}
        response = httpx.request(method, self.url + path, headers=headers, timeout=30, **kwargs)
        response.raise_for_status()
        return response.json()

    def probe_runs(self, line: str) -> int:
        assert self.probe_log is not None
        return self.probe_log.read_text().splitlines().count(line)


def _assistants(server: ServerHandle, key: str | None = None) -> dict[str, str]:
    headers = {"x-api-key": key} if key else {}
    found = httpx.post(server.url + "/assistants/search", json={"limit": 100}, headers=headers, timeout=30)
    found.raise_for_status()
    return {a["graph_id"]: a["assistant_id"] for a in found.json()}


def _registry(tmp: Path, local: Backend | None, fake_url: str, *, offline_url: str | None = None) -> Path:
    """The tests' model registry plus ``fake-tools`` (scripted tool calls) and, given
    ``offline_url``, ``offline`` (a fake this module can stop); the local backend's
    answers are capped at `MODEL_MAX_TOKENS`."""
    models = write_models_file(tmp / "models.yaml", local, fake_url, chat_default="local" if local else "fake-ok")
    registry = yaml.safe_load(models.read_text())
    backends, aliases = registry["backends"], registry["aliases"]
    if local is not None:
        backends["local"]["default_max_tokens"] = MODEL_MAX_TOKENS
    backends["fake-tools"] = {**backends["fake-ok"], "model": "fake-tools"}
    aliases["fake-tools"] = "fake-tools"
    if offline_url is not None:
        backends["offline"] = {**backends["fake-ok"], "base_url": offline_url, "timeouts": {"connect_s": 1, "read_s": 5}}
        aliases["offline"] = "offline"
    models.write_text(yaml.safe_dump(registry))
    return models


_HERE = "tests.playground.conftest"


@pytest.fixture(scope="module")
def playground_server(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[Playground]:
    """``switchyard serve --dev`` (no keys) with the graphs the page is tried on."""
    tmp = tmp_path_factory.mktemp("playground")
    probe_log = tmp / "probe.log"
    probe_log.write_text("")
    with ExitStack() as stack:
        offline = stack.enter_context(ExitStack())
        offline_url = offline.enter_context(run_fake_backend())
        models = _registry(tmp, local_backend, fake_backend_url, offline_url=offline_url)
        settings: dict[str, Any] = {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
                "agent": {"path": "tests.fakes.graphs:make_probe_agent", "model": "fake-tools", "tools": ["probe", "calculator", "sleepy", "boom"]},
                "echo": {"path": f"{_HERE}:make_echo_graph", "model": "fake-ok"},
                "slow": {"path": f"{_HERE}:make_slow_graph", "model": "fake-ok"},
                "sleeper": {"path": f"{_HERE}:make_sleeper_graph", "model": "fake-ok"},
                "offline": {"path": "graphs.chat:make_graph", "model": "offline"},
                "broken": {"path": "graphs.chat:make_graph", "model": "fake-break"},
                "crash": {"path": "tests.fakes.graphs:make_crashing_graph", "model": "fake-ok"},
            },
            "tools": {"require_approval": ["probe"]},
            # A stream's response waits at most this long for the answering backend to
            # be known (``sleeper``'s run id reaches the page after it).
            "server": {"keepalive_s": 3},
        }
        handle = start_server(tmp, settings, env={PROBE_LOG_ENV: str(probe_log)})
        stack.callback(stop_server, handle)
        yield Playground(server=handle, assistants=_assistants(handle), probe_log=probe_log, offline=offline)


@pytest.fixture
def doomed_server(tmp_path: Path, fake_backend_url: str) -> Iterator[Playground]:
    """``switchyard serve --dev`` with ``chat`` on the fake, for one test that stops it."""
    models = _registry(tmp_path, None, fake_backend_url)
    graphs = {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}}
    handle = start_server(tmp_path, {"gateway": {"models_file": str(models)}, "graphs": graphs})
    try:
        yield Playground(server=handle, assistants=_assistants(handle))
    finally:
        stop_server(handle)


TENANTS: dict[str, Any] = {
    "acme": {"graphs": ["*"], "limits": _LIMITS},
    # One request per key, then 429 for a long while (Retry-After).
    "tight": {"graphs": ["*"], "limits": {"requests_per_s": 0.01, "burst": 1, "max_concurrent_runs": 1}},
}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[Playground]:
    """``switchyard serve`` with keys on (not ``--dev``), runs cut at 2 seconds."""
    tmp = tmp_path_factory.mktemp("playground-keys")
    models = _registry(tmp, None, fake_backend_url)
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"},
            "slow": {"path": f"{_HERE}:make_slow_graph", "model": "fake-ok"},
        },
        "auth": {"tenants": TENANTS},
        "server": {"run_deadline_s": 2},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield Playground(server=handle, assistants=_assistants(handle, keys["acme"]), keys=keys)
    finally:
        stop_server(handle)
