"""Builder of the ``graphrag`` graph.

``START → rewrite → (link_and_expand ∥ retrieve_chunks) → assemble → generate → cite →
END``, or ``assemble → no_answer → END`` when neither side found anything usable.
``link_and_expand`` links the question's entities in the collection's knowledge graph,
expands k hops and ranks the facts; ``retrieve_chunks`` searches the chunks (as ``rag``
does) in the same step. ``assemble`` numbers one context of chunks, the facts' source
chunks among them, so an answer that follows two facts cites both documents.

A collection without a graph answers from its chunks alone (logged), never an error.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from graphs.context import RunContext
from graphs.deps import GraphDeps
from graphs.graphrag.nodes import GraphRagNodes
from graphs.graphrag.state import (
    ASSEMBLE,
    CITE,
    GENERATE,
    LINK_AND_EXPAND,
    NO_ANSWER,
    RETRIEVE_CHUNKS,
    REWRITE,
    GraphRagState,
)

__all__ = ["make_graph"]


def make_graph(deps: GraphDeps) -> StateGraph[GraphRagState, RunContext]:
    """The ``graphrag`` graph over ``deps.knowledge`` and ``deps.graph``, answering with
    ``deps.model``; limits from ``knowledge.rag`` (chunks, grading, timeouts) and
    ``knowledge.graph.retrieval`` (facts, hops).

    Raises:
        ValueError: the platform has no knowledge base or no knowledge graph.
    """
    if deps.knowledge is None:
        raise ValueError("the graphrag graph needs the knowledge base (GraphDeps.knowledge)")
    if deps.graph is None:
        raise ValueError("the graphrag graph needs the knowledge graph (GraphDeps.graph): configure knowledge.graph")
    nodes = GraphRagNodes(
        deps.model, deps.knowledge, deps.graph, deps.knowledge.settings.rag, deps.graph.settings.retrieval
    )
    builder = StateGraph(GraphRagState, context_schema=RunContext)
    builder.add_node(REWRITE, nodes.rag.rewrite)  # type: ignore[arg-type]
    builder.add_node(LINK_AND_EXPAND, nodes.link_and_expand)
    builder.add_node(RETRIEVE_CHUNKS, nodes.rag.retrieve)  # type: ignore[arg-type]
    builder.add_node(ASSEMBLE, nodes.assemble)
    builder.add_node(GENERATE, nodes.generate())
    builder.add_node(CITE, nodes.rag.cite)  # type: ignore[arg-type]
    builder.add_node(NO_ANSWER, nodes.rag.no_answer)  # type: ignore[arg-type]
    builder.add_edge(START, REWRITE)
    builder.add_edge(REWRITE, LINK_AND_EXPAND)
    builder.add_edge(REWRITE, RETRIEVE_CHUNKS)
    # Both branches end before assembly starts (a join, not two runs of it).
    builder.add_edge([LINK_AND_EXPAND, RETRIEVE_CHUNKS], ASSEMBLE)
    builder.add_conditional_edges(ASSEMBLE, lambda state: GENERATE if state.get("sources") else NO_ANSWER, [GENERATE, NO_ANSWER])
    builder.add_edge(GENERATE, CITE)
    builder.add_edge(CITE, END)
    builder.add_edge(NO_ANSWER, END)
    return builder
