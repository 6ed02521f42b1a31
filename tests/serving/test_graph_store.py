"""A run's nodes get LangGraph's store as ``runtime.store``, as LangGraph Server gives
graphs theirs: the tenant's own view of the items ``/store/*`` shows, on both APIs,
threads and stateless runs alike; another tenant's memory is never seen."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from tests.serving.lg_ops_server import OpsServer, clients, ops_server, says  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.e2e]


def _answer(state: dict) -> str:
    return str(state["messages"][-1]["content"])


async def test_a_graph_remembers_in_its_tenants_store(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme, globex = clients["acme"], clients["globex"]
    await acme.store.delete_item(["memories"], "last")
    await globex.store.delete_item(["memories"], "last")
    tid = (await acme.threads.create())["thread_id"]
    assert _answer(await acme.runs.wait(tid, "memory", input=says("the sky is green"))) == "I remembered: nothing yet"
    # A stateless run of the same tenant, on the other API: the same memory.
    openai = httpx.post(
        ops_server.handle.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {ops_server.keys['acme']}"},
        json={"model": "memory", "messages": says("water is dry")["messages"]},
        timeout=60,
    )
    assert openai.status_code == 200, openai.text
    assert openai.json()["choices"][0]["message"]["content"] == "I remembered: the sky is green"
    assert _answer(await acme.runs.wait(None, "memory", input=says("third"))) == "I remembered: water is dry"
    # The store API shows the tenant the item its graph wrote.
    item = await acme.store.get_item(["memories"], "last")
    assert item is not None and item["value"] == {"text": "third"} and item["namespace"] == ["memories"]
    # Another tenant's graph starts from nothing and never sees acme's memory.
    other = (await globex.threads.create())["thread_id"]
    assert _answer(await globex.runs.wait(other, "memory", input=says("mine"))) == "I remembered: nothing yet"
    assert (await globex.store.get_item(["memories"], "last"))["value"] == {"text": "mine"}
    assert (await acme.store.get_item(["memories"], "last"))["value"] == {"text": "third"}
