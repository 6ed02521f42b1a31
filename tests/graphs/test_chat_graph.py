"""The chat graph against the real local model: streamed events, usage, parameters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest
from typing import Any

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from gateway import Backend, BackendUnavailableError, ModelGateway, load_registry
from graphs import Finish, GraphRegistry, GraphSpec, RunContext, TextDelta, message_events
from graphs.chat.prompts import SYSTEM_PROMPT
from tests.conftest import REPO, write_models_file

pytestmark = [pytest.mark.integration, pytest.mark.llm]


@pytest.fixture
async def chat(local_backend: Backend) -> AsyncIterator[GraphRegistry]:
    gateway = ModelGateway(load_registry(REPO / "config/models.yaml"))
    yield GraphRegistry.load({"chat": GraphSpec(path="graphs.chat:make_graph")}, gateway)
    await gateway.aclose()


async def _events(registry: GraphRegistry, messages: list[object], **params: object) -> list[object]:
    stream = registry.get("chat").graph.astream(
        {"messages": messages}, context=RunContext(model_params=params), stream_mode=["messages"], version="v2"
    )
    async with aclosing(message_events(stream)) as events:
        return [event async for event in events]


async def test_answer_streams_token_by_token_then_finishes(chat: GraphRegistry) -> None:
    events = await _events(chat, [HumanMessage("What is the capital of France?")], max_tokens=24, temperature=0)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1  # streamed, not one block
    assert all(d.node == "call_model" for d in deltas)
    assert "Paris" in "".join(d.text for d in deltas)
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.prompt_tokens > 0 and 0 < finish.completion_tokens <= 24


async def test_max_tokens_from_the_run_context_is_applied(chat: GraphRegistry) -> None:
    events = await _events(chat, [HumanMessage("Tell me a long story about ships.")], max_tokens=3)
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length" and finish.completion_tokens == 3


class _SeenByModel(AsyncCallbackHandler):
    """Records the messages each model call was sent (a real callback, no fake model)."""

    def __init__(self) -> None:
        self.calls: list[list[BaseMessage]] = []

    async def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **_: Any) -> None:
        self.calls.extend(messages)


@pytest.mark.parametrize("own_system", [False, True])
async def test_the_default_system_prompt_is_used_unless_the_caller_brings_one(
    chat: GraphRegistry, own_system: bool
) -> None:
    seen = _SeenByModel()
    conversation = [HumanMessage("Hi")]
    if own_system:
        conversation.insert(0, SystemMessage("Reply with the single word: banana."))
    result = await chat.get("chat").graph.ainvoke(
        {"messages": conversation},
        config={"callbacks": [seen]},
        context=RunContext(model_params={"max_tokens": 8, "temperature": 0}),
    )
    (sent,) = seen.calls
    assert [m.type for m in sent] == ["system", "human"]
    expected = "Reply with the single word: banana." if own_system else SYSTEM_PROMPT
    assert sent[0].content == expected
    # The default prompt is model input only; the thread's state holds what was said.
    assert [m.type for m in result["messages"]] == [*(["system"] if own_system else []), "human", "ai"]


async def test_unreachable_backend_is_a_gateway_error(tmp_path: Path) -> None:
    models = write_models_file(tmp_path / "models.yaml", None, "http://127.0.0.1:9/v1", chat_default="down")
    gateway = ModelGateway(load_registry(models))
    registry = GraphRegistry.load({"chat": GraphSpec(path="graphs.chat:make_graph")}, gateway)
    with pytest.raises(BackendUnavailableError, match="'down'"):
        await registry.get("chat").graph.ainvoke({"messages": [HumanMessage("hi")]}, context=RunContext())
    await gateway.aclose()
