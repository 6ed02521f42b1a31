"""Per-run facts that ride in the LangGraph run ``context`` (never in globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from graphs.guards import OutputPolicy

__all__ = ["RunContext"]


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
