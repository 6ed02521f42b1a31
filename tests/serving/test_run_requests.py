"""Malformed and hostile run requests (issue 10, items 3, 5 and 6): each gets a clear
4xx naming what is wrong, before anything is taken, and leaves the server as it was:
no run slot leaked, no thread left busy, nothing sent to the model.

The graphs run on the FAKE scripted backend (tests/fakes), which records every
request it receives, so a test can prove a refused run never reached it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from urllib.parse import quote

import httpx
import pytest

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file
from tests.fakes.openai_backend import RECEIVED

pytestmark = [pytest.mark.e2e]

HI = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("run-requests")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {
                "chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"},
                "chat-small": {"path": "graphs.chat:make_graph", "model": "fake-plain"},  # 1024-token window
            },
            "guardrails": {"blocked_terms": ["forbidden"]},
            "server": {"max_concurrent_runs": 2, "history_max_bytes": 4096},
        },
    )
    try:
        yield handle
    finally:
        stop_server(handle)


@pytest.fixture
def http(guarded_server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded_server.url, timeout=30) as client:
        yield client


def _thread(http: httpx.Client) -> str:
    return str(http.post("/threads", json={}).json()["thread_id"])


def _served(http: httpx.Client, thread: str | None = None) -> None:
    """A good run on each API (and on ``thread``) is served: nothing was leaked."""
    path = f"/threads/{thread}/runs/wait" if thread else "/runs/wait"
    answer = http.post(path, json={"assistant_id": "chat", "input": HI})
    assert answer.status_code == 200, answer.text
    assert answer.json()["messages"][-1]["content"] == "Hello from the fake"
    chat = http.post("/v1/chat/completions", json={"model": "chat", "messages": HI["messages"]})
    assert chat.status_code == 200, chat.text


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("command", {"command": {"bogus": 1}}, "command.bogus"),
    ("configurable", {"config": {"configurable": "x"}}, "config.configurable"),
    ("config-metadata", {"config": {"metadata": [1]}}, "config.metadata"),
    ("messages-number", {"input": {"messages": 5}}, "input.messages"),
    ("message-object", {"input": {"messages": [{"role": "user"}]}}, "input.messages.0"),
    ("huge-int", {"metadata": {"n": 2**70}}, "metadata.n"),
    ("recursion", {"config": {"recursion_limit": -1}}, "config.recursion_limit"),
    ("goto", {"command": {"goto": "nowhere"}}, "command.goto"),
    ("model-override", {"context": {"model_params": {"model": "other-model"}}}, "model_params.model"),
    ("sampling", {"context": {"model_params": {"temperature": "hot"}}}, "model_params.temperature"),
    ("unknown-param", {"context": {"model_params": {"logit_bias": {}}}}, "model_params.logit_bias"),
]


@pytest.mark.parametrize(("name", "extra", "named"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_run_is_a_4xx_and_leaks_nothing(http: httpx.Client, name: str, extra: dict[str, Any], named: str) -> None:
    thread = _thread(http)
    before = len(RECEIVED)
    for _ in range(4):  # twice the server's run slots
        for path in ("/runs/wait", f"/threads/{thread}/runs/wait", f"/threads/{thread}/runs/stream", f"/threads/{thread}/runs"):
            response = http.post(path, json={"assistant_id": "chat", "input": HI, **extra})
            assert response.status_code in (400, 422), (path, response.status_code, response.text)
            assert named in response.json()["detail"], response.text
    assert len(RECEIVED) == before  # nothing reached the model
    assert http.get(f"/threads/{thread}").json()["status"] == "idle"
    _served(http, thread)


def test_max_tokens_past_the_context_window_is_refused_on_the_langgraph_api(http: httpx.Client) -> None:
    before = len(RECEIVED)
    for body in (
        {"assistant_id": "chat-small", "input": HI, "context": {"model_params": {"max_tokens": 3000}}},
        {"assistant_id": "chat-small", "input": HI, "context": {"model_params": {"max_completion_tokens": 3000}}},
    ):
        response = http.post("/runs/wait", json=body)
        assert response.status_code == 400, response.text
        assert "exceeds the context window" in response.json()["detail"]
    openai = http.post("/v1/chat/completions", json={"model": "chat-small", "messages": HI["messages"], "max_tokens": 3000})
    assert openai.status_code == 400  # the same check on both APIs
    assert len(RECEIVED) == before
    ok = http.post("/runs/wait", json={"assistant_id": "chat", "input": HI, "context": {"model_params": {"max_tokens": 7}}})
    assert ok.status_code == 200
    sent = RECEIVED[-1]
    assert sent["model"] == "fake-ok" and 7 in (sent.get("max_tokens"), sent.get("max_completion_tokens")), sent


BLOCKED_FORMS: list[tuple[str, dict[str, Any]]] = [
    ("dict", {"input": {"messages": [{"role": "user", "content": "a forbidden word"}]}}),
    ("pair", {"input": {"messages": [["user", "a forbidden word"]]}}),
    ("string", {"input": {"messages": ["a forbidden word"]}}),
    ("single", {"input": {"messages": "a forbidden word"}}),
    ("parts", {"input": {"messages": [{"role": "user", "content": [{"type": "text", "text": "forbidden"}]}]}}),
    ("langchain", {"input": {"messages": [{"type": "human", "content": "Forbidden!"}]}}),
    ("update", {"command": {"update": {"messages": [["user", "a forbidden word"]]}}}),
    ("update-pairs", {"command": {"update": [["messages", ["a forbidden word"]]]}}),
]


@pytest.mark.parametrize(("form", "body"), BLOCKED_FORMS, ids=[f[0] for f in BLOCKED_FORMS])
def test_the_input_filter_reads_every_message_form(http: httpx.Client, form: str, body: dict[str, Any]) -> None:
    thread = _thread(http)
    before = len(RECEIVED)
    response = http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", **body})
    assert response.status_code == 400, response.text
    assert "blocked term" in response.json()["detail"]
    assert len(RECEIVED) == before
    state = http.get(f"/threads/{thread}/state").json()
    assert "forbidden" not in json.dumps(state).lower()  # nor did it reach the thread's state


@pytest.mark.parametrize("thread_id", ["é-thread", "a\r\nb", "a\x00b", "a/b", "x" * 200, " lead"])
def test_thread_ids_that_cannot_go_into_a_header_are_refused(http: httpx.Client, thread_id: str) -> None:
    response = http.post("/threads", json={"thread_id": thread_id})
    assert response.status_code == 422, response.text
    quoted = quote(thread_id, safe="")
    for method, path in (("POST", f"/threads/{quoted}/runs/wait"), ("GET", f"/threads/{quoted}")):
        answer = http.request(method, path, json={"assistant_id": "chat", "input": HI, "if_not_exists": "create"})
        assert answer.status_code in (404, 422), (path, answer.status_code)


def test_a_created_thread_id_round_trips_in_content_location(http: httpx.Client) -> None:
    thread = http.post("/threads", json={"thread_id": "user:42@team.example~a+b=c"}).json()["thread_id"]
    response = http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", "input": HI})
    assert response.status_code == 200
    assert response.headers["content-location"].startswith("/threads/user%3A42%40team.example~a%2Bb%3Dc/runs/")


@pytest.mark.parametrize("last_event_id", ["-3", "-100000", "1e3", "x", "99999999999999999999999"])
def test_a_bad_last_event_id_is_400(http: httpx.Client, last_event_id: str) -> None:
    thread = _thread(http)
    run = http.post(f"/threads/{thread}/runs", json={"assistant_id": "chat", "input": HI}).json()
    http.get(f"/threads/{thread}/runs/{run['run_id']}/join")
    response = http.get(f"/threads/{thread}/runs/{run['run_id']}/stream", headers={"Last-Event-ID": last_event_id})
    assert response.status_code == 400, response.text


def test_resuming_a_stream_replays_only_what_follows(http: httpx.Client) -> None:
    thread = _thread(http)
    run = http.post(f"/threads/{thread}/runs", json={"assistant_id": "chat", "input": HI, "stream_mode": "messages-tuple"}).json()
    http.get(f"/threads/{thread}/runs/{run['run_id']}/join")
    def ids(headers: dict[str, str]) -> list[int]:
        text = http.get(f"/threads/{thread}/runs/{run['run_id']}/stream", headers=headers).text
        return [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    every = ids({})
    assert every == list(range(len(every))) and len(every) > 3
    assert ids({"Last-Event-ID": "2"}) == every[3:]
    assert ids({"Last-Event-ID": str(len(every) + 5)}) == []


def test_thread_search_bounds_and_odd_metadata_keys(http: httpx.Client) -> None:
    assert http.post("/threads/search", json={"offset": 1e30}).status_code == 422
    assert http.post("/threads/search", json={"limit": 10, "offset": 2**40}).status_code == 422
    odd = {'a"b': 1, "$.c": "d", "": "empty", "é": [1, {"x": None}]}
    created = http.post("/threads", json={"metadata": odd})
    assert created.status_code == 200, created.text
    for key, value in odd.items():
        found = http.post("/threads/search", json={"metadata": {key: value}})
        assert found.status_code == 200, found.text
        assert created.json()["thread_id"] in [t["thread_id"] for t in found.json()]
    assert http.post("/threads", json={"metadata": {"n": 2**64}}).status_code == 422


def test_lone_surrogates_are_refused_on_both_apis(http: httpx.Client) -> None:
    before = len(RECEIVED)
    raw = b'{"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "bad \\ud800 text"}]}}'
    response = http.post("/runs/wait", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "surrogate" in response.text
    raw = b'{"model": "chat", "messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
    response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "surrogate" in response.text
    assert len(RECEIVED) == before


def test_history_is_paged_by_size_too(http: httpx.Client) -> None:
    thread = _thread(http)
    for _ in range(6):
        assert http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", "input": HI}).status_code == 200
    states: list[dict[str, Any]] = []
    before: str | None = None
    for _ in range(50):
        page = http.post(f"/threads/{thread}/history", json={"limit": 1000, **({"before": before} if before else {})}).json()
        if not page:
            break
        assert len(page) == 1 or sum(len(json.dumps(s)) for s in page[:-1]) <= 4096
        states += page
        before = page[-1]["checkpoint"]["checkpoint_id"]
    ids = [s["checkpoint"]["checkpoint_id"] for s in states]
    assert len(ids) == len(set(ids)) and len(ids) >= 6 * 3  # every state, once, newest first


def test_values_no_store_can_keep_are_refused(http: httpx.Client) -> None:
    for raw in (
        b'{"metadata": {"x": NaN}}',
        b'{"metadata": {"x": "a\\u0000b"}}',
        b'{"metadata": {"a\\u0000": 1}}',
        b'{"metadata": {"graph_id": 5}}',
    ):
        response = http.post("/threads", content=raw, headers={"content-type": "application/json"})
        assert response.status_code in (200, 422), (raw, response.text)
        assert response.status_code == 422 or b"graph_id" in raw
    thread = _thread(http)
    raw = b'{"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "nul \\u0000 here"}]}}'
    response = http.post(f"/threads/{thread}/runs/wait", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "NUL" in response.text
    _served(http, thread)


@pytest.mark.parametrize("extra", [{"on_disconnect": "continue"}, {"stream_resumable": True}, {"on_completion": "keep", "on_disconnect": "continue"}])
def test_a_stateless_stream_that_runs_on_in_the_background_ends(http: httpx.Client, extra: dict[str, Any]) -> None:
    """Schemathesis found it: the stateless run's record was never finished, so its
    followed stream sent keep-alives forever."""
    with http.stream("POST", "/runs/stream", json={"assistant_id": "chat", "input": HI, **extra}, timeout=10) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert events[0] == "event: metadata" and "event: values" in events
    assert "event: error" not in events
