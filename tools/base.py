"""A tool: a LangChain tool with a pydantic argument schema, plus the metadata the
executor enforces (timeout, retries, output size, approval)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import StructuredTool
from pydantic import BaseModel

__all__ = ["Tool", "ToolContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may know about the run calling it."""

    tenant: str | None = None
    collection: str | None = None
    allowed_collections: tuple[str, ...] = ("*",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """One tool.

    ``run`` gets the validated arguments and the run's `ToolContext` and returns the
    observation text. It is only ever called by the executor, after the policy allowed
    the call.
    """

    name: str
    description: str
    args_schema: type[BaseModel]
    run: Callable[[BaseModel, ToolContext], Awaitable[str]]
    timeout_s: float = 10.0
    """Past this, the call is cancelled and the model gets a timeout observation."""
    idempotent: bool = False
    """Only idempotent tools are retried."""
    max_retries: int = 0
    """Retries after a failure (idempotent tools only)."""
    max_output_chars: int = 4000
    """Longer observations are cut, saying so."""
    requires_approval: bool = False
    """A call pauses the run until a person approves, edits or rejects it."""
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = field(default=())
    """Few-shot lines for the agent's prompt (small models call tools better with them)."""

    def __post_init__(self) -> None:
        if self.max_retries and not self.idempotent:
            raise ValueError(f"tool {self.name!r}: max_retries is only allowed for idempotent tools")

    def for_model(self) -> StructuredTool:
        """The schema the model is shown (``bind_tools``); never executed through
        LangChain, only through the executor."""

        async def refuse(**_: Any) -> str:
            raise RuntimeError("tools run through the Switchyard executor only")

        return StructuredTool.from_function(
            coroutine=refuse,
            name=self.name,
            description=self.description,
            args_schema=self.args_schema,
            metadata={"timeout_s": self.timeout_s, "requires_approval": self.requires_approval, "tags": list(self.tags)},
        )
