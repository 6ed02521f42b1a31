"""The executor: where the tool policy is enforced, whatever the model sends.

Every call the model makes goes through `ToolExecutor.run`, which decides before
anything runs:

- ``refused``: an unknown tool, a tool outside the policy, arguments that are not
  valid JSON or do not fit the tool's schema, or a call past the run's budget. The
  tool is not executed; the model gets a tool message saying what was wrong and which
  tools exist.
- ``executed``: the tool ran within its timeout (retried once more per
  ``max_retries`` if it is idempotent and failed); its output, cut to
  ``max_output_chars``, is the observation.
- ``timed_out``: the tool was cancelled at its timeout; the run goes on with a
  timeout observation.
- ``failed``: the tool raised; the run goes on with an error observation.

The ToolMessage of every call carries ``artifact={"decision": ..., "reason": ...}``
(the same decision, for clients showing it). Every attempt produces a `ToolCallRecord` for the audit log (tool, a hash of the
arguments, decision, reason, duration), handed to the run's sink.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from pydantic import ValidationError

from tools.base import Tool, ToolContext
from tools.policy import ToolPolicy
from tools.registry import ToolRegistry

__all__ = ["ToolCallRecord", "ToolDecision", "ToolExecutor", "args_hash"]

log = logging.getLogger(__name__)

ToolDecision = Literal["executed", "refused", "timed_out", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRecord:
    """One tool-call attempt, for the audit log and the metrics."""

    call_id: str
    tool: str
    args_hash: str
    """SHA-256 of the arguments as canonical JSON (never the arguments themselves)."""
    decision: ToolDecision
    reason: str = ""
    duration_ms: float = 0.0


def args_hash(args: Any) -> str:
    raw = args if isinstance(args, str) else json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _message(text: str, call_id: str, name: str, decision: ToolDecision, reason: str) -> ToolMessage:
    """The observation the model reads, with the decision as its artifact.

    The artifact is not sent to the model (only ``content`` is); it rides in the
    thread's state and the stream so that a client (the playground) can show the
    decision without parsing the text's "Refused:" / "Timed out:" / "Error:" prefix.
    """
    return ToolMessage(
        text,
        tool_call_id=call_id,
        name=name,
        status="success" if decision == "executed" else "error",
        artifact={"decision": decision, "reason": reason},
    )


class ToolExecutor:
    """Runs one run's tool calls under its policy.

    Args:
        registry: the tools that exist.
        policy: what this run may call, and its budgets.
        context: what tools may know about the run.
        audit: receives a record for every attempt.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        policy: ToolPolicy,
        context: ToolContext,
        audit: Callable[[ToolCallRecord], None] | None = None,
        *,
        calls_made: int = 0,
    ) -> None:
        self._registry = registry
        self.policy = policy
        self._context = context
        self._audit = audit or (lambda record: None)
        self.calls_made = calls_made
        """Calls attempted so far in the run (refused ones included)."""

    def allowed_tools(self) -> list[Tool]:
        return [self._registry.get(name) for name in sorted(self.policy.allowed) if self._registry.find(name)]

    def _available(self) -> str:
        return ", ".join(sorted(self.policy.allowed)) or "none"

    def needs_approval(self, name: str) -> bool:
        tool = self._registry.find(name)
        return tool is not None and name in self.policy.allowed and (
            tool.requires_approval or name in self.policy.require_approval
        )

    def check(self, name: str, args: Any) -> tuple[Tool | None, Any, str | None]:
        """``(tool, validated args, None)``, or ``(None, None, why it is refused)``."""
        tool = self._registry.find(name)
        if tool is None:
            return None, None, f"unknown tool {name!r}; the tools you can call are: {self._available()}"
        if name not in self.policy.allowed:
            return None, None, f"tool {name!r} is not allowed here; the tools you can call are: {self._available()}"
        if self.calls_made > self.policy.max_tool_calls:
            return None, None, (
                f"the run's budget of {self.policy.max_tool_calls} tool calls is used up; answer with what you have"
            )
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError as exc:
                return None, None, f"the arguments of {name!r} are not valid JSON ({exc.msg})"
        try:
            return tool, tool.args_schema.model_validate(args), None
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return None, None, f"invalid arguments for {name!r}: {problems}"

    def refuse(self, call_id: str, name: str, args: Any, reason: str) -> ToolMessage:
        """Answer a call without running it (a check failed, or a person rejected it)."""
        self._record(call_id, name, args, "refused", reason, 0.0)
        return _message(f"Refused: {reason}", call_id, name, "refused", reason)

    async def run(self, call_id: str, name: str, args: Any) -> ToolMessage:
        """Check a call against the policy, then execute it (or not); never raises for
        what the model sent or what the tool did."""
        self.calls_made += 1
        tool, validated, refusal = self.check(name, args)
        if refusal is not None or tool is None:
            return self.refuse(call_id, name, args, refusal or "refused")
        started = time.perf_counter()
        attempts = 1 + (tool.max_retries if tool.idempotent else 0)
        for attempt in range(attempts):
            try:
                output = await asyncio.wait_for(tool.run(validated, self._context), tool.timeout_s)
            except TimeoutError:
                elapsed = (time.perf_counter() - started) * 1000
                reason = f"no result within {tool.timeout_s:g}s; the call was cancelled"
                self._record(call_id, name, args, "timed_out", reason, elapsed)
                return _message(f"Timed out: {reason}", call_id, name, "timed_out", reason)
            except Exception as exc:  # boundary: a failing tool is an observation, not a crashed run
                if attempt + 1 < attempts:
                    log.info("tool %s failed (%r); retrying", name, exc)
                    continue
                elapsed = (time.perf_counter() - started) * 1000
                reason = f"{exc.__class__.__name__}: {exc}"
                self._record(call_id, name, args, "failed", reason, elapsed)
                return _message(f"Error: {reason}", call_id, name, "failed", reason)
            break
        elapsed = (time.perf_counter() - started) * 1000
        text = str(output)
        if len(text) > tool.max_output_chars:
            text = text[: tool.max_output_chars] + f"\n[output cut at {tool.max_output_chars} characters]"
        self._record(call_id, name, args, "executed", "", elapsed)
        return _message(text, call_id, name, "executed", "")

    def _record(self, call_id: str, name: str, args: Any, decision: ToolDecision, reason: str, ms: float) -> None:
        record = ToolCallRecord(
            call_id=call_id, tool=name, args_hash=args_hash(args), decision=decision, reason=reason, duration_ms=round(ms, 1)
        )
        log.info("tool call %s: %s%s", name, decision, f" ({reason})" if reason else "")
        try:
            self._audit(record)
        except Exception:  # boundary: the audit sink must not break the run
            log.exception("tool audit sink failed")
