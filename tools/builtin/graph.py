"""``graph_neighbors``: the knowledge graph's k-hop expansion as a tool."""

from __future__ import annotations

from pydantic import BaseModel, Field

from knowledge import CollectionNotAllowedError, GraphNotFoundError, KnowledgeGraph
from tools.base import Tool, ToolContext

__all__ = ["GraphNeighborsArgs", "graph_neighbors"]

MAX_FACTS = 30
"""Fact lines one call returns at most (a small model's context is short)."""


class GraphNeighborsArgs(BaseModel):
    name: str = Field(min_length=1, max_length=200, description="The name of an office, document, procedure... to look up")
    hops: int = Field(default=1, ge=1, le=3, description="How far to follow relations from it (1 to 3)")


def graph_neighbors(graph: KnowledgeGraph) -> Tool:
    """The tool over ``graph``: the facts within ``hops`` of the entities named ``name``
    (its name or an alias) in the run's collection (or the default), within the
    tenant's allowed collections. One fact a line, with the documents that state it::

        Separation Certificate (Document) ISSUED_INSTEAD_BY Labour Arbitration Office (Office) [32-separation-certificate.md]

    A collection without a graph, or a name the graph does not know, is an answer
    saying so (the model can search the chunks instead), not an error.
    """

    async def run(args: GraphNeighborsArgs, context: ToolContext) -> str:
        collection = context.collection or graph.knowledge.settings.default_collection
        if "*" not in context.allowed_collections and collection not in context.allowed_collections:
            raise CollectionNotAllowedError(collection, context.tenant)
        try:
            found = await graph.neighbors(collection, args.name, hops=args.hops, limit=MAX_FACTS)
        except GraphNotFoundError:
            return f"The collection {collection!r} has no knowledge graph; search its passages instead."
        if not found.matched:
            return f"No entity named {args.name!r} in the knowledge graph."
        if not found.facts:
            named = ", ".join(f"{e.name} ({e.type})" for e in found.matched)
            return f"{named}: no relations recorded."
        return "\n".join(f"{fact.text()} [{', '.join(fact.doc_ids)}]" for fact in found.facts)

    return Tool(
        name="graph_neighbors",
        description=(
            "Look up an office, document or procedure in the knowledge graph; returns the facts around it "
            "(what it requires, who issues or handles it), each with the documents that state it."
        ),
        args_schema=GraphNeighborsArgs,
        run=run,  # type: ignore[arg-type]
        timeout_s=15.0,
        idempotent=True,
        max_retries=1,
        examples=(
            'User: Who issues the Separation Certificate? -> graph_neighbors({"name": "Separation Certificate", "hops": 1})',
        ),
    )
