"""Wire models of the LangGraph Server API (requests; responses are plain JSON built
by the service, in the shapes of ``langgraph_sdk.schema``).

Request models ignore unknown fields: newer SDKs send more (``durability``,
``strict_resume``, ``langsmith_tracer``...) than a given server knows.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Literal, get_args

from pydantic import AliasChoices, AliasGenerator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from serving._json import json_problem

__all__ = [
    "HISTORY_FIELDS",
    "MAX_EXTRACT",
    "MAX_SEARCH_IDS",
    "THREAD_FIELDS",
    "THREAD_ID_PATTERN",
    "AssistantCount",
    "AssistantSearch",
    "HistoryRequest",
    "MAX_BULK",
    "RunCommand",
    "RunBatchItem",
    "RunsCancel",
    "ThreadPrune",
    "ThreadPruned",
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
    "extract_path",
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


ThreadField = Literal["thread_id", "created_at", "updated_at", "metadata", "status", "values", "interrupts", "config"]
"""The fields of a thread (``Thread`` below), which ``select`` and ``extract`` name."""

THREAD_FIELDS: tuple[str, ...] = get_args(ThreadField)

MAX_SEARCH_IDS = 1000
"""The most thread ids one ``/threads/search`` may ask for."""

MAX_EXTRACT = 10
"""The most paths one ``/threads/search`` may extract (as LangGraph Server)."""

_EXTRACT_STEP = re.compile(r"\.([^.\[\]]+)|\[(-?\d{1,9})\]")


def extract_path(path: str) -> tuple[str, list[str | int]]:
    """An ``extract`` path (``values.messages[-1].content``) as its thread field and the
    keys and indices after it.

    Raises:
        ValueError: the path is not dot keys and bracketed indices after a thread field.
    """
    root = re.match(r"[^.\[\]]+", path)
    if root is None or root.group() not in THREAD_FIELDS:
        raise ValueError(f"path {path!r} must start with a thread field ({', '.join(THREAD_FIELDS)})")
    steps: list[str | int] = []
    position = root.end()
    while position < len(path):
        step = _EXTRACT_STEP.match(path, position)
        if step is None:
            raise ValueError(f"path {path!r}: expected .key or [index] at character {position}")
        steps.append(step.group(1) if step.group(1) is not None else int(step.group(2)))
        position = step.end()
    return root.group(), steps


class _ValuesFilter(_Request):
    values: dict[str, Any] | None = None
    """Threads whose latest state values contain these (as JSON containment: every key
    with a value that contains the given one); checked thread by thread, in pages."""


class ThreadSearch(_ValuesFilter):
    """``POST /threads/search``: metadata containment, state values, ids, status,
    order, paging, and the fields of each thread to answer."""

    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    ids: list[ThreadId] | None = Field(default=None, max_length=MAX_SEARCH_IDS)
    """Only these threads (an empty list: no such filter, as the SDKs send none)."""
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] | None = None
    """Default ``created_at``."""
    sort_order: Literal["asc", "desc"] | None = None
    """Default ``desc``."""
    select: list[ThreadField] | None = Field(default=None, min_length=1)
    """Only these fields of each thread (all when absent)."""
    extract: dict[str, str] | None = Field(default=None, max_length=MAX_EXTRACT)
    """Alias -> path (``values.messages[-1]``): answered in each thread's ``extracted``,
    None where the path leads nowhere."""
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=_MAX_OFFSET)

    @field_validator("extract")
    @classmethod
    def _paths(cls, extract: dict[str, str] | None) -> dict[str, str] | None:
        for alias, path in (extract or {}).items():
            if not alias:
                raise ValueError("an alias must not be empty")
            extract_path(path)
        return extract


class ThreadCount(_ValuesFilter):
    """``POST /threads/count``: the filters of ``/threads/search``."""

    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


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


MAX_BULK = 1000
"""The most ids one ``POST /threads/prune`` or ``POST /runs/cancel`` names."""


class ThreadPrune(_Request):
    """``POST /threads/prune``."""

    thread_ids: Annotated[list[ThreadId], Field(max_length=MAX_BULK)]
    """The threads; another tenant's and unknown ones are skipped (not counted)."""
    strategy: Literal["delete", "keep_latest"] = "delete"
    """``delete``: each thread as ``DELETE /threads/{id}`` does; ``keep_latest``: only
    each namespace's latest checkpoint (and its writes) stays, with the thread."""


class RunsCancel(_Request):
    """``POST /runs/cancel``: ``run_ids`` (on ``thread_id`` if given), or every run of
    the tenant in ``status`` (on ``thread_id`` if given)."""

    thread_id: ThreadId | None = None
    run_ids: Annotated[list[Annotated[str, Field(pattern=THREAD_ID_PATTERN)]], Field(max_length=MAX_BULK)] | None = None
    status: Literal["pending", "running", "all"] | None = None


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


HistoryField = Literal["values", "next", "tasks", "checkpoint", "metadata", "created_at", "parent_checkpoint", "interrupts"]
"""The fields of a state (``ThreadState`` below), which a history's ``select`` names."""

HISTORY_FIELDS: tuple[str, ...] = get_args(HistoryField)

_HISTORY_FILTER_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class HistoryRequest(_Request):
    """``POST /threads/{id}/history``."""

    limit: int = Field(default=10, ge=1, le=1000)
    before: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    """Only checkpoints whose metadata has these top-level keys with these values
    (``{"source": "input"}``, ``{"step": 2}``)."""
    checkpoint: CheckpointRef | None = None
    """The namespace to list (a subgraph's ``checkpoint_ns``) and, with a
    ``checkpoint_id``, that one checkpoint."""
    select: list[str] | None = Field(default=None, min_length=1)
    """Only these fields of each state; ``values.<key>`` answers ``values`` with that
    key alone."""

    @field_validator("metadata")
    @classmethod
    def _keys(cls, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        # The checkpointers read a dot as a path on SQLite and as part of the key on
        # PostgreSQL, and SQLite's refuses other characters: allow what both read alike.
        for key in metadata or {}:
            if not _HISTORY_FILTER_KEY.match(key):
                raise ValueError(f"key {key!r}: only letters, digits, '_' and '-' can be filtered on")
        return metadata

    @field_validator("select")
    @classmethod
    def _fields(cls, select: list[str] | None) -> list[str] | None:
        for name in select or []:
            key = name.removeprefix("values.") if name.startswith("values.") else None
            if name not in HISTORY_FIELDS and not key:
                raise ValueError(f"{name!r} is not a state field ({', '.join(HISTORY_FIELDS)}, or values.<key>)")
        return select


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


class SearchedThread(_Response):
    """A thread as ``/threads/search`` answers it: every field of `Thread`, or only
    those ``select`` names; ``extracted`` holds the ``extract`` paths' values."""

    thread_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    values: dict[str, Any] | None = None
    interrupts: dict[str, list[dict[str, Any]]] | None = None
    config: dict[str, Any] | None = None
    extracted: dict[str, Any] | None = None


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


class ThreadPruned(_Response):
    pruned_count: int
    """Threads deleted (``delete``) or pruned (``keep_latest``)."""


class Ok(_Response):
    ok: bool


class Info(_Response):
    version: str
    flags: dict[str, bool]


class Detail(BaseModel):
    """Errors on the LangGraph API: ``{"detail": message}``."""

    detail: str
