"""Assistant routes beyond search, count and get: the graph's drawing, its JSON
schemas and its subgraphs' (what ``assistants.getGraph``, ``getSchemas`` and
``getSubgraphs`` ask for), and the writes.

Our assistants are the registered graphs, one system assistant each (see
`LangGraphService.resolve`): creating, changing or deleting one is answered 405 with
how to add a graph; an assistant has one version, 1. Every route resolves the
assistant for the caller's tenant first (404 unknown, 403 a graph the tenant may
not use), with the key and deadline dependencies of the other LangGraph routes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from inspect import isclass
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from langgraph.channels.base import BaseChannel
from langgraph.pregel import Pregel
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticOmit

from graphs import CLIENT_CONTEXT_FIELDS, RunContext
from serving.deps import PrincipalDep
from serving.errors import ServingError
from serving.langgraph_api.bodies import JsonBodyRoute
from serving.langgraph_api.protocol import Assistant
from serving.langgraph_api.router import ServiceDep
from serving.langgraph_api.router import router as langgraph_router
from serving.langgraph_api.service import dumps

__all__ = ["graph_json", "graph_schemas", "router"]

log = logging.getLogger(__name__)

router = APIRouter(
    tags=["langgraph"],
    dependencies=list(langgraph_router.dependencies),
    responses=dict(langgraph_router.responses),
    route_class=JsonBodyRoute,
)

AssistantIdPath = Annotated[str, Path(description="A graph id, or its system assistant's UUID")]

_READ_ONLY = (
    "assistants are the registered graphs (one system assistant per graph) and cannot be created, "
    "changed or deleted through the API; to add one, write a graph module and add it under `graphs:` "
    "in the server's config (`my-graph: {path: 'my_graphs/graph.py:make_graph', model: chat-default}`), "
    "then restart the server (docs/authoring-graphs.md)"
)


def _json(value: Any) -> Response:
    return Response(dumps(value), media_type="application/json")


_STATIC = frozenset({"search", "count"})
"""``/assistants/{name}`` paths that are routes of their own (``POST``): another
method on them is the usual 405 naming ``POST``, not a refusal of an assistant."""


def _not_allowed(allow: str, detail: str = "Method Not Allowed") -> Response:
    # A 405 names what the path allows (none: an empty `Allow`, as RFC 9110 has it).
    return Response(dumps({"detail": detail}), status_code=405, media_type="application/json", headers={"Allow": allow})


def _read_only(allow: str) -> Response:
    return _not_allowed(allow, _READ_ONLY)


# ---- what a graph can say about itself --------------------------------------------------


class _OmitInvalid(GenerateJsonSchema):
    """JSON schemas without the fields JSON Schema cannot describe (callables...)."""

    def handle_invalid_for_json_schema(self, schema: Any, error_info: str) -> Any:
        raise PydanticOmit


def _jsonable(update_type: Any) -> Any:
    try:
        TypeAdapter(update_type).json_schema()
    except Exception:  # boundary: any type a graph declares; undescribable is `Any`
        return Any
    return update_type


def _channels_schema(name: str, channels: Mapping[str, Any]) -> dict[str, Any]:
    """A schema with one optional property per channel (its update type), as
    LangGraph Server describes a state."""
    fields: dict[str, Any] = {}
    for index, (key, channel) in enumerate(channels.items()):
        if not isinstance(channel, BaseChannel):
            continue  # managed values are not inputs or state keys
        annotation = _jsonable(channel.UpdateType)
        if key.isidentifier() and not key.startswith("_") and not hasattr(BaseModel, key):
            fields[key] = (annotation, None)
        else:  # a key pydantic cannot take as a field name
            fields[f"field_{index}"] = (annotation, Field(default=None, alias=key, title=key))
    return create_model(name, **fields).model_json_schema(by_alias=True)  # type: ignore[call-overload, no-any-return]


def _builder_schema(graph: Pregel[Any, Any, Any, Any], which: str) -> dict[str, Any] | None:
    """The input or output schema of a `StateGraph`, from its channels (when the
    declared type has none of its own, e.g. a ``typing.TypedDict`` before 3.12)."""
    builder = getattr(graph, "builder", None)
    declared = getattr(builder, f"{which}_schema", None)
    channels = getattr(builder, "schemas", {}).get(declared)
    if channels is None:
        return None
    return _channels_schema(graph.get_name(which.title()), channels)


def _context_schema(graph: Pregel[Any, Any, Any, Any]) -> dict[str, Any] | None:
    """The graph's ``context_schema``; for `RunContext`, only what a client may set
    (`CLIENT_CONTEXT_FIELDS`: the server sets the rest)."""
    declared = graph.context_schema
    if declared is None:
        return None
    schema: dict[str, Any] = TypeAdapter(declared).json_schema(schema_generator=_OmitInvalid)
    if isclass(declared) and issubclass(declared, RunContext):
        schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k in CLIENT_CONTEXT_FIELDS}
        if "required" in schema:
            schema["required"] = [k for k in schema["required"] if k in CLIENT_CONTEXT_FIELDS]
        _prune_defs(schema)
    return schema


def _prune_defs(schema: dict[str, Any]) -> None:
    """Drop the ``$defs`` nothing refers to any more."""
    defs = schema.get("$defs")
    if not defs:
        return
    used: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in used and name in defs:
                    used.add(name)
                    walk(defs[name])
            for key, item in value.items():
                if key != "$defs":
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(schema)
    schema["$defs"] = {name: d for name, d in defs.items() if name in used}
    if not schema["$defs"]:
        del schema["$defs"]


def _attempt(graph: Pregel[Any, Any, Any, Any], what: str, *makers: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    for make in makers:
        try:
            schema = make()
        except Exception as exc:  # boundary: a graph's types; what cannot be described is null
            log.debug("graph %s: no %s schema from %s: %s", graph.get_name(), what, getattr(make, "__name__", make), exc)
            continue
        if schema is not None:
            return schema
    return None


def graph_schemas(graph: Pregel[Any, Any, Any, Any]) -> dict[str, dict[str, Any] | None]:
    """A graph's input, output, state, config and context JSON schemas; each that the
    graph cannot produce is ``None`` (a graph's types never make the request fail).

    ``config_schema`` is ``None``: graphs declare no ``configurable`` of their own
    (per-run settings go in ``context``).
    """
    return {
        "input_schema": _attempt(graph, "input", graph.get_input_jsonschema, lambda: _builder_schema(graph, "input")),
        "output_schema": _attempt(graph, "output", graph.get_output_jsonschema, lambda: _builder_schema(graph, "output")),
        "state_schema": _attempt(
            graph, "state", lambda: _channels_schema(graph.get_name("State"), {k: graph.channels[k] for k in graph.stream_channels_list})
        ),
        "config_schema": None,
        "context_schema": _attempt(graph, "context", lambda: _context_schema(graph)),
    }


def _xray(value: str | None) -> bool | int:
    """``xray`` as the SDKs send it: ``true``/``false`` or a depth (an integer > 0).

    Raises:
        ServingError: 422 naming ``xray``.
    """
    text = (value or "false").strip().lower()
    if text in ("true", "false"):
        return text == "true"
    if text.isascii() and text.isdigit() and 0 < int(text) <= 100:
        return int(text)
    raise ServingError(422, f"xray must be true, false or a depth from 1 to 100, got {value!r}")


def graph_json(graph: Pregel[Any, Any, Any, Any], xray: bool | int) -> dict[str, Any]:
    """The drawable graph (nodes and edges), as LangGraph Server sends it: without the
    module path of each node's runnable.

    Raises:
        ServingError: 422 if the graph cannot be drawn.
    """
    try:
        drawn = graph.get_graph(xray=xray).to_json()
    except Exception as exc:  # boundary: a graph's own structure
        log.warning("graph %s cannot be drawn (xray=%s): %r", graph.get_name(), xray, exc)
        raise ServingError(422, f"the graph cannot be drawn with xray={xray}") from exc
    for node in drawn.get("nodes", []):
        data = node.get("data") if isinstance(node, dict) else None
        if isinstance(data, dict):
            data.pop("id", None)
    return drawn


# ---- routes --------------------------------------------------------------------------------


@router.get("/assistants/{assistant_id}/graph", response_model=dict[str, Any])
async def get_assistant_graph(
    assistant_id: AssistantIdPath,
    service: ServiceDep,
    principal: PrincipalDep,
    xray: Annotated[str | None, Query(description="Draw subgraphs too: true, or how deep (1..100)")] = None,
) -> Response:
    """The graph's nodes and edges (``assistants.getGraph``)."""
    entry = service.resolve(assistant_id, principal)
    return _json(graph_json(entry.graph, _xray(xray)))


@router.get("/assistants/{assistant_id}/schemas", response_model=dict[str, Any])
async def get_assistant_schemas(assistant_id: AssistantIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    """``{graph_id, input_schema, output_schema, state_schema, config_schema,
    context_schema}``; a schema the graph cannot produce is null."""
    entry = service.resolve(assistant_id, principal)
    return _json({"graph_id": entry.graph_id, **graph_schemas(entry.graph)})


def _subgraphs(graph: Pregel[Any, Any, Any, Any], namespace: str | None, recurse: bool) -> dict[str, Any]:
    return {ns: graph_schemas(sub) for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse)}


@router.get("/assistants/{assistant_id}/subgraphs", response_model=dict[str, dict[str, Any]])
async def get_assistant_subgraphs(
    assistant_id: AssistantIdPath,
    service: ServiceDep,
    principal: PrincipalDep,
    namespace: str | None = None,
    recurse: bool = False,
) -> Response:
    """``{namespace: schemas}`` of the graph's subgraphs (nested ones with ``recurse``)."""
    entry = service.resolve(assistant_id, principal)
    return _json(_subgraphs(entry.graph, namespace, recurse))


@router.get("/assistants/{assistant_id}/subgraphs/{namespace:path}", response_model=dict[str, dict[str, Any]])
async def get_assistant_subgraphs_in(
    assistant_id: AssistantIdPath, namespace: str, service: ServiceDep, principal: PrincipalDep, recurse: bool = False
) -> Response:
    """The subgraphs under ``namespace`` (``{}`` if there is none of that name)."""
    entry = service.resolve(assistant_id, principal)
    return _json(_subgraphs(entry.graph, namespace, recurse))


class _Versions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=2**31 - 1)


class _Latest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int


@router.post("/assistants/{assistant_id}/versions", response_model=list[Assistant])
async def list_assistant_versions(
    assistant_id: AssistantIdPath, service: ServiceDep, principal: PrincipalDep, body: _Versions | None = None
) -> Response:
    """An assistant's versions: it has one, 1 (``metadata`` filters it as on search)."""
    query = body or _Versions()
    assistant = service.get_assistant(assistant_id, principal)
    matches = not query.metadata or all(assistant["metadata"].get(k) == v for k, v in query.metadata.items())
    return _json([assistant][query.offset : query.offset + query.limit] if matches else [])


@router.post("/assistants/{assistant_id}/latest", response_model=Assistant)
async def set_latest_assistant_version(
    assistant_id: AssistantIdPath, body: _Latest, service: ServiceDep, principal: PrincipalDep
) -> Response:
    """Version 1 is the latest already; there is no other."""
    assistant = service.get_assistant(assistant_id, principal)
    if body.version != assistant["version"]:
        raise ServingError(404, f"assistant {assistant_id!r} has no version {body.version}; its only version is 1")
    return _json(assistant)


# Refusals, not operations: left out of the API description (which lists what works).
_NOT_ALLOWED: dict[str, Any] = {"status_code": 405, "response_model": None, "include_in_schema": False}


@router.post("/assistants", **_NOT_ALLOWED)
async def create_assistant() -> Response:
    """Refused: assistants come from the server's config (the detail says how)."""
    return _read_only("")


@router.patch("/assistants/{assistant_id}", **_NOT_ALLOWED)
async def update_assistant(assistant_id: AssistantIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Refused (after the 404/403 of an assistant the caller cannot see or use)."""
    if assistant_id in _STATIC:
        return _not_allowed("POST")
    service.resolve(assistant_id, principal)
    return _read_only("GET")


@router.delete("/assistants/{assistant_id}", **_NOT_ALLOWED)
async def delete_assistant(assistant_id: AssistantIdPath, service: ServiceDep, principal: PrincipalDep) -> Response:
    """Refused (after the 404/403 of an assistant the caller cannot see or use)."""
    if assistant_id in _STATIC:
        return _not_allowed("POST")
    service.resolve(assistant_id, principal)
    return _read_only("GET")
