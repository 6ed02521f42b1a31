"""The store API (``/store/*``) through the official ``langgraph-sdk`` client, on a
server with API keys and two tenants, once on SQLite and once on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import BadRequestError, UnprocessableEntityError

from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

_FAST = {"requests_per_s": 10000, "burst": 10000}
TENANTS = {"acme": {"graphs": ["*"], "limits": _FAST}, "globex": {"graphs": ["*"], "limits": _FAST}}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def secured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    """A server without --dev (keys required), its graph on the FAKE backend (no model
    needed), with a key for each tenant."""
    tmp = tmp_path_factory.mktemp(f"store-{request.param}")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat-fake": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
        "auth": {"tenants": TENANTS},
        "server": {"max_body_bytes": 65536},
    }
    database = None
    if request.param == "postgres":
        server_dsn: str = request.getfixturevalue("postgres")
        database = f"store_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server_dsn, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{database}"')
        settings["threads"] = {"postgres_dsn": server_dsn.rsplit("/", 1)[0] + f"/{database}"}
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)
        if database is not None:
            with psycopg.connect(server_dsn, autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    assert (tmp / "data" / "threads.sqlite").is_file() == (request.param == "sqlite")


@pytest.fixture
async def clients(secured: tuple[ServerHandle, dict[str, str]]) -> AsyncIterator[dict[str, LangGraphClient]]:
    server, keys = secured
    made = {tenant: get_client(url=server.url, api_key=key) for tenant, key in keys.items()}
    yield made
    for client in made.values():
        await client.http.client.aclose()


def _raw(secured: tuple[ServerHandle, dict[str, str]], tenant: str = "acme") -> httpx.Client:
    server, keys = secured
    return httpx.Client(base_url=server.url, headers={"x-api-key": keys[tenant]}, timeout=30)


async def test_put_get_search_list_delete(clients: dict[str, LangGraphClient]) -> None:
    store = clients["acme"].store
    root = f"docs-{uuid.uuid4().hex[:8]}"
    await store.put_item([root, "u1"], "a", {"title": "A", "n": 1})
    await store.put_item([root, "u1"], "b", {"title": "B", "n": 2}, index=False)
    await store.put_item([root, "u2"], "c", {"title": "C", "n": 2}, index=["title"], ttl=60)

    item = await store.get_item([root, "u1"], "a")
    assert {k: item[k] for k in ("namespace", "key", "value")} == {
        "namespace": [root, "u1"], "key": "a", "value": {"title": "A", "n": 1}}
    for field in ("created_at", "updated_at"):
        assert datetime.fromisoformat(item[field]).tzinfo is not None  # ISO 8601 with the zone

    await store.put_item([root, "u1"], "a", {"title": "A2"})  # replaces
    assert (await store.get_item([root, "u1"], "a", refresh_ttl=False))["value"] == {"title": "A2"}

    found = await store.search_items([root])
    assert sorted(i["key"] for i in found["items"]) == ["a", "b", "c"]
    assert all("score" in i and i["score"] is None for i in found["items"])
    assert sorted(i["key"] for i in (await store.search_items([root], filter={"n": 2}))["items"]) == ["b", "c"]
    assert [i["key"] for i in (await store.search_items([root, "u2"], filter={"n": {"$eq": 2}}))["items"]] == ["c"]
    not_a2 = await store.search_items([root], filter={"title": {"$ne": "A2"}, "n": 2})
    assert sorted(i["key"] for i in not_a2["items"]) == ["b", "c"]
    pages = [
        i["key"] for offset in range(3)
        for i in (await store.search_items([root], limit=1, offset=offset))["items"]
    ]
    assert sorted(pages) == ["a", "b", "c"]

    listed = await store.list_namespaces(prefix=[root])
    assert listed == {"namespaces": [[root, "u1"], [root, "u2"]]}
    assert (await store.list_namespaces(prefix=[root], max_depth=1)) == {"namespaces": [[root]]}
    assert (await store.list_namespaces(prefix=[root], suffix=["u2"])) == {"namespaces": [[root, "u2"]]}
    assert (await store.list_namespaces(prefix=[root, "*"], limit=1, offset=1)) == {"namespaces": [[root, "u2"]]}

    await store.delete_item([root, "u1"], "a")
    assert await store.get_item([root, "u1"], "a") is None
    await store.delete_item([root, "u1"], "a")  # again: nothing to delete, no error


async def test_a_missing_item_is_null_as_on_langgraph_server(
    clients: dict[str, LangGraphClient], secured: tuple[ServerHandle, dict[str, str]]
) -> None:
    # The JS SDK's getItem returns `Item | null` from this `null`; the Python SDK's None.
    assert await clients["acme"].store.get_item(["nothing", "here"], "k") is None
    with _raw(secured) as http:
        response = http.get("/store/items", params={"namespace": "nothing.here", "key": "k"})
    assert response.status_code == 200 and response.json() is None


async def test_tenants_never_see_each_others_items(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"].store, clients["globex"].store
    root = f"shared-{uuid.uuid4().hex[:8]}"
    await acme.put_item([root, "x"], "k", {"owner": "acme", "secret": 1})

    assert await globex.get_item([root, "x"], "k") is None
    assert (await globex.search_items([root]))["items"] == []
    assert all(i["value"].get("owner") != "acme" for i in (await globex.search_items([], limit=1000))["items"])
    assert (await globex.search_items([], filter={"secret": 1}))["items"] == []
    assert (await globex.list_namespaces(prefix=[root]))["namespaces"] == []
    assert [root, "x"] not in (await globex.list_namespaces(limit=1000))["namespaces"]

    await globex.delete_item([root, "x"], "k")  # deletes nothing of acme's
    await globex.put_item([root, "x"], "k", {"owner": "globex"})  # its own item, same name
    assert (await acme.get_item([root, "x"], "k"))["value"] == {"owner": "acme", "secret": 1}
    assert (await globex.get_item([root, "x"], "k"))["value"] == {"owner": "globex"}

    # Namespaces come back as they were written: the tenant's hidden label never shows.
    for client in (acme, globex):
        for namespace in (await client.list_namespaces(limit=1000))["namespaces"]:
            assert not namespace[0].startswith("tenant:"), namespace
        for item in (await client.search_items([], limit=1000))["items"]:
            assert not item["namespace"][0].startswith("tenant:"), item
    assert (await acme.list_namespaces(prefix=[root], max_depth=1))["namespaces"] == [[root]]


async def test_a_key_is_required(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, _ = secured
    response = httpx.post(server.url + "/store/items/search", json={})
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/store/items", {"namespace": ["a.b"], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": ["a", ""], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": [], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": "a", "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": ["langgraph"], "key": "k", "value": {}}, "namespace"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "", "value": {}}, "key"),
        ("PUT", "/store/items", {"namespace": ["a"], "value": {}}, "key"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": [1]}, "value"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": "text"}, "value"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {"t": "nul\u0000"}}, "value"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}, "index": True}, "index"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}, "ttl": -1}, "ttl"),
        ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}, "ttl": 1e300}, "ttl"),
        ("DELETE", "/store/items", {"namespace": ["a.b"], "key": "k"}, "namespace"),
        ("DELETE", "/store/items", {"namespace": ["a"]}, "key"),
        ("POST", "/store/items/search", {"namespace_prefix": ["a.b"]}, "namespace_prefix"),
        ("POST", "/store/items/search", {"filter": {"bad key!": 1}}, "filter"),
        ("POST", "/store/items/search", {"filter": {"n": {"$regex": "x"}}}, "filter"),
        ("POST", "/store/items/search", {"limit": 0}, "limit"),
        ("POST", "/store/items/search", {"offset": -1}, "offset"),
        ("POST", "/store/namespaces", {"prefix": ["a.b"]}, "prefix"),
        ("POST", "/store/namespaces", {"suffix": [""]}, "suffix"),
        ("POST", "/store/namespaces", {"max_depth": 0}, "max_depth"),
        ("POST", "/store/namespaces", {"limit": 100000}, "limit"),
    ],
)
def test_bad_input_is_422_naming_the_field(
    secured: tuple[ServerHandle, dict[str, str]], method: str, path: str, body: dict[str, Any], field: str
) -> None:
    with _raw(secured) as http:
        response = http.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"], response.text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"namespace": "a..b", "key": "k"}, "namespace"),
        ({"namespace": "", "key": "k"}, "namespace"),
        ({"namespace": "a", "key": ""}, "key"),
        ({"namespace": "a"}, "key"),
        ({"key": "k"}, "namespace"),
        ({"namespace": "a", "key": "k", "refresh_ttl": "maybe"}, "refresh_ttl"),
    ],
)
def test_bad_get_is_422_naming_the_field(
    secured: tuple[ServerHandle, dict[str, str]], params: dict[str, str], field: str
) -> None:
    with _raw(secured) as http:
        response = http.get("/store/items", params=params)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"], response.text


async def test_semantic_search_without_an_index_is_400_naming_query(clients: dict[str, LangGraphClient]) -> None:
    with pytest.raises(BadRequestError) as refused:
        await clients["acme"].store.search_items(["docs"], query="anything about cats")
    assert refused.value.response.status_code == 400
    assert "query" in refused.value.response.json()["detail"]


async def test_sdk_refusals_and_body_limit(
    clients: dict[str, LangGraphClient], secured: tuple[ServerHandle, dict[str, str]]
) -> None:
    with pytest.raises(UnprocessableEntityError):
        await clients["acme"].store.put_item(["a"], "k", {"n": 1}, ttl=0)  # type: ignore[arg-type]
    with _raw(secured) as http:
        big = http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": {"t": "x" * 70000}})
    assert big.status_code == 413 and "request body larger than" in big.json()["detail"]  # the LangGraph shape
