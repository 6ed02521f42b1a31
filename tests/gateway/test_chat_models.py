"""Chat models from the gateway against the real llama.cpp backend: tool-call plumbing,
schema-constrained output, answers cut by ``max_tokens`` under a response format, and
the llama.cpp quirks the gateway absorbs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from gateway import Backend, ModelGateway, load_registry
from gateway import RoutedChatModel
from gateway.chat import GatewayChatModel, LlamaCppChatModel, build_chat_model
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.llm]


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"sunny in {city}"


@tool
def get_time(zone: str) -> str:
    """Get the current time in a time zone."""
    return "12:00"


@pytest.fixture
async def gateway(local_backend: Backend) -> AsyncIterator[ModelGateway]:
    gw = ModelGateway(load_registry(REPO / "config/models.yaml"))
    yield gw
    await gw.aclose()


async def test_the_local_alias_gets_the_llamacpp_model(gateway: ModelGateway) -> None:
    routed = gateway.chat_model("chat-default")
    assert isinstance(routed, RoutedChatModel) and routed.alias == "chat-default"
    assert routed is gateway.chat_model("chat-default")  # shared, built once
    backend = gateway.backend("chat-default")
    assert isinstance(gateway.backend_chat_model(backend), LlamaCppChatModel)
    assert gateway.backend_chat_model(backend) is gateway.backend_chat_model(backend)


# SmolLM2 calls tools reliably only after examples of calls (measured: 0/5 zero-shot,
# 6/6 with this layout); the tests are about the plumbing, not the model's judgement.
FEW_SHOT = [
    SystemMessage("You answer by calling one of the tools."),
    HumanMessage("What's the weather in London?"),
    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "London"}, "id": "call_1"}]),
    HumanMessage("What's the weather in Tokyo?"),
    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Tokyo"}, "id": "call_2"}]),
]


async def test_tool_calls_come_back_in_openai_shape(gateway: ModelGateway) -> None:
    model = gateway.chat_model("chat-default").bind_tools([get_weather, get_time])
    answer = await model.ainvoke([*FEW_SHOT, HumanMessage("What's the weather in Paris?")], max_tokens=64, temperature=0)
    assert [call["name"] for call in answer.tool_calls] == ["get_weather"]
    assert answer.tool_calls[0]["args"] == {"city": "Paris"}
    assert answer.response_metadata["finish_reason"] == "tool_calls"


async def test_forcing_a_named_tool_works_on_llamacpp(gateway: ModelGateway) -> None:
    # llama.cpp ignores tool_choice {type: function, name} (it falls back to "auto");
    # the gateway sends "required" with only the named tool offered, so the grammar
    # admits that tool alone, even when the question and the examples point at another
    # one (without the rewrite this answer is get_weather: checked).
    model = gateway.chat_model("chat-default").bind_tools([get_weather, get_time], tool_choice="get_time")
    answer = await model.ainvoke([*FEW_SHOT, HumanMessage("What's the weather in Paris?")], max_tokens=64, temperature=0)
    assert [call["name"] for call in answer.tool_calls] == ["get_time"]


async def test_schema_constrained_output_is_valid_json(gateway: ModelGateway) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    model = gateway.chat_model("chat-default").bind(
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
        max_tokens=64,
        temperature=0,
    )
    answer = await model.ainvoke([HumanMessage("Name the capital of France and its country, as JSON.")])
    parsed = json.loads(answer.content)
    assert set(parsed) == {"city", "country"} and all(isinstance(v, str) for v in parsed.values())


async def test_requests_without_a_limit_get_the_backend_default(gateway: ModelGateway) -> None:
    backend = gateway.backend("chat-default")
    assert backend.default_max_tokens == 512
    answer = await gateway.chat_model("chat-default").ainvoke(
        [HumanMessage("Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")], temperature=0
    )
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 512
    relayed = await gateway.complete_chat(
        "chat-default", {"messages": [{"role": "user", "content": "Continue this list forever: 1, 2, 3,"}], "temperature": 0}
    )
    assert relayed["usage"]["completion_tokens"] == 512


# An answer cut by max_tokens under a response_format: OpenAI's API returns the text cut
# short with finish_reason "length"; the SDK's structured-output helpers, which
# ChatOpenAI uses for any response_format, raised LengthFinishReasonError instead (a 500
# on both APIs). SmolLM2 needs more than 5 tokens for any JSON object, so this cuts.
JSON_CUT = {"response_format": {"type": "json_object"}, "max_tokens": 5, "temperature": 0}
ASK_JSON = [HumanMessage("Describe Paris as a JSON object with many fields.")]


def _cut_short(answer: AIMessage) -> None:
    assert answer.response_metadata["finish_reason"] == "length"
    assert isinstance(answer.content, str) and answer.content.strip()
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 5


async def test_a_json_answer_cut_by_max_tokens_is_the_truncated_text(gateway: ModelGateway) -> None:
    model = gateway.chat_model("chat-default").bind(**JSON_CUT)
    _cut_short(await model.ainvoke(ASK_JSON))
    chunks = [chunk async for chunk in model.astream(ASK_JSON)]
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    _cut_short(whole)


async def test_a_json_answer_cut_by_max_tokens_without_streaming(gateway: ModelGateway, local_backend: Backend) -> None:
    # A vLLM-kind model asks for the whole answer at once: the SDK's `parse` path.
    backend = local_backend.model_copy(update={"kind": "vllm"})
    async with httpx.AsyncClient() as pool:
        model = build_chat_model(backend, http_async_client=pool)
        assert isinstance(model, GatewayChatModel) and not model.streaming
        _cut_short(await model.bind(**JSON_CUT).ainvoke(ASK_JSON))


class City(BaseModel):
    name: str
    country: str
    population: int


async def test_a_parsed_response_format_cut_by_max_tokens_ends_with_length(gateway: ModelGateway) -> None:
    # A pydantic class keeps the SDK's streaming helper (it parses the answer); cut
    # short, the stream ends with the finish reason instead of an error, and no object.
    model = gateway.chat_model("chat-default").bind(response_format=City, max_tokens=5, temperature=0)
    answer = await model.ainvoke(ASK_JSON)
    assert answer.response_metadata["finish_reason"] == "length"
    assert isinstance(answer.content, str) and answer.content
    assert answer.additional_kwargs.get("parsed") is None
