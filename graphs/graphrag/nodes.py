"""Nodes of the ``graphrag`` graph, closed over the chat model, the knowledge base and
the knowledge graph.

The chunk side (rewrite, hybrid search, the citation check, the no-answer message) is
the ``rag`` graph's own nodes (`graphs.rag.nodes.RagNodes`): one behaviour, one copy.
This module adds the graph side and the assembly of one context from both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.guards import checked
from graphs.graphrag.prompts import ANSWER_PROMPT, format_facts, format_sources
from graphs.graphrag.state import GraphRagState, Source
from graphs.rag.nodes import RagNodes
from knowledge import GraphNotFoundError, GraphStoreError, KnowledgeBase, KnowledgeGraph
from knowledge.settings import GraphRetrievalSettings, RagSettings

__all__ = ["GRAPH_EXTRA_SOURCES", "GraphRagNodes"]

log = logging.getLogger(__name__)

Node = Callable[[GraphRagState, Runtime[RunContext]], Awaitable[dict[str, Any]]]

GRAPH_EXTRA_SOURCES = 2
"""Chunks the context may hold beyond ``knowledge.rag.max_sources``: room for the
chunks only the graph found (a two-hop answer's second document), without crowding
out the searched ones. The local model's context (2048 tokens a slot) holds about six
chunks of 200 tokens with the facts, the prompt and a 256-token answer."""


def _context(runtime: Runtime[RunContext]) -> RunContext:
    return runtime.context if runtime.context is not None else RunContext()


def _interleave(first: list[str], second: list[str]) -> Iterator[str]:
    """``a1, b1, a2, b2, ...``, each id once."""
    seen: set[str] = set()
    for index in range(max(len(first), len(second))):
        for items in (first, second):
            if index < len(items) and items[index] not in seen:
                seen.add(items[index])
                yield items[index]


class GraphRagNodes:
    """The graph's own nodes.

    Args:
        model: the chat model that answers.
        knowledge: where chunks are searched.
        graph: the knowledge graph (entity linking and expansion).
        settings: the chunk side's retrieval, grading and timeouts (``knowledge.rag``).
        retrieval: the graph side's limits (``knowledge.graph.retrieval``): facts, hops.
    """

    def __init__(
        self,
        model: BaseChatModel,
        knowledge: KnowledgeBase,
        graph: KnowledgeGraph,
        settings: RagSettings,
        retrieval: GraphRetrievalSettings,
    ) -> None:
        self.rag = RagNodes(model, knowledge, settings)
        """The chunk side: ``rewrite``, ``retrieve``, ``cite``, ``no_answer``."""
        self._model = model
        self._knowledge = knowledge
        self._graph = graph
        self._settings = settings
        self._retrieval = retrieval

    async def link_and_expand(self, state: GraphRagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        # The chunk side's collection rule (it runs in the same step and checks it too).
        collection = self.rag.collection(runtime)
        question = state.get("query") or ""
        if not question.strip():
            return {"linked": [], "graph_facts": [], "graph_status": "ok"}
        try:
            async with asyncio.timeout(self._settings.node_timeout_s):
                found = await self._graph.retrieve(collection, question, max_facts=self._retrieval.max_facts)
        except GraphNotFoundError:
            # Not an error: a collection ingested without --graph still answers, from chunks.
            log.info("collection %r has no knowledge graph; answering from its chunks only", collection)
            return {"linked": [], "graph_facts": [], "graph_status": "no_graph"}
        except TimeoutError:
            log.warning("graph retrieval from %r timed out after %ss; answering from chunks", collection, self._settings.node_timeout_s)
            return {"linked": [], "graph_facts": [], "graph_status": "timeout"}
        except GraphStoreError as exc:
            # The graph store failed (a Neo4j server gone, an engine error): the chunks
            # still answer; the log says why the facts are missing.
            log.warning("graph retrieval from %r failed (%s); answering from chunks", collection, exc)
            return {"linked": [], "graph_facts": [], "graph_status": "error"}
        return {
            "linked": [link.json() for link in found.linked],
            "graph_facts": [fact.json() for fact in found.facts],
            "graph_status": "ok",
        }

    async def assemble(self, state: GraphRagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        """Number the chunks the model gets: the facts' chunks (in the facts' order) and
        the graded searched chunks (by relevance), taken in turn, at most
        ``max_sources + GRAPH_EXTRA_SOURCES``; then keep the facts stated by one of them."""
        threshold = self._settings.min_relevance
        searched = [c for c in state.get("candidates", []) if (c.get("relevance") or 0) >= threshold]
        searched = searched[: self._settings.max_sources]
        facts = state.get("graph_facts", [])
        chunks: dict[str, dict[str, Any]] = {}
        relevance: dict[str, float] = {}
        for chunk in searched:
            chunks[chunk["chunk_id"]] = chunk
            relevance[chunk["chunk_id"]] = float(chunk["relevance"])
        from_facts: list[str] = []
        for fact in facts:
            for source in fact.get("sources", []):
                chunks.setdefault(source["chunk_id"], source)
                from_facts.append(source["chunk_id"])
        limit = self._settings.max_sources + GRAPH_EXTRA_SOURCES
        order = list(_interleave(list(dict.fromkeys(from_facts)), [c["chunk_id"] for c in searched]))[:limit]
        sources: list[Source] = []
        for index, chunk_id in enumerate(order, start=1):
            chunk = chunks[chunk_id]
            sources.append(
                Source(
                    index=index,
                    doc_id=chunk["doc_id"],
                    chunk_id=chunk_id,
                    title=chunk.get("title"),
                    source=chunk.get("source", ""),
                    heading=chunk.get("heading", ""),
                    text=chunk["text"],
                    # A chunk only the graph found has no similarity to the question.
                    relevance=round(relevance.get(chunk_id, 0.0), 4),
                )
            )
        number = {s["chunk_id"]: s["index"] for s in sources}
        kept = []
        for fact in facts:
            cited = sorted({number[c] for c in fact.get("chunk_ids", []) if c in number})
            if cited:
                # The chunk texts are in ``sources``; a fact names them by number.
                kept.append({**{k: v for k, v in fact.items() if k != "sources"}, "cited_as": cited})
        return {"sources": sources, "facts": kept}

    def generate(self) -> Node:
        @checked
        async def generate(state: GraphRagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
            prompt = ANSWER_PROMPT.format(
                facts=format_facts(state.get("facts", [])),
                sources=format_sources(list(state["sources"])),  # type: ignore[arg-type]
            )
            conversation = [m for m in state["messages"] if not isinstance(m, SystemMessage)]
            answer = await self.rag.bound(runtime).ainvoke([SystemMessage(prompt), *conversation])
            return {"messages": [answer]}

        return generate
