"""Builder of the ``agent`` graph: ``model → tools → model …`` within a step budget.

``START → model``; after ``model``: ``tools`` if it asked for tool calls, else
``END``; ``tools`` hands back to ``model``, or to ``out_of_steps`` when the run's
model turns are used up (counted in the run's `graphs.RunBudget`, not in state). The model is only shown the tools the policy allows, and on its last turn
none; the ``tools`` node refuses anything else it sends (`tools.ToolExecutor`).
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from graphs.agent.nodes import AgentNodes
from graphs.agent.state import MODEL, OUT_OF_STEPS, TOOLS, AgentState
from graphs.context import RunContext
from graphs.deps import GraphDeps

__all__ = ["make_graph"]


def make_graph(deps: GraphDeps) -> StateGraph[AgentState, RunContext]:
    """Raises:
    ValueError: the platform has no tool registry, or the graph's tool list names a
        tool that does not exist (a typo in the config is caught at start-up).
    """
    if deps.tools is None:
        raise ValueError("the agent graph needs the tool registry (GraphDeps.tools)")
    for name in deps.tool_names:
        if name != "*" and deps.tools.find(name) is None:
            raise ValueError(f"unknown tool {name!r} in the graph's tools (tools: {', '.join(deps.tools.names())})")
    nodes = AgentNodes(deps.model, deps.tools, deps.tool_names)
    builder = StateGraph(AgentState, context_schema=RunContext)
    builder.add_node(MODEL, nodes.model())
    builder.add_node(TOOLS, nodes.tools, destinations=(MODEL, OUT_OF_STEPS))
    builder.add_node(OUT_OF_STEPS, nodes.out_of_steps)
    builder.add_edge(START, MODEL)

    def after_model(state: AgentState) -> str:
        last = state["messages"][-1]
        asked = bool(getattr(last, "tool_calls", None) or getattr(last, "invalid_tool_calls", None))
        return TOOLS if asked else END

    builder.add_conditional_edges(MODEL, after_model, [TOOLS, END])
    builder.add_edge(OUT_OF_STEPS, END)
    return builder
