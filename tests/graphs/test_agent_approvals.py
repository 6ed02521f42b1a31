"""Approvals of the ``agent`` graph: the interrupt value clients recognise, and every
answer a person may send (HumanResponse, LangChain 1.0 decisions, our own)."""

from __future__ import annotations

from typing import Any

import pytest

from graphs.agent.approvals import Approval, approval_request, parse_approval

NOT_UNDERSTOOD = "was not understood"


def test_the_request_is_a_human_interrupt_and_a_hitl_request() -> None:
    value = approval_request(tool="probe", args={"note": "hello"}, call_id="call_7", tool_description="Records a note.")
    # langgraph.prebuilt.interrupt.HumanInterrupt
    assert value["action_request"] == {"action": "probe", "args": {"note": "hello"}}
    assert value["config"] == {"allow_accept": True, "allow_edit": True, "allow_respond": True, "allow_ignore": True}
    assert "Records a note." in value["description"] and "call_7" in value["description"]
    assert '{"note": "hello"}' in value["description"]
    assert value["tool_call_id"] == "call_7"
    # LangChain 1.0 HITLRequest (what Agent Chat UI's isAgentInboxInterruptSchema checks since 1.0)
    [request] = value["action_requests"]
    assert (request["name"], request["args"]) == ("probe", {"note": "hello"})
    assert value["review_configs"] == [{"action_name": "probe", "allowed_decisions": ["approve", "edit", "reject"]}]


def _agent_chat_ui_before_1_0(value: Any) -> bool:
    """Agent Chat UI's isAgentInboxInterruptSchema before its 1.0 schema, on the value."""
    first = value[0] if isinstance(value, list) else value
    return (
        isinstance(first, dict)
        and isinstance(first.get("action_request"), dict)
        and isinstance(first.get("config"), dict)
        and {"allow_respond", "allow_accept", "allow_edit", "allow_ignore"} <= first["config"].keys()
    )


def _agent_chat_ui_1_0(value: Any) -> bool:
    """Agent Chat UI's isAgentInboxInterruptSchema since 1.0, on ``interrupt.value``."""
    if not isinstance(value, dict):
        return False
    requests, configs = value.get("action_requests"), value.get("review_configs")
    return (
        isinstance(requests, list) and bool(requests) and isinstance(configs, list) and bool(configs)
        and all(isinstance(r.get("name"), str) and isinstance(r.get("args"), dict) for r in requests)
        and all(isinstance(c.get("action_name"), str) and isinstance(c.get("allowed_decisions"), list) for c in configs)
    )


def test_both_agent_chat_ui_checks_recognise_the_request() -> None:
    value = approval_request(tool="probe", args={"note": "x"}, call_id="c", tool_description="d")
    assert _agent_chat_ui_before_1_0(value) and _agent_chat_ui_1_0(value)
    # and the old shape was recognised by neither
    old = {"type": "tool_approval", "tool": "probe", "args": {"note": "x"}, "tool_call_id": "c"}
    assert not _agent_chat_ui_before_1_0(old) and not _agent_chat_ui_1_0(old)


RUNS = Approval(run=True)


@pytest.mark.parametrize(
    "answer",
    [
        [{"type": "accept", "args": None}],
        {"type": "accept", "args": None},
        {"type": "accept"},
        # Agent Chat UI (before 1.0) echoes the unchanged ActionRequest with an accept
        [{"type": "accept", "args": {"action": "probe", "args": {"note": "hello"}}}],
        {"decisions": [{"type": "approve"}]},
        {"action": "approve"},
        "approve",
        "accept",
        True,
    ],
)
def test_answers_that_run_the_call_as_made(answer: Any) -> None:
    assert parse_approval(answer, "probe") == RUNS


@pytest.mark.parametrize(
    "answer",
    [
        [{"type": "edit", "args": {"action": "probe", "args": {"note": "edited"}}}],
        {"type": "edit", "args": {"action": "probe", "args": {"note": "edited"}}},
        {"decisions": [{"type": "edit", "edited_action": {"name": "probe", "args": {"note": "edited"}}}]},
        {"action": "edit", "args": {"note": "edited"}},
    ],
)
def test_edits_run_with_the_new_arguments(answer: Any) -> None:
    assert parse_approval(answer, "probe") == Approval(run=True, args={"note": "edited"})


@pytest.mark.parametrize(
    "answer",
    [
        [{"type": "edit", "args": {"action": "tally", "args": {"note": "x"}}}],
        {"decisions": [{"type": "edit", "edited_action": {"name": "tally", "args": {"note": "x"}}}]},
    ],
)
def test_an_edit_that_changes_the_tool_is_refused(answer: Any) -> None:
    approval = parse_approval(answer, "probe")
    assert not approval.run and approval.args is None
    assert "asked for tool 'tally' instead of 'probe'" in approval.reason


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ([{"type": "response", "args": "use the calculator instead"}], "a person declined this call and said: use the calculator instead"),
        ({"type": "response", "args": "  "}, "a person declined this call without a message"),
        ({"decisions": [{"type": "reject", "message": "not today"}]}, "a person declined this call and said: not today"),
        ({"decisions": [{"type": "reject"}]}, "a person declined this call without a message"),
        ([{"type": "ignore", "args": None}], "a person chose to skip this call; it was not made"),
        ({"type": "ignore"}, "a person chose to skip this call; it was not made"),
        ({"action": "reject", "reason": "not today"}, "a person rejected this call: not today"),
        ({"action": "reject"}, "a person rejected this call: no reason given"),
        ("reject", "a person rejected this call"),
        (False, "a person rejected this call"),
    ],
)
def test_answers_that_decline_tell_the_model_why(answer: Any, reason: str) -> None:
    assert parse_approval(answer, "probe") == Approval(run=False, reason=reason)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([], "expected a list of one HumanResponse"),
        ([{"type": "accept", "args": None}, {"type": "accept", "args": None}], "expected a list of one HumanResponse"),
        ([[{"type": "accept", "args": None}]], "expected a list of one HumanResponse"),
        (["approve"], "expected a list of one HumanResponse"),
        ({"type": "approve", "args": None}, "type is one of accept, edit, response, ignore"),
        ({"type": None}, "type is one of accept, edit, response, ignore"),
        ({"type": "accept", "args": "yes please"}, "accept takes no arguments"),
        ({"type": "ignore", "args": "why"}, "ignore takes no arguments"),
        ({"type": "response", "args": None}, "a response's args is the person's text"),
        ({"type": "response", "args": {"text": "hi"}}, "a response's args is the person's text"),
        ({"type": "edit", "args": {"note": "edited"}}, "an edit needs the tool's name"),
        ({"type": "edit", "args": {"action": "probe", "args": "note=edited"}}, "an edit needs the tool's name"),
        ({"type": "edit", "args": None}, "an edit's args is"),
        ({"decisions": []}, "expected one decision"),
        ({"decisions": "approve"}, "expected one decision"),
        ({"decisions": [{"type": "accept"}]}, "a decision's type is one of approve, edit, reject"),
        ({"decisions": [{"type": "edit", "edited_action": None}]}, 'an edit needs "edited_action"'),
        ({"action": "edit", "args": "note=edited"}, ""),
        ({"action": "maybe"}, ""),
        ("sure", ""),
        (None, ""),
        (1, ""),
    ],
)
def test_answers_not_understood_do_not_run_and_say_so(answer: Any, why: str) -> None:
    approval = parse_approval(answer, "probe")
    assert not approval.run and approval.args is None
    assert NOT_UNDERSTOOD in approval.reason and why in approval.reason
    assert approval.reason.endswith("so the call was not made")


def test_a_long_answer_is_quoted_cut() -> None:
    approval = parse_approval({"action": "x" * 5000}, "probe")
    assert not approval.run and len(approval.reason) < 400
