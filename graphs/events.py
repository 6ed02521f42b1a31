"""Typed events from a graph run, independent of any wire protocol.

Graphs stream LangGraph v2 parts (``astream(..., stream_mode=["messages"],
version="v2")``); `message_events` turns them into the few events a chat answer
needs. The serving layer encodes these events for each protocol it speaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
import json
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage

__all__ = ["Citations", "Facts", "Finish", "GraphEvent", "TextDelta", "ToolCallDelta", "ToolResult", "message_events"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    """Answer text as the model produces it."""

    text: str
    node: str
    """The graph node whose model call produced it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a tool call the model is making (OpenAI streaming shape)."""

    index: int
    id: str | None
    name: str | None
    arguments: str
    """A fragment of the JSON arguments; fragments concatenate in order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    """The end of the run's answer: the last model call's finish reason and the token
    usage summed over every model call of the run."""

    reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Citations:
    """The sources a retrieval graph will give the model (its ``sources`` state key),
    numbered as the answer cites them; sent before the answer."""

    sources: list[dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """The knowledge-graph facts a graph gives the model (the ``graphrag`` graph's
    ``facts`` state key), each with ``cited_as``: the numbers of the `Citations` sources
    that state it; sent with the citations, before the answer."""

    facts: list[dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What an executed (or refused) tool call returned to the model."""

    tool_call_id: str
    name: str
    content: str
    status: str
    """``success``, or ``error`` for a refused, timed-out or failed call."""


GraphEvent = TextDelta | ToolCallDelta | Finish | Citations | Facts | ToolResult


def _text(message: BaseMessage) -> str:
    content = message.content
    return content if isinstance(content, str) else str(message.text)


async def message_events(parts: AsyncIterator[dict[str, Any]]) -> AsyncIterator[GraphEvent]:
    """Map a v2 ``messages`` (and ``updates``) stream to `GraphEvent` values, ending
    with one `Finish`. A node update with ``sources`` (retrieval graphs) is `Citations`;
    one with ``facts`` (the ``graphrag`` graph) is `Facts`, after the citations.

    Only AI messages are answer text; tool results and echoed inputs are not. A node
    that returns a whole ``AIMessage`` without streaming still yields its text once.
    Model calls tagged ``nostream`` never reach this stream (LangGraph drops them).
    """
    reason = "stop"
    prompt_tokens = completion_tokens = 0
    async for part in parts:
        if part["type"] == "updates":
            for update in (part["data"] or {}).values():
                if isinstance(update, dict) and update.get("sources"):
                    yield Citations(sources=list(update["sources"]))
                if isinstance(update, dict) and update.get("facts"):
                    yield Facts(facts=list(update["facts"]))
            continue
        if part["type"] != "messages":
            continue
        message, metadata = part["data"]
        if isinstance(message, ToolMessage):
            content = message.content if isinstance(message.content, str) else str(message.content)
            yield ToolResult(tool_call_id=message.tool_call_id, name=message.name or "", content=content, status=message.status)
            continue
        if not isinstance(message, AIMessage):
            continue
        node = metadata.get("langgraph_node", "")
        text = _text(message)
        if text:
            yield TextDelta(text=text, node=node)
        if isinstance(message, AIMessageChunk):
            for chunk in message.tool_call_chunks:
                yield ToolCallDelta(
                    index=chunk.get("index") or 0, id=chunk.get("id"), name=chunk.get("name"), arguments=chunk.get("args") or ""
                )
        else:
            for index, call in enumerate(message.tool_calls):
                yield ToolCallDelta(index=index, id=call["id"], name=call["name"], arguments=json.dumps(call["args"]))
        finish = message.response_metadata.get("finish_reason")
        if finish:
            reason = finish
        usage = message.usage_metadata
        if usage:
            prompt_tokens += usage.get("input_tokens", 0)
            completion_tokens += usage.get("output_tokens", 0)
    yield Finish(reason=reason, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
