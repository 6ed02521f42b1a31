"""Prompts of the ``graphrag`` graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphs.rag.prompts import NO_ANSWER_TEXT, format_sources

__all__ = ["ANSWER_PROMPT", "NO_ANSWER_TEXT", "format_facts", "format_sources"]

ANSWER_PROMPT = """You answer questions using only the facts and the numbered sources below.
The facts come from a knowledge graph; the number after each fact is the source that states it.
When the answer needs more than one fact, follow them from one to the next.
Cite the sources you use with their numbers in square brackets, like [1] or [2].
If the facts and sources do not contain the answer, say that you do not know.

Facts:
{facts}

Sources:
{sources}"""


def format_facts(facts: Sequence[dict[str, Any]]) -> str:
    """One line per fact: ``- <subject> (<type>) <RELATION> <object> (<type>) [n]``."""
    if not facts:
        return "(none)"
    lines = []
    for fact in facts:
        cited = "".join(f"[{n}]" for n in fact.get("cited_as", []))
        lines.append(f"- {fact['text']} {cited}".rstrip())
    return "\n".join(lines)
