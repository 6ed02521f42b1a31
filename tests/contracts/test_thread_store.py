"""One contract for every thread store: SQLite (embedded) and PostgreSQL (a real
server from the fixtures), each test on a fresh database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serving.persistence import ThreadSettings, ThreadStores, open_thread_stores

pytestmark = [pytest.mark.integration]


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ThreadStores]:
    if request.param == "postgres":
        settings = ThreadSettings(postgres_dsn=request.getfixturevalue("postgres_dsn"))
    else:
        settings = ThreadSettings()
    opened = await open_thread_stores(settings, tmp_path)
    assert opened.backend == request.param
    yield opened
    await opened.aclose()


async def test_create_get_and_tenant_isolation(stores: ThreadStores) -> None:
    threads = stores.threads
    record, created = await threads.create(tenant="a", metadata={"k": "v"}, graph_id="chat")
    assert created and record is not None and record.status == "idle" and record.metadata == {"k": "v"}
    assert (await threads.get(record.thread_id, tenant="a")) == record
    assert await threads.get(record.thread_id, tenant="b") is None
    again, created_again = await threads.create(tenant="a", thread_id=record.thread_id)
    assert not created_again and again == record
    foreign, created_foreign = await threads.create(tenant="b", thread_id=record.thread_id)
    assert foreign is None and not created_foreign


async def test_update_and_merge_metadata(stores: ThreadStores) -> None:
    threads = stores.threads
    record, _ = await threads.create(tenant="a", metadata={"keep": 1})
    assert record is not None
    await threads.update(record.thread_id, status="busy", graph_id="chat")
    await threads.set_metadata(record.thread_id, {"graph_id": "chat", "keep": 2})
    stored = await threads.get(record.thread_id, tenant="a")
    assert stored is not None and stored.status == "busy" and stored.graph_id == "chat"
    assert stored.metadata == {"keep": 2, "graph_id": "chat"}
    assert stored.updated_at >= record.updated_at


async def test_search_by_metadata_status_and_pages_newest_first(stores: ThreadStores) -> None:
    threads = stores.threads
    ids = []
    for index in range(5):
        record, _ = await threads.create(tenant="a", metadata={"team": "x" if index % 2 else "y", "n": index})
        assert record is not None
        ids.append(record.thread_id)
        await asyncio.sleep(0.002)  # distinct creation times
    await threads.create(tenant="b", metadata={"team": "x"})
    await threads.update(ids[1], status="interrupted")
    assert [r.thread_id for r in await threads.search(tenant="a", limit=10)] == ids[::-1]
    assert [r.thread_id for r in await threads.search(tenant="a", metadata={"team": "x"})] == [ids[3], ids[1]]
    assert [r.thread_id for r in await threads.search(tenant="a", metadata={"n": 4})] == [ids[4]]
    assert [r.thread_id for r in await threads.search(tenant="a", status="interrupted")] == [ids[1]]
    assert [r.thread_id for r in await threads.search(tenant="a", limit=2, offset=1)] == [ids[3], ids[2]]


async def test_ping_and_checkpointer_are_usable(stores: ThreadStores) -> None:
    await stores.threads.ping()
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    assert await stores.checkpointer.aget_tuple(config) is None
