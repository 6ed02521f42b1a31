"""``threads.search``, ``threads.count`` and ``threads.get_history`` honour every filter
the SDKs send (issue 12, finding 3): ``ids``, ``sort_by``/``sort_order``, ``select``,
``values`` and ``extract`` on search (``values`` on count too), and ``metadata``,
``checkpoint`` and ``select`` on history; through the official ``langgraph-sdk`` client
on a real server with two tenants (another tenant's threads are never found or counted).
Runs go through the graphs of ``tests/fakes/gated.py``."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

from serving.auth import Principal, TenantSettings
from serving.langgraph_api.protocol import ThreadSearch
from serving.langgraph_api.service import LangGraphService
from serving.persistence import ThreadSettings, open_thread_stores
from tests.serving.lg_ops_server import clients, ops_server, says  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


async def _ran(client: LangGraphClient, text: str, graph: str = "gated", **metadata: Any) -> str:
    tid = (await client.threads.create(metadata=metadata))["thread_id"]
    await client.runs.wait(tid, graph, input=says(text))
    return tid


async def test_search_by_ids_in_any_order_pages_without_repeats(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tag = uuid.uuid4().hex
    names = [f"{tag}-{letter}" for letter in "dbeac"]  # created in this order, not in id order
    for name in names:
        await acme.threads.create(thread_id=name, metadata={"tag": tag})
    other = (await globex.threads.create(metadata={"tag": tag}))["thread_id"]

    found = await acme.threads.search(ids=[names[0], names[3], other, str(uuid.uuid4())], sort_by="thread_id", sort_order="asc")
    assert [t["thread_id"] for t in found] == sorted([names[0], names[3]])  # not globex's, not the unknown id
    assert await globex.threads.search(ids=names) == []
    assert [t["thread_id"] for t in await globex.threads.search(ids=[other, names[0]])] == [other]

    ordered = [t["thread_id"] for t in await acme.threads.search(metadata={"tag": tag}, sort_by="thread_id", sort_order="desc")]
    assert ordered == sorted(names, reverse=True)
    oldest = await acme.threads.search(metadata={"tag": tag}, sort_by="created_at", sort_order="asc")
    assert [t["thread_id"] for t in oldest] == names
    assert [t["thread_id"] for t in await acme.threads.search(metadata={"tag": tag})] == names[::-1]  # default: newest first
    await acme.threads.update(names[2], metadata={"touched": True})
    assert (await acme.threads.search(metadata={"tag": tag}, sort_by="updated_at", sort_order="desc"))[0]["thread_id"] == names[2]
    # All five idle: ties broken by thread_id, so pages of two give each thread once.
    paged: list[str] = []
    for offset in range(0, 6, 2):
        page = await acme.threads.search(ids=names, sort_by="status", sort_order="asc", limit=2, offset=offset)
        paged.extend(t["thread_id"] for t in page)
    assert paged == sorted(names)


async def test_search_refuses_unknown_orders_and_too_many_ids(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    http = acme.http
    for body, field in (
        ({"sort_by": "metadata"}, "sort_by"),
        ({"sort_by": "created_at; DROP TABLE switchyard_threads"}, "sort_by"),
        ({"sort_order": "sideways"}, "sort_order"),
        ({"ids": [str(uuid.uuid4()) for _ in range(1001)]}, "ids"),
        ({"ids": ["not a thread id!"]}, "ids"),
        ({"select": ["thread_id", "secrets"]}, "select"),
        ({"select": []}, "select"),
        ({"extract": {"x": "nowhere.a"}}, "extract"),
        ({"extract": {"x": "values.a[b]"}}, "extract"),
        ({"extract": {f"k{i}": "values.a" for i in range(11)}}, "extract"),
    ):
        with pytest.raises(UnprocessableEntityError, match=field):
            await http.post("/threads/search", json=body)
    assert len(await acme.threads.search(ids=[str(uuid.uuid4()) for _ in range(1000)])) == 0  # the bound itself is fine


async def test_select_answers_only_those_fields(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tag = uuid.uuid4().hex
    tid = await _ran(acme, f"select {tag}", tag=tag)
    [thread] = await acme.threads.search(metadata={"tag": tag}, select=["thread_id", "status", "metadata"])
    assert set(thread) == {"thread_id", "status", "metadata"}
    assert thread["thread_id"] == tid and thread["status"] == "idle" and thread["metadata"]["tag"] == tag
    [with_values] = await acme.threads.search(metadata={"tag": tag}, select=["values"])
    assert set(with_values) == {"values"}
    assert with_values["values"]["messages"][0]["content"] == f"select {tag}"
    [whole] = await acme.threads.search(metadata={"tag": tag})
    assert set(whole) == {"thread_id", "created_at", "updated_at", "metadata", "status", "values", "interrupts", "config"}


async def test_values_filter_on_search_and_count(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tag = uuid.uuid4().hex
    texts = [f"{tag} {i}" for i in range(3)]
    tids = [await _ran(acme, text, tag=tag) for text in texts]
    empty = (await acme.threads.create(metadata={"tag": tag}))["thread_id"]  # no state at all
    await _ran(globex, texts[0], tag=tag)  # the same values in another tenant

    def mentions(text: str) -> dict[str, Any]:
        return {"messages": [{"type": "human", "content": text}]}

    found = await acme.threads.search(values=mentions(texts[1]))
    assert [t["thread_id"] for t in found] == [tids[1]]
    assert found[0]["values"]["messages"][0]["content"] == texts[1]
    assert await acme.threads.count(values=mentions(texts[1])) == 1
    assert await acme.threads.search(values=mentions(f"{tag} none")) == []
    assert await acme.threads.count(values=mentions(f"{tag} none")) == 0
    # Every thread that ran (the reply is the same), with the other filters and pages.
    ran = {"messages": [{"type": "ai", "content": "through the gate"}]}
    assert await acme.threads.count(values=ran, metadata={"tag": tag}) == 3
    assert await globex.threads.count(values=ran, metadata={"tag": tag}) == 1
    assert await acme.threads.count(metadata={"tag": tag}) == 4  # with the empty thread
    newest_first = [t["thread_id"] for t in await acme.threads.search(values=ran, metadata={"tag": tag})]
    assert newest_first == tids[::-1] and empty not in newest_first
    pages = [
        [t["thread_id"] for t in await acme.threads.search(values=ran, metadata={"tag": tag}, limit=2, offset=offset)]
        for offset in (0, 2, 4)
    ]
    assert pages == [tids[:0:-1], [tids[0]], []]
    assert [t["thread_id"] for t in await acme.threads.search(values=ran, ids=[tids[0], empty])] == [tids[0]]
    assert [t["thread_id"] for t in await globex.threads.search(values=mentions(texts[0]), ids=tids)] == []
    # Containment: scalars compare by type (a string is not the number).
    assert await acme.threads.count(values={"messages": [{"content": 1}]}, metadata={"tag": tag}) == 0


async def test_extract_answers_values_at_paths(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tag = uuid.uuid4().hex
    tid = await _ran(acme, f"extract {tag}", tag=tag)
    paths = {
        "last": "values.messages[-1].content",
        "first": "values.messages[0].content",
        "kind": "values.messages[1].type",
        "beyond": "values.messages[9].content",
        "missing": "values.nothing.here",
        "tag": "metadata.tag",
        "status": "status",
    }
    [thread] = await acme.threads.search(metadata={"tag": tag}, select=["thread_id"], extract=paths)
    assert thread == {
        "thread_id": tid,
        "extracted": {
            "last": "2 messages",  # the reply counts the question and the gate's answer
            "first": f"extract {tag}",
            "kind": "ai",
            "beyond": None,
            "missing": None,
            "tag": tag,
            "status": "idle",
        },
    }


async def test_history_filters_by_metadata_namespace_and_selects_fields(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme, "history")
    everything = await acme.threads.get_history(tid, limit=100)
    assert len(everything) > 2
    inputs = await acme.threads.get_history(tid, limit=100, metadata={"source": "input"})
    assert inputs and all(s["metadata"]["source"] == "input" for s in inputs)
    assert len(inputs) < len(everything)
    first = await acme.threads.get_history(tid, metadata={"step": -1})
    assert [s["checkpoint"]["checkpoint_id"] for s in first] == [everything[-1]["checkpoint"]["checkpoint_id"]]
    assert await acme.threads.get_history(tid, metadata={"source": "nowhere"}) == []

    # One checkpoint by its id; only the selected fields; values.<key> for one key.
    middle = everything[1]["checkpoint"]
    one = await acme.threads.get_history(tid, checkpoint={"checkpoint_ns": "", "checkpoint_id": middle["checkpoint_id"]})
    assert [s["checkpoint"]["checkpoint_id"] for s in one] == [middle["checkpoint_id"]]
    slim = await acme.threads.get_history(tid, limit=2, select=["checkpoint", "values.messages", "next"])
    assert [set(s) for s in slim] == [{"checkpoint", "values", "next"}] * 2
    assert slim[0]["values"] == {"messages": everything[0]["values"]["messages"]}
    assert slim[0]["checkpoint"] == everything[0]["checkpoint"]

    with pytest.raises(UnprocessableEntityError, match="select"):
        await acme.threads.get_history(tid, select=["values", "secrets"])
    with pytest.raises(UnprocessableEntityError, match="metadata"):
        await acme.threads.get_history(tid, metadata={"a.b": 1})
    with pytest.raises(UnprocessableEntityError, match="metadata"):
        await acme.threads.get_history(tid, metadata={"x') OR 1=1 --": 1})
    with pytest.raises(NotFoundError):
        await globex.threads.get_history(tid, metadata={"source": "input"})


async def test_history_of_a_subgraph_namespace(clients: dict[str, LangGraphClient]) -> None:
    acme = clients["acme"]
    tid = await _ran(acme, "nested", graph="nested")
    state = await acme.threads.get_state(tid)
    namespace = state["tasks"][0]["checkpoint"]["checkpoint_ns"]
    assert namespace.startswith("child:")
    inner = await acme.threads.get_history(tid, checkpoint={"checkpoint_ns": namespace})
    assert inner and all(s["checkpoint"]["checkpoint_ns"] == namespace for s in inner)
    assert inner[0]["next"] == ["ask"]
    outer = await acme.threads.get_history(tid)
    assert all(s["checkpoint"]["checkpoint_ns"] == "" for s in outer)
    assert {s["checkpoint"]["checkpoint_id"] for s in inner}.isdisjoint(s["checkpoint"]["checkpoint_id"] for s in outer)
    assert await acme.threads.get_history(tid, checkpoint={"checkpoint_ns": "nowhere:1"}) == []  # no checkpoints there
    one = await acme.threads.get_history(tid, checkpoint={"checkpoint_ns": namespace, "checkpoint_id": inner[-1]["checkpoint"]["checkpoint_id"]})
    assert [s["checkpoint"] for s in one] == [inner[-1]["checkpoint"]]
    with pytest.raises(NotFoundError):
        await clients["globex"].threads.get_history(tid, checkpoint={"checkpoint_ns": namespace})


async def test_search_reads_no_state_unless_an_answer_needs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, on a real SQLite store: which searches read each thread's state
    (``values`` and ``interrupts`` live in the checkpointer, the rest in the store)."""
    stores = await open_thread_stores(ThreadSettings(), tmp_path)
    try:
        for _ in range(3):
            await stores.threads.create(tenant="a", graph_id="chat", metadata={"tag": "t"})
        await stores.threads.create(tenant="b", graph_id="chat", metadata={"tag": "t"})
        host = SimpleNamespace(output_policy=lambda principal: None)
        service = LangGraphService([], stores.threads, stores.checkpointer, host, None)  # type: ignore[arg-type]
        reads: list[str] = []

        async def snapshot(record: Any, *args: Any, **kwargs: Any) -> None:
            reads.append(record.thread_id)

        monkeypatch.setattr(service, "_snapshot", snapshot)
        principal = Principal(tenant="a", key_id="k", settings=TenantSettings())

        async def search(**body: Any) -> list[dict[str, Any]]:
            reads.clear()
            return await service.search_threads(ThreadSearch(**body), principal)

        found = await search(select=["thread_id", "status", "metadata", "created_at", "updated_at", "config"])
        assert len(found) == 3 and reads == []
        assert len(await search(extract={"tag": "metadata.tag"}, select=["thread_id"])) == 3 and reads == []
        assert len(await search(select=["thread_id", "interrupts"])) == 3 and len(reads) == 3
        assert len(await search(select=["thread_id"], extract={"m": "values.messages[-1]"})) == 3 and len(reads) == 3
        assert len(await search()) == 3 and len(reads) == 3
    finally:
        await stores.aclose()
