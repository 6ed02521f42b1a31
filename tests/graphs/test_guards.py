"""The output policy: whole texts and streams, terms split across tokens, patterns,
and the node wrapper that keeps unchecked text out of a graph's state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graphs.guards import REDACTED, OutputBlockedError, OutputPolicy, StreamGuard, checked

POLICY = OutputPolicy(redact=("Project Falcon", "secret"), block=("launch code",))


def _stream(policy: OutputPolicy, pieces: list[str]) -> list[str]:
    guard = StreamGuard(policy)
    return [guard.feed(p) for p in pieces] + [guard.flush()]


def test_whole_text_redaction_is_case_insensitive_on_whole_words() -> None:
    verdict = POLICY.check("The SECRET of project falcon is no secretary's business.")
    assert verdict.text == f"The {REDACTED} of {REDACTED} is no secretary's business."
    assert verdict.redactions == 2 and verdict.blocked is None


def test_a_blocked_term_blocks_the_whole_text() -> None:
    verdict = POLICY.check("Here is the Launch Code: 0000")
    assert verdict.blocked == "Launch Code"
    assert "0000" not in verdict.text and "blocked" in verdict.text


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_a_term_split_across_tokens_is_redacted_before_any_of_it_is_sent(size: int) -> None:
    text = "Ask about Project Falcon, the secret one; secretaries know."
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    out = _stream(POLICY, pieces)
    assert "".join(out) == POLICY.check(text).text
    sent = ""
    for part in out:
        sent += part
        assert "Proj" not in sent and "secret " not in sent.lower()


def test_a_blocked_term_in_a_stream_stops_it_before_the_term_is_sent() -> None:
    guard = StreamGuard(POLICY)
    sent = ""
    with pytest.raises(OutputBlockedError) as blocked:
        for piece in ["The la", "unch co", "de is 12", "34 and more"]:
            sent += guard.feed(piece)
    assert blocked.value.term == "launch code"
    assert "la" not in sent.replace("The", "")  # nothing of the term went out


def test_patterns_are_redacted_in_streams() -> None:
    policy = OutputPolicy(redact_patterns=(r"[\w.+-]+@[\w-]+\.[\w.]+",), pattern_hold=40)
    text = "Write to jane.doe@example.com or bob@corp.org today."
    out = _stream(policy, [text[i : i + 3] for i in range(0, len(text), 3)])
    assert "".join(out) == f"Write to {REDACTED} or {REDACTED} today."


def test_an_invalid_pattern_is_named() -> None:
    with pytest.raises(ValueError, match=r"invalid output redact pattern '\(unclosed'"):
        OutputPolicy(redact_patterns=("(unclosed",))


def test_no_policy_holds_nothing_back() -> None:
    assert _stream(OutputPolicy(), ["a", "b"]) == ["a", "b", ""]


async def test_the_node_wrapper_checks_what_reaches_the_state() -> None:
    async def node(state: Any, runtime: Any) -> dict[str, Any]:
        return {"messages": [AIMessage("the secret is out", id="m1")]}

    wrapped = checked(node)
    runtime = SimpleNamespace(context=SimpleNamespace(output_policy=POLICY))
    update = await wrapped({"messages": [HumanMessage("hi")]}, runtime)
    assert update["messages"][0].content == f"the {REDACTED} is out"
    assert update["messages"][0].id == "m1"  # replaces the streamed message, same id

    async def leaking(state: Any, runtime: Any) -> dict[str, Any]:
        return {"messages": [AIMessage("the launch code is 1234", id="m2")]}

    blocked = (await checked(leaking)({}, runtime))["messages"][0]
    assert "1234" not in blocked.content
    assert blocked.response_metadata["finish_reason"] == "content_filter"
    # Without a policy the node is untouched.
    plain = await wrapped({}, SimpleNamespace(context=SimpleNamespace(output_policy=None)))
    assert plain["messages"][0].content == "the secret is out"


def test_redaction_is_idempotent_even_when_a_pattern_matches_the_marker() -> None:
    """A text checked when a node wrote it is checked again where it leaves: twice
    must read as once."""
    policy = OutputPolicy(redact_patterns=("[A-Za-z]+",), redact=("secret",))
    once = policy.check("a secret word").text
    assert once == f"{REDACTED} {REDACTED} {REDACTED}"
    assert policy.check(once).text == once and policy.check(once).redactions == 0


def test_checked_value_walks_messages_and_state_without_changing_them() -> None:
    from langchain_core.messages import ToolMessage
    from langgraph.types import Interrupt

    from graphs.guards import checked_value

    policy = OutputPolicy(redact_patterns=(r"\S+@\S+\.example",), block=("launch code",))
    call = AIMessage("", tool_calls=[{"name": "mail", "args": {"to": ["ada@x.example"]}, "id": "c1"}])
    state = {
        "messages": [HumanMessage("write to bo@y.example"), call, ToolMessage("sent to ada@x.example", tool_call_id="c1")],
        "sources": [{"index": 1, "doc_id": "d", "text": "contact: cy@z.example"}],
        "__interrupt__": [Interrupt(value={"args": {"to": "ada@x.example"}}, id="i1")],
    }
    checked, count = checked_value(state, policy, block="raise")
    assert count == 5 and "example" not in repr(checked)
    assert checked["messages"][1].tool_calls[0]["args"] == {"to": [REDACTED]}
    assert checked["messages"][2].tool_call_id == "c1" and checked["sources"][0]["doc_id"] == "d"
    assert "ada@x.example" in repr(state)  # the original is untouched
    with pytest.raises(OutputBlockedError):
        checked_value({"sources": [{"text": "the Launch Code is 0000"}]}, policy, block="raise")
    replaced, _ = checked_value({"sources": [{"text": "the Launch Code is 0000"}]}, policy, block="replace")
    assert "0000" not in replaced["sources"][0]["text"] and "withheld" in replaced["sources"][0]["text"]


# ---- the marker in model output (review finding: idempotent redaction bypass) -----------

PASSWORD = OutputPolicy(redact_patterns=(r"password\s*[:=]\s*\S+",))


def test_a_marker_written_by_the_model_does_not_shield_what_follows_it() -> None:
    """Model output may contain ``[redacted]`` itself: a pattern still matches across it."""
    verdict = PASSWORD.check("the password: [redacted]hunter2 is old")
    assert "hunter2" not in verdict.text
    assert verdict.text == f"the {REDACTED} is old" and verdict.redactions == 1
    streamed = "".join(_stream(PASSWORD, list("the password: [redacted]hunter2 is old")))
    assert streamed == verdict.text


@pytest.mark.parametrize(
    "policy",
    [PASSWORD, OutputPolicy(redact_patterns=(r"\[\w+\]",)), OutputPolicy(redact=("redacted", "secret"))],
)
def test_redaction_is_idempotent(policy: OutputPolicy) -> None:
    text = "a secret, password=abc and [tag] here; password: [redacted]x"
    once = policy.check(text)
    twice = policy.check(once.text)
    assert twice.text == once.text and twice.redactions == 0
    assert policy.check(f"only {REDACTED} here").text == f"only {REDACTED} here"


# ---- what the value walk reaches (review finding: sets and objects passed unchecked) ---


class _Opaque:
    def __str__(self) -> str:
        return "an object whose text holds the secret"


def test_checked_value_walks_sets_and_checks_unknown_objects_as_text() -> None:
    import datetime
    import uuid

    from graphs.guards import checked_value

    when, ident = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC), uuid.UUID(int=7)
    value = {
        "set": {"the secret"},
        "frozen": frozenset({"a secret"}),
        "tuple": ("secret", 1),
        "object": _Opaque(),
        "error": AttributeError("'str' object has no attribute 'secret_internals'"),
        "kept": [1, 2.5, True, None, when, ident],
    }
    checked, count = checked_value(value, POLICY, block="raise")
    assert checked["set"] == [f"the {REDACTED}"] and checked["frozen"] == [f"a {REDACTED}"]
    assert checked["tuple"] == (REDACTED, 1)
    assert checked["object"] == f"an object whose text holds the {REDACTED}"
    assert checked["error"] == "AttributeError"  # never the exception's own text
    assert checked["kept"] == [1, 2.5, True, None, when, ident]
    assert count == 4
    with pytest.raises(OutputBlockedError):
        checked_value({frozenset({"the launch code"})}, POLICY, block="raise")
