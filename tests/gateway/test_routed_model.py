"""`ModelGateway` and `RoutedChatModel` as a library (issue 13), against real local HTTP
backends: no Switchyard server.

The backends are `FaultyBackend`: a FAKE OpenAI-compatible HTTP service (STYLE.md allows
one for failure injection) that a test switches between answering, answering 4xx/5xx,
dropping the connection before any answer, and breaking a stream before or after its first
chunk. It answers ``hello from <name>``, counts every connection and keeps every request
body, so a test knows who served, who was contacted, and what was sent. A port with nothing
listening is the refused connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from gateway import (
    ROUTE_SCOPE,
    Alias,
    AliasTarget,
    Backend,
    BackendResponseError,
    BackendUnavailableError,
    BreakerSettings,
    Capabilities,
    CapabilityError,
    ModelGateway,
    ModelRegistry,
    RegistryError,
    RouteScope,
    RoutedChatModel,
    UnknownModelError,
)
from gateway.balancer import key_point
from gateway.registry import Timeouts
from tests.fakes.openai_backend import free_port

Mode = Literal["ok", "hang", "400", "429", "500", "drop", "break", "break_after_first", "error_event"]


class FaultyBackend:
    """A FAKE OpenAI chat-completions server on loopback; see the module docstring.

    Every response closes its connection, so `connections` counts requests that reached it.
    """

    def __init__(self, name: str, mode: Mode = "ok") -> None:
        self.name = name
        self.mode: Mode = mode
        self.connections = 0
        self.bodies: list[dict[str, Any]] = []
        self.port = 0
        self.arrived = asyncio.Event()
        """Set when a request's body has been read."""
        self.gate = asyncio.Event()
        """In ``hang`` mode a request waits for this before it is answered."""
        self._server: asyncio.Server | None = None

    @property
    def answer(self) -> str:
        return f"hello from {self.name}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.gate.set()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def backend(self, **capabilities: Any) -> Backend:
        return _backend(self.name, self.port, **capabilities)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            raw = await reader.readexactly(length)
            mode = self.mode
            if mode == "drop":
                return  # closed without a byte of answer
            body = json.loads(raw)
            self.bodies.append(body)
            self.arrived.set()
            if mode == "hang":
                await self.gate.wait()
            if mode in ("400", "429", "500"):
                error = json.dumps({"error": {"message": f"{self.name} says {mode}", "type": "test"}}).encode()
                writer.write(
                    f"HTTP/1.1 {mode} Scripted\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(error)}\r\nConnection: close\r\n\r\n".encode() + error
                )
                await writer.drain()
                return
            if not body.get("stream"):
                if mode == "break":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"id\"")
                    await writer.drain()
                    return  # the body breaks off
                whole = json.dumps(self._whole(body)).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(whole)}\r\nConnection: close\r\n\r\n".encode() + whole
                )
                await writer.drain()
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            if mode == "break":
                await writer.drain()
                return  # headers, then the stream breaks before its first chunk
            if mode == "error_event":  # vLLM's in-band error, before any chunk
                data = b'data: {"error": {"message": "engine dead", "code": 500}}\n\n'
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
                await writer.drain()
                return
            for index, event in enumerate(self._events(body)):
                data = f"data: {event}\n\n".encode()
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
                if mode == "break_after_first" and index == 1:
                    return  # role chunk and one word, then the stream breaks
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    def _whole(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{self.name}", "object": "chat.completion", "created": 0, "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        }

    def _events(self, body: dict[str, Any]) -> list[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps({
                "id": f"chatcmpl-{self.name}", "object": "chat.completion.chunk", "created": 0,
                "model": body.get("model"), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })

        words = self.answer.split(" ")
        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": word if i == 0 else " " + word}) for i, word in enumerate(words)]
        events.append(chunk({}, "stop"))
        events.append(json.dumps({
            "id": f"chatcmpl-{self.name}", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
            "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        }))
        events.append("[DONE]")
        return events


def _backend(name: str, port: int, *, context_window: int = 4096, tools: bool = True, json_schema: bool = True) -> Backend:
    return Backend(
        id=name, kind="vllm", base_url=f"http://127.0.0.1:{port}/v1", model=f"served-{name}",
        timeouts=Timeouts(connect_s=2, read_s=5),
        capabilities=Capabilities(context_window=context_window, tools=tools, json_schema=json_schema),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def a() -> AsyncIterator[FaultyBackend]:
    server = FaultyBackend("a")
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def b() -> AsyncIterator[FaultyBackend]:
    server = FaultyBackend("b")
    await server.start()
    yield server
    await server.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


BREAKER = BreakerSettings(failures=2, cooldown_s=10)


def _registry(backends: list[Backend], aliases: dict[str, Alias | str]) -> ModelRegistry:
    return ModelRegistry({x.id: x for x in backends}, aliases, breaker=BREAKER)


def _targets(**weights: int) -> tuple[AliasTarget, ...]:
    return tuple(AliasTarget(backend=name, weight=w) for name, w in weights.items())


def _aliases() -> dict[str, Alias | str]:
    return {
        "main": Alias(name="main", targets=_targets(a=1), fallbacks=("b",)),
        "split": Alias(name="split", targets=_targets(a=1, b=1)),
        "only-b": "b",
    }


@pytest.fixture
async def gateway(a: FaultyBackend, b: FaultyBackend, clock: Clock) -> AsyncIterator[ModelGateway]:
    gw = ModelGateway(_registry([a.backend(), b.backend()], _aliases()), clock=clock)
    yield gw
    await gw.aclose()


def _key_on(backend: str) -> str:
    """A sticky key the 50/50 ``split`` alias sends to ``backend`` first."""
    want_first = backend == "a"
    return next(k for i in range(1000) if ((k := f"thread-{i}") and (key_point(k) < 0.5) == want_first))


BODY = {"messages": [{"role": "user", "content": "hi"}]}


async def _streamed(gateway: ModelGateway, alias: str, scope: RouteScope | None = None, body: dict[str, Any] = BODY) -> str:
    text = ""
    async for chunk in gateway.stream_chat(alias, body, scope):
        assert chunk["model"] == alias
        for choice in chunk.get("choices") or ():
            text += choice["delta"].get("content") or ""
    return text


async def _whole(gateway: ModelGateway, alias: str, scope: RouteScope | None = None, body: dict[str, Any] = BODY) -> str:
    answer = await gateway.complete_chat(alias, body, scope)
    assert answer["model"] == alias
    return str(answer["choices"][0]["message"]["content"])


CALLS = {"stream_chat": _streamed, "complete_chat": _whole}


# ---- ModelGateway: retry before the first token -------------------------------------------------


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("failure", ["refused", "500", "drop", "break"])
async def test_a_failure_before_the_first_chunk_moves_to_the_next_backend(
    a: FaultyBackend, b: FaultyBackend, clock: Clock, call: str, failure: str
) -> None:
    dead = _backend("a", free_port()) if failure == "refused" else a.backend()
    if failure != "refused":
        a.mode = failure  # type: ignore[assignment]
    gw = ModelGateway(_registry([dead, b.backend()], _aliases()), clock=clock)
    try:
        scope = RouteScope(key="t-1")
        assert await CALLS[call](gw, "main", scope) == b.answer
        assert scope.served == ["b"] and scope.retried == ["a"] and scope.backend == "b"
        assert gw.retries == {("main", "a"): 1}
        assert gw.served == {("main", "b"): 1}
        assert b.connections == 1 and b.bodies[0]["model"] == "served-b"
        assert gw.breakers.states()["a"] == "closed"  # one failure of two
        assert gw.breakers.get("a", BREAKER).failures == 1
    finally:
        await gw.aclose()


async def test_an_error_event_before_the_first_chunk_moves_to_the_next_backend(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend
) -> None:
    a.mode = "error_event"
    scope = RouteScope(key="t")
    assert await _streamed(gateway, "main", scope) == b.answer
    assert scope.retried == ["a"] and scope.served == ["b"]
    assert gateway.breakers.get("a", BREAKER).failures == 1


@pytest.mark.parametrize("call", CALLS)
async def test_a_backend_that_does_not_answer_in_time_is_passed_over(
    a: FaultyBackend, b: FaultyBackend, call: str
) -> None:
    slow = Backend(**{**a.backend().model_dump(), "timeouts": Timeouts(connect_s=2, read_s=0.3)})
    gw = ModelGateway(_registry([slow, b.backend()], _aliases()))
    a.mode = "hang"
    try:
        scope = RouteScope(key="t")
        assert await CALLS[call](gw, "main", scope) == b.answer
        assert scope.retried == ["a"] and scope.served == ["b"]
        assert gw.breakers.get("a", BREAKER).failures == 1
    finally:
        a.gate.set()
        await gw.aclose()


async def test_least_loaded_sends_to_the_less_loaded_target(a: FaultyBackend, b: FaultyBackend) -> None:
    gw = ModelGateway(_registry(
        [a.backend(), b.backend()],
        {"split": Alias(name="split", targets=_targets(a=1, b=1), balance="least_loaded")},
    ))
    try:
        loads = {"a": 4.0, "b": 1.0}
        gw.set_load_source(loads.get)
        for i in range(6):
            assert await _streamed(gw, "split", RouteScope(key=f"t{i}")) == b.answer
        loads.update(a=0.0)
        for i in range(6):
            assert await _streamed(gw, "split", RouteScope(key=f"t{i}")) == a.answer
    finally:
        await gw.aclose()


async def test_a_fallback_listed_twice_is_refused(a: FaultyBackend, b: FaultyBackend) -> None:
    with pytest.raises(ValueError, match="listed twice"):  # one request would contact b twice
        Alias(name="main", targets=_targets(a=1), fallbacks=("b", "b"))


@pytest.mark.parametrize("call", CALLS)
async def test_a_4xx_is_raised_not_retried(gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, call: str) -> None:
    a.mode = "400"
    scope = RouteScope(key="t-1")
    with pytest.raises(BackendResponseError) as caught:
        await CALLS[call](gateway, "main", scope)
    assert caught.value.status == 400 and caught.value.backend_id == "a"
    assert "a says 400" in str(caught.value)
    assert b.connections == 0
    assert scope.retried == [] and gateway.retries == {}
    assert gateway.breakers.states()["a"] == "closed"  # it answered: alive
    assert gateway.breakers.get("a", BREAKER).failures == 0


@pytest.mark.parametrize("call", CALLS)
async def test_a_429_is_retried_without_counting_against_the_breaker(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, call: str
) -> None:
    a.mode = "429"
    for _ in range(3):  # three runs, each with its own scope (a run sticks to who served it)
        scope = RouteScope(key="t-1")
        assert await CALLS[call](gateway, "main", scope) == b.answer
        assert scope.retried == ["a"] and scope.served == ["b"]
    assert a.connections == 3  # never opened: overload is not a fault
    assert gateway.breakers.states()["a"] == "closed"


async def test_a_failure_after_the_first_chunk_is_raised_never_spliced(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend
) -> None:
    a.mode = "break_after_first"
    scope = RouteScope(key="t-1")
    text = ""
    with pytest.raises(BackendUnavailableError) as caught:
        async for chunk in gateway.stream_chat("main", BODY, scope):
            for choice in chunk.get("choices") or ():
                text += choice["delta"].get("content") or ""
    assert caught.value.backend_id == "a"
    assert text == "hello"  # a's first word, nothing from b
    assert b.connections == 0
    assert scope.served == ["a"] and scope.retried == []
    assert gateway.breakers.get("a", BREAKER).failures == 1  # it still counts against a


@pytest.mark.parametrize("call", CALLS)
async def test_the_breaker_opens_and_the_dead_backend_is_left_alone_until_the_cooldown(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, clock: Clock, call: str
) -> None:
    a.mode = "500"
    for _ in range(BREAKER.failures):
        assert await CALLS[call](gateway, "main", RouteScope(key="t")) == b.answer
    assert a.connections == BREAKER.failures
    assert gateway.breakers.states()["a"] == "open"
    for _ in range(5):
        scope = RouteScope(key="t")
        assert await CALLS[call](gateway, "main", scope) == b.answer
        assert scope.retried == []  # skipped, not tried
    assert a.connections == BREAKER.failures  # not contacted while open
    clock.now += BREAKER.cooldown_s - 0.01
    assert await CALLS[call](gateway, "main", RouteScope(key="t")) == b.answer
    assert a.connections == BREAKER.failures
    clock.now += 0.01
    assert await CALLS[call](gateway, "main", RouteScope(key="t")) == b.answer  # the probe fails
    assert a.connections == BREAKER.failures + 1
    assert gateway.breakers.states()["a"] == "open"
    assert await CALLS[call](gateway, "main", RouteScope(key="t")) == b.answer
    assert a.connections == BREAKER.failures + 1  # re-opened: left alone again
    a.mode = "ok"
    clock.now += BREAKER.cooldown_s
    scope = RouteScope(key="t")
    assert await CALLS[call](gateway, "main", scope) == a.answer  # the probe succeeds
    assert scope.served == ["a"]
    assert gateway.breakers.states()["a"] == "closed"
    assert gateway.breakers.transitions[("a", "open")] == 2
    assert gateway.breakers.transitions[("a", "half_open")] == 2
    assert gateway.breakers.transitions[("a", "closed")] == 1


async def _open_a(gateway: ModelGateway, a: FaultyBackend, clock: Clock) -> None:
    """Open a's breaker with 500s, then move past the cool-down."""
    a.mode = "500"
    for _ in range(BREAKER.failures):
        await _streamed(gateway, "main", RouteScope(key="t"))
    assert gateway.breakers.states()["a"] == "open"
    clock.now += BREAKER.cooldown_s


async def _wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)  # a guard against a hang, not a timing assertion
    event.clear()


async def test_while_the_probe_is_out_other_requests_skip_the_backend(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, clock: Clock
) -> None:
    await _open_a(gateway, a, clock)
    a.mode = "hang"
    a.arrived.clear()
    probe_scope = RouteScope(key="probe")
    probe = asyncio.create_task(_streamed(gateway, "main", probe_scope))
    try:
        await _wait(a.arrived)
        assert gateway.breakers.states()["a"] == "half_open"
        for i in range(3):
            scope = RouteScope(key=f"other-{i}")
            assert await _streamed(gateway, "main", scope) == b.answer
            assert scope.retried == []
        assert a.connections == BREAKER.failures + 1  # only the probe reached a
        a.gate.set()
        assert await probe == a.answer
    finally:
        a.gate.set()
        await asyncio.gather(probe, return_exceptions=True)
    assert probe_scope.served == ["a"]
    assert gateway.breakers.states()["a"] == "closed"


async def test_a_cancelled_probe_lets_the_next_request_probe(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, clock: Clock
) -> None:
    await _open_a(gateway, a, clock)
    a.mode = "hang"
    a.arrived.clear()
    probe = asyncio.create_task(_streamed(gateway, "main", RouteScope(key="probe")))
    await _wait(a.arrived)
    probe.cancel()  # the client went away before the first token
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert gateway.breakers.states()["a"] == "half_open"
    assert gateway.retries == {("main", "a"): BREAKER.failures}  # the cancel is no failure
    a.mode = "ok"
    scope = RouteScope(key="next")
    assert await _streamed(gateway, "main", scope) == a.answer  # the next request probes
    assert scope.served == ["a"]
    assert gateway.breakers.states()["a"] == "closed"


@pytest.mark.parametrize("call", CALLS)
async def test_every_backend_open_is_unavailable_naming_the_alias(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, call: str
) -> None:
    a.mode = b.mode = "500"
    for _ in range(BREAKER.failures):
        with pytest.raises(BackendUnavailableError) as caught:
            await CALLS[call](gateway, "main", RouteScope(key="t"))
        assert "'main'" in str(caught.value), caught.value
    assert gateway.breakers.states() == {"a": "open", "b": "open"}
    contacted = (a.connections, b.connections)
    with pytest.raises(BackendUnavailableError) as caught:
        await CALLS[call](gateway, "main", RouteScope(key="t"))
    message = str(caught.value)
    assert "'main'" in message and "a: circuit open" in message and "b: circuit open" in message, message
    assert (a.connections, b.connections) == contacted


# ---- ModelGateway: reload ----------------------------------------------------------------------


async def test_reload_swaps_the_registry(gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend) -> None:
    gateway.chat_model("main")
    assert await _streamed(gateway, "main", RouteScope(key="t")) == a.answer
    new = _registry([a.backend(), b.backend()], {**_aliases(), "main": Alias(name="main", targets=_targets(a=0, b=1))})
    gateway.reload(new)
    assert gateway.registry is new
    for i in range(5):
        assert await _streamed(gateway, "main", RouteScope(key=f"t{i}")) == b.answer
    assert a.connections == 1


async def test_reload_refuses_a_registry_missing_a_required_alias_and_keeps_the_old(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend
) -> None:
    old = gateway.registry
    gateway.chat_model("split")  # a graph holds a routed model for it
    without_split = _registry([a.backend(), b.backend()], {"main": "b", "only-b": "b"})
    with pytest.raises(RegistryError) as caught:
        gateway.reload(without_split)
    assert "aliases.split: missing" in str(caught.value), caught.value
    assert gateway.registry is old
    without_main = _registry([a.backend(), b.backend()], {"split": "b"})
    with pytest.raises(RegistryError) as caught:
        gateway.reload(without_main, required={"main": "graph chat"})
    assert "aliases.main: missing, but graph chat calls it" in str(caught.value), caught.value
    assert gateway.registry is old
    assert await _streamed(gateway, "main", RouteScope(key="t")) == a.answer


async def test_reload_keeps_breakers_of_kept_backends(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend
) -> None:
    a.mode = "500"
    for _ in range(BREAKER.failures):
        await _streamed(gateway, "main", RouteScope(key="t"))
    gateway.reload(_registry([a.backend(), b.backend()], _aliases()))
    assert gateway.breakers.states()["a"] == "open"
    assert await _streamed(gateway, "main", RouteScope(key="t")) == b.answer
    assert a.connections == BREAKER.failures


# ---- ModelGateway: capability contracts ----------------------------------------------------------


@pytest.fixture
def contracts(a: FaultyBackend, b: FaultyBackend) -> ModelGateway:
    small = _backend("small", a.port, context_window=100, tools=False, json_schema=False)
    big = _backend("big", b.port, context_window=200, tools=True, json_schema=True)
    return ModelGateway(ModelRegistry(
        {"small": small, "big": big},
        {"both": Alias(name="both", targets=_targets(small=1, big=1)), "small-only": "small"},
    ))


def _messages(chars: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "x" * chars}]


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}


def test_attempts_keep_only_capable_backends(contracts: ModelGateway) -> None:
    for i in range(20):
        key = f"t{i}"
        assert {b.id for b in contracts.attempts("both", key, {"messages": _messages(10)})} == {"small", "big"}
        assert [b.id for b in contracts.attempts("both", key, {"messages": _messages(10), "tools": TOOLS})] == ["big"]
        assert [b.id for b in contracts.attempts("both", key, {"messages": _messages(10), "response_format": JSON_SCHEMA})] == ["big"]
        assert [b.id for b in contracts.attempts("both", key, {"messages": _messages(600)})] == ["big"]  # ~150 tokens


def test_capability_errors_name_the_request_field(contracts: ModelGateway) -> None:
    with pytest.raises(CapabilityError) as caught:
        contracts.attempts("small-only", "t", {"messages": _messages(10), "tools": TOOLS})
    assert (caught.value.param, caught.value.capability, caught.value.backend_id) == ("tools", "tools", "small")
    with pytest.raises(CapabilityError) as caught:
        contracts.attempts("small-only", "t", {"messages": _messages(10), "response_format": JSON_SCHEMA})
    assert caught.value.param == "response_format"
    with pytest.raises(CapabilityError) as caught:
        contracts.attempts("both", "t", {"messages": _messages(10), "max_tokens": 500})
    assert caught.value.param == "max_tokens"
    with pytest.raises(UnknownModelError):
        contracts.attempts("nope", "t", {"messages": _messages(10)})


def test_a_prompt_longer_than_every_window_names_messages_and_the_largest(contracts: ModelGateway) -> None:
    with pytest.raises(CapabilityError) as caught:
        contracts.attempts("both", "t", {"messages": _messages(4000)})  # ~1000 tokens
    error = caught.value
    assert (error.param, error.capability) == ("messages", "context_window")
    assert error.needed == 1000
    assert "the largest is 200 tokens" in str(error) and "'both'" in str(error), error


async def test_an_incapable_request_is_refused_before_any_backend_is_called(
    contracts: ModelGateway, a: FaultyBackend, b: FaultyBackend
) -> None:
    try:
        with pytest.raises(CapabilityError):
            await _streamed(contracts, "small-only", RouteScope(key="t"), {"messages": _messages(10), "tools": TOOLS})
        with pytest.raises(CapabilityError):
            await _whole(contracts, "both", RouteScope(key="t"), {"messages": _messages(4000)})
        assert (a.connections, b.connections) == (0, 0)
        # and a capable request to "both" with tools goes to big (b's port) whatever the key
        for i in range(4):
            assert await _whole(contracts, "both", RouteScope(key=f"t{i}"), {"messages": _messages(10), "tools": TOOLS}) == b.answer
        assert a.connections == 0
    finally:
        await contracts.aclose()


# ---- RoutedChatModel inside a LangGraph graph ------------------------------------------------------


def _graph(model: Any, *, stream: bool) -> Any:
    async def call(state: MessagesState) -> dict[str, list[BaseMessage]]:
        if stream:
            message: Any = None
            async for chunk in model.astream(state["messages"]):
                message = chunk if message is None else message + chunk
        else:
            message = await model.ainvoke(state["messages"])
        return {"messages": [message]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    return builder.compile()


async def _ask(graph: Any, configurable: dict[str, Any]) -> tuple[str, str]:
    """The graph's final answer, and the text of the tokens it streamed (``messages`` mode)."""
    streamed = ""
    final = ""
    async for mode, part in graph.astream(
        {"messages": [HumanMessage("hi")]}, {"configurable": configurable}, stream_mode=["messages", "values"]
    ):
        if mode == "messages":
            message, _ = part
            if isinstance(message, AIMessageChunk):
                streamed += str(message.content)
        else:
            final = str(part["messages"][-1].content)
    return final, streamed


STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["ainvoke", "astream"])


@STREAMS
async def test_the_sticky_key_in_the_scope_picks_the_backend_and_is_recorded(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, stream: bool
) -> None:
    model = gateway.chat_model("split")
    assert isinstance(model, RoutedChatModel)
    graph = _graph(model, stream=stream)
    for server in (a, b):
        key = _key_on(server.name)
        for _ in range(5):
            scope = RouteScope(key=key)
            final, streamed = await _ask(graph, {ROUTE_SCOPE: scope})
            assert final == server.answer and streamed == server.answer
            assert scope.served == [server.name] and scope.retried == []
    assert (a.connections, b.connections) == (5, 5)
    assert all(body["stream"] is True for body in a.bodies + b.bodies)  # ainvoke streams from the backend too


@STREAMS
async def test_the_scope_aliases_override_the_model_alias(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, stream: bool
) -> None:
    graph = _graph(gateway.chat_model("main"), stream=stream)  # "main" would go to a
    scope = RouteScope(key="t", aliases={"main": "only-b"})
    final, _ = await _ask(graph, {ROUTE_SCOPE: scope})
    assert final == b.answer and scope.served == ["b"]
    assert a.connections == 0
    assert gateway.served == {("only-b", "b"): 1}


@STREAMS
async def test_without_a_scope_the_thread_id_is_the_key(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, stream: bool
) -> None:
    graph = _graph(gateway.chat_model("split"), stream=stream)
    for server in (a, b):
        for _ in range(5):
            final, _ = await _ask(graph, {"thread_id": _key_on(server.name)})
            assert final == server.answer
    assert (a.connections, b.connections) == (5, 5)


@STREAMS
@pytest.mark.parametrize("failure", ["500", "drop", "break"])
async def test_a_failure_before_the_first_token_falls_over_and_the_graph_sees_one_answer(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, stream: bool, failure: str
) -> None:
    a.mode = failure  # type: ignore[assignment]
    graph = _graph(gateway.chat_model("main"), stream=stream)
    scope = RouteScope(key="t")
    final, streamed = await _ask(graph, {ROUTE_SCOPE: scope})
    assert final == b.answer and streamed == b.answer
    assert scope.retried == ["a"] and scope.served == ["b"]
    assert (a.connections, b.connections) == (1, 1)


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"sunny in {city}"


async def test_bind_tools_sends_openai_tool_schemas(gateway: ModelGateway, a: FaultyBackend) -> None:
    bound = gateway.chat_model("main").bind_tools([get_weather], tool_choice="get_weather").bind(temperature=0.25)

    async def call(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    graph = builder.compile()
    result = await graph.ainvoke({"messages": [HumanMessage("weather in Paris?")]}, {"configurable": {ROUTE_SCOPE: RouteScope(key="t")}})
    assert result["messages"][-1].content == a.answer
    sent = a.bodies[-1]
    assert sent["model"] == "served-a"
    assert sent["tools"] == [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["temperature"] == 0.25
    assert sent["messages"] == [{"role": "user", "content": "weather in Paris?"}]
    for choice, wire in (("any", "required"), (True, "required"), ("auto", "auto")):
        await gateway.chat_model("main").bind_tools([get_weather], tool_choice=choice).ainvoke("hi")
        assert a.bodies[-1]["tool_choice"] == wire


async def test_bound_tools_go_only_to_backends_that_have_them(a: FaultyBackend, b: FaultyBackend) -> None:
    gw = ModelGateway(_registry(
        [_backend("a", a.port, tools=False), b.backend()],
        {"split": Alias(name="split", targets=_targets(a=1, b=1))},
    ))
    try:
        graph = _graph(gw.chat_model("split").bind_tools([get_weather]), stream=False)
        scope = RouteScope(key=_key_on("a"))  # a comes first for this key, but has no tools
        final, _ = await _ask(graph, {ROUTE_SCOPE: scope})
        assert final == b.answer
        assert scope.served == ["b"] and scope.retried == []
        assert a.connections == 0
    finally:
        await gw.aclose()


@STREAMS
async def test_a_bare_call_with_a_scope_in_its_config_is_routed_by_it(
    gateway: ModelGateway, a: FaultyBackend, b: FaultyBackend, stream: bool
) -> None:
    model = gateway.chat_model("split")
    for server in (a, b):
        for _ in range(5):
            scope = RouteScope(key=_key_on(server.name))
            config = {"configurable": {ROUTE_SCOPE: scope}}
            if stream:
                text = "".join([str(chunk.content) async for chunk in model.astream("hi", config)])
            else:
                text = str((await model.ainvoke("hi", config)).content)
            assert text == server.answer
            assert scope.served == [server.name]


async def test_a_prompt_too_long_for_the_routed_model_is_refused_before_any_call(a: FaultyBackend, b: FaultyBackend) -> None:
    gw = ModelGateway(_registry(
        [_backend("a", a.port, context_window=50), _backend("b", b.port, context_window=80)],
        {"split": Alias(name="split", targets=_targets(a=1, b=1))},
    ))
    try:
        graph = _graph(gw.chat_model("split"), stream=True)
        with pytest.raises(CapabilityError) as caught:
            await graph.ainvoke({"messages": [HumanMessage("y" * 1000)]}, {"configurable": {"thread_id": "t"}})
        assert caught.value.param == "messages" and "the largest is 80 tokens" in str(caught.value)
        assert (a.connections, b.connections) == (0, 0)
    finally:
        await gw.aclose()


def test_an_unknown_alias_has_no_chat_model(gateway: ModelGateway) -> None:
    with pytest.raises(UnknownModelError):
        gateway.chat_model("nope")
