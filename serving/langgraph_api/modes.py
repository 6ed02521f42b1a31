"""The stream modes LangGraph Server computes on top of the graph's own, and the run
options checked against the graph.

- ``messages`` (the server's legacy mode, still asked for by older clients and the JS
  SDK's ``streamMode: "messages"``): from the graph's ``messages`` parts, per message
  id a ``messages/metadata`` event (``{id: {"metadata": ...}}``) the first time,
  then ``messages/partial`` with ``[the message accumulated so far]`` for each chunk,
  and ``messages/complete`` with ``[the whole message]`` when it ends (its last
  chunk, or a message sent whole). `MessagesMode` does the accumulating.
- ``events``: LangChain ``astream_events`` v2 events (``on_chat_model_stream``,
  ``on_chain_start``...) named ``events`` on the wire, as LangGraph Server sends them:
  the run goes through ``astream_events``, whose root ``on_chain_stream`` events carry
  the graph's own stream parts (`graph_parts` turns them back into v2 parts).

Both go through the run's output guard like every other mode: `checked_whole` for an
accumulated message, `checked_event` for an event, `GuardStreams` so that the same
model chunk can be stream-checked for two modes without the two mixing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Literal

from langchain_core.messages import AIMessageChunk, BaseMessage, BaseMessageChunk, message_chunk_to_message
from langgraph.pregel import Pregel

from serving.errors import ServingError
from serving.guardrails import OutputGuard

__all__ = [
    "MESSAGE_EVENTS",
    "GuardStreams",
    "MessagesMode",
    "breakpoints",
    "checked_event",
    "checked_whole",
    "graph_parts",
    "refuse_unsupported",
]

MESSAGE_EVENTS = ("messages/metadata", "messages/partial", "messages/complete")
"""The event names of the ``messages`` stream mode."""

_ROOT_STREAM = "on_chain_stream"
_HIDDEN_TAG = "langsmith:hidden"


def _last(message: BaseMessage) -> bool:
    """Whether ``message`` ends its message: sent whole, or the last chunk (a chat
    model's stream ends with one marked ``chunk_position="last"``; the chunk with
    ``finish_reason`` may be followed by a usage chunk)."""
    if not isinstance(message, BaseMessageChunk):
        return True
    if isinstance(message, AIMessageChunk):
        return message.chunk_position == "last"
    return bool(message.response_metadata.get("finish_reason"))


class MessagesMode:
    """One run's ``messages`` mode: the graph's ``(message, metadata)`` parts as
    ``messages/metadata``, ``messages/partial`` and ``messages/complete`` events.

    A message is kept (accumulated) from its first chunk to its last, then dropped:
    a run holds only the messages being streamed.
    """

    def __init__(self) -> None:
        self._open: dict[str, BaseMessage] = {}

    def add(
        self, message: BaseMessage, metadata: Any, check: Callable[[BaseMessage], BaseMessage] | None = None
    ) -> list[tuple[str, Any]]:
        """The events for one part of the graph's ``messages`` mode.

        Args:
            message: a chunk or a whole message (already checked, when a policy applies).
            metadata: the part's metadata (node, step, tags...).
            check: applied to the accumulated message before it is sent.

        Returns:
            ``(event name, data)`` pairs, in order.
        """
        key = message.id or ""
        events: list[tuple[str, Any]] = []
        previous = self._open.get(key)
        if previous is None:
            events.append(("messages/metadata", {key: {"metadata": metadata}}))
            so_far = message
        elif isinstance(previous, BaseMessageChunk) and isinstance(message, BaseMessageChunk):
            so_far = previous + message
        else:  # a whole message under an id being streamed: it replaces the chunks
            so_far = message
        whole = message_chunk_to_message(so_far)
        if check is not None:
            whole = check(whole)
        if isinstance(message, BaseMessageChunk):
            events.append(("messages/partial", [whole]))
        if _last(message):
            events.append(("messages/complete", [whole]))
            self._open.pop(key, None)
        else:
            self._open[key] = so_far
        return events


class GuardStreams:
    """The run's guard with stream keys of their own: the ``events`` mode checks the
    same model chunks as the ``messages`` modes, as a separate stream.

    Has what `_checked_message` uses of an `OutputGuard` (``active``, ``feed``,
    ``flush``, ``pending``, ``check_value``).
    """

    def __init__(self, guard: OutputGuard) -> None:
        self._guard = guard
        self._space = object()

    @property
    def active(self) -> bool:
        return self._guard.active

    def feed(self, key: Any, text: str) -> str:
        return self._guard.feed((self._space, key), text)

    def flush(self, key: Any) -> str:
        return self._guard.flush((self._space, key))

    def pending(self) -> list[Any]:
        return [k[1] for k in self._guard.pending() if isinstance(k, tuple) and len(k) == 2 and k[0] is self._space]

    def check_value(self, value: Any) -> Any:
        return self._guard.check_value(value)


def checked_whole(message: BaseMessage, guard: OutputGuard) -> BaseMessage:
    """An accumulated message checked whole, except a text content: that was built
    from chunks the stream guard released (checked in order, across chunk
    boundaries), so it is kept as it is.

    Raises:
        OutputBlockedError: a text in it holds a blocked term.
    """
    if isinstance(message.content, str):
        rest = guard.check_value(message.model_copy(update={"content": ""}))
        return rest.model_copy(update={"content": message.content})  # type: ignore[no-any-return]
    return guard.check_value(message)  # type: ignore[no-any-return]


def checked_event(event: Mapping[str, Any], guard: GuardStreams, check_chunk: Callable[[Any, Any], Any]) -> Any:
    """An ``events`` event checked: a model's streamed chunk through the stream guard
    (``check_chunk``: the service's message check, with ``guard``), everything else
    whole.

    Raises:
        OutputBlockedError: a text in it holds a blocked term.
    """
    data = event.get("data")
    if event.get("event") == "on_chat_model_stream" and isinstance(data, dict) and isinstance(data.get("chunk"), BaseMessage):
        chunk = check_chunk(data["chunk"], guard)
        rest = guard.check_value({**event, "data": {**data, "chunk": None}})
        return {**rest, "data": {**rest["data"], "chunk": chunk}}
    return guard.check_value(dict(event))


def _part(chunk: Any, subgraphs: bool) -> dict[str, Any]:
    """A v1 stream chunk (``(mode, data)``, or ``(ns, mode, data)`` with subgraphs) as
    the v2 part ``astream(..., version="v2")`` would have yielded."""
    if subgraphs:
        ns, mode, data = chunk
    else:
        (mode, data), ns = chunk, ()
    part: dict[str, Any] = {"type": mode, "ns": tuple(ns), "data": data}
    if mode == "values":
        interrupts: Any = ()
        if isinstance(data, dict) and "__interrupt__" in data:
            data = dict(data)
            interrupts = data.pop("__interrupt__")
        part.update(data=data, interrupts=interrupts)
    return part


async def graph_parts(
    graph: Pregel[Any, Any, Any, Any],
    graph_input: Any,
    config: Any,
    *,
    stream_mode: list[str],
    subgraphs: bool,
    events: bool,
    **kwargs: Any,
) -> AsyncIterator[dict[str, Any]]:
    """The run's v2 stream parts; with ``events``, also its ``astream_events`` v2
    events, as parts of type ``events`` (``data``: the event).

    The events come from ``astream_events``, whose root ``on_chain_stream`` events are
    the graph's own stream (turned back into v2 parts here), as LangGraph Server does;
    events tagged ``langsmith:hidden`` are left out, as there.
    """
    if not events:
        stream = graph.astream(graph_input, config, stream_mode=stream_mode, subgraphs=subgraphs, version="v2", **kwargs)
        async with aclosing(stream) as parts:
            async for part in parts:
                yield part  # type: ignore[misc]
        return
    source = graph.astream_events(graph_input, config, version="v2", stream_mode=stream_mode, subgraphs=subgraphs, **kwargs)
    async with aclosing(source) as stream:  # type: ignore[type-var]
        async for event in stream:
            if _HIDDEN_TAG in (event.get("tags") or ()):
                continue
            if event["event"] == _ROOT_STREAM and not event.get("parent_ids"):
                yield _part(event["data"]["chunk"], subgraphs)
            else:
                yield {"type": "events", "ns": (), "data": event}


def breakpoints(
    value: Literal["*"] | Sequence[str] | None, graph: Pregel[Any, Any, Any, Any], *, field: str
) -> Literal["*"] | list[str] | None:
    """``interrupt_before`` / ``interrupt_after`` as ``astream`` takes them: ``*`` or
    node names (none: ``None``).

    Raises:
        ServingError: 422 naming the field and each name that is not a node.
    """
    if value is None or value == "*":
        return value
    names = list(dict.fromkeys(value))
    nodes = set(graph.nodes) - {"__start__"}
    unknown = [name for name in names if name not in nodes]
    if unknown:
        raise ServingError(
            422,
            f"{field}: graph has no node {', '.join(map(repr, unknown))}; its nodes: {', '.join(sorted(nodes))} (or '*')",
        )
    return names or None


def refuse_unsupported(webhook: str | None, after_seconds: float | None, feedback_keys: Sequence[str] | None) -> None:
    """Run options LangGraph Server has and this server does not: refused, not ignored.

    Raises:
        ServingError: 400 naming the field.
    """
    if webhook:
        raise ServingError(400, "webhook is not supported: follow the run with its stream, join or GET instead")
    if after_seconds:
        raise ServingError(400, "after_seconds is not supported: runs start when they are created")
    if feedback_keys:
        raise ServingError(400, "feedback_keys is not supported: this server has no LangSmith feedback")
