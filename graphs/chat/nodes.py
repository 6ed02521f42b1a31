"""Nodes of the ``chat`` graph."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langgraph.runtime import Runtime

from graphs.chat.state import ChatState
from graphs.context import RunContext
from graphs.guards import checked

__all__ = ["make_call_model"]


def make_call_model(
    model: BaseChatModel, system_prompt: str
) -> Callable[[ChatState, Runtime[RunContext]], Awaitable[dict[str, Any]]]:
    """The model-calling node, closed over the shared chat model.

    The node binds the request's sampling parameters from the run context, prepends
    ``system_prompt`` unless the conversation starts with a system message, and
    returns the model's answer, checked against the run's output policy
    (`graphs.guards.checked`). Under ``stream_mode="messages"`` LangGraph streams the
    answer token by token as the model produces it.
    """

    @checked
    async def call_model(state: ChatState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        messages = list(state["messages"])
        if not messages or messages[0].type != "system":
            messages.insert(0, SystemMessage(system_prompt))
        params = runtime.context.model_params if runtime.context is not None else {}
        bound = model.bind(**params) if params else model
        answer = await bound.ainvoke(messages)
        return {"messages": [answer]}

    return call_model
