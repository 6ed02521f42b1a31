"""The LangGraph Server store API: ``/store/items``, ``/store/items/search``,
``/store/namespaces``, as ``client.store.*`` in the Python and JS SDKs call them.

Wire models, the service and the routes of the store, on `serving.store` (LangGraph's
own stores on the thread stores' database). Shapes as in ``langgraph_sdk.schema``
(``Item``, ``SearchItemsResponse``, ``ListNamespaceResponse``) and LangGraph Server:

- ``PUT /store/items`` ``{namespace, key, value, index?, ttl?}``: 204.
- ``GET /store/items?namespace=a.b&key=k[&refresh_ttl=...]``: the item, or ``null``
  when there is none (both SDKs send the namespace joined with ``.``; the JS SDK's
  ``getItem`` returns ``Item | null`` from that ``null``, the Python SDK's ``get_item``
  returns ``None``; a 404 would make both raise).
- ``DELETE /store/items`` ``{namespace, key}``: 204, whether or not it existed.
- ``POST /store/items/search`` ``{namespace_prefix, filter, limit, offset, query,
  refresh_ttl}``: ``{"items": [...]}``, each with ``score`` (``null``: no semantic search).
- ``POST /store/namespaces`` ``{prefix, suffix, max_depth, limit, offset}``:
  ``{"namespaces": [[...], ...]}``.

Every call is the caller's tenant's (`serving.store.TenantStore`): another tenant's
items are as absent as items never written. Bad input is a 422 naming the field
(LangGraph's namespace rule: a non-empty list of non-empty labels without ``.``, and
not rooted at ``langgraph`` when writing); a ``query`` (semantic search) is a 400 since
no index is configured.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from langgraph.store.base import Item, SearchItem
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from serving._json import json_problem
from serving.auth import Principal
from serving.deps import PrincipalDep, require_key
from serving.errors import RequestError, ServingError
from serving.langgraph_api.bodies import JsonBodyRoute
from serving.langgraph_api.protocol import Detail
from serving.store import StoreBackend, TenantStore

__all__ = [
    "ListNamespaces",
    "ListNamespacesResponse",
    "SearchItemsResponse",
    "StoreItem",
    "SearchItems",
    "StoreDelete",
    "StorePut",
    "StoreService",
    "router",
]

_MAX_OFFSET = 2**31 - 1
_MAX_TTL_MINUTES = 100 * 365 * 24 * 60
"""A century: an expiry any database's timestamps can hold."""

_FILTER_KEY = re.compile(r"^[A-Za-z0-9_.-]+$")
"""Filter keys the library's stores accept (its SQLite store's rule, for both)."""
_FILTER_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def _labels(labels: list[str]) -> list[str]:
    """LangGraph's namespace label rule (``langgraph.store.base``): non-empty text
    without ``.`` (labels are stored joined with ``.``)."""
    for label in labels:
        if not label:
            raise ValueError("namespace labels cannot be empty")
        if "." in label:
            raise ValueError(f"namespace label {label!r} contains a period ('.')")
    return labels


def _namespace(labels: list[str]) -> list[str]:
    if not labels:
        raise ValueError("a namespace needs at least one label")
    return _labels(labels)


_LABEL_SCHEMA = {"type": "string", "minLength": 1, "pattern": "^[^.]+$"}

# The schema states the rule; the validators check it with messages that say why.
Namespace = Annotated[
    list[str],
    AfterValidator(_namespace),
    WithJsonSchema({"type": "array", "items": _LABEL_SCHEMA, "minItems": 1}),
]
"""A namespace: a non-empty list of labels."""
NamespacePath = Annotated[list[str], AfterValidator(_labels), WithJsonSchema({"type": "array", "items": _LABEL_SCHEMA})]
"""A namespace prefix or suffix (may be empty)."""


class _StoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="after")
    def _storable(self) -> _StoreRequest:
        # Text a database cannot keep (NUL, lone surrogates), numbers JSON cannot carry
        # back: refused here, naming where, rather than failing in the database.
        problem = json_problem({name: getattr(self, name) for name in self.model_fields_set}, stored=True)
        if problem is not None:
            raise ValueError(problem)
        return self


class StorePut(_StoreRequest):
    """``PUT /store/items``: store or replace one item."""

    namespace: Namespace
    """Where the item lives, e.g. ``["memories", "user-1"]``."""
    key: str = Field(min_length=1)
    """Its key within the namespace."""
    value: dict[str, Any]
    """The item: a JSON object."""
    index: Literal[False] | list[str] | None = None
    """Fields to index for semantic search; no index is configured, so it has no effect."""
    ttl: float | None = Field(default=None, gt=0, le=_MAX_TTL_MINUTES)
    """Minutes until the item expires unless read (reads refresh it); none: never."""

    @field_validator("namespace")
    @classmethod
    def _not_reserved(cls, namespace: list[str]) -> list[str]:
        if namespace[0] == "langgraph":
            raise ValueError('the root label "langgraph" is reserved')
        return namespace


class StoreDelete(_StoreRequest):
    """``DELETE /store/items``."""

    namespace: Namespace
    key: str = Field(min_length=1)


class SearchItems(_StoreRequest):
    """``POST /store/items/search``: the items under a namespace prefix, newest first."""

    namespace_prefix: NamespacePath = Field(default_factory=list)
    """Search this namespace and those under it; empty: all of the caller's."""
    filter: dict[str, Any] | None = None
    """Top-level value fields equal to these values, or ``{"$eq" | "$ne" | "$gt" |
    "$gte" | "$lt" | "$lte": value}``."""
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=_MAX_OFFSET)
    query: str | None = None
    """Semantic search: refused, no index is configured."""
    refresh_ttl: bool | None = None
    """Refresh the expiry of the items found (default: yes)."""

    @field_validator("filter")
    @classmethod
    def _filter(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, condition in (value or {}).items():
            if not _FILTER_KEY.match(key):
                raise ValueError(f"filter key {key!r}: only letters, digits, '_', '.' and '-'")
            if isinstance(condition, dict):
                if not condition:
                    raise ValueError(f"filter {key!r}: an empty operator object")
                if unknown := set(condition) - _FILTER_OPERATORS:
                    raise ValueError(
                        f"filter {key!r}: unknown operator(s) {', '.join(sorted(map(repr, unknown)))};"
                        f" one of {', '.join(sorted(_FILTER_OPERATORS))}"
                    )
        return value


class ListNamespaces(_StoreRequest):
    """``POST /store/namespaces``: the caller's namespaces (``*`` in a prefix or suffix
    matches any one label)."""

    prefix: NamespacePath | None = None
    suffix: NamespacePath | None = None
    max_depth: int | None = Field(default=None, ge=1, le=1000)
    """Namespaces cut to this many labels (and deduplicated)."""
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=_MAX_OFFSET)


class StoreItem(BaseModel):
    """An item (``langgraph_sdk.schema.Item``; ``score`` on search results only)."""

    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: str
    """ISO 8601, with the zone."""
    updated_at: str
    score: float | None = None
    """Search results: the relevance of a semantic search, else ``null``."""


class SearchItemsResponse(BaseModel):
    """``POST /store/items/search``."""

    items: list[StoreItem]


class ListNamespacesResponse(BaseModel):
    """``POST /store/namespaces``."""

    namespaces: list[list[str]]


def _timestamp(value: datetime) -> str:
    # SQLite keeps UTC without a zone; PostgreSQL returns it with one.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


def _item(item: Item) -> dict[str, Any]:
    """An item in the wire shape of ``langgraph_sdk.schema.Item`` (and ``SearchItem``)."""
    body: dict[str, Any] = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": _timestamp(item.created_at),
        "updated_at": _timestamp(item.updated_at),
    }
    if isinstance(item, SearchItem):
        body["score"] = item.score
    return body


class StoreService:
    """The store API's work: each call on the caller's tenant's `TenantStore`."""

    def __init__(self, store: StoreBackend) -> None:
        self._store = store

    def _tenant(self, principal: Principal) -> TenantStore:
        return TenantStore(self._store, principal.tenant)

    async def put_item(self, body: StorePut, principal: Principal) -> None:
        # Through the library's `aput`, so its own checks and TTL handling apply; an
        # `index` without a configured index is ignored there.
        await self._tenant(principal).aput(tuple(body.namespace), body.key, body.value, index=body.index, ttl=body.ttl)

    async def get_item(self, namespace: str, key: str, refresh_ttl: bool | None, principal: Principal) -> dict[str, Any] | None:
        """The item, or None; ``namespace`` is the labels joined with ``.``.

        Raises:
            ServingError: 422 for an empty label or key.
        """
        labels = namespace.split(".")
        try:
            _namespace(labels)
        except ValueError as exc:
            raise ServingError(422, f"namespace: {exc}") from None
        if not key:
            raise ServingError(422, "key: must not be empty")
        problem = json_problem({"namespace": namespace, "key": key}, stored=True)
        if problem is not None:
            raise ServingError(422, problem)
        item = await self._tenant(principal).aget(tuple(labels), key, refresh_ttl=refresh_ttl)
        return None if item is None else _item(item)

    async def delete_item(self, body: StoreDelete, principal: Principal) -> None:
        await self._tenant(principal).adelete(tuple(body.namespace), body.key)

    async def search_items(self, body: SearchItems, principal: Principal) -> dict[str, Any]:
        """Raises:
        RequestError: a ``query`` (semantic search) without a configured index.
        """
        if body.query and not self._store.semantic:
            raise RequestError(
                "semantic search needs a vector index, and none is configured on this server;"
                " search with namespace_prefix and filter instead",
                param="query",
            )
        items = await self._tenant(principal).asearch(
            tuple(body.namespace_prefix),
            filter=body.filter,
            limit=body.limit,
            offset=body.offset,
            query=body.query or None,
            refresh_ttl=body.refresh_ttl,
        )
        return {"items": [_item(item) for item in items]}

    async def list_namespaces(self, body: ListNamespaces, principal: Principal) -> dict[str, Any]:
        namespaces = await self._tenant(principal).alist_namespaces(
            prefix=tuple(body.prefix) if body.prefix else None,
            suffix=tuple(body.suffix) if body.suffix else None,
            max_depth=body.max_depth,
            limit=body.limit,
            offset=body.offset,
        )
        return {"namespaces": [list(namespace) for namespace in namespaces]}


# --- routes -----------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": description, "content": {"application/json": {"schema": Detail.model_json_schema()}}}
    for status, description in {
        400: "Refused: semantic search (query) without a configured index",
        401: "Missing or invalid API key",
        413: "Request body too large",
        422: "Invalid request (names the field)",
        429: "Rate limit (see Retry-After)",
        503: "The store's database failed or did not answer (see Retry-After)",
    }.items()
}

router = APIRouter(tags=["store"], dependencies=[require_key], responses=_ERRORS, route_class=JsonBodyRoute)


async def _service(request: Request) -> StoreService:
    service: StoreService = request.app.state.store_service
    return service


StoreServiceDep = Annotated[StoreService, Depends(_service)]


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


@router.put("/store/items", status_code=204, response_class=Response)
async def put_item(body: StorePut, service: StoreServiceDep, principal: PrincipalDep) -> Response:
    """Store or replace an item."""
    await service.put_item(body, principal)
    return Response(status_code=204)


@router.get("/store/items", response_model=StoreItem | None)
async def get_item(
    service: StoreServiceDep,
    principal: PrincipalDep,
    namespace: Annotated[
        str,
        Query(description="The namespace's labels joined with '.'", json_schema_extra={"pattern": r"^[^.]+(\.[^.]+)*$"}),
    ],
    key: Annotated[str, Query(json_schema_extra={"minLength": 1})],
    refresh_ttl: Annotated[bool | None, Query(description="Refresh the item's expiry (default: yes)")] = None,
) -> Response:
    """The item, or ``null`` if there is none (in this tenant)."""
    return _json(await service.get_item(namespace, key, refresh_ttl, principal))


@router.delete("/store/items", status_code=204, response_class=Response)
async def delete_item(body: StoreDelete, service: StoreServiceDep, principal: PrincipalDep) -> Response:
    """Delete an item (204 whether or not it existed)."""
    await service.delete_item(body, principal)
    return Response(status_code=204)


@router.post("/store/items/search", response_model=SearchItemsResponse)
async def search_items(service: StoreServiceDep, principal: PrincipalDep, body: SearchItems | None = None) -> Response:
    """Items under a namespace prefix, filtered by value fields, newest first."""
    return _json(await service.search_items(body or SearchItems(), principal))


@router.post("/store/namespaces", response_model=ListNamespacesResponse)
async def list_namespaces(service: StoreServiceDep, principal: PrincipalDep, body: ListNamespaces | None = None) -> Response:
    """The caller's namespaces, optionally by prefix, suffix and depth."""
    return _json(await service.list_namespaces(body or ListNamespaces(), principal))
