"""State and node names of the ``graphrag`` graph."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

from graphs.rag.state import Source

__all__ = [
    "ASSEMBLE",
    "CITE",
    "GENERATE",
    "GraphRagState",
    "GraphStatus",
    "LINK_AND_EXPAND",
    "NO_ANSWER",
    "RETRIEVE_CHUNKS",
    "REWRITE",
    "Source",
]

REWRITE = "rewrite"
"""A follow-up question becomes a standalone query (multi-turn only), as in ``rag``."""
LINK_AND_EXPAND = "link_and_expand"
"""The question's entities linked in the collection's graph, expanded k hops, facts
ranked (`KnowledgeGraph.retrieve`); runs at the same time as `RETRIEVE_CHUNKS`."""
RETRIEVE_CHUNKS = "retrieve_chunks"
"""Hybrid search of the collection's chunks, as ``rag``'s ``retrieve``."""
ASSEMBLE = "assemble"
"""One numbered context: the facts' source chunks and the graded chunks, interleaved,
and the facts that can cite one of them."""
GENERATE = "generate"
"""The model answers from the facts and the numbered sources."""
CITE = "cite"
"""If the answer cites nothing, a sources line is added: never an uncited answer."""
NO_ANSWER = "no_answer"
"""Neither retriever found anything usable: say so plainly."""

GraphStatus = Literal["ok", "no_graph", "timeout", "error"]
"""How the graph side went: ``ok``, ``no_graph`` (the collection has none: the answer
comes from chunks only), ``timeout`` (it took longer than the node's limit) or
``error`` (the graph store failed; logged, the answer comes from chunks)."""


class GraphRagState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    """The conversation; the answer is appended."""
    query: str
    """What was searched for: the rewrite of the last question, or the question."""
    collection: str
    """The collection searched (chunks and graph)."""
    candidates: list[dict[str, Any]]
    """Chunks from the vector search (`SearchHit.json()`), before grading."""
    linked: list[dict[str, Any]]
    """Entities of the graph the question was linked to (`LinkedEntity.json()`: ``id``,
    ``name``, ``type``, ``how`` (``exact``, ``alias``, ``vector``), ``score``, ``mention``)."""
    graph_facts: list[dict[str, Any]]
    """Facts the graph retrieval ranked (`RankedFact.json()`), best first, before
    assembly."""
    graph_status: GraphStatus
    """See `GraphStatus`."""
    sources: list[Source]
    """The chunks the answer may cite, numbered from 1 (facts' chunks and searched
    chunks). Also what clients show as ``citations``."""
    facts: list[dict[str, Any]]
    """The facts given to the model, best first: `RankedFact.json()` without the chunk
    texts (those are in ``sources``), plus ``cited_as``: the numbers of the sources
    that state it. Also what clients get as ``facts``."""
