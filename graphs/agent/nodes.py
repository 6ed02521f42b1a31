"""Nodes of the ``agent`` graph."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, InvalidToolCall, SystemMessage, ToolMessage
from langchain_core.messages.utils import message_chunk_to_message
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from graphs.agent.approvals import Approval, approval_request, parse_approval
from graphs.agent.prompts import system_prompt
from graphs.agent.state import MODEL, OUT_OF_STEPS, AgentState
from graphs.context import RunContext
from graphs.guards import checked
from tools import ToolContext, ToolExecutor, ToolPolicy, ToolRegistry

__all__ = ["AgentNodes"]


def _strict(full: Any) -> AIMessage:
    """The model's message, with every tool call whose arguments were not valid JSON
    as sent moved to ``invalid_tool_calls``. (LangChain parses streamed arguments
    leniently: ``{"a": "b`` would pass as ``{"a": "b"}``; the executor must refuse it.)"""
    message = message_chunk_to_message(full) if isinstance(full, AIMessageChunk) else full
    assert isinstance(message, AIMessage)
    raw = {c.get("id"): c.get("args") for c in getattr(full, "tool_call_chunks", None) or []}
    valid, invalid = [], list(message.invalid_tool_calls)
    for call in message.tool_calls:
        text = raw.get(call["id"])
        if isinstance(text, str) and text.strip():
            try:
                json.loads(text)
            except ValueError as exc:
                invalid.append(
                    InvalidToolCall(name=call["name"], args=text, id=call["id"], error=f"arguments are not valid JSON: {exc}")
                )
                continue
        valid.append(call)
    if len(valid) == len(message.tool_calls):
        return message
    return message.model_copy(update={"tool_calls": valid, "invalid_tool_calls": invalid})


def _context(runtime: Runtime[RunContext]) -> RunContext:
    # A graph invoked without a context (a test, a notebook) still gets a budget of
    # its own: RunContext() makes a new one.
    return runtime.context if runtime.context is not None else RunContext()


class AgentNodes:
    def __init__(self, model: BaseChatModel, registry: ToolRegistry, graph_tools: tuple[str, ...]) -> None:
        self._model = model
        self._registry = registry
        self._graph_tools = graph_tools

    def _executor(self, context: RunContext) -> ToolExecutor:
        settings = self._registry.settings
        policy = ToolPolicy.intersect(
            self._graph_tools,
            context.allowed_tools,
            self._registry.names(),
            max_tool_calls=settings.max_tool_calls,
            max_steps=settings.max_steps,
            require_approval=settings.require_approval,
        )
        tool_context = ToolContext(
            tenant=context.tenant, collection=context.collection, allowed_collections=context.allowed_collections
        )
        return ToolExecutor(
            self._registry, policy, tool_context, context.on_tool_call, calls_made=context.budget.tool_calls
        )

    def model(self) -> Any:
        @checked
        async def model(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
            context = _context(runtime)
            executor = self._executor(context)
            context.budget.model_turns += 1
            turns = context.budget.model_turns
            # The last turn, or a spent call budget: no tools are offered, the model answers.
            spent = turns >= executor.policy.max_steps or executor.calls_made >= executor.policy.max_tool_calls
            offered = [] if spent else executor.allowed_tools()
            bound: Any = self._model.bind_tools([t.for_model() for t in offered]) if offered else self._model
            if context.model_params:
                bound = bound.bind(**context.model_params)
            examples = [e for t in offered for e in t.examples]
            conversation = [m for m in state["messages"] if not isinstance(m, SystemMessage)]
            full: Any = None
            async for chunk in bound.astream([SystemMessage(system_prompt(examples)), *conversation]):
                full = chunk if full is None else full + chunk
            return {"messages": [_strict(full)]}

        return model

    async def tools(self, state: AgentState, runtime: Runtime[RunContext]) -> Command[Any]:
        """Run (or refuse) the last message's tool calls, then hand back to the model,
        or to ``out_of_steps`` when the run's model turns are used up."""
        context = _context(runtime)
        executor = self._executor(context)
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        # Approvals come first, before anything runs: a resumed node starts over, so
        # nothing may have been executed before an interrupt.
        # One interrupt per call, in order: a resumed node gets its answers back in
        # that order, so nothing a client echoes (a tool_call_id) is needed to match them.
        answers: dict[str, Approval] = {}
        for call in last.tool_calls:
            if executor.needs_approval(call["name"]) and context.approvals:
                tool, _, refusal = executor.check(call["name"], call["args"])
                if refusal is None and tool is not None:
                    request = approval_request(
                        tool=call["name"], args=call["args"], call_id=call["id"] or "", tool_description=tool.description
                    )
                    answers[call["id"] or ""] = parse_approval(interrupt(request), call["name"])
        results: list[ToolMessage] = []
        for bad in last.invalid_tool_calls:
            executor.calls_made += 1
            reason = f"the call could not be parsed ({bad.get('error') or 'malformed arguments'})"
            results.append(executor.refuse(bad.get("id") or "", bad.get("name") or "?", bad.get("args") or "", reason))
        for call in last.tool_calls:
            call_id, name, args = call["id"] or "", call["name"], call["args"]
            if executor.needs_approval(name) and not context.approvals:
                executor.calls_made += 1
                reason = executor.check(name, args)[2] or f"{name!r} needs a person's approval, which this run cannot ask for"
                results.append(executor.refuse(call_id, name, args, reason))
                continue
            approval = answers.get(call_id)
            if approval is not None and not approval.run:
                executor.calls_made += 1
                results.append(executor.refuse(call_id, name, args, approval.reason))
                continue
            if approval is not None and approval.args is not None:
                args = approval.args  # checked by the executor like the model's
            results.append(await executor.run(call_id, name, args))
        # Counted in the run's budget after each node (a resumed node starts over, and
        # the calls before its interrupt were not made).
        context.budget.tool_calls = executor.calls_made
        spent = context.budget.model_turns >= executor.policy.max_steps
        return Command(goto=OUT_OF_STEPS if spent else MODEL, update={"messages": results})

    async def out_of_steps(self, state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        limit = self._registry.settings.max_steps
        text = f"I stopped here: this run's budget of {limit} model turns is used up."
        return {"messages": [AIMessage(text, response_metadata={"finish_reason": "stop"})]}
