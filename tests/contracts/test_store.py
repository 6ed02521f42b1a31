"""One contract for the store (LangGraph's own SqliteStore and PostgresStore, as the
server opens them with the thread stores): tenants, expiry, and concurrent use with
the thread store and checkpointer on the same database, each test on a fresh one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serving.persistence import ThreadSettings, ThreadStores, open_thread_stores
from serving.store import TenantStore, tenant_label

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


async def test_tenants_see_only_their_own_items(stores: ThreadStores) -> None:
    # Tenant names that would be wildcards or separators if used as labels unchanged.
    a, b = TenantStore(stores.store, "a.b"), TenantStore(stores.store, "*")
    await a.aput(("docs", "x"), "k", {"owner": "a"})
    await b.aput(("docs", "x"), "k", {"owner": "b"})
    await b.aput(("other",), "k", {"owner": "b"})
    item = await a.aget(("docs", "x"), "k")
    assert item is not None and item.value == {"owner": "a"} and item.namespace == ("docs", "x")
    assert [i.value for i in await a.asearch(())] == [{"owner": "a"}]
    assert await a.alist_namespaces() == [("docs", "x")]
    assert await a.alist_namespaces(prefix=("*",)) == [("docs", "x")]
    assert sorted(await b.alist_namespaces(max_depth=1)) == [("docs",), ("other",)]
    await b.adelete(("docs", "x"), "k")
    assert await b.aget(("docs", "x"), "k") is None
    assert (await a.aget(("docs", "x"), "k")) is not None
    # The raw store holds the tenant's label first; a tenant never sees it.
    raw = await stores.store.alist_namespaces()
    assert sorted(raw) == sorted([(tenant_label("a.b"), "docs", "x"), (tenant_label("*"), "other")])
    assert len({tenant_label(name) for name in ("a.b", "a%2Eb", "a_b", "*")}) == 4


async def test_expired_items_are_gone(stores: ThreadStores) -> None:
    store = TenantStore(stores.store, "t")
    await store.aput(("tmp",), "short", {"n": 1}, ttl=0.0001)  # 6 ms
    await store.aput(("tmp",), "long", {"n": 2}, ttl=60)
    # SQLite's clock has whole seconds: poll (without refreshing) until it has passed.
    deadline = time.monotonic() + 15
    while await store.aget(("tmp",), "short", refresh_ttl=False) is not None:
        assert time.monotonic() < deadline, "an expired item is still returned"
        await asyncio.sleep(0.2)
    assert [i.key for i in await store.asearch(("tmp",))] == ["long"]
    assert (await store.aget(("tmp",), "long")) is not None


async def test_concurrent_store_thread_and_checkpoint_calls_all_succeed(stores: ThreadStores) -> None:
    """The store shares the thread stores' writer (SQLite) or pool (PostgreSQL): a
    load mixing the three, with callers cancelled mid-call, leaves every call that was
    not cancelled successful and the database writable ("database is locked" was the
    failure of two connections, issue 10)."""
    store = TenantStore(stores.store, "load")

    async def store_calls(index: int) -> None:
        await store.aput(("load", str(index % 5)), f"k{index}", {"i": index})
        assert (await store.aget(("load", str(index % 5)), f"k{index}")) is not None
        await store.asearch(("load",), filter={"i": index}, limit=5)
        await store.alist_namespaces(prefix=("load",))

    async def thread_calls(index: int) -> None:
        record, _ = await stores.threads.create(tenant="load", metadata={"i": index})
        assert record is not None
        await stores.threads.update(record.thread_id, status="busy")
        config = {"configurable": {"thread_id": record.thread_id, "checkpoint_ns": ""}}
        assert await stores.checkpointer.aget_tuple(config) is None

    tasks = [asyncio.create_task(call(i)) for i in range(60) for call in (store_calls, thread_calls)]
    await asyncio.sleep(0)
    for task in tasks[::7]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    assert not failures, failures
    await store.aput(("after",), "k", {"ok": True})
    assert (await store.aget(("after",), "k")) is not None
    await stores.threads.ping()


async def test_an_update_keeps_created_at(stores: ThreadStores) -> None:
    store = TenantStore(stores.store, "t")
    await store.aput(("doc",), "k", {"v": 1})
    first = await store.aget(("doc",), "k")
    assert first is not None
    # SQLite's timestamps have whole seconds: wait for the next one (the clock, not a
    # duration, is what the assertion below needs).
    second = int(time.time())
    while int(time.time()) == second:
        await asyncio.sleep(0.05)
    await store.aput(("doc",), "k", {"v": 2})
    updated = await store.aget(("doc",), "k")
    assert updated is not None and updated.value == {"v": 2}
    assert updated.created_at == first.created_at
    assert updated.updated_at > first.updated_at
