"""The output policy on every path a text leaves by, not only the answer (issue 11,
finding 6): citations (OpenAI, streamed and whole; LangGraph events and final values),
tool-call arguments and tool results, and a thread's state read back (``/state``,
``/history``, ``/threads/{id}``, ``/threads/search``, ``runs/wait``, ``runs/join``).
A blocked term holds on those paths too.

The ``rag`` graph answers with the FAKE backend (tests/fakes: "Hello from the fake",
whatever the sources say), so the address below can only leave through the
citations and the state. The ``agent-fake`` graph gets a forged ``probe`` call with
``{"note": "hello"}`` from the same backend; its tool result echoes the note. The
embedder and Qdrant (local mode) are the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.graphs import PROBE_LOG_ENV

pytestmark = [pytest.mark.e2e]

EMAIL = "ada.quill@verrin-harbor.example"
DOCUMENT = (
    f"Ada Quill is the harbor master of Verrin Harbor. Berth bookings at Verrin Harbor go to her "
    f"by e-mail at {EMAIL}, at least two days ahead."
)
QUESTION = "Who is the harbor master of Verrin Harbor, and how are berths booked there?"
EMAIL_PATTERN = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    """Global policy: e-mail addresses and the word "hello" are redacted. Tenant
    ``acme`` also blocks "Quill" (in the document only, never in an answer)."""
    tmp = tmp_path_factory.mktemp("redaction")
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
            "rag": {"path": "graphs.rag:make_graph", "model": "fake-ok"},
            "agent-fake": {"path": "tests.fakes.graphs:make_probe_agent", "model": "fake-tools", "tools": ["probe"]},
        },
        "knowledge": {"default_collection": "harbor"},
        "guardrails": {"output_redact_patterns": [EMAIL_PATTERN], "output_redact_terms": ["hello"]},
        "auth": {"tenants": {"acme": {"output_block_terms": ["Quill"]}, "globex": {}}},
    }
    (tmp / "switchyard.yaml").write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {t: f"Bearer {create_key(tmp / 'switchyard.yaml', t)}" for t in ("acme", "globex")}
    handle = start_server(tmp, settings, dev=False, env={PROBE_LOG_ENV: str(probe_log)})
    try:
        upload = {"documents": [{"id": "harbor-contacts", "text": DOCUMENT}]}
        added = httpx.post(handle.url + "/v1/collections/harbor/documents", json=upload,
                           headers={"Authorization": keys["globex"]}, timeout=120)
        assert added.status_code == 200 and added.json()["added"] == 1, added.text
        yield handle, keys
    finally:
        stop_server(handle)


def _leaks(text: str, *secrets: str) -> list[str]:
    return [s for s in secrets if s.lower() in text.lower()]


def _openai(server: ServerHandle, key: str, model: str, content: str, *, stream: bool) -> str:
    """The raw response body."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers={"Authorization": key}, timeout=60) as r:
        text = r.read().decode()
    assert r.status_code == 200, text
    return text


def _chunks(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def _langgraph_stream(server: ServerHandle, key: str, path: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    events, current = [], None
    with httpx.stream("POST", server.url + path, json=body, headers={"Authorization": key}, timeout=60) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    for line in raw.splitlines():
        if line.startswith("event: "):
            current = line[7:]
        elif line.startswith("data: "):
            events.append((current, json.loads(line[6:])))
    return raw, events


def _reads(server: ServerHandle, key: str, thread: str) -> dict[str, str]:
    """Every read-back of a thread's state, as the raw bodies."""
    headers = {"Authorization": key}
    url = server.url + f"/threads/{thread}"
    return {
        "state": httpx.get(url + "/state", headers=headers).text,
        "history": httpx.post(url + "/history", json={"limit": 10}, headers=headers).text,
        "thread": httpx.get(url, headers=headers).text,
        "search": httpx.post(server.url + "/threads/search", json={"limit": 100}, headers=headers).text,
    }


def _rag_input() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": QUESTION}]}


# ---- redaction: citations -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_citations_are_redacted(policy_server: tuple[ServerHandle, dict[str, str]], stream: bool) -> None:
    server, keys = policy_server
    raw = _openai(server, keys["globex"], "rag", QUESTION, stream=stream)
    assert not _leaks(raw, EMAIL), raw
    citations = ([c for chunk in _chunks(raw) for c in chunk.get("citations") or []] if stream
                 else json.loads(raw)["citations"])
    assert citations and citations[0]["doc_id"] == "harbor-contacts"
    assert "[redacted]" in citations[0]["text"] and "harbor master" in citations[0]["text"]


def test_langgraph_events_state_and_reads_are_redacted(policy_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = policy_server
    key = keys["globex"]
    thread = httpx.post(server.url + "/threads", json={}, headers={"Authorization": key}).json()["thread_id"]
    body = {"assistant_id": "rag", "input": _rag_input(), "stream_mode": ["values", "updates", "messages-tuple"]}
    raw, events = _langgraph_stream(server, key, f"/threads/{thread}/runs/stream", body)
    assert events[-1][0] != "error", events[-1]
    assert not _leaks(raw, EMAIL), raw
    final = [data for name, data in events if name == "values"][-1]
    assert "[redacted]" in final["sources"][0]["text"]
    for name, read in _reads(server, key, thread).items():
        assert not _leaks(read, EMAIL), f"{name}: {read}"
        assert "[redacted]" in read, name
    # The stored state is as the graph wrote it: what is redacted is what leaves.
    waited = httpx.post(server.url + f"/threads/{thread}/runs/wait", json={"assistant_id": "rag", "input": _rag_input()},
                        headers={"Authorization": key}, timeout=60)
    assert waited.status_code == 200 and not _leaks(waited.text, EMAIL)
    assert "[redacted]" in waited.json()["sources"][0]["text"]
    run = httpx.post(server.url + f"/threads/{thread}/runs", json={"assistant_id": "rag", "input": _rag_input()},
                     headers={"Authorization": key}).json()
    joined = httpx.get(server.url + f"/threads/{thread}/runs/{run['run_id']}/join", headers={"Authorization": key}, timeout=60)
    assert joined.status_code == 200 and not _leaks(joined.text, EMAIL) and "[redacted]" in joined.text


def test_stateless_wait_is_redacted(policy_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = policy_server
    waited = httpx.post(server.url + "/runs/wait", json={"assistant_id": "rag", "input": _rag_input()},
                        headers={"Authorization": keys["globex"]}, timeout=60)
    assert waited.status_code == 200 and not _leaks(waited.text, EMAIL)
    assert "[redacted]" in waited.json()["sources"][0]["text"]


# ---- redaction: tool-call arguments and tool results ----------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_arguments_and_results_are_redacted(policy_server: tuple[ServerHandle, dict[str, str]], stream: bool) -> None:
    server, keys = policy_server
    raw = _openai(server, keys["globex"], "agent-fake", "SCRIPT:probe", stream=stream)
    assert not _leaks(raw, "hello"), raw
    if stream:
        chunks = _chunks(raw)
        arguments = "".join(
            call["function"].get("arguments") or ""
            for chunk in chunks for choice in chunk["choices"] for call in choice["delta"].get("tool_calls") or []
        )
        results = [r for chunk in chunks for r in chunk.get("tool_results") or []]
    else:
        answer = json.loads(raw)
        arguments = "".join(c["function"]["arguments"] for c in answer["choices"][0]["message"].get("tool_calls") or [])
        results = answer["tool_results"]
    assert json.loads(arguments) == {"note": "[redacted]"}
    assert results and results[0]["content"] == "probe saw '[redacted]'"


@pytest.mark.parametrize("stream", [False, True])
def test_relayed_tool_arguments_are_redacted(policy_server: tuple[ServerHandle, dict[str, str]], stream: bool) -> None:
    """A model alias's own tool calls, relayed as the backend sent them."""
    server, keys = policy_server
    raw = _openai(server, keys["globex"], "fake-tools", "SCRIPT:probe", stream=stream)
    assert not _leaks(raw, "hello"), raw
    if stream:
        calls = [call for chunk in _chunks(raw) for choice in chunk["choices"] for call in choice["delta"].get("tool_calls") or []]
        assert calls[0]["function"]["name"] == "probe" and calls[0]["id"]
        arguments = "".join(call["function"].get("arguments") or "" for call in calls)
    else:
        arguments = json.loads(raw)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"note": "[redacted]"}


def test_langgraph_tool_arguments_and_results_are_redacted(policy_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = policy_server
    key = keys["globex"]
    thread = httpx.post(server.url + "/threads", json={}, headers={"Authorization": key}).json()["thread_id"]
    body = {"assistant_id": "agent-fake", "input": {"messages": [{"role": "user", "content": "SCRIPT:probe"}]},
            "stream_mode": ["messages-tuple", "values", "updates"]}
    raw, events = _langgraph_stream(server, key, f"/threads/{thread}/runs/stream", body)
    assert events[-1][0] != "error", events[-1]
    assert not _leaks(raw, "hello"), raw
    tool = next(m for name, data in events if name == "values" for m in data["messages"] if m["type"] == "tool")
    assert tool["content"] == "probe saw '[redacted]'"
    call = next(m for m in events[-1][1]["messages"] if m["type"] == "ai" and m["tool_calls"])
    assert call["tool_calls"][0]["args"] == {"note": "[redacted]"}
    for name, read in _reads(server, key, thread).items():
        assert not _leaks(read, "hello"), f"{name}: {read}"


# ---- blocking on the same paths -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_blocked_term_in_a_citation_stops_the_openai_answer(policy_server: tuple[ServerHandle, dict[str, str]],
                                                              stream: bool) -> None:
    server, keys = policy_server
    raw = _openai(server, keys["acme"], "rag", QUESTION, stream=stream)
    assert not _leaks(raw, "Quill", EMAIL), raw
    if stream:
        assert _chunks(raw)[-1]["choices"][0]["finish_reason"] == "content_filter"
    else:
        answer = json.loads(raw)
        assert answer["choices"][0]["finish_reason"] == "content_filter" and not answer.get("citations")


def test_a_blocked_term_holds_on_langgraph_events_and_reads(policy_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = policy_server
    key = keys["acme"]
    thread = httpx.post(server.url + "/threads", json={}, headers={"Authorization": key}).json()["thread_id"]
    # Only the answer's tokens are streamed: the run completes, and its state holds
    # the document (retrieved chunks, sources)...
    tokens = {"assistant_id": "rag", "input": _rag_input(), "stream_mode": ["messages-tuple"]}
    raw, events = _langgraph_stream(server, key, f"/threads/{thread}/runs/stream", tokens)
    assert events[-1][0] != "error", events[-1]
    assert not _leaks(raw, "Quill", EMAIL), raw
    # ...which every read shows withheld (a read has no run to stop).
    for name, read in _reads(server, key, thread).items():
        assert not _leaks(read, "Quill", EMAIL), f"{name}: {read}"
        assert "withheld by the output check" in read, name
    # A stream of the state stops the run, as a blocked answer does.
    body = {"assistant_id": "rag", "input": _rag_input(), "stream_mode": ["values", "updates"]}
    raw, events = _langgraph_stream(server, key, f"/threads/{thread}/runs/stream", body)
    assert events[-1][0] == "error" and events[-1][1]["error"] == "OutputBlocked"
    assert not _leaks(raw, "Quill", EMAIL), raw
    waited = httpx.post(server.url + f"/threads/{thread}/runs/wait", headers={"Authorization": key}, timeout=60,
                        json={"assistant_id": "rag", "input": _rag_input()})
    assert waited.status_code == 200 and waited.json()["__error__"]["error"] == "OutputBlocked"
    assert not _leaks(waited.text, "Quill", EMAIL)
