"""Output checks: redact or block what a model says before it leaves the platform.

An `OutputPolicy` (filled per request by the serving layer from the global and the
tenant's lists, carried in `RunContext.output_policy`) has:

- ``redact``: terms replaced by ``[redacted]`` (case-insensitive, whole words);
- ``redact_patterns``: regular expressions replaced the same way (e-mail addresses,
  card or account numbers...);
- ``block``: terms that stop the answer (``finish_reason: "content_filter"``).

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

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from langchain_core.messages import AIMessage

__all__ = ["REDACTED", "OutputBlockedError", "OutputPolicy", "OutputVerdict", "StreamGuard", "checked"]

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
        redacted, count = self._redact.subn(REDACTED, text)
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
        for match in self._redact.finditer(text):
            if match.start() >= end:
                break
            if match.end() > end:  # crosses the cut: release up to its start only
                end = match.start()
                break
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
