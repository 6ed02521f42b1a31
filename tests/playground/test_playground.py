"""The chat playground (``/playground``) in a real browser: Debian's headless chromium
driven by Playwright for Python, against running servers (issue 18, Tests).

Each test drives the page only through what a person does (pick a graph, type, press
a button, reload) and reads it through the DOM contract the page keeps (ids,
``data-*`` attributes: see serving/playground/); the server's API is read beside it
to check that what the page shows is what the server has.

The answers that must stream come from the real local model (SmolLM2, capped at a few
dozen tokens); where the model must do something specific (call a tool that needs
approval) the FAKE scripted backend answers (tests/fakes). Fixtures: conftest.py here.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from tests.conftest import stop_server
from tests.playground.conftest import ARTIFACTS, HOSTILE, MODEL_TIMEOUT_MS, TIMEOUT_MS, Playground

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
FAKE_ANSWER = "Hello from the fake"
"""What the FAKE scripted backend always answers (once the agent's tool has run)."""

# Records every state of the newest AI answer (its text and data-streaming) as the
# page changes it, so a test can see the text grow token by token.
_RECORD_STATES = """
() => {
  window.__states = [];
  const record = () => {
    const answers = document.querySelectorAll("#messages .message[data-role=ai]");
    const answer = answers[answers.length - 1];
    if (!answer) return;
    const text = answer.querySelector(".text")?.textContent ?? "";
    const streaming = answer.getAttribute("data-streaming");
    const last = window.__states[window.__states.length - 1];
    if (!last || last.text !== text || last.streaming !== streaming) window.__states.push({ text, streaming });
  };
  new MutationObserver(record).observe(document.getElementById("messages"),
    { subtree: true, childList: true, characterData: true, attributes: true });
}
"""

# True once the page has finished a run started when it showed `before` AI messages:
# a new AI message, nothing streaming, Send usable again.
_RUN_ENDED = """
(before) => {
  const answers = document.querySelectorAll("#messages .message[data-role=ai]");
  return answers.length > before
    && !document.querySelector("#messages [data-streaming=true]")
    && !document.getElementById("send").disabled;
}
"""


# ---- what a person does ------------------------------------------------------------------


def open_playground(page: Page, app: Playground) -> None:
    page.goto(f"{app.url}/playground")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def choose_graph(page: Page, app: Playground, graph: str) -> None:
    """Pick ``graph`` in the graph list and wait until its diagram is shown."""
    page.locator("#graph-select").select_option(value=app.assistants[graph])
    expect(page.locator("#graph-select")).to_have_value(app.assistants[graph])
    expect(page.locator("#graph-mermaid")).not_to_be_empty()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def ai_count(page: Page) -> int:
    return page.locator("#messages .message[data-role=ai]").count()


def send(page: Page, text: str) -> int:
    """Type ``text`` and press Send; returns how many AI messages were shown before."""
    before = ai_count(page)
    expect(page.locator("#send")).to_be_enabled()
    page.locator("#message-input").fill(text)
    page.locator("#send").click()
    return before


def wait_run_ended(page: Page, before: int, timeout: float = TIMEOUT_MS) -> Locator:
    """Wait until the run has ended with a new answer; returns the newest answer."""
    page.wait_for_function(_RUN_ENDED, arg=before, timeout=timeout)
    answer = page.locator("#messages .message[data-role=ai]").last
    expect(answer).to_have_attribute("data-streaming", "false")
    return answer


def thread_in_url(page: Page) -> str:
    """The thread the page's address names (once the page has made one)."""
    expect(page).to_have_url(re.compile(r"[?&]thread=[^&]+"))
    threads = parse_qs(urlparse(page.url).query).get("thread")
    assert threads, f"no thread in the page's address: {page.url}"
    return threads[0]


def sign_in(page: Page, key: str) -> None:
    """Type ``key`` into the API key field and save it."""
    expect(page.locator("#auth")).to_be_visible()
    page.locator("#api-key").fill(key)
    page.locator("#save-key").click()


def meta(answer: Locator, name: str) -> str:
    return (answer.locator(f".meta [data-field={name}]").text_content() or "").strip()


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def thread_runs(app: Playground, thread_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
    return app.api("GET", f"/threads/{thread_id}/runs", tenant=tenant)


# ---- the page and its graphs -------------------------------------------------------------


def test_page_loads_with_graphs_and_diagram(page: Page, playground_server: Playground) -> None:
    """The page needs no key in dev mode, lists every graph, and shows the chosen
    graph's Mermaid text and a drawing of it; it is served with a strict CSP."""
    app = playground_server
    response = page.goto(f"{app.url}/playground")
    assert response is not None and response.ok
    headers = response.headers
    assert headers["content-security-policy"] == CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-cache"
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#auth")).to_be_hidden()
    expect(page.locator("#error")).to_be_hidden()

    options = page.locator("#graph-select option")
    expect(options).to_have_count(len(app.assistants))
    shown = {options.nth(i).get_attribute("value"): options.nth(i).text_content() for i in range(options.count())}
    assert set(shown) == set(app.assistants.values())
    for graph, assistant in app.assistants.items():
        assert graph in (shown[assistant] or ""), f"option {assistant} does not name {graph}: {shown[assistant]!r}"

    choose_graph(page, app, "agent")
    drawn = app.api("GET", f"/assistants/{app.assistants['agent']}/graph")
    nodes = [n["id"] for n in drawn["nodes"] if n["id"] not in ("__start__", "__end__")]
    assert nodes
    mermaid = page.locator("#graph-mermaid").text_content() or ""
    assert re.match(r"\s*(graph|flowchart)\b", mermaid), mermaid
    diagram = page.locator("#graph-diagram").text_content() or ""
    for node in nodes:
        assert node in mermaid, f"node {node} missing from the Mermaid text:\n{mermaid}"
        assert node in diagram, f"node {node} missing from the drawn diagram: {diagram!r}"
    if any(e.get("conditional") for e in drawn["edges"]):
        assert "-.->" in mermaid or "-.-" in mermaid, f"conditional edges are not dotted:\n{mermaid}"
    assert page.locator("#graph-diagram").locator("rect, circle, ellipse, path, line, polygon").count() >= len(nodes)


# ---- streaming with the real model -------------------------------------------------------


def test_answer_streams_token_by_token(page: Page, playground_server: Playground) -> None:
    """The real model's answer is seen growing through several states before the run
    ends; the answer shows its request id, run id and backend, and equals what the
    thread's state holds. Saves the screenshot ``test-artifacts/playground.png``."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "chat")
    page.evaluate(_RECORD_STATES)
    before = send(page, "Write three short sentences about trains.")
    answer = wait_run_ended(page, before, timeout=MODEL_TIMEOUT_MS)

    states: list[dict[str, str]] = page.evaluate("window.__states")
    streamed = [s["text"] for s in states if s["streaming"] == "true" and s["text"]]
    assert len(set(streamed)) >= 3, f"the answer did not arrive token by token: {states}"
    for shorter, longer in zip(streamed, streamed[1:]):
        assert longer.startswith(shorter), f"the streamed text did not only grow: {shorter!r} -> {longer!r}"
    final = answer.locator(".text").text_content() or ""
    assert final.strip().startswith(streamed[-1].strip()), (streamed[-1], final)
    expect(page.locator("#stop")).to_be_disabled()

    thread_id = thread_in_url(page)
    values = app.api("GET", f"/threads/{thread_id}/state")["values"]
    assert text_of(values["messages"][-1]).strip() == final.strip()
    assert meta(answer, "backend") == "local"
    run_id = meta(answer, "run-id")
    assert run_id in {r["run_id"] for r in thread_runs(app, thread_id)}
    assert re.fullmatch(r"[0-9A-Za-z-]{8,}", meta(answer, "request-id")), meta(answer, "request-id")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


def test_thread_resumes_after_reload(page: Page, playground_server: Playground) -> None:
    """A reload reopens the thread (address, then localStorage): its messages come
    back from the thread's state and the next message continues the same thread."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "chat")
    first = "Name one colour."
    answer = wait_run_ended(page, send(page, first), timeout=MODEL_TIMEOUT_MS)
    first_answer = (answer.locator(".text").text_content() or "").strip()
    thread_id = thread_in_url(page)
    expect(page.locator("#thread-select")).to_have_value(thread_id)

    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    assert thread_in_url(page) == thread_id
    expect(page.locator("#thread-select")).to_have_value(thread_id)
    expect(page.locator("#graph-select")).to_have_value(app.assistants["chat"])
    expect(page.locator("#messages .message[data-role=human] .text")).to_have_text([first])
    expect(page.locator("#messages .message[data-role=ai] .text")).to_have_text([first_answer])

    second = "Name another one."
    wait_run_ended(page, send(page, second), timeout=MODEL_TIMEOUT_MS)
    assert thread_in_url(page) == thread_id
    messages = app.api("GET", f"/threads/{thread_id}/state")["values"]["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "human", "ai"]
    assert text_of(messages[0]) == first and text_of(messages[2]) == second
    assert text_of(messages[1]).strip() == first_answer
    expect(page.locator("#messages .message[data-role=human] .text")).to_have_text([first, second])

    # A new thread starts empty; picking the old one in the list shows it again.
    page.locator("#new-thread").click()
    expect(page.locator("#messages .message")).to_have_count(0)
    page.locator("#thread-select").select_option(value=thread_id)
    expect(page.locator("#messages .message[data-role=human] .text")).to_have_text([first, second])
    assert thread_in_url(page) == thread_id

    # Opened again without the thread in the address: localStorage remembers it.
    page.goto(f"{app.url}/playground")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#thread-select")).to_have_value(thread_id)
    expect(page.locator("#messages .message[data-role=human] .text")).to_have_text([first, second])


# ---- tools and approvals (FAKE scripted backend: the agent calls probe) ------------------


def ask_for_probe(page: Page, app: Playground) -> Locator:
    """A new agent thread whose run waits for the approval of probe({"note": "hello"})."""
    open_playground(page, app)
    choose_graph(page, app, "agent")
    page.locator("#new-thread").click()
    send(page, "SCRIPT:probe")
    approval = page.locator("#approval")
    expect(approval).to_be_visible()
    expect(approval.locator(".approval-tool")).to_have_text("probe")
    assert json.loads(approval.locator(".approval-args").input_value()) == {"note": "hello"}
    expect(page.locator("#status")).to_contain_text(re.compile("approval", re.I))
    call = page.locator(".tool-call[data-tool=probe]").last
    expect(call).to_have_attribute("data-decision", "pending")
    assert json.loads(call.locator(".tool-args").text_content() or "") == {"note": "hello"}
    return call


def test_approve_runs_the_tool(page: Page, playground_server: Playground) -> None:
    app = playground_server
    before = app.probe_runs("probe hello")
    call = ask_for_probe(page, app)
    assert app.probe_runs("probe hello") == before, "nothing runs before the approval"
    answers = ai_count(page)
    page.locator("#approval [data-action=approve]").click()
    expect(call).to_have_attribute("data-decision", "executed")
    expect(call.locator(".tool-result")).to_contain_text("probe saw 'hello'")
    expect(page.locator("#approval")).to_be_hidden()
    answer = wait_run_ended(page, answers)
    expect(answer.locator(".text")).to_have_text(FAKE_ANSWER)
    assert app.probe_runs("probe hello") == before + 1
    # A resumed run's backend comes from its metadata when no header names it.
    assert meta(answer, "backend") == "fake-tools"
    assert meta(answer, "run-id") not in ("", "—")


def test_reject_refuses_the_tool(page: Page, playground_server: Playground) -> None:
    app = playground_server
    before = app.probe_runs("probe hello")
    call = ask_for_probe(page, app)
    answers = ai_count(page)
    page.locator("#approval .approval-reason").fill("not today")
    page.locator("#approval [data-action=reject]").click()
    expect(call).to_have_attribute("data-decision", "refused")
    expect(call.locator(".tool-result")).to_contain_text("not today")
    wait_run_ended(page, answers)
    assert app.probe_runs("probe hello") == before
    thread_id = thread_in_url(page)
    tool = [m for m in app.api("GET", f"/threads/{thread_id}/state")["values"]["messages"] if m["type"] == "tool"][-1]
    assert tool["artifact"]["decision"] == "refused"


def test_edit_runs_the_tool_with_edited_args(page: Page, playground_server: Playground) -> None:
    """Edited arguments that are not JSON are refused by the page without sending;
    valid ones run the tool with them."""
    app = playground_server
    before = app.probe_runs("probe edited")
    call = ask_for_probe(page, app)
    args = page.locator("#approval .approval-args")
    args.fill('{"note": "edited"')
    page.locator("#approval [data-action=edit]").click()
    expect(page.locator("#approval .approval-error")).to_be_visible()
    expect(page.locator("#approval")).to_be_visible()
    expect(call).to_have_attribute("data-decision", "pending")

    answers = ai_count(page)
    args.fill('{"note": "edited"}')
    page.locator("#approval [data-action=edit]").click()
    expect(call).to_have_attribute("data-decision", "executed")
    expect(call.locator(".tool-result")).to_contain_text("probe saw 'edited'")
    wait_run_ended(page, answers)
    assert app.probe_runs("probe edited") == before + 1


@pytest.mark.parametrize(
    ("script", "tool", "decision", "result"),
    [
        ("sleepy", "sleepy", "timed_out", "Timed out"),
        ("boom", "boom", "failed", "Error"),
        ("disallowed", "http_get", "refused", "Refused"),
    ],
)
def test_tool_call_decisions(page: Page, playground_server: Playground, script: str, tool: str, decision: str, result: str) -> None:
    """A call that needs no approval shows its arguments, then the executor's decision
    (from the tool message's artifact) and its result, as the run goes on."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "agent")
    answer = wait_run_ended(page, send(page, f"SCRIPT:{script}"))
    call = page.locator(f".tool-call[data-tool={tool}]").last
    expect(call).to_have_attribute("data-decision", decision)
    expect(call.locator(".tool-result")).to_contain_text(result)
    expect(call).to_have_attribute("data-call-id", re.compile(r"\S"))
    expect(answer.locator(".text")).to_have_text(FAKE_ANSWER)
    expect(page.locator("#approval")).to_be_hidden()


# ---- what a hostile string becomes ---------------------------------------------------------


def test_hostile_strings_are_shown_as_text(page: Page, playground_server: Playground) -> None:
    """Markup in a question, an answer, a citation and a fact is shown as text: no
    element is made from it and no script runs, during the run and after a reload."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "echo")
    answer = wait_run_ended(page, send(page, HOSTILE))
    expect(answer.locator(".text")).to_have_text(f"You said: {HOSTILE} [1]")
    expect(page.locator("#messages .message[data-role=human] .text")).to_have_text([HOSTILE])
    citation = answer.locator(".citations .citation[data-index='1']")
    expect(citation).to_have_attribute("data-doc-id", "doc-echo")
    expect(citation).to_contain_text(f"[1] {HOSTILE}")
    expect(citation.get_by_text("The chunk says:")).to_be_hidden()
    citation.locator("summary").click()  # expanded: the chunk's text
    expect(citation.get_by_text("The chunk says:")).to_be_visible()
    fact = answer.locator(".fact").first
    expect(fact).to_contain_text("MENTIONS")
    expect(fact).to_contain_text(HOSTILE)
    thread_id = thread_in_url(page)
    expect(page.locator(f"#thread-select option[value='{thread_id}']")).to_contain_text("<img")
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None

    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#messages .message[data-role=ai] .text")).to_have_text([f"You said: {HOSTILE} [1]"])
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None


# ---- stopping a run ------------------------------------------------------------------------


def _wait_run_not_running(app: Playground, thread_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        runs = thread_runs(app, thread_id)
        if runs and all(r["status"] not in ("pending", "running") for r in runs):
            return runs
        assert time.monotonic() < deadline, f"the thread's run is still going: {runs}"
        time.sleep(0.2)


def _cancel_runs(app: Playground, thread_id: str) -> None:
    """Cancel the thread's runs still going (a test's leftovers)."""
    for run in thread_runs(app, thread_id):
        if run["status"] in ("pending", "running"):
            httpx.post(f"{app.url}/threads/{thread_id}/runs/{run['run_id']}/cancel", timeout=10)


def test_stop_cancels_the_run(page: Page, playground_server: Playground) -> None:
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "slow")
    send(page, "Take your time.")
    expect(page.locator("#stop")).to_be_enabled()
    expect(page.locator("#send")).to_be_disabled()
    working = page.locator("#messages .message[data-role=ai]").last
    expect(working.locator(".text")).to_have_text(FAKE_ANSWER)
    expect(working.locator(".meta [data-field=run-id]")).not_to_have_text(re.compile(r"^\s*(—)?\s*$"))
    page.locator("#stop").click()
    expect(page.locator("#status")).to_contain_text(re.compile("cancel", re.I))
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#messages [data-streaming=true]")).to_have_count(0)
    runs = _wait_run_not_running(app, thread_in_url(page))
    assert all(r["status"] != "success" for r in runs), runs


def test_stop_at_once_cancels_the_run(page: Page, playground_server: Playground) -> None:
    """Stop pressed while the page does not know the run's id yet (the server starts a
    stream's response once the answering backend is known, or after its keep-alive
    interval) still cancels the run on the server, not only the page's request."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "sleeper")
    send(page, "Take your time.")
    thread_id = thread_in_url(page)
    try:
        deadline = time.monotonic() + 10
        while not thread_runs(app, thread_id):  # the run exists; its response has not started
            assert time.monotonic() < deadline, "the page started no run"
            time.sleep(0.05)
        page.locator("#stop").click()
        expect(page.locator("#status")).to_contain_text(re.compile("cancel", re.I))
        expect(page.locator("#send")).to_be_enabled()
        runs = _wait_run_not_running(app, thread_id)
        assert all(r["status"] != "success" for r in runs), runs
    finally:
        _cancel_runs(app, thread_id)


def test_reload_during_a_run_shows_the_thread_busy(page: Page, playground_server: Playground) -> None:
    """A reload while the thread's run goes on reopens the thread as busy."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "slow")
    send(page, "Take your time.")
    expect(page.locator("#stop")).to_be_enabled()
    expect(page.locator("#messages .message[data-role=ai] .text")).to_have_text([FAKE_ANSWER])
    thread_id = thread_in_url(page)
    try:
        page.reload()
        expect(page.locator("body")).to_have_attribute("data-ready", "true")
        assert thread_in_url(page) == thread_id
        expect(page.locator("#status")).to_contain_text(re.compile("busy|running|streaming", re.I))
    finally:
        _cancel_runs(app, thread_id)


# ---- error states --------------------------------------------------------------------------


def test_backend_stopped_shows_backend_down(page: Page, playground_server: Playground) -> None:
    """The ``offline`` graph answers while its backend runs; once this test stops that
    backend, the next message shows the backend as down, naming it."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, "offline")
    answer = wait_run_ended(page, send(page, "Hello?"))
    expect(answer.locator(".text")).to_have_text(FAKE_ANSWER)
    expect(page.locator("#error")).to_be_hidden()

    assert app.offline is not None
    app.offline.close()  # stops the backend's server: its port now refuses connections
    send(page, "Still there?")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("data-kind", "backend_down")
    expect(error).to_contain_text("offline")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#messages [data-streaming=true]")).to_have_count(0)


@pytest.mark.parametrize(("graph", "kind"), [("broken", "backend_down"), ("crash", "error")])
def test_failed_run_shows_its_error(page: Page, playground_server: Playground, graph: str, kind: str) -> None:
    """A backend that drops the answer half-way, and a graph with a bug: the stream's
    error event is shown, classified, and the page is ready for the next message."""
    app = playground_server
    open_playground(page, app)
    choose_graph(page, app, graph)
    send(page, "Hello?")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("data-kind", kind)
    expect(error).not_to_be_empty()
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#messages [data-streaming=true]")).to_have_count(0)


def test_server_stopped_shows_server_down(page: Page, doomed_server: Playground) -> None:
    """When the server itself is gone, the page says so (the fetch fails)."""
    app = doomed_server
    open_playground(page, app)
    choose_graph(page, app, "chat")
    wait_run_ended(page, send(page, "Hello?"))
    stop_server(app.server)
    send(page, "Still there?")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("data-kind", "server_down")
    expect(page.locator("#send")).to_be_enabled()


_KEY_KEPT = """(key) => [localStorage, sessionStorage].some((area) => Object.values(area).some((v) => v.includes(key)))"""
"""Whether the browser keeps ``key`` anywhere the page can store it."""
_KEY_REMEMBERED = """(key) => Object.values(localStorage).some((v) => v.includes(key))"""
"""Whether ``key`` is kept for every tab of this browser (``#remember-key``)."""


def test_auth_key_field(page: Page, keyed_server: Playground) -> None:
    """With keys on, the page asks for one: a wrong key shows an auth error, the right
    one lists the graphs and runs them. The key is kept for the tab (a reload keeps
    it, another tab asks again) or, with "remember", for the browser; "Forget key"
    removes it."""
    app = keyed_server
    page.goto(f"{app.url}/playground")
    expect(page.locator("#auth")).to_be_visible()
    expect(page.locator("#api-key")).to_have_attribute("type", "password")

    sign_in(page, "sk-not-a-key")
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error")).to_have_attribute("data-kind", "auth")

    key = app.keys["acme"]
    sign_in(page, key)
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#graph-select option")).to_have_count(len(app.assistants))
    choose_graph(page, app, "chat")
    answer = wait_run_ended(page, send(page, "Hello?"))
    expect(answer.locator(".text")).to_have_text(FAKE_ANSWER)
    assert meta(answer, "backend") == "fake-ok"

    page.reload()  # the key is kept for this tab
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#graph-select option")).to_have_count(len(app.assistants))
    assert page.evaluate(_KEY_KEPT, key)
    assert not page.evaluate(_KEY_REMEMBERED, key), "kept in localStorage without 'remember'"
    other = page.context.new_page()  # another tab of the same browser asks again
    other.goto(f"{app.url}/playground")
    expect(other.locator("#auth")).to_be_visible()
    expect(other.locator("#graph-select option")).to_have_count(0)
    other.close()

    page.locator("#forget-key").click()
    assert not page.evaluate(_KEY_KEPT, key)
    page.reload()
    expect(page.locator("#auth")).to_be_visible()
    expect(page.locator("#graph-select option")).to_have_count(0)

    # Remembered on this browser: every tab has it, until one forgets it.
    page.locator("#remember-key").check()
    sign_in(page, key)
    expect(page.locator("#graph-select option")).to_have_count(len(app.assistants))
    assert page.evaluate(_KEY_REMEMBERED, key)
    other = page.context.new_page()
    other.goto(f"{app.url}/playground")
    expect(other.locator("body")).to_have_attribute("data-ready", "true")
    expect(other.locator("#graph-select option")).to_have_count(len(app.assistants))
    other.locator("#forget-key").click()
    assert not other.evaluate(_KEY_KEPT, key)
    other.close()


def test_rate_limited_shows_retry_after(page: Page, keyed_server: Playground) -> None:
    """A key whose rate limit is spent gets 429: shown as rate limited, with when to
    try again. (The ``tight`` tenant's key allows one request, then none for minutes.)"""
    app = keyed_server
    page.goto(f"{app.url}/playground")
    sign_in(page, app.keys["tight"])
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("data-kind", "rate_limited")
    expect(error).to_contain_text(re.compile(r"\d+\s*s|retry|again", re.I))


def test_deadline_shows_deadline(page: Page, keyed_server: Playground) -> None:
    """A run cut by the server's run deadline (2 seconds here) is shown as such."""
    app = keyed_server
    page.goto(f"{app.url}/playground")
    sign_in(page, app.keys["acme"])
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    choose_graph(page, app, "slow")
    send(page, "Take your time.")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("data-kind", "deadline")
    expect(page.locator("#send")).to_be_enabled()
