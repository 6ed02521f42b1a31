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
    messages: Annotated[list[AnyMessage], add_messages]
    steps: int
    """Model turns taken."""
    tool_calls: int
    """Tool calls attempted (the budget counts refused ones too)."""
