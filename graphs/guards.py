"""Output checks: redact or block what a model says before it leaves the platform.

An `OutputPolicy` (filled per request by the serving layer from the global and the
tenant's lists, carried in `RunContext.output_policy`) has:

- ``redact``: terms replaced by ``[redacted]`` (case-insensitive, whole words);
- ``redact_patterns``: regular expressions replaced the same way (e-mail addresses,
  card or account numbers...);
- ``block``: terms that stop the answer (``finish_reason: "content_filter"``).

Applied to every text that leaves the server, not only the model's answer: citations,
tool results, tool-call arguments, interrupts and any state value (`checked_value`
walks a value: messages, dicts, lists, interrupts). Redaction is idempotent (a match
lying within a ``[redacted]`` marker is kept as it is; one that runs past a marker is
redacted, so output cannot shield text by writing the marker), so a text checked when it was
written and again where it leaves reads the same on every path.

It is enforced in two places, so that no unchecked text is visible anywhere:

- in the graph: `checked` wraps a model-calling node, so the message it returns (what
  ``values``/``updates`` events, the thread's state and a whole answer carry) is
  already checked. A separate check node after the model's would be too late: the
  model node's own ``updates`` event and the step's ``values`` would carry the raw text.
- on the token stream: `StreamGuard` checks text arriving in pieces, holding back
  the last ``hold`` characters so that a term split across tokens is still caught
  before any part of it is sent. A policy adds that many characters of latency to a
  stream, and nothing without one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, time
from enum import Enum
from functools import cached_property
from typing import Any, Literal
from uuid import UUID

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.types import Interrupt
from pydantic import BaseModel

__all__ = [
    "REDACTED",
    "OutputBlockedError",
    "OutputPolicy",
    "OutputVerdict",
    "StreamGuard",
    "checked",
    "checked_value",
]

REDACTED = "[redacted]"


class OutputBlockedError(Exception):
    """The answer contains a blocked term.

    Attributes:
        term: the term found (as written in the answer).
    """

    def __init__(self, term: str) -> None:
        self.term = term
        # The message does not repeat the term: it may be what the policy protects.
        super().__init__("the answer was withheld by the output check (it contained a blocked term)")


@dataclass(frozen=True, slots=True)
class OutputVerdict:
    text: str
    """The text to show (redacted), or the refusal when blocked."""
    redactions: int
    blocked: str | None
    """The blocked term found, if any."""


def _words(terms: tuple[str, ...]) -> str:
    return r"\b(?:" + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)) + r")\b"


def _marker_spans(text: str) -> list[tuple[int, int]]:
    """Where ``[redacted]`` markers are in ``text``."""
    spans, start = [], text.find(REDACTED)
    while start != -1:
        spans.append((start, start + len(REDACTED)))
        start = text.find(REDACTED, start + len(REDACTED))
    return spans


def _within(match: re.Match[str], markers: list[tuple[int, int]]) -> bool:
    """The match lies inside one marker (it would only rewrite the marker)."""
    return any(start <= match.start() and match.end() <= end for start, end in markers)


@dataclass(frozen=True)
class OutputPolicy:
    """What to redact and what to block in answers. Empty: nothing is checked."""

    redact: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    pattern_hold: int = 64
    """The longest text a ``redact_patterns`` match may span, in characters (how much
    of a stream is held back when patterns are set)."""

    def __post_init__(self) -> None:
        for pattern in self.redact_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid output redact pattern {pattern!r}: {exc}") from None

    @property
    def active(self) -> bool:
        return bool(self.redact or self.redact_patterns or self.block)

    @cached_property
    def _redact(self) -> re.Pattern[str] | None:
        parts = ([_words(tuple(self.redact))] if self.redact else []) + [f"(?:{p})" for p in self.redact_patterns]
        return re.compile("|".join(parts), re.I) if parts else None

    @cached_property
    def _block(self) -> re.Pattern[str] | None:
        return re.compile(_words(tuple(self.block)), re.I) if self.block else None

    @cached_property
    def hold(self) -> int:
        """Characters a stream holds back: enough that any match still being written
        starts after what has been released."""
        longest = max((len(t) for t in (*self.redact, *self.block)), default=0)
        return max(longest, self.pattern_hold if self.redact_patterns else 0)

    def blocked_term(self, text: str) -> str | None:
        match = self._block.search(text) if self._block is not None else None
        return match.group(0) if match else None

    def check(self, text: str) -> OutputVerdict:
        """Check a whole text."""
        if (term := self.blocked_term(text)) is not None:
            return OutputVerdict(text=str(OutputBlockedError(term)), redactions=0, blocked=term)
        if self._redact is None:
            return OutputVerdict(text=text, redactions=0, blocked=None)
        # The pattern always runs over the whole text, so that a match may span a
        # marker (``password: [redacted]hunter2``: model output can write the marker
        # too). A match lying within a marker is kept as it is, so that checking
        # twice reads as checking once even under a pattern that matches the marker
        # or a part of it.
        markers = _marker_spans(text)
        count = 0

        def replace(match: re.Match[str]) -> str:
            nonlocal count
            if _within(match, markers):
                return match.group(0)
            count += 1
            return REDACTED

        redacted = self._redact.sub(replace, text)
        return OutputVerdict(text=redacted, redactions=count, blocked=None)

    def redact_spans(self, text: str, end: int) -> tuple[str, int, int]:
        """``text[:end]`` redacted, using matches found in the whole ``text`` (so word
        boundaries see what follows); where the release may end (before any match that
        crosses ``end``); and the number of redactions."""
        if self._redact is None:
            return text[:end], end, 0
        count = 0
        out: list[str] = []
        position = 0
        markers = _marker_spans(text)
        for match in self._redact.finditer(text):
            if match.start() >= end:
                break
            if match.end() > end:  # crosses the cut: release up to its start only
                end = match.start()
                break
            if _within(match, markers):  # kept as it is (see `check`)
                continue
            out += [text[position : match.start()], REDACTED]
            position = match.end()
            count += 1
        out.append(text[position:end])
        return "".join(out), end, count


class StreamGuard:
    """An `OutputPolicy` over one message's text arriving in pieces."""

    def __init__(self, policy: OutputPolicy) -> None:
        self._policy = policy
        self._pending = ""
        self.redactions = 0
        """Redactions made so far."""

    def feed(self, piece: str) -> str:
        """The text safe to send now (possibly empty).

        Raises:
            OutputBlockedError: the text so far contains a blocked term.
        """
        self._pending += piece
        self._check_block()
        cut = len(self._pending) - self._policy.hold
        if cut <= 0:
            return ""
        return self._release(cut)

    def flush(self) -> str:
        """The rest, at the end of the message.

        Raises:
            OutputBlockedError: the text contains a blocked term.
        """
        self._check_block()
        return self._release(len(self._pending))

    def _check_block(self) -> None:
        # Released text never holds the start of a term still being written (see
        # `OutputPolicy.hold`), so the pending text is all there is to search.
        term = self._policy.blocked_term(self._pending)
        if term is not None:
            raise OutputBlockedError(term)

    def _release(self, cut: int) -> str:
        text, cut, count = self._policy.redact_spans(self._pending, cut)
        self.redactions += count
        self._pending = self._pending[cut:]
        return text


def checked(node: Callable[..., Awaitable[dict[str, Any]]]) -> Callable[..., Awaitable[dict[str, Any]]]:
    """Wrap a model-calling node: the AI messages it returns are checked against the
    run's `OutputPolicy` (``runtime.context.output_policy``) before they reach the
    state. A blocked answer becomes the refusal, with ``finish_reason:
    "content_filter"``; the model's text is not kept."""

    async def wrapper(state: Any, runtime: Any) -> dict[str, Any]:
        update = await node(state, runtime)
        context = getattr(runtime, "context", None)
        policy: OutputPolicy | None = getattr(context, "output_policy", None)
        if policy is None or not policy.active or not isinstance(update, dict):
            return update
        messages = update.get("messages")
        if not isinstance(messages, list):
            return update
        return {**update, "messages": [_check_message(m, policy) for m in messages]}

    wrapper.__name__ = getattr(node, "__name__", "node")
    wrapper.__doc__ = node.__doc__
    return wrapper


def _check_message(message: Any, policy: OutputPolicy) -> Any:
    if not isinstance(message, AIMessage) or not isinstance(message.content, str):
        return message
    verdict = policy.check(message.content)
    if verdict.blocked is not None:
        metadata = {**message.response_metadata, "finish_reason": "content_filter"}
        return message.model_copy(update={"content": verdict.text, "tool_calls": [], "response_metadata": metadata})
    if verdict.redactions:
        return message.model_copy(update={"content": verdict.text})
    return message


class _ValueCheck:
    """One walk of `checked_value`: what it redacted, what it does on a block."""

    def __init__(self, policy: OutputPolicy, block: Literal["raise", "replace"]) -> None:
        self.policy = policy
        self.block = block
        self.redactions = 0

    def text(self, text: str) -> str:
        verdict = self.policy.check(text)
        if verdict.blocked is not None and self.block == "raise":
            raise OutputBlockedError(verdict.blocked)
        self.redactions += verdict.redactions
        return verdict.text

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, BaseMessage):
            return self.message(value)
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, Interrupt):
            return Interrupt(value=self.value(value.value), id=value.id)
        if isinstance(value, tuple):
            return tuple(self.value(item) for item in value)
        if isinstance(value, (set, frozenset)):  # as the wire carries it: a list
            return [self.value(item) for item in value]
        if value is None or isinstance(value, (bool, int, float, datetime, date, time, UUID)):
            return value  # no text in it
        if isinstance(value, Enum):
            return self.value(value.value)
        if isinstance(value, BaseModel):  # as the wire would carry it
            return self.value(value.model_dump())
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self.value(dataclasses.asdict(value))
        if isinstance(value, BaseException):
            # Its text may reveal internals: the serving layer maps exceptions to
            # their client message before checking; here only the type is kept.
            return type(value).__name__
        # Anything else would reach the wire as its text (`repr`): checked as text.
        return self.text(str(value))

    def content(self, content: Any) -> Any:
        if isinstance(content, str):
            return self.text(content)
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, str):
                    part = self.text(part)
                elif isinstance(part, dict) and isinstance(part.get("text"), str):
                    part = {**part, "text": self.text(part["text"])}
                parts.append(part)
            return parts
        return content

    def message(self, message: BaseMessage) -> BaseMessage:
        """The message's texts checked: content, tool-call arguments (parsed, raw,
        invalid), ``additional_kwargs`` (raw tool calls, reasoning) and a tool's
        artifact; its ids, names and metadata are left as they are."""
        update: dict[str, Any] = {"content": self.content(message.content)}
        if message.additional_kwargs:
            update["additional_kwargs"] = self.value(message.additional_kwargs)
        for field in ("tool_calls", "invalid_tool_calls", "tool_call_chunks"):
            calls = getattr(message, field, None)
            if calls:
                update[field] = [{**call, "args": self.value(call.get("args"))} for call in calls]
        if getattr(message, "artifact", None) is not None:
            update["artifact"] = self.value(message.artifact)  # type: ignore[attr-defined]
        return message.model_copy(update=update)


def checked_value(value: Any, policy: OutputPolicy, *, block: Literal["raise", "replace"]) -> tuple[Any, int]:
    """``value`` with every text in it checked against ``policy``, and the number of
    redactions made. The value itself is not changed (a checked copy is returned).

    Walks strings, LangChain messages (their texts only, see `_ValueCheck.message`),
    dicts (values, not keys), lists, tuples, sets (as lists), interrupts, pydantic
    models and dataclasses (as the wire would carry them: dicts). Numbers, booleans,
    dates and UUIDs are kept; an exception becomes its type's name (never its text);
    any other object becomes its text, checked.

    Args:
        block: what a text holding a blocked term becomes: ``"raise"`` stops (a run
            whose output is being sent), ``"replace"`` puts the refusal in its place
            (a stored state read back: there is no run to stop).

    Raises:
        OutputBlockedError: with ``block="raise"``, a text holds a blocked term.
    """
    walk = _ValueCheck(policy, block)
    return walk.value(value), walk.redactions
