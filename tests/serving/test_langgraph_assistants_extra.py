"""The assistant routes beyond search/count/get (issue 12, finding 3) through the
official ``langgraph-sdk`` client on a real server with two tenants' keys:
``assistants.get_graph`` (xray), ``get_schemas``, ``get_subgraphs`` (namespace,
recurse), the writes refused with a 405 that says how to add a graph, versions and
``set_latest``; every route is scoped like ``GET /assistants/{id}`` (403 a graph the
tenant may not use, 404 unknown), and none shadows ``/assistants/search|count``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIStatusError, NotFoundError, PermissionDeniedError

from serving.langgraph_api.protocol import assistant_uuid
from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

_UNLIMITED = {"requests_per_s": 1000, "burst": 1000}
TENANTS = {
    "acme": {"graphs": ["chat", "nested"], "limits": _UNLIMITED},
    "globex": {"graphs": ["nested"], "limits": _UNLIMITED},
}


@pytest.fixture(scope="module")
def tenants_server(
    tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("langgraph-assistants")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
            "nested": {"path": "tests.fakes.nested_graphs:make_nested_graph", "model": "chat-default"},
        },
        "auth": {"tenants": TENANTS},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


@pytest.fixture
async def clients(tenants_server: tuple[ServerHandle, dict[str, str]]) -> AsyncIterator[dict[str, LangGraphClient]]:
    server, keys = tenants_server
    clients = {tenant: get_client(url=server.url, api_key=key) for tenant, key in keys.items()}
    yield clients
    for client in clients.values():
        await client.http.client.aclose()


def _raw(tenants_server: tuple[ServerHandle, dict[str, str]], method: str, path: str, **kwargs: Any) -> httpx.Response:
    server, keys = tenants_server
    return httpx.request(method, server.url + path, headers={"x-api-key": keys["acme"]}, timeout=30, **kwargs)


async def test_get_graph_draws_nodes_and_edges_and_xray_opens_subgraphs(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    chat = await acme.assistants.get_graph("chat")
    assert [n["id"] for n in chat["nodes"]] == ["__start__", "call_model", "__end__"]
    assert chat["edges"] == [{"source": "__start__", "target": "call_model"}, {"source": "call_model", "target": "__end__"}]
    assert "id" not in chat["nodes"][1]["data"]  # not the module path of the node's runnable
    # By the system assistant's UUID too.
    assert await acme.assistants.get_graph(assistant_uuid("chat")) == chat

    flat = {n["id"] for n in (await acme.assistants.get_graph("nested"))["nodes"]}
    assert flat == {"__start__", "inner", "after", "__end__"}
    xray = {n["id"] for n in (await acme.assistants.get_graph("nested", xray=True))["nodes"]}
    assert {"inner:middle", "inner:deeper:bottom"} <= xray and "inner" not in xray
    one = {n["id"] for n in (await acme.assistants.get_graph("nested", xray=1))["nodes"]}
    assert {"inner:middle", "inner:deeper"} <= one and "inner:deeper:bottom" not in one


@pytest.mark.parametrize("xray", ["0", "-1", "maybe", "101"])
def test_a_bad_xray_is_a_422_naming_it(tenants_server: tuple[ServerHandle, dict[str, str]], xray: str) -> None:
    answer = _raw(tenants_server, "GET", "/assistants/chat/graph", params={"xray": xray})
    assert answer.status_code == 422
    assert "xray" in answer.json()["detail"]


async def test_get_schemas_describes_input_output_state_and_the_clients_context(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    schemas = await acme.assistants.get_schemas("chat")
    assert set(schemas) == {"graph_id", "input_schema", "output_schema", "state_schema", "config_schema", "context_schema"}
    assert schemas["graph_id"] == "chat"
    for key in ("input_schema", "output_schema", "state_schema"):
        assert list(schemas[key]["properties"]) == ["messages"], key
        assert schemas[key]["properties"]["messages"]["type"] == "array"
    assert schemas["config_schema"] is None  # graphs declare no `configurable` of their own
    # The context a client may send; the server-set fields (tenant, policies, budget) are not described.
    context = schemas["context_schema"]
    assert set(context["properties"]) == {"model_params", "collection"}
    text = json.dumps(context)
    assert "tenant" not in text and "output_policy" not in text and "OutputPolicy" not in text and "$defs" not in context

    nested = await acme.assistants.get_schemas(assistant_uuid("nested"))
    assert nested["graph_id"] == "nested"
    assert set(nested["state_schema"]["properties"]) == {"messages", "hops"}
    assert nested["input_schema"]["properties"]["hops"]["type"] == "integer"


async def test_get_subgraphs_by_namespace_and_recursively(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    assert await acme.assistants.get_subgraphs("chat") == {}
    top = await acme.assistants.get_subgraphs("nested")
    assert list(top) == ["inner"]
    assert set(top["inner"]["state_schema"]["properties"]) == {"messages", "hops"}
    assert set(top["inner"]) == {"input_schema", "output_schema", "state_schema", "config_schema", "context_schema"}
    every = await acme.assistants.get_subgraphs("nested", recurse=True)
    assert set(every) == {"inner", "inner|deeper"}
    assert list(await acme.assistants.get_subgraphs("nested", namespace="inner")) == ["inner"]
    # A namespace with the separator in it travels in the path (the SDK quotes it).
    assert list(await acme.assistants.get_subgraphs("nested", namespace="inner|deeper", recurse=True)) == ["inner|deeper"]
    assert await acme.assistants.get_subgraphs("nested", namespace="nope") == {}


async def test_the_routes_are_scoped_to_the_tenants_graphs(
    clients: dict[str, LangGraphClient], tenants_server: tuple[ServerHandle, dict[str, str]]
) -> None:
    globex = clients["globex"]
    assert (await globex.assistants.get_schemas("nested"))["graph_id"] == "nested"
    for call in (
        globex.assistants.get_graph("chat"),
        globex.assistants.get_schemas("chat"),
        globex.assistants.get_subgraphs("chat"),
        globex.assistants.get_subgraphs("chat", namespace="x"),
        globex.assistants.get_versions("chat"),
    ):
        with pytest.raises(PermissionDeniedError):
            await call
    for call in (
        globex.assistants.get_graph("nope"),
        globex.assistants.get_schemas("nope"),
        globex.assistants.get_subgraphs("nope"),
        globex.assistants.update("nope", metadata={"a": 1}),
        globex.assistants.delete("nope"),
    ):
        with pytest.raises(NotFoundError):
            await call
    with pytest.raises(PermissionDeniedError):
        await globex.assistants.delete("chat")
    server, _ = tenants_server
    assert httpx.get(server.url + "/assistants/chat/schemas").status_code == 401


async def test_writes_are_refused_with_a_405_saying_how_to_add_a_graph(
    clients: dict[str, LangGraphClient], tenants_server: tuple[ServerHandle, dict[str, str]]
) -> None:
    acme = clients["acme"]
    for call in (
        acme.assistants.create("chat", config={"configurable": {"x": 1}}, name="mine"),
        acme.assistants.update("chat", metadata={"a": 1}),
        acme.assistants.delete("chat"),
    ):
        with pytest.raises(APIStatusError) as refused:
            await call
        assert refused.value.response.status_code == 405
        detail = refused.value.response.json()["detail"]
        assert "registered graphs" in detail and "graphs:" in detail
    assert _raw(tenants_server, "POST", "/assistants", json={"graph_id": "chat"}).headers["allow"] == ""
    assert _raw(tenants_server, "DELETE", "/assistants/chat").headers["allow"] == "GET"
    # Nothing changed.
    assert (await acme.assistants.get("chat"))["metadata"].get("a") is None


async def test_an_assistant_has_one_version(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    assistant = await acme.assistants.get("chat")
    assert await acme.assistants.get_versions("chat") == [assistant]
    assert await acme.assistants.get_versions(assistant_uuid("chat"), limit=1) == [assistant]
    assert await acme.assistants.get_versions("chat", offset=1) == []
    assert await acme.assistants.get_versions("chat", metadata={"created_by": "system"}) == [assistant]
    assert await acme.assistants.get_versions("chat", metadata={"created_by": "someone"}) == []
    assert await acme.assistants.set_latest("chat", 1) == assistant
    with pytest.raises(NotFoundError):
        await acme.assistants.set_latest("chat", 2)


async def test_search_count_and_get_are_not_shadowed(
    clients: dict[str, LangGraphClient], tenants_server: tuple[ServerHandle, dict[str, str]]
) -> None:
    acme = clients["acme"]
    assert {a["graph_id"] for a in await acme.assistants.search()} == {"chat", "nested"}
    assert await acme.assistants.count() == 2
    assert (await acme.assistants.get("nested"))["graph_id"] == "nested"
    # /assistants/search and /count are POST routes: another method on them is a 405 naming POST.
    for path in ("/assistants/search", "/assistants/count"):
        for method in ("PATCH", "DELETE"):
            answer = _raw(tenants_server, method, path)
            assert (answer.status_code, answer.headers["allow"]) == (405, "POST"), (method, path)
    assert _raw(tenants_server, "GET", "/assistants/search/graph").status_code == 404
