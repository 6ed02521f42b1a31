"""Input filter: refuse requests that contain a sensitive term.

Terms come from ``guardrails.blocked_terms`` (every tenant) and each tenant's own
``blocked_terms``. Matching is case-insensitive on whole words (``secret`` does not
match ``secretary``). A refusal names the term and which list it is on, so the caller
knows what to change; nothing of the request reaches a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict

from serving.auth import Principal
from serving.errors import RequestError

__all__ = ["GuardrailSettings", "InputFilter", "message_texts"]


class GuardrailSettings(BaseModel):
    """The ``guardrails`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocked_terms: tuple[str, ...] = ()
    """Terms refused for every tenant."""


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


class InputFilter:
    """Checks request texts against the global and the caller's tenant lists."""

    def __init__(self, settings: GuardrailSettings) -> None:
        self._global = tuple(settings.blocked_terms)

    def check(self, texts: Iterable[str], principal: Principal, *, param: str = "messages") -> None:
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
