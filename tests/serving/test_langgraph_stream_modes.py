"""The ``messages`` and ``events`` stream modes and the run options ``interrupt_before``
/ ``interrupt_after`` (issue 12, finding 3), through the official ``langgraph-sdk``
client against real servers: LangGraph Server's legacy ``messages`` events
(``messages/metadata``, ``messages/partial``, ``messages/complete``), ``astream_events``
v2 events named ``events``, both under the output policy (redacted, blocked) like every
other mode; a joined stream filtered exactly on them; breakpoints by node name or
``*`` (an unknown node a 422 naming it); ``webhook``, ``after_seconds`` and
``feedback_keys`` refused (400) while other unknown fields stay ignored.

The FAKE backend (tests/fakes) answers "Hello from the fake" in four tokens, so the
policy's terms are split across chunks as a real model's would be; the real local
model streams one run with every mode at once (``llm``). The conversion helpers are
also tested alone (no services).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import yaml
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import UnprocessableEntityError

from graphs import OutputPolicy
from serving.errors import ServingError
from serving.guardrails import OutputGuard
from serving.langgraph_api.modes import GuardStreams, MessagesMode, _part, breakpoints, graph_parts
from serving.langgraph_api.service import _checked_message, join_events
from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.nested_graphs import make_nested_graph

HI = {"messages": [{"role": "user", "content": "Hi"}]}
ANSWER = "Hello from the [redacted]"
CONTROL = {"metadata", "error", "end"}


# ---- the conversions alone ------------------------------------------------------------------


def test_messages_mode_accumulates_a_streamed_message_and_completes_it_at_its_last_chunk() -> None:
    mode = MessagesMode()
    meta = {"langgraph_node": "call_model"}
    first = mode.add(AIMessageChunk("Hel", id="m1"), meta)
    assert [name for name, _ in first] == ["messages/metadata", "messages/partial"]
    assert first[0][1] == {"m1": {"metadata": meta}}
    assert first[1][1] == [AIMessage("Hel", id="m1")]
    second = mode.add(AIMessageChunk("lo", id="m1"), meta)
    assert second == [("messages/partial", [AIMessage("Hello", id="m1")])]
    last = mode.add(AIMessageChunk("", id="m1", chunk_position="last"), meta)
    assert [name for name, _ in last] == ["messages/partial", "messages/complete"]
    assert last[1][1] == [AIMessage("Hello", id="m1")] and isinstance(last[1][1][0], AIMessage)
    # A whole message (a node's result, a tool's): its metadata, then complete.
    whole = mode.add(ToolMessage("42", tool_call_id="c1", id="t1"), meta)
    assert [name for name, _ in whole] == ["messages/metadata", "messages/complete"]
    # Ended messages are not kept.
    assert mode._open == {}


def test_messages_mode_applies_the_check_to_what_it_sends() -> None:
    mode = MessagesMode()
    seen: list[str] = []

    def check(message: Any) -> Any:
        seen.append(message.content)
        return message.model_copy(update={"content": message.content.upper()})

    events = mode.add(AIMessageChunk("hi", id="m", chunk_position="last"), {}, check)
    assert [(name, data[0].content) for name, data in events[1:]] == [("messages/partial", "HI"), ("messages/complete", "HI")]
    assert seen == ["hi"]


def test_v1_chunks_become_v2_parts() -> None:
    interrupted = {"messages": [], "__interrupt__": ("question",)}
    part = _part(("values", interrupted), subgraphs=False)
    assert part == {"type": "values", "ns": (), "data": {"messages": []}, "interrupts": ("question",)}
    assert "__interrupt__" in interrupted  # the graph's own value is left alone
    assert _part((("inner:1",), "updates", {"n": 1}), subgraphs=True) == {"type": "updates", "ns": ("inner:1",), "data": {"n": 1}}
    assert _part(("values", {"a": 1}), subgraphs=False)["interrupts"] == ()


def test_breakpoints_are_node_names_or_star() -> None:
    graph = make_nested_graph(None).compile()  # type: ignore[arg-type]
    assert breakpoints("*", graph, field="interrupt_before") == "*"
    assert breakpoints(None, graph, field="interrupt_before") is None
    assert breakpoints([], graph, field="interrupt_before") is None
    assert breakpoints(["after", "inner", "after"], graph, field="interrupt_after") == ["after", "inner"]
    with pytest.raises(ServingError) as refused:
        breakpoints(["inner", "nope", "__start__"], graph, field="interrupt_after")
    assert refused.value.status == 422
    assert "interrupt_after" in str(refused.value) and "'nope'" in str(refused.value) and "'__start__'" in str(refused.value)


def test_the_join_filter_keeps_exactly_each_modes_events() -> None:
    assert join_events(["messages-tuple"]) == {"messages"}
    assert join_events(["messages"]) == {"messages", "messages/metadata", "messages/partial", "messages/complete"}
    assert join_events(["events"]) == {"events"}
    assert join_events(["events", "values"]) == {"events", "values"}
    with pytest.raises(ServingError):
        join_events(["messages/partial"])  # an event name, not a mode


def test_two_modes_stream_check_the_same_chunks_apart() -> None:
    guard = OutputGuard(OutputPolicy(redact=("secret",)))
    events = GuardStreams(guard)
    chunks = [AIMessageChunk("a sec", id="m"), AIMessageChunk("ret b", id="m"), AIMessageChunk("", id="m", chunk_position="last")]
    direct = "".join(_checked_message(c, guard).content for c in chunks)
    # Interleaved with the direct stream, as a run with `messages` and `events` does.
    guard2 = OutputGuard(OutputPolicy(redact=("secret",)))
    spaced = GuardStreams(guard2)
    both, apart = [], []
    for chunk in chunks:
        both.append(_checked_message(chunk, guard2).content)
        apart.append(_checked_message(chunk, spaced).content)
    assert direct == "".join(both) == "".join(apart) == "a [redacted] b"
    assert guard2.pending() == [] and events.pending() == []


async def test_graph_parts_with_events_are_the_graph_stream_plus_events() -> None:
    graph = make_nested_graph(None).compile(name="nested")  # type: ignore[arg-type]
    modes = ["values", "updates", "custom"]
    plain = [p async for p in graph_parts(graph, {"messages": [HumanMessage("hi")]}, {}, stream_mode=modes, subgraphs=True, events=False)]
    mixed = [p async for p in graph_parts(graph, {"messages": [HumanMessage("hi")]}, {}, stream_mode=modes, subgraphs=True, events=True)]
    own = [p for p in mixed if p["type"] != "events"]

    def shape(parts: list[dict[str, Any]]) -> list[Any]:  # task ids in namespaces differ per run
        return [(p["type"], tuple(ns.split(":")[0] for ns in p["ns"])) for p in parts]

    assert shape(own) == shape(plain)
    assert [p["data"] for p in own if p["type"] == "values"][-1]["hops"] == 3
    events = [p["data"] for p in mixed if p["type"] == "events"]
    names = {(e["event"], e["name"]) for e in events}
    assert {("on_chain_start", "nested"), ("on_chain_end", "nested"), ("on_chain_start", "bottom")} <= names
    assert not any(e["event"] == "on_chain_stream" and not e["parent_ids"] for e in events)


# ---- a real server, the FAKE backend, an output policy ----------------------------------------

_UNLIMITED = {"requests_per_s": 1000, "burst": 1000}
TENANTS = {
    "acme": {"graphs": ["chat", "nested"], "limits": _UNLIMITED},
    "globex": {"graphs": ["chat"], "output_block_terms": ["from the"], "limits": _UNLIMITED},
}


@pytest.fixture(scope="module")
def policy_server(
    tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("langgraph-stream-modes")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
            "nested": {"path": "tests.fakes.nested_graphs:make_nested_graph", "model": "chat-default"},
        },
        "guardrails": {"output_redact_terms": ["FAKE"]},
        "auth": {"tenants": TENANTS},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


@pytest.fixture
async def clients(policy_server: tuple[ServerHandle, dict[str, str]]) -> AsyncIterator[dict[str, LangGraphClient]]:
    server, keys = policy_server
    clients = {tenant: get_client(url=server.url, api_key=key) for tenant, key in keys.items()}
    yield clients
    for client in clients.values():
        await client.http.client.aclose()


async def _parts(client: LangGraphClient, thread_id: str | None, assistant: str, **kwargs: Any) -> list[Any]:
    return [part async for part in client.runs.stream(thread_id, assistant, **kwargs)]


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else json.dumps(content)


def _texts(value: Any) -> Iterator[str]:
    """Every string in a value, but a message's ``response_metadata`` (the model's
    name is there: the policy leaves a message's metadata as it is)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "response_metadata":
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _events_text(parts: list[Any]) -> str:
    """What the model streamed, from the `events` mode's chunks."""
    return "".join(
        p.data["data"]["chunk"]["content"] for p in parts if p.event == "events" and p.data["event"] == "on_chat_model_stream"
    )


@pytest.mark.e2e
async def test_messages_mode_streams_partials_and_completes_under_the_policy(clients: dict[str, LangGraphClient]) -> None:
    parts = await _parts(clients["acme"], None, "chat", input=HI, stream_mode="messages")
    names = [p.event for p in parts]
    assert names[0] == "metadata" and set(names) == {"metadata", "messages/metadata", "messages/partial", "messages/complete"}
    meta = [p.data for p in parts if p.event == "messages/metadata"]
    assert len(meta) == 1
    (message_id,) = meta[0]
    assert meta[0][message_id]["metadata"]["langgraph_node"] == "call_model"
    partials = [p.data for p in parts if p.event == "messages/partial"]
    assert all(len(data) == 1 and data[0]["id"] == message_id and data[0]["type"] == "ai" for data in partials)
    texts = [_text(data[0]) for data in partials]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))  # accumulated
    assert len(set(texts)) > 2  # streamed in pieces, not sent once
    complete = [p.data for p in parts if p.event == "messages/complete"]
    assert [[_text(m) for m in data] for data in complete] == [[ANSWER]]
    assert texts[-1] == ANSWER
    # Held back and redacted across the chunk boundary: the term never left.
    assert not any("fake" in t.lower() for t in texts)


@pytest.mark.e2e
async def test_events_mode_sends_astream_events_all_checked(clients: dict[str, LangGraphClient]) -> None:
    parts = await _parts(clients["acme"], None, "chat", input=HI, stream_mode=["events", "values"])
    assert {p.event for p in parts} == {"metadata", "events", "values"}
    events = [p.data for p in parts if p.event == "events"]
    kinds = [e["event"] for e in events]
    for kind in ("on_chain_start", "on_chain_end", "on_chat_model_start", "on_chat_model_stream", "on_chat_model_end"):
        assert kind in kinds, kind
    assert events[0]["event"] == "on_chain_start" and events[0]["name"] == "chat" and events[0]["parent_ids"] == []
    assert all({"event", "name", "run_id", "parent_ids", "data"} <= set(e) for e in events)
    # The graph's own stream went to its mode, not into `events`.
    assert not any(e["event"] == "on_chain_stream" and not e["parent_ids"] for e in events)
    assert _events_text(parts) == ANSWER
    for event in events:  # the chunks, the whole answer at the end, the state: all checked
        assert not any("fake" in text.lower() for text in _texts(event)), event["event"]
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == ANSWER


@pytest.mark.e2e
async def test_every_message_mode_at_once_gets_the_whole_checked_answer(clients: dict[str, LangGraphClient]) -> None:
    parts = await _parts(clients["acme"], None, "chat", input=HI, stream_mode=["messages", "messages-tuple", "events"])
    tuples = "".join(p.data[0]["content"] for p in parts if p.event == "messages")
    complete = [p.data[0]["content"] for p in parts if p.event == "messages/complete"]
    assert tuples == _events_text(parts) == ANSWER and complete == [ANSWER]


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["messages", "events"])
async def test_a_blocked_term_stops_the_run_in_either_mode(clients: dict[str, LangGraphClient], mode: str) -> None:
    parts = await _parts(clients["globex"], None, "chat", input=HI, stream_mode=mode)
    assert parts[-1].event == "error" and parts[-1].data["error"] == "OutputBlocked"
    # (a message's metadata is the server's, left as it is: as in `messages-tuple`)
    sent = " ".join(_texts([p.data for p in parts[:-1] if p.event != "messages/metadata"])).lower()
    assert "from the" not in sent and "fake" not in sent
    assert sum(p.event in ("messages/partial", "events") for p in parts) > 1  # it had started streaming


@pytest.mark.e2e
async def test_a_joined_stream_keeps_exactly_the_modes_asked_for(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    run = await acme.runs.create(tid, "chat", input=HI, stream_mode=["messages", "messages-tuple", "values"])
    everything = [p async for p in acme.runs.join_stream(tid, run["run_id"])]
    sent = {p.event for p in everything}
    assert {"messages", "messages/metadata", "messages/partial", "messages/complete", "values"} <= sent

    async def joined(mode: str | list[str]) -> set[str]:
        return {p.event async for p in acme.runs.join_stream(tid, run["run_id"], stream_mode=mode)} - CONTROL

    assert await joined("messages-tuple") == {"messages"}
    assert await joined("messages") == {"messages", "messages/metadata", "messages/partial", "messages/complete"}
    assert await joined("values") == {"values"}
    assert await joined("events") == set()  # the run did not ask for them
    with pytest.raises(UnprocessableEntityError):
        await joined("messages/partial")


@pytest.mark.e2e
async def test_interrupt_before_and_after_stop_the_run_at_those_nodes(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    stopped = await acme.runs.wait(tid, "nested", input=HI, interrupt_before=["after"])
    assert [m["content"] for m in stopped["messages"]] == ["Hi", "from the bottom", "from the middle"]
    assert (await acme.threads.get_state(tid))["next"] == ["after"]
    # A run with no input goes on from the breakpoint.
    done = await acme.runs.wait(tid, "nested", input=None)
    assert done["messages"][-1]["content"] == "after" and (await acme.threads.get_state(tid))["next"] == []

    tid = (await acme.threads.create())["thread_id"]
    await acme.runs.wait(tid, "nested", input=HI, interrupt_after=["inner"])
    assert (await acme.threads.get_state(tid))["next"] == ["after"]

    tid = (await acme.threads.create())["thread_id"]
    first = await acme.runs.wait(tid, "nested", input=HI, interrupt_before="*")
    assert [m["content"] for m in first["messages"]] == ["Hi"]
    assert (await acme.threads.get_state(tid))["next"] == ["inner"]

    # Streamed: the stream ends at the breakpoint, without an error.
    tid = (await acme.threads.create())["thread_id"]
    parts = await _parts(acme, tid, "chat", input=HI, stream_mode=["values", "updates"], interrupt_before=["call_model"])
    assert "error" not in {p.event for p in parts}
    assert {"__interrupt__": []} in [p.data for p in parts if p.event == "updates"]
    assert (await acme.threads.get_state(tid))["next"] == ["call_model"]


@pytest.mark.e2e
@pytest.mark.parametrize("field", ["interrupt_before", "interrupt_after"])
async def test_a_breakpoint_that_is_not_a_node_is_a_422_naming_it(
    clients: dict[str, LangGraphClient], policy_server: tuple[ServerHandle, dict[str, str]], field: str
) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await acme.runs.wait(tid, "chat", input=HI, **{field: ["call_model", "no_such_node"]})
    assert refused.value.response.status_code == 422
    detail = refused.value.response.json()["detail"]
    assert field in detail and "'no_such_node'" in detail and "call_model" in detail
    server, keys = policy_server
    streamed = httpx.post(server.url + "/runs/stream", headers={"x-api-key": keys["acme"]},
                          json={"assistant_id": "chat", "input": HI, field: "all"}, timeout=30)
    assert streamed.status_code == 422  # neither "*" nor a list
    # Nothing ran on the thread.
    assert (await acme.threads.get(tid))["values"] is None


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("field", "value"), [("webhook", "https://example.com/hook"), ("after_seconds", 5), ("feedback_keys", ["score"])]
)
def test_options_this_server_does_not_have_are_refused_naming_them(
    policy_server: tuple[ServerHandle, dict[str, str]], field: str, value: Any
) -> None:
    server, keys = policy_server
    headers = {"x-api-key": keys["acme"]}
    for path in ("/runs/wait", "/runs/stream"):
        refused = httpx.post(server.url + path, headers=headers, json={"assistant_id": "chat", "input": HI, field: value}, timeout=30)
        assert refused.status_code == 400, (path, refused.text)
        assert field in refused.json()["detail"]
    # Other unknown fields newer SDKs send stay ignored; so do the refused ones when empty.
    ignored = {"durability": "sync", "checkpoint_during": True, "langsmith_tracer": {"x": 1}, "after_seconds": 0,
               "feedback_keys": [], "webhook": None}
    ok = httpx.post(server.url + "/runs/wait", headers=headers, json={"assistant_id": "chat", "input": HI, **ignored}, timeout=30)
    assert ok.status_code == 200 and ok.json()["messages"][-1]["content"] == ANSWER


# ---- the real local model ------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.llm
async def test_the_real_model_streams_every_mode_consistently(server: ServerHandle) -> None:
    client = get_client(url=server.url, api_key=None)
    try:
        parts = await _parts(
            client, None, "chat", stream_mode=["messages", "events", "values"],
            input={"messages": [{"role": "user", "content": "Say hello."}]},
            context={"model_params": {"max_tokens": 16, "temperature": 0}},
        )
    finally:
        await client.http.client.aclose()
    assert "error" not in {p.event for p in parts}
    answer = [p.data for p in parts if p.event == "values"][-1]["messages"][-1]
    assert answer["type"] == "ai" and answer["content"]
    complete = [p.data for p in parts if p.event == "messages/complete"]
    assert [[m["content"] for m in data] for data in complete] == [[answer["content"]]]
    assert complete[0][0]["id"] == answer["id"]
    partials = [p.data[0]["content"] for p in parts if p.event == "messages/partial"]
    assert partials[-1] == answer["content"] and len(partials) > 1
    assert _events_text(parts) == answer["content"]
