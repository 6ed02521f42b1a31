"""State and node names of the ``chat`` graph."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

__all__ = ["CALL_MODEL", "ChatState"]

CALL_MODEL = "call_model"
"""The one node: send the conversation to the model, append its answer."""


class ChatState(TypedDict):
    """The conversation so far."""

    messages: Annotated[list[AnyMessage], add_messages]
    """Messages in order; nodes return new ones and ``add_messages`` appends them."""
