"""State and node names of the ``agent`` graph."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

__all__ = ["MODEL", "OUT_OF_STEPS", "TOOLS", "AgentState"]

MODEL = "model"
"""The model answers, or asks for tool calls (it is shown only the allowed tools)."""
TOOLS = "tools"
"""Every call is checked by the executor; approvals pause the run first."""
OUT_OF_STEPS = "out_of_steps"
"""The step budget is used up: the run ends with a message saying so."""


class AgentState(TypedDict, total=False):
    """The conversation only. What a run has spent (model turns, tool calls) is
    counted in `graphs.RunBudget`, in the run's context, never in state: state is
    what a client writes with ``input`` and ``command.update``."""

    messages: Annotated[list[AnyMessage], add_messages]
