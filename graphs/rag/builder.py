"""Builder of the ``rag`` graph.

``START → rewrite → retrieve → grade → generate → cite → END``, or
``grade → no_answer → END`` when no chunk passes grading: never an error for a
question the collection cannot answer, never an answer without citations.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from graphs.context import RunContext
from graphs.deps import GraphDeps
from graphs.rag.nodes import RagNodes
from graphs.rag.state import CITE, GENERATE, GRADE, NO_ANSWER, RETRIEVE, REWRITE, RagState

__all__ = ["make_graph"]


def make_graph(deps: GraphDeps) -> StateGraph[RagState, RunContext]:
    """The ``rag`` graph over ``deps.knowledge``, answering with ``deps.model``.

    Raises:
        ValueError: the platform has no knowledge base.
    """
    if deps.knowledge is None:
        raise ValueError("the rag graph needs the knowledge base (GraphDeps.knowledge)")
    nodes = RagNodes(deps.model, deps.knowledge, deps.knowledge.settings.rag)
    builder = StateGraph(RagState, context_schema=RunContext)
    builder.add_node(REWRITE, nodes.rewrite)
    builder.add_node(RETRIEVE, nodes.retrieve)
    builder.add_node(GRADE, nodes.grade)
    builder.add_node(GENERATE, nodes.generate())
    builder.add_node(CITE, nodes.cite)
    builder.add_node(NO_ANSWER, nodes.no_answer)
    builder.add_edge(START, REWRITE)
    builder.add_edge(REWRITE, RETRIEVE)
    builder.add_edge(RETRIEVE, GRADE)
    builder.add_conditional_edges(GRADE, lambda state: GENERATE if state.get("sources") else NO_ANSWER, [GENERATE, NO_ANSWER])
    builder.add_edge(GENERATE, CITE)
    builder.add_edge(CITE, END)
    builder.add_edge(NO_ANSWER, END)
    return builder
