"""Wire models of the LangGraph Server API (requests; responses are plain JSON built
by the service, in the shapes of ``langgraph_sdk.schema``).

Request models ignore unknown fields: newer SDKs send more (``durability``,
``strict_resume``, ``langsmith_tracer``...) than a given server knows.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, AliasGenerator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from serving._json import json_problem

__all__ = [
    "THREAD_ID_PATTERN",
    "AssistantCount",
    "AssistantSearch",
    "HistoryRequest",
    "RunCommand",
    "RunBatchItem",
    "RunConfig",
    "RunCreate",
    "StateCheckpointRequest",
    "StatePatch",
    "StateUpdate",
    "StreamModeName",
    "ThreadCount",
    "ThreadCreate",
    "ThreadPatch",
    "ThreadSearch",
    "assistant_uuid",
]

_SYSTEM_ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


def assistant_uuid(graph_id: str) -> str:
    """The id of a graph's system assistant, as LangGraph Server derives it (so a
    client may address a graph by name or by this id)."""
    return str(uuid.uuid5(_SYSTEM_ASSISTANT_NAMESPACE, graph_id))


THREAD_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@~+=-]{0,127}$"
"""Thread ids: what LangGraph clients send (UUIDs) and other plain names, never text
that cannot go into a URL or a header unescaped."""

ThreadId = Annotated[str, Field(pattern=THREAD_ID_PATTERN)]

_MAX_OFFSET = 2**31 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="after")
    def _storable(self) -> _Request:
        # What cannot be stored or echoed back (integers past 64 bits, lone
        # surrogates) is refused here, naming where it is, not half-way through a run.
        problem = json_problem({name: getattr(self, name) for name in self.model_fields_set}, stored=True)
        if problem is not None:
            raise ValueError(problem)
        return self


class AssistantSearch(_Request):
    """``POST /assistants/search``."""

    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=_MAX_OFFSET)


class AssistantCount(_Request):
    """``POST /assistants/count``: the filters of ``/assistants/search``."""

    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None


class ThreadCreate(_Request):
    """``POST /threads``."""

    thread_id: ThreadId | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"


class ThreadSearch(_Request):
    """``POST /threads/search``: metadata containment, status, paging."""

    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=_MAX_OFFSET)


class ThreadCount(_Request):
    """``POST /threads/count``: the filters of ``/threads/search``."""

    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


class HistoryRequest(_Request):
    """``POST /threads/{id}/history``."""

    limit: int = Field(default=10, ge=1, le=1000)
    before: dict[str, Any] | str | None = None


class RunCommand(BaseModel):
    """``command``: answer an interrupt (``resume``), write to the state (``update``),
    and/or go to nodes (``goto``), instead of ``input``."""

    model_config = ConfigDict(extra="forbid")

    resume: Any = None
    update: dict[str, Any] | list[tuple[str, Any]] | None = None
    goto: str | list[str] | None = None


class RunConfig(BaseModel):
    """``config``: the parts of a LangGraph run config a client may set."""

    model_config = ConfigDict(extra="ignore")

    configurable: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    tags: list[str] | None = None
    recursion_limit: int | None = Field(default=None, ge=1, le=10_000)
    run_name: str | None = None

    def as_config(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


StreamModeName = Literal[
    "values", "updates", "messages-tuple", "messages", "events", "custom", "debug", "tasks", "checkpoints"
]


class RunCreate(_Request):
    """``POST /threads/{id}/runs/stream|wait`` and ``POST /runs/stream|wait``."""

    assistant_id: str
    """A graph id, or its system assistant's UUID."""
    input: dict[str, Any] | None = None
    command: RunCommand | None = None
    """``{"resume": value}`` (and/or ``update``, ``goto``): replaces ``input``."""
    stream_mode: StreamModeName | list[StreamModeName] = "values"
    stream_subgraphs: bool = False
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    if_not_exists: Literal["reject", "create"] = "reject"
    on_completion: Literal["delete", "keep"] | None = None
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] = "reject"
    """When the thread already has a run: ``reject`` (409), ``interrupt`` (cancel it,
    keeping what it saved, then start), ``enqueue`` (start when it ends). ``rollback``
    is refused (400)."""
    stream_resumable: bool = False
    """Keep the run's events so a client can rejoin its stream with ``Last-Event-ID``
    (``GET /threads/{id}/runs/{run_id}/stream``); the run goes on if the client leaves."""
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    """What a client disconnect does to a streamed run."""
    interrupt_before: Literal["*"] | list[str] | None = None
    """Stop before these nodes run (``*``: before every node); a node name that is not
    the graph's is a 422. A run with no input continues from there."""
    interrupt_after: Literal["*"] | list[str] | None = None
    """Stop after these nodes have run (``*``: after every node)."""
    webhook: str | None = None
    """Not supported: refused (400) when set."""
    after_seconds: float | None = Field(default=None, ge=0)
    """Not supported: refused (400) when above 0."""
    feedback_keys: list[str] | None = None
    """Not supported (LangSmith feedback): refused (400) when not empty."""

    def modes(self) -> list[str]:
        """The requested stream modes, de-duplicated, ``values`` when none."""
        requested = [self.stream_mode] if isinstance(self.stream_mode, str) else list(self.stream_mode)
        return list(dict.fromkeys(requested)) or ["values"]


class RunBatchItem(RunCreate):
    """One run of ``POST /runs/batch``: a run body, on ``thread_id`` if given (else
    stateless). Fields are also read in camelCase (``streamMode``, ``threadId``...):
    the JS SDK's ``createBatch`` sends its payloads' own keys."""

    model_config = ConfigDict(
        extra="ignore",
        alias_generator=AliasGenerator(validation_alias=lambda name: AliasChoices(name, to_camel(name))),
    )

    thread_id: ThreadId | None = None


MAX_BATCH = 100
"""The most runs one ``POST /runs/batch`` starts."""


class ThreadPatch(_Request):
    """``PATCH /threads/{id}``."""

    metadata: dict[str, Any] | None = None
    """Merged into the thread's metadata (top-level keys replaced)."""
    ttl: Any = None
    """Not supported: a 400 when sent."""


class CheckpointRef(_Request):
    """A checkpoint of a thread, as the SDKs send one (``thread_id`` is the path's)."""

    checkpoint_id: str | None = None
    checkpoint_ns: str = ""
    thread_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None


class StateUpdate(_Request):
    """``POST /threads/{id}/state``: write ``values`` as if node ``as_node`` returned
    them, on the latest checkpoint or on ``checkpoint`` / ``checkpoint_id``."""

    values: dict[str, Any] | None = None
    as_node: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None


class StatePatch(_Request):
    """``PATCH /threads/{id}/state``: metadata merged into the latest checkpoint's."""

    metadata: dict[str, Any]


class StateCheckpointRequest(_Request):
    """``POST /threads/{id}/state/checkpoint``: the state at ``checkpoint``."""

    checkpoint: CheckpointRef
    subgraphs: bool = False


# ---- responses (for the OpenAPI schema; the service builds the same shapes) ----------


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class Assistant(_Response):
    """One assistant per registered graph (``langgraph_sdk.schema.Assistant``)."""

    assistant_id: str
    graph_id: str
    name: str
    description: str | None
    config: dict[str, Any]
    context: dict[str, Any]
    metadata: dict[str, Any]
    version: int
    created_at: str
    updated_at: str


class Thread(_Response):
    """A thread and its latest values (``langgraph_sdk.schema.Thread``)."""

    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any]
    status: Literal["idle", "busy", "interrupted", "error"]
    values: dict[str, Any] | None
    interrupts: dict[str, list[dict[str, Any]]]
    config: dict[str, Any]


class Checkpoint(_Response):
    thread_id: str | None
    checkpoint_ns: str
    checkpoint_id: str | None
    checkpoint_map: dict[str, Any] | None = None


class ThreadState(_Response):
    """A thread's state at a checkpoint (``langgraph_sdk.schema.ThreadState``)."""

    values: dict[str, Any] | list[Any]
    next: list[str]
    tasks: list[dict[str, Any]]
    checkpoint: Checkpoint | None
    parent_checkpoint: Checkpoint | None
    metadata: dict[str, Any] | None
    created_at: str | None
    interrupts: list[dict[str, Any]]


class Run(_Response):
    """A run (``langgraph_sdk.schema.Run``)."""

    run_id: str
    thread_id: str | None
    assistant_id: str
    created_at: str
    updated_at: str
    status: Literal["pending", "running", "error", "success", "timeout", "interrupted"]
    metadata: dict[str, Any]
    multitask_strategy: str


class Ok(_Response):
    ok: bool


class Info(_Response):
    version: str
    flags: dict[str, bool]


class Detail(BaseModel):
    """Errors on the LangGraph API: ``{"detail": message}``."""

    detail: str
