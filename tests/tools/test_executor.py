"""The executor enforces the policy whatever the model sends, and turns timeouts and
failures into observations; the built-in calculator never evaluates code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import BaseModel

from tools import Tool, ToolCallRecord, ToolContext, ToolExecutor, ToolPolicy, ToolRegistry, ToolsSettings
from tools.builtin.calculator import evaluate


class NoteArgs(BaseModel):
    note: str


def _registry(log: list[str]) -> ToolRegistry:
    async def note(args: NoteArgs, context: ToolContext) -> str:
        log.append(args.note)
        return "x" * 50

    async def slow(args: NoteArgs, context: ToolContext) -> str:
        await asyncio.sleep(5)
        log.append("slow finished")
        return "late"

    flaky_calls: list[int] = []

    async def flaky(args: NoteArgs, context: ToolContext) -> str:
        flaky_calls.append(1)
        if len(flaky_calls) == 1:
            raise ConnectionError("first try fails")
        return "second try works"

    tools = [
        Tool(name="note", description="", args_schema=NoteArgs, run=note, max_output_chars=20),  # type: ignore[arg-type]
        Tool(name="slow", description="", args_schema=NoteArgs, run=slow, timeout_s=0.2),  # type: ignore[arg-type]
        Tool(name="flaky", description="", args_schema=NoteArgs, run=flaky, idempotent=True, max_retries=1),  # type: ignore[arg-type]
        Tool(name="secret", description="", args_schema=NoteArgs, run=note),  # type: ignore[arg-type]
    ]
    return ToolRegistry(tools, ToolsSettings())


def _executor(log: list[str], records: list[ToolCallRecord], max_calls: int = 8) -> ToolExecutor:
    registry = _registry(log)
    policy = ToolPolicy.intersect(["note", "slow", "flaky", "secret"], ["note", "slow", "flaky"], registry.names(), max_tool_calls=max_calls)
    return ToolExecutor(registry, policy, ToolContext(), records.append)


async def test_refusals_never_run_the_tool() -> None:
    log: list[str] = []
    records: list[ToolCallRecord] = []
    executor = _executor(log, records)
    cases = [
        ("secret", {"note": "a"}, "not allowed here; the tools you can call are: flaky, note, slow"),
        ("rm", {"note": "a"}, "unknown tool 'rm'"),
        ("note", '{"note": ', "not valid JSON"),
        ("note", {"note": 3}, "invalid arguments for 'note': note: Input should be a valid string"),
    ]
    for name, args, reason in cases:
        message = await executor.run("c", name, args)
        assert message.status == "error" and reason in message.content, message.content
    assert log == []  # nothing ran
    assert [r.decision for r in records] == ["refused"] * 4
    assert all(len(r.args_hash) == 32 for r in records)


async def test_executed_cut_timed_out_failed_and_retried() -> None:
    log: list[str] = []
    records: list[ToolCallRecord] = []
    executor = _executor(log, records)
    done = await executor.run("1", "note", {"note": "hi"})
    assert done.content.startswith("x" * 20) and "[output cut at 20 characters]" in done.content
    late = await executor.run("2", "slow", {"note": "z"})
    assert late.status == "error" and late.content.startswith("Timed out")
    flaky = await executor.run("3", "flaky", {"note": "z"})
    assert flaky.content == "second try works"
    await asyncio.sleep(0.3)
    assert log == ["hi"]  # the slow tool was cancelled, not left running
    assert [r.decision for r in records] == ["executed", "timed_out", "executed"]
    # The decision rides in the message's artifact for clients (the playground).
    assert done.artifact == {"decision": "executed", "reason": ""}
    assert late.artifact == {"decision": "timed_out", "reason": records[1].reason}


async def test_every_message_carries_its_decision() -> None:
    """Refused and failed calls say so in the artifact, with the recorded reason."""
    records: list[ToolCallRecord] = []

    async def broken(args: NoteArgs, context: ToolContext) -> str:
        raise RuntimeError("disk on fire")

    registry = ToolRegistry(
        [Tool(name="broken", description="", args_schema=NoteArgs, run=broken)],  # type: ignore[arg-type]
        ToolsSettings(),
    )
    policy = ToolPolicy.intersect(["broken"], ["broken"], registry.names(), max_tool_calls=8)
    executor = ToolExecutor(registry, policy, ToolContext(), records.append)
    failed = await executor.run("1", "broken", {"note": "a"})
    refused = await executor.run("2", "rm", {})
    rejected = executor.refuse("3", "broken", {"note": "b"}, "a person rejected the call")
    assert failed.artifact == {"decision": "failed", "reason": "RuntimeError: disk on fire"}
    assert refused.artifact["decision"] == "refused" and "unknown tool 'rm'" in refused.artifact["reason"]
    assert rejected.artifact == {"decision": "refused", "reason": "a person rejected the call"}
    assert [m.status for m in (failed, refused, rejected)] == ["error"] * 3
    assert [r.reason for r in records] == [m.artifact["reason"] for m in (failed, refused, rejected)]


async def test_the_call_budget_is_enforced() -> None:
    log: list[str] = []
    records: list[ToolCallRecord] = []
    executor = _executor(log, records, max_calls=3)
    for i in range(5):
        await executor.run(str(i), "note", {"note": str(i)})
    assert log == ["0", "1", "2"]
    assert records[-1].decision == "refused" and "budget of 3 tool calls" in records[-1].reason


def test_policy_is_the_intersection() -> None:
    available = ["a", "b", "c"]
    assert ToolPolicy.intersect(["a", "b"], ["*"], available).allowed == {"a", "b"}
    assert ToolPolicy.intersect(["*"], ["b", "c", "zz"], available).allowed == {"b", "c"}
    assert ToolPolicy.intersect(["a"], ["b"], available).allowed == frozenset()


@pytest.mark.parametrize(
    ("expression", "value"), [("(3 + 4) * 2 / 7", 2.0), ("2 ** 10", 1024), ("-5 // 2", -3), ("7 % 3", 1)]
)
def test_calculator(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('true')", "open('/etc/passwd')", "x + 1", "(1).real", "9 ** 9 ** 9", "1 / 0", "[1, 2]"]
)
def test_calculator_refuses_anything_but_arithmetic(expression: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        evaluate(expression)
