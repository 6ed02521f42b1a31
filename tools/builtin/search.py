"""``knowledge_search``: the knowledge layer's retriever as a tool."""

from __future__ import annotations

from pydantic import BaseModel, Field

from knowledge import CollectionNotAllowedError, KnowledgeBase
from tools.base import Tool, ToolContext

__all__ = ["knowledge_search"]


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for")
    k: int = Field(default=3, ge=1, le=10, description="How many passages")


def knowledge_search(knowledge: KnowledgeBase) -> Tool:
    """The tool over ``knowledge``; it searches the run's collection (or the default),
    within the tenant's allowed collections."""

    async def run(args: SearchArgs, context: ToolContext) -> str:
        collection = context.collection or knowledge.settings.default_collection
        if "*" not in context.allowed_collections and collection not in context.allowed_collections:
            raise CollectionNotAllowedError(collection, context.tenant)
        hits = await knowledge.search(collection, args.query, k=args.k)
        if not hits:
            return "No passages found."
        return "\n\n".join(f"[{h.doc_id}] {' '.join(h.text.split())}" for h in hits)

    return Tool(
        name="knowledge_search",
        description="Search the knowledge base; returns the most relevant passages with their document ids.",
        args_schema=SearchArgs,
        run=run,  # type: ignore[arg-type]
        timeout_s=15.0,
        idempotent=True,
        max_retries=1,
        examples=('User: What do our docs say about refunds? -> knowledge_search({"query": "refund policy"})',),
    )
