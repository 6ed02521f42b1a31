"""A graph run with ``response_format: json_object`` cut by ``max_tokens``, on the real
local model, over both APIs and their real clients: the answer is the text cut short
with finish reason ``length`` (what OpenAI's API returns), not a 500 from the SDK's
``LengthFinishReasonError`` (see gateway/chat.py)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph_sdk import get_client
from openai import AsyncOpenAI

from tests.conftest import ServerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

QUESTION = "Describe Paris as a JSON object with many fields."
CUT = {"response_format": {"type": "json_object"}, "max_tokens": 5, "temperature": 0}


async def test_openai_api_returns_the_cut_answer(server: ServerHandle) -> None:
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="dev", max_retries=0)
    messages: Any = [{"role": "user", "content": QUESTION}]
    whole = await client.chat.completions.create(model="chat", messages=messages, **CUT)  # type: ignore[arg-type]
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].message.content and whole.usage is not None and whole.usage.completion_tokens == 5
    stream = await client.chat.completions.create(model="chat", messages=messages, stream=True, **CUT)  # type: ignore[arg-type]
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    await client.close()


async def test_langgraph_api_returns_the_cut_answer(server: ServerHandle) -> None:
    client = get_client(url=server.url)
    state = await client.runs.wait(
        None, "chat", input={"messages": [{"role": "user", "content": QUESTION}]}, context={"model_params": CUT}
    )
    assert isinstance(state, dict) and "__error__" not in state, state
    answer = state["messages"][-1]
    assert answer["type"] == "ai" and answer["content"]
    assert answer["response_metadata"]["finish_reason"] == "length"
