"""What an eval run needs from whoever runs the graphs: the runner interface.

``eval`` defines it; the serving layer provides it (``serving.eval_runner``), running each
case through the same graph builders and run host the server uses, so the layers stay
one-way (``eval`` never imports ``serving``). Tests may provide their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from eval.datasets import Case, Suite

__all__ = ["CaseOutput", "CaseRequest", "CaseRunner"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseRequest:
    """One case to run."""

    case: Case
    graph: str
    """The graph id to run (the suite's ``graph``: ``rag``, ``agent`` or ``chat``)."""
    collection: str | None = None
    """The knowledge collection the case asks (rag, the agent's knowledge search)."""
    seed: int = 7
    """The sampling seed (temperature is 0), for backends that honour it."""
    max_tokens: int | None = None
    """The suite's bound on the answer's length (``SuiteConfig.max_tokens``); None: the
    backend's default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseOutput:
    """What one case's run produced, as the metrics read it."""

    answer: str = ""
    """The final answer's text (empty when no text came)."""
    retrieved_ids: Sequence[str] = ()
    """Document ids of the retrieved chunks, in rank order (best first)."""
    contexts: Sequence[str] = ()
    """The retrieved chunks' texts, in the order the answer's ``[n]`` citations number them
    (``[1]`` is ``contexts[0]``)."""
    tool_calls: Sequence[Mapping[str, Any]] = ()
    """The tool calls the run made, ``{"name", "args"}`` each, in order."""
    ttft_s: float | None = None
    """Seconds to the first answer token; None when none came."""
    total_s: float | None = None
    """Seconds to the end of the run."""
    backend: str | None = None
    """The backend that served the run's model calls (the last one, when several did)."""
    error: str | None = None
    """The run failed: why. Every metric of the case is then an error, not a score."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth keeping in the run file (finish reason, token counts)."""


@runtime_checkable
class CaseRunner(Protocol):
    """Runs cases of a suite against one model."""

    @property
    def model(self) -> str:
        """The alias or backend id being evaluated."""
        ...

    @property
    def backend_version(self) -> str:
        """The backend's id and model (and its version, when the backend reports one)."""
        ...

    async def ensure_corpus(self, suite: Suite, collection: str) -> None:
        """Ingest ``suite``'s corpus into ``collection`` unless it already holds it."""
        ...

    async def run_case(self, request: CaseRequest) -> CaseOutput:
        """Run one case. A failed run is returned with ``error`` set, not raised."""
        ...
