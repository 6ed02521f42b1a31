"""Nodes of the ``rag`` graph, closed over the chat model and the knowledge base."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.guards import checked
from graphs.rag.prompts import ANSWER_PROMPT, NO_ANSWER_TEXT, REWRITE_PROMPT, format_sources
from graphs.rag.state import RagState, Source
from knowledge import CollectionNotAllowedError, KnowledgeBase
from knowledge.settings import RagSettings

__all__ = ["RagNodes"]

log = logging.getLogger(__name__)

Node = Callable[[RagState, Runtime[RunContext]], Awaitable[dict[str, Any]]]
_CITATION = re.compile(r"\[(\d{1,2})\]")


def _last_question(messages: list[AnyMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text if not isinstance(message.content, str) else message.content
    return ""


def _context(runtime: Runtime[RunContext]) -> RunContext:
    return runtime.context if runtime.context is not None else RunContext()


class RagNodes:
    """The graph's nodes.

    Args:
        model: the chat model that rewrites and answers.
        knowledge: where to search.
        settings: retrieval, grading and timeouts.
    """

    def __init__(self, model: BaseChatModel, knowledge: KnowledgeBase, settings: RagSettings) -> None:
        self._model = model
        self._knowledge = knowledge
        self._settings = settings

    def bound(self, runtime: Runtime[RunContext]) -> Any:
        """The chat model with the run's sampling parameters."""
        params = _context(runtime).model_params
        return self._model.bind(**params) if params else self._model

    async def rewrite(self, state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        messages = state["messages"]
        question = _last_question(messages)
        humans = sum(isinstance(m, HumanMessage) for m in messages)
        if not self._settings.rewrite or humans < 2:
            return {"query": question}
        conversation = "\n".join(f"{m.type}: {m.content}" for m in messages[-6:] if isinstance(m.content, str))
        try:
            async with asyncio.timeout(self._settings.node_timeout_s):
                # Tagged nostream: the rewrite is not part of the answer clients see.
                answer = await self.bound(runtime).with_config(tags=["nostream"]).ainvoke(
                    [HumanMessage(REWRITE_PROMPT.format(conversation=conversation))]
                )
        except TimeoutError:
            log.warning("query rewrite timed out after %ss; searching the question as asked", self._settings.node_timeout_s)
            return {"query": question}
        rewritten = " ".join(str(answer.content).split())[:500]
        return {"query": rewritten or question}

    def collection(self, runtime: Runtime[RunContext]) -> str:
        """The run's collection (else the default), if the tenant may use it.

        Raises:
            CollectionNotAllowedError: the tenant's ``collections`` do not allow it.
        """
        context = _context(runtime)
        name = context.collection or self._knowledge.settings.default_collection
        if "*" not in context.allowed_collections and name not in context.allowed_collections:
            raise CollectionNotAllowedError(name, context.tenant)
        return name

    async def retrieve(self, state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        collection = self.collection(runtime)
        question = _last_question(state["messages"])
        queries = list(dict.fromkeys(q for q in (state.get("query") or question, question) if q.strip()))
        k = self._settings.candidates
        try:
            async with asyncio.timeout(self._settings.node_timeout_s):
                # The question as asked and its rewrite are searched at the same time.
                results = await asyncio.gather(*(self._knowledge.search(collection, q, k=k) for q in queries))
        except TimeoutError:
            log.warning("retrieval from %r timed out after %ss", collection, self._settings.node_timeout_s)
            return {"candidates": [], "collection": collection}
        best: dict[str, dict[str, Any]] = {}
        for hits in results:
            for hit in hits:
                found = hit.json()
                kept = best.get(hit.chunk_id)
                if kept is None or (found["relevance"] or 0) > (kept["relevance"] or 0):
                    best[hit.chunk_id] = found
        ranked = sorted(best.values(), key=lambda h: h["relevance"] or 0, reverse=True)
        return {"candidates": ranked, "collection": collection}

    async def grade(self, state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        threshold = self._settings.min_relevance
        kept = [c for c in state.get("candidates", []) if (c.get("relevance") or 0) >= threshold]
        sources: list[Source] = [
            Source(
                index=i,
                doc_id=c["doc_id"],
                chunk_id=c["chunk_id"],
                title=c.get("title"),
                source=c.get("source", ""),
                heading=c.get("heading", ""),
                text=c["text"],
                relevance=round(float(c["relevance"]), 4),
            )
            for i, c in enumerate(kept[: self._settings.max_sources], start=1)
        ]
        return {"sources": sources}

    def generate(self) -> Node:
        @checked
        async def generate(state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
            system = SystemMessage(ANSWER_PROMPT.format(sources=format_sources(list(state["sources"]))))  # type: ignore[arg-type]
            conversation = [m for m in state["messages"] if not isinstance(m, SystemMessage)]
            answer = await self.bound(runtime).ainvoke([system, *conversation])
            return {"messages": [answer]}

        return generate

    async def cite(self, state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        answer = state["messages"][-1]
        sources = state.get("sources", [])
        text = answer.content if isinstance(answer.content, str) else ""
        cited = {int(n) for n in _CITATION.findall(text)} & {s["index"] for s in sources}
        if cited or not sources or answer.response_metadata.get("finish_reason") == "content_filter":
            return {}
        listed = "; ".join(f"[{s['index']}] {s['title'] or s['doc_id']}" for s in sources)
        return {"messages": [AIMessage(f"\n\nSources: {listed}", response_metadata={"finish_reason": "stop"})]}

    async def no_answer(self, state: RagState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        collection = state.get("collection") or self._knowledge.settings.default_collection
        return {"messages": [AIMessage(NO_ANSWER_TEXT.format(collection=collection), response_metadata={"finish_reason": "stop"})]}
