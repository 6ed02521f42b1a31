"""``POST /threads/count`` and ``POST /assistants/count`` (issue 12, finding 3) through
the official ``langgraph-sdk`` client (``threads.count``, ``assistants.count``) on a
real server with two tenants' keys: the same filters and tenant scoping as the
``/search`` routes, an integer body as the Agent Server answers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

TENANTS = {"acme": {"graphs": ["chat"]}, "globex": {"graphs": ["*"]}}


@pytest.fixture(scope="module")
def tenants_server(
    tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("langgraph-counts")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
            "chat-too": {"path": "graphs.chat:make_graph", "model": "chat-default"},
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


async def test_threads_count_has_the_search_filters_and_only_the_tenants_threads(
    clients: dict[str, LangGraphClient], tenants_server: tuple[ServerHandle, dict[str, str]]
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tag = uuid.uuid4().hex
    for n in range(3):
        await acme.threads.create(metadata={"tag": tag, "n": n})
    await globex.threads.create(metadata={"tag": tag})  # the same tag, another tenant

    assert await acme.threads.count(metadata={"tag": tag}) == 3
    assert await acme.threads.count(metadata={"tag": tag, "n": 1}) == 1
    assert await acme.threads.count(metadata={"tag": tag}, status="idle") == 3
    assert await acme.threads.count(metadata={"tag": tag}, status="busy") == 0
    assert await globex.threads.count(metadata={"tag": tag}) == 1
    assert await acme.threads.count(metadata={"tag": uuid.uuid4().hex}) == 0
    # The same number as every page of /threads/search with the same filters.
    every = await acme.threads.search(metadata={"tag": tag}, limit=1000)
    assert len(every) == 3
    assert await acme.threads.count() == len(await acme.threads.search(limit=1000))

    server, keys = tenants_server
    raw = httpx.post(server.url + "/threads/count", json={"metadata": {"tag": tag}},
                     headers={"x-api-key": keys["acme"]})
    assert raw.status_code == 200 and raw.json() == 3 and raw.text == "3"
    refused = httpx.post(server.url + "/threads/count", json={"status": "sleeping"}, headers={"x-api-key": keys["acme"]})
    assert refused.status_code == 422
    assert httpx.post(server.url + "/threads/count", json={}).status_code == 401


async def test_assistants_count_has_the_search_filters_and_only_the_tenants_graphs(
    clients: dict[str, LangGraphClient],
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    assert await acme.assistants.count() == len(await acme.assistants.search(limit=100)) == 1
    assert await globex.assistants.count() == len(await globex.assistants.search(limit=100)) == 2
    assert await globex.assistants.count(graph_id="chat-too") == 1
    assert await acme.assistants.count(graph_id="chat-too") == 0  # not acme's to use
    assert await globex.assistants.count(graph_id="nope") == 0
    assert await globex.assistants.count(metadata={"no-such-key": "x"}) == 0
