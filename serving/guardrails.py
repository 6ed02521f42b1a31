"""Guardrails: the input filter and the output policy, from global and tenant lists.

Input: a request that contains a sensitive term is refused. Terms come from
``guardrails.blocked_terms`` (every tenant) and each tenant's own ``blocked_terms``.
Matching is case-insensitive on whole words (``secret`` does not match
``secretary``). A refusal names the term and which list it is on, so the caller knows
what to change; nothing of the request reaches a model.

Output: `Guardrails.output_policy` is the `graphs.guards.OutputPolicy` of a caller
(``guardrails.output_*`` plus the tenant's ``output_*`` lists). It applies to every
text that leaves the server, wherever it leaves:

- answers are checked in the graph's model nodes (`graphs.checked`, so the model's
  own next turn sees the checked text) and on the token stream of both protocols;
- everything else a run sends (citations, tool results, tool-call arguments, state
  events, interrupts) is checked where it is sent (`OutputGuard.check_value`,
  `OutputGuard.feed` for streamed tool-call arguments): a blocked term stops the run,
  as in an answer;
- a thread's stored state is left as the graph wrote it and checked where it is read
  back (state, history, thread values, ``join``: `checked_for_reading`), with the
  reader's policy; a text holding a blocked term reads as the refusal.

Redaction is one function of the text (`OutputPolicy.check`, idempotent), so a text
reads the same on every path that shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from graphs import OutputBlockedError, OutputPolicy, StreamGuard, checked_value
from serving.auth import Principal, TenantSettings
from serving.errors import RequestError

__all__ = ["GuardrailSettings", "Guardrails", "OutputGuard", "checked_for_reading", "message_texts"]


class GuardrailSettings(BaseModel):
    """The ``guardrails`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocked_terms: tuple[str, ...] = ()
    """Terms refused in every tenant's input."""
    output_redact_terms: tuple[str, ...] = ()
    """Terms replaced by ``[redacted]`` in every answer (whole words, any case)."""
    output_redact_patterns: tuple[str, ...] = ()
    """Regular expressions replaced by ``[redacted]`` in every answer."""
    output_pattern_max_chars: int = Field(default=64, ge=1, le=4096)
    """The longest text a pattern match may span: how much of a stream is held back
    while patterns are set."""
    output_block_terms: tuple[str, ...] = ()
    """Terms that stop an answer (``finish_reason: "content_filter"``)."""

    @field_validator("output_redact_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return patterns


@lru_cache(maxsize=256)
def _pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    if not terms:
        return None
    return re.compile(r"\b(" + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)) + r")\b", re.I)


def message_texts(messages: Iterable[Any]) -> Iterable[str]:
    """The text of OpenAI- or LangChain-style messages (dicts or objects)."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]


class Guardrails:
    """The global lists, combined with each caller's tenant lists."""

    def __init__(self, settings: GuardrailSettings) -> None:
        self._settings = settings
        self._global = tuple(settings.blocked_terms)

    def output_policy(self, principal: Principal) -> OutputPolicy | None:
        """The caller's output policy, or None when nothing is to be checked."""
        return _output_policy(self._settings, principal.settings)

    def check_input(self, texts: Iterable[str], principal: Principal, *, param: str = "messages") -> None:
        """Raises:
            RequestError: naming the first blocked term found and its list.
        """
        lists = (("global", _pattern(self._global)), (f"tenant {principal.tenant!r}", _pattern(principal.settings.blocked_terms)))
        active = [(name, pattern) for name, pattern in lists if pattern is not None]
        if not active:
            return
        for text in texts:
            for name, pattern in active:
                if match := pattern.search(text):
                    raise RequestError(
                        f"input refused: it contains {match.group(0)!r}, a blocked term on the {name} list",
                        param=param,
                        code="content_blocked",
                    )


@lru_cache(maxsize=256)
def _output_policy(settings: GuardrailSettings, tenant: TenantSettings) -> OutputPolicy | None:
    policy = OutputPolicy(
        redact=(*settings.output_redact_terms, *tenant.output_redact_terms),
        redact_patterns=settings.output_redact_patterns,
        block=(*settings.output_block_terms, *tenant.output_block_terms),
        pattern_hold=settings.output_pattern_max_chars,
    )
    return policy if policy.active else None


class OutputGuard:
    """One run's output check on the wire: a `StreamGuard` per answer being streamed
    (an OpenAI choice index, a LangGraph message id), and what it did."""

    def __init__(self, policy: OutputPolicy | None) -> None:
        self.policy = policy
        self._streams: dict[Any, StreamGuard] = {}
        self._flushed = 0
        self.blocked: str | None = None
        """The blocked term found (for the audit log; never sent to the client)."""

    @property
    def active(self) -> bool:
        return self.policy is not None

    def feed(self, key: Any, text: str) -> str:
        """The part of ``text`` (the next piece of answer ``key``) safe to send now.

        Raises:
            OutputBlockedError: the answer contains a blocked term.
        """
        if self.policy is None:
            return text
        guard = self._streams.get(key)
        if guard is None:
            guard = self._streams[key] = StreamGuard(self.policy)
        try:
            return guard.feed(text)
        except OutputBlockedError as exc:
            self.blocked = exc.term
            raise

    def flush(self, key: Any) -> str:
        """The rest of answer ``key`` (its end has come).

        Raises:
            OutputBlockedError: the answer contains a blocked term.
        """
        guard = self._streams.pop(key, None)
        if guard is None:
            return ""
        try:
            return guard.flush()
        except OutputBlockedError as exc:
            self.blocked = exc.term
            raise
        finally:
            self._flushed += guard.redactions

    def pending(self) -> list[Any]:
        """The keys of the streams holding text back."""
        return list(self._streams)

    def check_value(self, value: Any) -> Any:
        """A checked copy of a value about to be sent whole (citations, a tool result,
        a state event): every text in it redacted.

        Raises:
            OutputBlockedError: a text in it holds a blocked term (the run stops).
        """
        if self.policy is None:
            return value
        try:
            checked, count = checked_value(value, self.policy, block="raise")
        except OutputBlockedError as exc:
            self.blocked = exc.term
            raise
        self._flushed += count
        return checked

    @property
    def redactions(self) -> int:
        return self._flushed + sum(g.redactions for g in self._streams.values())


def checked_for_reading(value: Any, policy: OutputPolicy | None) -> Any:
    """A stored value (thread state) as the reader may see it: texts redacted, and a
    text holding a blocked term replaced by the refusal (a read has no run to stop)."""
    if policy is None:
        return value
    return checked_value(value, policy, block="replace")[0]
