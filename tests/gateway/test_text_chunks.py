"""The gateway's shortcut for text-only stream chunks builds exactly what
``langchain-openai`` builds, and leaves every other chunk to it."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk

from gateway.chat import GatewayChatModel, text_generation_chunk


def _library(chunk: dict[str, Any]) -> Any:
    model = GatewayChatModel(model="m", api_key="k", base_url="http://127.0.0.1:9/v1")
    return model._convert_chunk_to_generation_chunk(chunk, AIMessageChunk, {})


def _chunk(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": delta, **choice}]}


@pytest.mark.parametrize(
    "delta",
    [{"content": "Hello"}, {"role": "assistant", "content": ""}, {"content": " 世界"}, {"content": None}],
)
def test_text_chunks_equal_the_library_result(delta: dict[str, Any]) -> None:
    chunk = _chunk(delta, finish_reason=None)
    fast = text_generation_chunk(chunk)
    assert fast is not None
    expected = _library(chunk)
    assert fast == expected
    assert fast.message.model_dump() == expected.message.model_dump()
    assert (fast + expected).text == expected.text * 2  # merges like a validated chunk


@pytest.mark.parametrize(
    "chunk",
    [
        _chunk({"content": "x"}, finish_reason="stop"),
        _chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": ""}}]}),
        _chunk({"content": "", "reasoning_content": "hmm"}),
        _chunk({"content": "x"}, logprobs={"content": []}),
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
        _chunk({"role": "tool", "content": "x"}),
    ],
)
def test_other_chunks_go_to_the_library(chunk: dict[str, Any]) -> None:
    assert text_generation_chunk(chunk) is None
