"""Approvals of the ``agent`` graph: what a paused run shows, and what a person may answer.

The interrupt value is LangGraph's ``HumanInterrupt`` (``langgraph.prebuilt.interrupt``,
now ``langchain.agents.interrupt``), the shape Agent Inbox and Agent Chat UI (before its
1.0 schema) render with accept / edit / respond / ignore buttons. The same object also
carries LangChain 1.0's ``HITLRequest`` keys (``action_requests``, ``review_configs``),
which Agent Chat UI reads since its schema moved to LangChain 1.0 (November 2025), and
``tool_call_id``, which names the call for people and logs (the graph never reads it
back: a resumed node matches answers to its calls by their order).

Answers accepted (`parse_approval`):

- a list of one ``HumanResponse`` (what Agent Inbox and Agent Chat UI send), or one
  ``HumanResponse`` object: ``{"type": "accept" | "edit" | "response" | "ignore", "args": ...}``;
- LangChain 1.0's ``{"decisions": [{"type": "approve" | "edit" | "reject", ...}]}``;
- our own ``{"action": "approve" | "edit" | "reject", ...}``, ``"approve"`` / ``"reject"``
  and booleans.

Anything else, or an edit that names another tool, is not run, and the model is told why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Approval", "approval_request", "parse_approval"]

_SHOWN_CHARS = 200
"""How much of an answer that was not understood is quoted back to the model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """What a person's answer means for one tool call."""

    run: bool
    """Whether the call is made."""
    args: dict[str, Any] | None = None
    """Arguments a person wrote instead of the model's (an edit); ``None`` keeps the
    model's. They are checked by the executor like any others."""
    reason: str = ""
    """Why the call is not made: what the model is told (``run`` false only)."""


def approval_request(*, tool: str, args: dict[str, Any], call_id: str, tool_description: str) -> dict[str, Any]:
    """The interrupt value asking a person about one call.

    Args:
        tool: the tool's name (``action_request.action``).
        args: the model's arguments for it.
        call_id: the model's tool call id (shown, never needed back).
        tool_description: what the tool does, for the description.
    """
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    description = (
        f"{tool}: {tool_description}\n"
        f"The model asks to call {tool} with {shown} (tool call {call_id}).\n"
        "Accept runs it once; edit runs it with your arguments; respond declines it and "
        "tells the model your message; ignore skips it."
    )
    return {
        "action_request": {"action": tool, "args": args},
        "config": {"allow_accept": True, "allow_edit": True, "allow_respond": True, "allow_ignore": True},
        "description": description,
        "tool_call_id": call_id,
        # LangChain 1.0's HITLRequest, for Agent Chat UI since its 1.0 schema. ``arguments``
        # is the spelling of LangChain 1.0's alphas, which Agent Inbox reads when it
        # finds ``action_requests`` (without it, it would show no arguments).
        "action_requests": [{"name": tool, "args": args, "arguments": args, "description": description}],
        "review_configs": [{"action_name": tool, "allowed_decisions": ["approve", "edit", "reject"]}],
    }


def _run(args: dict[str, Any] | None = None) -> Approval:
    return Approval(run=True, args=args)


def _refuse(reason: str) -> Approval:
    return Approval(run=False, reason=reason)


def _not_understood(answer: Any, why: str = "") -> Approval:
    quoted = repr(answer)
    if len(quoted) > _SHOWN_CHARS:
        quoted = quoted[:_SHOWN_CHARS] + "…"
    detail = f" ({why})" if why else ""
    return _refuse(f"the approval answer {quoted} was not understood{detail}, so the call was not made")


def _declined(message: Any) -> Approval:
    text = message.strip() if isinstance(message, str) else ""
    if not text:
        return _refuse("a person declined this call without a message")
    return _refuse(f"a person declined this call and said: {text}")


def _edited(answer: Any, name: Any, args: Any, tool: str) -> Approval:
    if not isinstance(name, str) or not isinstance(args, dict):
        return _not_understood(answer, "an edit needs the tool's name and an object of arguments")
    if name != tool:
        return _refuse(
            f"a person's edit asked for tool {name!r} instead of {tool!r}; an edit may change the arguments, "
            "not the tool, so the call was not made"
        )
    return _run(args)


def _human_response(answer: dict[str, Any], tool: str) -> Approval:
    kind, args = answer.get("type"), answer.get("args")
    if kind == "accept":
        # Agent Chat UI sends back the unchanged ActionRequest with an accept; the call
        # runs as the model made it, whatever comes with it.
        if args is None or isinstance(args, dict):
            return _run()
        return _not_understood(answer, "accept takes no arguments")
    if kind == "ignore":
        if args is None:
            return _refuse("a person chose to skip this call; it was not made")
        return _not_understood(answer, "ignore takes no arguments")
    if kind == "response":
        if isinstance(args, str):
            return _declined(args)
        return _not_understood(answer, "a response's args is the person's text")
    if kind == "edit":
        if not isinstance(args, dict):
            return _not_understood(answer, 'an edit\'s args is {"action": <tool>, "args": {...}}')
        return _edited(answer, args.get("action"), args.get("args"), tool)
    return _not_understood(answer, "type is one of accept, edit, response, ignore")


def _decision(answer: Any, decision: Any, tool: str) -> Approval:
    """LangChain 1.0's ``{"type": "approve" | "edit" | "reject", ...}``."""
    kind = decision.get("type") if isinstance(decision, dict) else None
    if kind == "approve":
        return _run()
    if kind == "reject":
        return _declined(decision.get("message"))
    if kind == "edit":
        action = decision.get("edited_action")
        if isinstance(action, dict):
            return _edited(answer, action.get("name"), action.get("args"), tool)
        return _not_understood(answer, 'an edit needs "edited_action": {"name": <tool>, "args": {...}}')
    return _not_understood(answer, "a decision's type is one of approve, edit, reject")


def parse_approval(answer: Any, tool: str) -> Approval:
    """What a person's answer to the approval of a call to ``tool`` means.

    Never raises: an answer that is not understood is a refusal that says so.
    """
    if isinstance(answer, list):
        # One answer per interrupt, and this graph asks about one call per interrupt.
        if len(answer) != 1 or not isinstance(answer[0], dict):
            return _not_understood(answer, "expected a list of one HumanResponse")
        answer = answer[0]
    if answer is True or answer in ("approve", "approved", "accept", "yes"):
        return _run()
    if answer is False or answer in ("reject", "rejected", "no"):
        return _refuse("a person rejected this call")
    if not isinstance(answer, dict):
        return _not_understood(answer)
    if "type" in answer:
        return _human_response(answer, tool)
    if "decisions" in answer:
        decisions = answer["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1:
            return _not_understood(answer, "expected one decision")
        return _decision(answer, decisions[0], tool)
    action = answer.get("action")
    if action == "approve":
        return _run()
    if action == "edit" and isinstance(answer.get("args"), dict):
        return _run(answer["args"])
    if action == "reject":
        return _refuse(f"a person rejected this call: {answer.get('reason') or 'no reason given'}")
    return _not_understood(answer)
