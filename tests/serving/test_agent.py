"""The ``agent`` graph under the tool policy, over both APIs.

The FAKE scripted backend (tests/fakes) forges the calls a real model will not make
on demand: a tool outside the graph's list, an unknown tool, malformed and invalid
arguments, thirteen calls a turn in a loop (52 in all), a tool that sleeps past its timeout, one that
raises. The probe tools write a line to a file each time they really run, so a test
can prove a refused call did not. Approvals pause a thread's run and resume through
the LangGraph API. The real model runs the graph end to end too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError
from langgraph_sdk.schema import Command

from gateway import Backend
from tests.conftest import ServerHandle, start_server, stop_server, write_models_file
from tests.fakes.graphs import PROBE_LOG_ENV
from tests.fakes.openai_backend import RECEIVED

pytestmark = [pytest.mark.e2e, pytest.mark.llm]


@pytest.fixture(scope="module")
def agent_server(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, Path]]:
    tmp = tmp_path_factory.mktemp("agent")
    probe_log = tmp / "probe.log"
    probe_log.write_text("")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    registry = yaml.safe_load(models.read_text())
    registry["backends"]["fake-tools"] = {**registry["backends"]["fake-ok"], "model": "fake-tools",
                                          "capabilities": {"context_window": 4096, "tools": True}}
    registry["aliases"]["fake-tools"] = "fake-tools"
    models.write_text(yaml.safe_dump(registry))
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "agent": {"path": "graphs.agent:make_graph", "model": "chat-default", "tools": ["calculator", "current_time"]},
                "agent-fake": {"path": "tests.fakes.graphs:make_probe_agent", "model": "fake-tools",
                               "tools": ["probe", "tally", "sleepy", "boom", "calculator"]},
            },
            "tools": {"require_approval": ["probe"], "max_tool_calls": 8, "max_steps": 4},
        },
        env={PROBE_LOG_ENV: str(probe_log)},
    )
    try:
        yield handle, probe_log
    finally:
        stop_server(handle)


def _audit(server: ServerHandle, request_id: str) -> list[dict[str, Any]]:
    lines = (server.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "tool_call" and r.get("request_id") == request_id]


def _ask(server: ServerHandle, script: str, request_id: str) -> dict[str, Any]:
    body = {"model": "agent-fake", "messages": [{"role": "user", "content": f"SCRIPT:{script}"}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"x-request-id": request_id}, timeout=60)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize(
    ("script", "decision", "reason", "ran"),
    [
        ("disallowed", "refused", "tool 'http_get' is not allowed here; the tools you can call are: boom, calculator", ""),
        ("unknown", "refused", "unknown tool 'rm_rf'", ""),
        ("malformed", "refused", "could not be parsed", ""),
        ("invalid-args", "refused", "invalid arguments for 'probe'", ""),
        ("probe", "refused", "'probe' needs a person's approval, which this run cannot ask for", ""),
        ("sleepy", "timed_out", "no result within 0.5s", ""),
        ("boom", "failed", "RuntimeError: the tool broke", "boom ran\n"),
        ("calc", "executed", "", ""),
    ],
)
def test_forged_calls_get_the_right_decision_and_the_run_answers(
    agent_server: tuple[ServerHandle, Path], script: str, decision: str, reason: str, ran: str
) -> None:
    server, probe_log = agent_server
    before = probe_log.read_text()
    answer = _ask(server, script, f"forge-{script}")
    assert answer["choices"][0]["message"]["content"] == "Hello from the fake"  # the run ended with an answer
    [record] = _audit(server, f"forge-{script}")
    assert (record["decision"], record["graph"]) == (decision, "agent-fake")
    assert reason in record["reason"] and len(record["args_hash"]) == 32
    assert probe_log.read_text() == before + ran  # what was refused never ran
    [result] = answer["tool_results"]
    assert result["status"] == ("success" if decision == "executed" else "error")
    if script == "calc":
        assert result["content"] == "42"


def test_a_loop_of_calls_stops_at_the_budget(agent_server: tuple[ServerHandle, Path]) -> None:
    server, probe_log = agent_server
    before = probe_log.read_text().count("tally")
    answer = _ask(server, "loop", "loop-1")
    records = _audit(server, "loop-1")
    executed = [r for r in records if r["decision"] == "executed"]
    assert len(executed) == 8 and probe_log.read_text().count("tally") - before == 8
    assert all("budget of 8 tool calls" in r["reason"] for r in records if r["decision"] == "refused")
    assert len(records) == 52  # 13 a turn, 4 turns
    assert "budget of 4 model turns" in answer["choices"][0]["message"]["content"]


async def test_a_client_cannot_reset_the_budget_through_the_run_input(agent_server: tuple[ServerHandle, Path]) -> None:
    """Issue 10: ``input: {"steps": -1000, "tool_calls": -1000}`` with a high
    recursion limit executed 390 tool calls against a budget of 40. The server counts
    a run's turns and calls; state a client writes is not read."""
    server, probe_log = agent_server
    before = probe_log.read_text().count("tally")
    client = get_client(url=server.url, api_key=None)
    try:
        thread = (await client.threads.create())["thread_id"]
        forged = {"messages": [{"role": "user", "content": "SCRIPT:loop"}], "steps": -1000, "tool_calls": -1000}
        await client.runs.wait(thread, "agent-fake", input=forged, config={"recursion_limit": 60})
        executed = probe_log.read_text().count("tally") - before
        assert executed == 8  # max_tool_calls, not 8 + 1000
        state = await client.threads.get_state(thread)
        assert "budget of 4 model turns" in state["values"]["messages"][-1]["content"]
        assert "steps" not in state["values"] and "tool_calls" not in state["values"]
        # A second run on the same thread gets a budget of its own (per run, not per thread).
        await client.runs.wait(thread, "agent-fake", input={"messages": [{"role": "user", "content": "SCRIPT:loop"}]})
        assert probe_log.read_text().count("tally") - before == 16
        # A state write through command.update starts a run with its own budget too.
        await client.runs.wait(thread, "agent-fake", command={"update": {
                               "messages": [{"role": "user", "content": "SCRIPT:loop"}]}, "goto": "model"})
        assert probe_log.read_text().count("tally") - before == 24
    finally:
        await client.http.client.aclose()


def test_the_stream_shows_calls_and_results(agent_server: tuple[ServerHandle, Path]) -> None:
    server, _ = agent_server
    body = {"model": "agent-fake", "stream": True, "messages": [{"role": "user", "content": "SCRIPT:calc"}]}
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    calls = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "calculator"
    arguments = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "") for c in calls)
    assert json.loads(arguments) == {"expression": "6 * 7"}
    [results] = [c["tool_results"] for c in chunks if "tool_results" in c]
    assert results[0]["content"] == "42"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello from the fake" and chunks[-1]["choices"][0]["finish_reason"] == "stop"


PROBE_INPUT = {"messages": [{"role": "user", "content": "SCRIPT:probe"}]}


def _counts(probe_log: Path) -> dict[str, int]:
    text = probe_log.read_text()
    return {line: text.count(line) for line in ("probe hello", "probe edited", "tally")}


async def test_an_approval_is_a_human_interrupt_in_the_stream_and_the_state(agent_server: tuple[ServerHandle, Path]) -> None:
    """Issue 12: Agent Chat UI and Agent Inbox show their buttons for a ``HumanInterrupt``
    and resume with a list of ``HumanResponse``."""
    server, probe_log = agent_server
    client = get_client(url=server.url, api_key=None)
    try:
        before = _counts(probe_log)
        thread = (await client.threads.create())["thread_id"]
        parts = [p async for p in client.runs.stream(thread, "agent-fake", input=PROBE_INPUT, stream_mode=["updates", "values"])]
        pending = next(p.data["__interrupt__"] for p in parts if p.event == "updates" and "__interrupt__" in p.data)
        [interrupt] = pending
        value = interrupt["value"]
        assert value["action_request"] == {"action": "probe", "args": {"note": "hello"}}
        assert value["config"] == {"allow_accept": True, "allow_edit": True, "allow_respond": True, "allow_ignore": True}
        assert "Records a note." in value["description"] and value["tool_call_id"] in value["description"]
        assert value["action_requests"][0]["name"] == "probe" and value["review_configs"][0]["action_name"] == "probe"
        assert "type" not in value  # not the old {"type": "tool_approval"} shape
        assert [p for p in parts if p.event == "values"][-1].data["__interrupt__"] == pending
        state = await client.threads.get_state(thread)
        assert state["interrupts"] == pending and state["tasks"][0]["interrupts"] == pending
        assert state["next"] == ["tools"]
        assert (await client.threads.get(thread))["status"] == "interrupted"
        assert _counts(probe_log) == before  # nothing runs before the answer

        done = await client.runs.wait(thread, "agent-fake", command=Command(resume=[{"type": "accept", "args": None}]))
        assert done["messages"][-1]["content"] == "Hello from the fake"
        tool_message = [m for m in done["messages"] if m["type"] == "tool"][-1]
        assert tool_message["content"] == "probe saw 'hello'"
        assert tool_message["tool_call_id"] == value["tool_call_id"]
        assert _counts(probe_log) == {**before, "probe hello": before["probe hello"] + 1}
        assert (await client.threads.get(thread))["status"] == "idle"
        with pytest.raises((ConflictError, httpx.HTTPStatusError)) as again:  # the interrupt was answered already
            await client.runs.wait(thread, "agent-fake", command=Command(resume=[{"type": "accept", "args": None}]))
        assert "409" in str(again.value) or isinstance(again.value, ConflictError)
        assert _counts(probe_log)["probe hello"] == before["probe hello"] + 1
    finally:
        await client.http.client.aclose()


@pytest.mark.parametrize(
    ("answer", "ran", "told"),
    [
        ([{"type": "accept", "args": None}], "probe hello", "probe saw 'hello'"),
        ({"type": "accept", "args": None}, "probe hello", "probe saw 'hello'"),
        ([{"type": "edit", "args": {"action": "probe", "args": {"note": "edited"}}}], "probe edited", "probe saw 'edited'"),
        ([{"type": "edit", "args": {"action": "tally", "args": {"note": "x"}}}], None, "asked for tool 'tally' instead of 'probe'"),
        ([{"type": "edit", "args": {"action": "probe", "args": {"note": 42}}}], None, "invalid arguments for 'probe'"),
        ([{"type": "response", "args": "use the calculator instead"}], None, "a person declined this call and said: use the calculator instead"),
        ([{"type": "ignore", "args": None}], None, "a person chose to skip this call"),
        ([{"type": "edit", "args": "note=edited"}], None, "was not understood"),
        ({"decisions": [{"type": "approve"}]}, "probe hello", "probe saw 'hello'"),
        ({"decisions": [{"type": "reject", "message": "not today"}]}, None, "said: not today"),
        ({"action": "approve"}, "probe hello", "probe saw 'hello'"),
        ({"action": "edit", "args": {"note": "edited"}}, "probe edited", "probe saw 'edited'"),
        ({"action": "reject", "reason": "not today"}, None, "a person rejected this call: not today"),
        ("approve", "probe hello", "probe saw 'hello'"),
        (False, None, "a person rejected this call"),
    ],
    ids=["accept", "accept-object", "edit", "edit-other-tool", "edit-bad-args", "response", "ignore", "malformed",
         "decisions-approve", "decisions-reject", "legacy-approve", "legacy-edit", "legacy-reject", "string", "false"],
)
async def test_every_answer_to_an_approval(
    agent_server: tuple[ServerHandle, Path], answer: Any, ran: str | None, told: str
) -> None:
    """Each answer runs the call once (as made, or with the edited arguments, checked
    like any others) or not at all, and the model's next turn sees what happened."""
    server, probe_log = agent_server
    client = get_client(url=server.url, api_key=None)
    try:
        before = _counts(probe_log)
        thread = (await client.threads.create())["thread_id"]
        paused = await client.runs.wait(thread, "agent-fake", input=PROBE_INPUT)
        [pending] = paused["__interrupt__"]
        assert pending["value"]["action_request"]["action"] == "probe"
        received = len(RECEIVED)
        done = await client.runs.wait(thread, "agent-fake", command=Command(resume=answer))
        assert done["messages"][-1]["content"] == "Hello from the fake"
        expected = dict(before)
        if ran is not None:
            expected[ran] += 1
        assert _counts(probe_log) == expected  # ran once, or not at all; never another tool
        tool_message = [m for m in done["messages"] if m["type"] == "tool"][-1]
        assert told in tool_message["content"]
        assert tool_message["status"] == ("success" if ran else "error")
        # The model's next turn got the tool message.
        [turn] = [b for b in RECEIVED[received:] if b.get("model") == "fake-tools"]
        messages: list[dict[str, Any]] = turn["messages"]  # type: ignore[assignment]
        assert told in messages[-1]["content"] and messages[-1]["role"] == "tool"
    finally:
        await client.http.client.aclose()


async def test_the_real_model_runs_the_agent_on_both_apis(agent_server: tuple[ServerHandle, Path]) -> None:
    server, _ = agent_server
    question = [{"role": "user", "content": "What is 12 * 12? Use the calculator."}]
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                        json={"model": "agent", "messages": question, "max_tokens": 64, "temperature": 0}).json()
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert answer["choices"][0]["message"]["content"]
    for result in answer.get("tool_results", []):  # SmolLM2 may or may not call a tool
        assert result["status"] in ("success", "error")
    client = get_client(url=server.url, api_key=None)
    try:
        thread = (await client.threads.create())["thread_id"]
        state = await client.runs.wait(thread, "agent", input={"messages": question}, context={"model_params": {"max_tokens": 64, "temperature": 0}})
        assert state["messages"][-1]["type"] == "ai" and "steps" not in state
    finally:
        await client.http.client.aclose()


def test_the_cli_asks_for_approval(agent_server: tuple[ServerHandle, Path]) -> None:
    """``switchyard ask`` pauses on an approval, shows the ``HumanInterrupt`` and answers
    with a ``HumanResponse`` read at the terminal (here, piped); it runs beside the
    server that holds the data directory's stores."""
    import os
    import subprocess

    from tests.conftest import REPO, SWITCHYARD

    server, probe_log = agent_server
    env = {**os.environ, PROBE_LOG_ENV: str(probe_log)}
    for answer, ran in (("a\n", "probe hello"), ("r\nnot now\n", None), ("i\n", None),
                        ('e\n{"note": "edited"}\n', "probe edited")):
        before = _counts(probe_log)
        done = subprocess.run(
            [str(SWITCHYARD), "--config", str(server.config), "ask", "agent-fake", "SCRIPT:probe"],
            input=answer, capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        assert 'The model wants to call probe({"note": "hello"})' in done.stderr
        assert "[a]ccept, [e]dit the arguments, [r]espond instead, [i]gnore?" in done.stderr
        assert "Hello from the fake" in done.stdout
        expected = dict(before)
        if ran is not None:
            expected[ran] += 1
        assert _counts(probe_log) == expected
        if answer.startswith("r"):
            assert "a person declined this call and said: not now" in done.stderr  # the tool result line
