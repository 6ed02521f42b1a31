"""Per-run facts that ride in the LangGraph run ``context`` (never in globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from graphs.guards import OutputPolicy

__all__ = ["CLIENT_CONTEXT_FIELDS", "RunBudget", "RunContext"]


@dataclass(slots=True)
class RunBudget:
    """What one run has spent, counted by the server.

    One per run, made by whoever starts the run (the serving layer's run host, the
    CLI) and carried in `RunContext`. Graph nodes count into it and compare it with
    their limits; it is never read from graph state, which a client can write
    (``input: {"steps": -1000}`` must not buy a run more tool calls).
    """

    model_turns: int = 0
    """Model calls made in this run."""
    tool_calls: int = 0
    """Tool calls attempted in this run (refused ones included)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What one run needs to know about the request that started it.

    Graph nodes read it as ``runtime.context`` (``Runtime[RunContext]``).
    """

    request_id: str = ""
    """The ``x-request-id`` of the HTTP request (or CLI invocation); goes into logs."""
    model_params: dict[str, Any] = field(default_factory=dict)
    """Sampling parameters from the request (``temperature``, ``max_tokens``, ``stop``,
    ``top_p``, ``seed``...), bound onto the model call with ``.bind(**model_params)``."""
    collection: str | None = None
    """The knowledge collection a retrieval graph searches (default: the knowledge
    base's ``default_collection``)."""
    tenant: str | None = None
    """The caller's tenant (``None``: a local, single-user run)."""
    allowed_collections: tuple[str, ...] = ("*",)
    """Collections the caller's tenant may use (``*``: all); retrieval nodes refuse others."""
    allowed_tools: tuple[str, ...] = ("*",)
    """Tools the caller's tenant may use (``*``: all); intersected with the graph's."""
    approvals: bool = False
    """Whether a person can answer an approval (a run on a thread of the LangGraph API
    can; a stateless run cannot: calls that need approval are then refused)."""
    on_tool_call: Callable[[Any], None] | None = None
    """Receives a `tools.ToolCallRecord` for every tool-call attempt (the audit log)."""
    output_policy: OutputPolicy | None = None
    """What to redact or block in the run's answers (`graphs.guards`); set by the
    serving layer from the global and the tenant's lists."""
    budget: RunBudget = field(default_factory=RunBudget)
    """This run's spending (model turns, tool calls), counted by the graph's nodes."""


CLIENT_CONTEXT_FIELDS = frozenset({"model_params", "collection"})
"""The `RunContext` fields a client may set (LangGraph API ``context``); the server
sets every other one."""
