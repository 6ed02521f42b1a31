"""State and node names of the ``rag`` graph."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

__all__ = ["CITE", "GENERATE", "GRADE", "NO_ANSWER", "RETRIEVE", "REWRITE", "RagState", "Source"]

REWRITE = "rewrite"
"""A follow-up question becomes a standalone search query (multi-turn only)."""
RETRIEVE = "retrieve"
"""Hybrid search of the collection (the question and its rewrite, concurrently)."""
GRADE = "grade"
"""Keep the chunks whose relevance passes the threshold, best first."""
GENERATE = "generate"
"""The model answers from the numbered sources."""
CITE = "cite"
"""If the answer cites nothing, a sources line is added: never an uncited answer."""
NO_ANSWER = "no_answer"
"""Nothing passed grading: say so plainly."""


class Source(TypedDict):
    """A chunk given to the model, as cited: ``[index]``."""

    index: int
    doc_id: str
    chunk_id: str
    title: str | None
    source: str
    heading: str
    text: str
    relevance: float


class RagState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    """The conversation; the answer is appended."""
    query: str
    """What was searched for: the rewrite of the last question, or the question."""
    candidates: list[dict[str, Any]]
    """Retrieved chunks (`SearchHit.json()`), before grading."""
    sources: list[Source]
    """The chunks the answer may cite, numbered from 1. Also what clients show."""
    collection: str
    """The collection searched."""
