"""The output check on both protocols: redaction (global list) and blocking (a
tenant's list) of answers, streamed and whole, graphs and aliases, in the thread's
state as well as on the wire; then a real-model stream under a pattern.

The FAKE backend (tests/fakes) answers "Hello from the fake" on demand, in four
tokens: the terms below are split across them as a real model's would be."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from gateway import Backend
from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.promql import sample

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, local_backend: Backend, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("output-check")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat-fake": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
        "guardrails": {"output_redact_terms": ["FAKE"]},
        "auth": {"tenants": {"acme": {"output_block_terms": ["from the"]}, "globex": {}}},
    }
    (tmp / "switchyard.yaml").write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {t: create_key(tmp / "switchyard.yaml", t) for t in ("acme", "globex")}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, {t: f"Bearer {k}" for t, k in keys.items()}
    finally:
        stop_server(handle)


def _openai_stream(server: ServerHandle, key: str, model: str) -> tuple[list[str], str | None]:
    body = {"model": model, "messages": HI, "stream": True}
    pieces, finish = [], None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers={"Authorization": key}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                pieces.append(choice["delta"].get("content") or "")
                finish = choice.get("finish_reason") or finish
    return pieces, finish


@pytest.mark.parametrize("model", ["chat-fake", "fake-ok"])
def test_redaction_streamed_and_whole(guarded: tuple[ServerHandle, dict[str, str]], model: str) -> None:
    server, keys = guarded
    pieces, finish = _openai_stream(server, keys["globex"], model)
    assert "".join(pieces) == "Hello from the [redacted]"
    assert finish == "stop"
    assert not any("fake" in p.lower() for p in pieces)
    whole = httpx.post(server.url + "/v1/chat/completions", json={"model": model, "messages": HI},
                       headers={"Authorization": keys["globex"]}, timeout=30).json()
    assert whole["choices"][0]["message"]["content"] == "Hello from the [redacted]"


@pytest.mark.parametrize("model", ["chat-fake", "fake-ok"])
def test_a_tenants_blocked_term_stops_the_answer(guarded: tuple[ServerHandle, dict[str, str]], model: str) -> None:
    server, keys = guarded
    pieces, finish = _openai_stream(server, keys["acme"], model)
    assert finish == "content_filter"
    sent = "".join(pieces)
    assert "from" not in sent and "the" not in sent  # held back, never sent
    whole = httpx.post(server.url + "/v1/chat/completions", json={"model": model, "messages": HI},
                       headers={"Authorization": keys["acme"]}, timeout=30).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert "from the" not in choice["message"]["content"] and "withheld" in choice["message"]["content"]


def test_blocks_are_audited_and_counted(guarded: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = guarded
    text = httpx.get(server.url + "/metrics", headers={"Authorization": keys["globex"]}).text
    for kind in ("graph", "alias"):  # the tests above: two answers of each, streamed and whole
        assert sample(text, "switchyard_output_checks_total", kind=kind, action="blocked") == 2
        assert sample(text, "switchyard_output_checks_total", kind=kind, action="redacted") == 2
    audit = (server.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in audit]
    assert any(r["type"] == "output_blocked" and r["tenant"] == "acme" and r["term"] == "from the" for r in records)


def _contents(data: Any) -> Iterator[str]:
    """Every message ``content`` string in an event's data."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "content" and isinstance(value, str):
                yield value
            else:
                yield from _contents(value)
    elif isinstance(data, list):
        for item in data:
            yield from _contents(item)


def _langgraph_run(server: ServerHandle, key: str) -> tuple[str, list[tuple[str, Any]]]:
    headers = {"Authorization": key}
    thread = httpx.post(server.url + "/threads", json={}, headers=headers).json()["thread_id"]
    body = {"assistant_id": "chat-fake", "input": {"messages": HI}, "stream_mode": ["messages-tuple", "values", "updates"]}
    events, current = [], None
    with httpx.stream("POST", server.url + f"/threads/{thread}/runs/stream", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                current = line[7:]
            elif line.startswith("data: "):
                events.append((current, json.loads(line[6:])))
    return thread, events


def test_the_langgraph_api_streams_and_stores_only_checked_text(guarded: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = guarded
    thread, events = _langgraph_run(server, keys["globex"])
    streamed = "".join(data[0]["content"] for name, data in events if name == "messages")
    assert streamed == "Hello from the [redacted]"
    contents = list(_contents([data for name, data in events if name in ("values", "updates")]))
    assert "Hello from the [redacted]" in contents  # the model node's update and the values
    assert not [c for c in contents if "fake" in c.lower()]
    state = httpx.get(server.url + f"/threads/{thread}/state", headers={"Authorization": keys["globex"]}).json()
    assert state["values"]["messages"][-1]["content"] == "Hello from the [redacted]"


def test_the_langgraph_api_ends_a_blocked_run_with_an_error_event(guarded: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = guarded
    thread, events = _langgraph_run(server, keys["acme"])
    assert events[-1][0] == "error" and events[-1][1]["error"] == "OutputBlocked"
    assert "from the" not in json.dumps(events)
    headers = {"Authorization": keys["acme"]}
    assert httpx.get(server.url + f"/threads/{thread}", headers=headers).json()["status"] == "idle"
    state = httpx.get(server.url + f"/threads/{thread}/state", headers=headers).json()
    assert all(m["type"] != "ai" for m in state["values"].get("messages", []))


def test_a_real_model_stream_under_a_pattern(tmp_path_factory: pytest.TempPathFactory, local_backend: Backend,
                                             fake_backend_url: str) -> None:
    """Every run of letters is redacted as SmolLM2's tokens arrive, however its
    tokenizer splits words."""
    tmp = tmp_path_factory.mktemp("output-pattern")
    models = write_models_file(tmp / "models.yaml", local_backend, fake_backend_url)
    handle = start_server(tmp, {"gateway": {"models_file": str(models)},
                                "guardrails": {"output_redact_patterns": ["[A-Za-z]+"], "output_pattern_max_chars": 24}})
    try:
        body = {"model": "chat", "messages": [{"role": "user", "content": "Name three colours."}], "stream": True,
                "max_tokens": 40, "temperature": 0}
        text = ""
        with httpx.stream("POST", handle.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        text += choice["delta"].get("content") or ""
        assert "[redacted]" in text
        assert not re.search("[A-Za-z]", text.replace("[redacted]", ""))
    finally:
        stop_server(handle)
