"""The OpenAI-compatible API over HTTP, through the official ``openai`` client, against
the real local model (graph ``chat``) and the alias passthrough (``chat-default``)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.conftest import ServerHandle
from tests.fakes.openai_backend import RECEIVED

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused-in-dev-mode", max_retries=0)


def test_health_ready_and_models(server: ServerHandle) -> None:
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(server.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["backends"]["local"] == "ok"
    models = openai.OpenAI(base_url=server.url + "/v1", api_key="x").models.list()
    owners = {m.id: m.owned_by for m in models.data}
    assert owners["chat"] == "switchyard-graph"
    assert owners["chat-default"] == "switchyard-alias"


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_non_streamed_answer_has_usage_and_request_id(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=QUESTION, max_tokens=12)
    assert re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])
    answer = raw.parse()
    assert answer.model == model
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    assert 0 < answer.usage.completion_tokens <= 12


@pytest.mark.parametrize("model", ["chat", "chat-default"])
def test_streamed_answer_chunks(client: openai.OpenAI, model: str, server: ServerHandle) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=QUESTION, max_tokens=16, stream=True, extra_headers={"x-request-id": f"stream-{model}"}
    )
    assert raw.headers["x-request-id"] == f"stream-{model}"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)  # not asked for (see test_openai_usage.py)
    # The request id reaches the server's log.
    assert f"[stream-{model}]" in server.log_file.read_text()


def test_include_usage_adds_the_openai_usage_chunk(client: openai.OpenAI) -> None:
    for model in ("chat", "chat-default"):
        chunks = list(
            client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=8, stream=True, stream_options={"include_usage": True}
            )
        )
        assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        assert chunks[-2].choices[0].finish_reason is not None
        assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_ends_with_done(server: ServerHandle) -> None:
    body = {"model": "chat", "messages": QUESTION, "max_tokens": 6, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        json.loads(line.removeprefix("data:"))


@pytest.mark.parametrize("model", ["chat-fake", "fake-ok"])
@pytest.mark.parametrize("stream", [False, True])
def test_sampling_parameters_reach_the_backend(client: openai.OpenAI, model: str, stream: bool) -> None:
    RECEIVED.clear()
    answer = client.chat.completions.create(
        model=model, messages=QUESTION, max_completion_tokens=7, temperature=0.3, top_p=0.9, stop=["\n\n"],
        seed=11, presence_penalty=0.5, stream=stream,
    )
    if stream:
        list(answer)  # type: ignore[arg-type]
    (sent,) = RECEIVED
    assert sent["model"] == "fake-ok"  # the served name, not the alias or graph id
    assert {k: sent[k] for k in ("temperature", "top_p", "stop", "seed", "presence_penalty")} == {
        "temperature": 0.3, "top_p": 0.9, "stop": ["\n\n"], "seed": 11, "presence_penalty": 0.5,
    }
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 7


def test_completion_limit_is_applied_by_the_real_model(client: openai.OpenAI) -> None:
    short = client.chat.completions.create(model="chat", messages=QUESTION, max_completion_tokens=2)
    assert short.usage is not None and short.usage.completion_tokens == 2
    assert short.choices[0].finish_reason == "length"


def test_tool_call_history_is_accepted_by_the_graph(client: openai.OpenAI) -> None:
    # What OpenAI clients send after a tool call: an assistant turn with null content.
    history = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    for stream in (False, True):
        answer = client.chat.completions.create(model="chat", messages=history, max_tokens=12, stream=stream)  # type: ignore[arg-type]
        chunks = list(answer) if stream else None  # type: ignore[arg-type]
        assert chunks is None or chunks[-1].choices[0].finish_reason is not None


def test_tool_message_without_its_call_id_is_a_400(server: ServerHandle) -> None:
    bad = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "sunny"}]
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": "chat", "messages": bad})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.1.tool_call_id"


def test_alias_answer_passes_backend_fields_through(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="chat-default", messages=QUESTION, max_tokens=3, logprobs=True, top_logprobs=2
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content and len(logprobs.content[0].top_logprobs) == 2
