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


async def test_recover_makes_busy_threads_idle(stores: ThreadStores) -> None:
    threads = stores.threads
    ids = []
    for status in ("busy", "busy", "interrupted", "error", "idle"):
        record, _ = await threads.create(tenant="a")
        assert record is not None
        await threads.update(record.thread_id, status=status)  # type: ignore[arg-type]
        ids.append(record.thread_id)
    assert await threads.recover() == 2
    statuses = [(await threads.get(thread_id, tenant="a")).status for thread_id in ids]  # type: ignore[union-attr]
    assert statuses == ["idle", "idle", "interrupted", "error", "idle"]
    assert await threads.recover() == 0


async def test_delete(stores: ThreadStores) -> None:
    threads = stores.threads
    record, _ = await threads.create(tenant="a")
    assert record is not None
    await threads.delete(record.thread_id)
    assert await threads.get(record.thread_id, tenant="a") is None
    await threads.delete(record.thread_id)  # deleting twice is not an error
    again, created = await threads.create(tenant="a", thread_id=record.thread_id)
    assert created and again is not None


# Keys a JSON path cannot spell as-is, and values whose JSON types differ subtly.
_ODD_KEYS = ['a"b', "a.b", "$", "[0]", "", "a\\b", "it's", "ключ", "a b", '"', "*"]


async def test_search_metadata_filters_work_for_any_key(stores: ThreadStores) -> None:
    threads = stores.threads
    first, _ = await threads.create(tenant="a", metadata={key: f"v{i}" for i, key in enumerate(_ODD_KEYS)})
    second, _ = await threads.create(tenant="a", metadata={key: "other" for key in _ODD_KEYS})
    assert first is not None and second is not None
    for i, key in enumerate(_ODD_KEYS):
        found = await threads.search(tenant="a", metadata={key: f"v{i}"})
        assert [r.thread_id for r in found] == [first.thread_id], key
    both = {key: f"v{i}" for i, key in enumerate(_ODD_KEYS[:4])}
    assert [r.thread_id for r in await threads.search(tenant="a", metadata=both)] == [first.thread_id]
    assert await threads.search(tenant="a", metadata={"missing": "v0"}) == []
    stored = await threads.get(first.thread_id, tenant="a")
    assert stored is not None and stored.metadata == {key: f"v{i}" for i, key in enumerate(_ODD_KEYS)}


async def test_search_matches_json_types_the_same_way_on_every_store(stores: ThreadStores) -> None:
    threads = stores.threads
    values = {"int": 1, "float": 1.5, "true": True, "zero": 0, "none": None, "text": "1", "big": 2**70,
              "object": {"x": 1, "y": [1, 2]}, "array": [1, "a"]}
    record, _ = await threads.create(tenant="a", metadata=values)
    assert record is not None
    hits = {
        "int": 1, "int as float": 1.0, "float": 1.5, "true": True, "zero": 0, "none": None, "text": "1",
        "big": 2**70, "object": {"x": 1, "y": [1, 2]}, "array": [1, "a"],
    }
    for name, value in hits.items():
        key = name.split(" ")[0]
        assert [r.thread_id for r in await threads.search(tenant="a", metadata={key: value})] == [record.thread_id], name
    # (Not compared: a nested subset, which PostgreSQL's @> matches and SQLite does not.)
    misses = {"int": True, "true": 1, "zero": False, "none": 0, "text": 1, "float": "1.5", "big": 2**70 + 10**6}
    for key, value in misses.items():
        assert await threads.search(tenant="a", metadata={key: value}) == [], (key, value)


async def test_search_accepts_any_limit_and_offset(stores: ThreadStores) -> None:
    threads = stores.threads
    for _ in range(3):
        await threads.create(tenant="a")
    for huge in (2**31 - 1, 2**63 - 1, 2**63, 2**64, 10**30):
        assert len(await threads.search(tenant="a", limit=huge)) == 3
        assert await threads.search(tenant="a", offset=huge) == []
    assert await threads.search(tenant="a", limit=-1) == []
    assert len(await threads.search(tenant="a", offset=-5)) == 3


async def test_values_no_store_can_hold_are_refused_or_absent(stores: ThreadStores) -> None:
    threads = stores.threads
    for bad in ({"x": float("nan")}, {"x": float("inf")}, {"x": "a\x00b"}, {"a\x00": 1}, {"x": "\ud800"}):
        with pytest.raises(ValueError):
            await threads.create(tenant="a", metadata=bad)
    with pytest.raises(ValueError):
        await threads.create(tenant="a", thread_id="a\x00b")
    record, _ = await threads.create(tenant="a", metadata={"ok": 1})
    assert record is not None
    with pytest.raises(ValueError):
        await threads.set_metadata(record.thread_id, {"x": float("nan")})
    # Lookups with such ids or values find nothing rather than fail.
    assert await threads.get("a\x00b", tenant="a") is None
    assert await threads.get("\ud800", tenant="a") is None
    await threads.update("\ud800", status="idle")
    assert await threads.search(tenant="a", metadata={"x": "\x00"}) == []
    assert await threads.search(tenant="\ud800") == []
    assert [r.thread_id for r in await threads.search(tenant="a", metadata={"ok": 1})] == [record.thread_id]


async def test_update_sets_status_and_merges_metadata_in_one_write(stores: ThreadStores) -> None:
    threads = stores.threads
    record, _ = await threads.create(tenant="a", metadata={"keep": 1, "graph_id": "old"})
    assert record is not None
    await threads.update(record.thread_id, status="busy", graph_id="chat", metadata={"graph_id": "chat", "assistant_id": "x"})
    stored = await threads.get(record.thread_id, tenant="a")
    assert stored is not None and stored.status == "busy" and stored.graph_id == "chat"
    assert stored.metadata == {"keep": 1, "graph_id": "chat", "assistant_id": "x"}
    await threads.update(record.thread_id, status="idle")  # no metadata: left as it is
    stored = await threads.get(record.thread_id, tenant="a")
    assert stored is not None and stored.status == "idle" and stored.metadata["assistant_id"] == "x"
    await threads.update("no-such-thread", status="busy", metadata={"a": 1})  # nothing to update, no error


async def test_search_by_ids_only_finds_the_tenants_threads_among_them(stores: ThreadStores) -> None:
    threads = stores.threads
    mine = [(await threads.create(tenant="a", thread_id=f"t-{i}"))[0] for i in range(4)]
    theirs, _ = await threads.create(tenant="b", thread_id="t-other")
    assert all(r is not None for r in mine) and theirs is not None
    wanted = ["t-2", "t-0", "t-other", "no-such-thread", "t-2", "a\x00b", "\ud800"]
    found = await threads.search(tenant="a", ids=wanted, sort_by="thread_id", sort_order="asc")
    assert [r.thread_id for r in found] == ["t-0", "t-2"]  # not t-1, t-3 (not asked), not b's
    assert await threads.search(tenant="b", ids=["t-0"]) == []
    assert await threads.search(tenant="a", ids=[]) == []  # an empty list asks for no thread
    assert await threads.search(tenant="a", ids=["no-such-thread"]) == []
    await threads.update("t-2", status="error")
    assert [r.thread_id for r in await threads.search(tenant="a", ids=wanted, status="error")] == ["t-2"]
    many = [f"t-{i}" for i in range(4)] + [f"x-{i}" for i in range(5000)]  # past SQLite's variable limit
    assert len(await threads.search(tenant="a", ids=many, limit=100)) == 4


async def test_search_orders_by_each_column_and_pages_never_repeat_or_skip(stores: ThreadStores) -> None:
    threads = stores.threads
    names = ["m", "c", "x", "a", "k", "b", "z"]  # created in this order, not in id order
    for name in names:
        await threads.create(tenant="a", thread_id=name)
        await asyncio.sleep(0.002)  # distinct creation times
    for name in ("k", "a", "z"):
        await threads.update(name, status="busy")
    await threads.create(tenant="b", thread_id="zz-other")

    async def ids(**kwargs: object) -> list[str]:
        return [r.thread_id for r in await threads.search(tenant="a", limit=100, **kwargs)]  # type: ignore[arg-type]

    assert await ids(sort_by="thread_id", sort_order="asc") == sorted(names)
    assert await ids(sort_by="thread_id", sort_order="desc") == sorted(names, reverse=True)
    assert await ids(sort_by="created_at", sort_order="asc") == names
    assert await ids() == names[::-1]  # created_at, newest first, by default
    assert await ids(sort_by="created_at") == names[::-1]
    # Ties (three busy, four idle) are ordered by thread_id in the same direction.
    assert await ids(sort_by="status", sort_order="asc") == ["a", "k", "z", "b", "c", "m", "x"]
    assert await ids(sort_by="status", sort_order="desc") == ["x", "m", "c", "b", "z", "k", "a"]
    await asyncio.sleep(0.002)
    await threads.set_metadata("c", {"touched": True})
    updated = await ids(sort_by="updated_at", sort_order="desc")
    assert updated[0] == "c" and sorted(updated) == sorted(names)
    assert (await ids(sort_by="updated_at", sort_order="asc"))[-1] == "c"
    # Paging one or two at a time through tied keys gives every thread exactly once.
    for sort_by in ("status", "thread_id", "created_at", "updated_at"):
        for order in ("asc", "desc"):
            for size in (1, 2, 3):
                paged: list[str] = []
                for offset in range(0, len(names), size):
                    page = await threads.search(tenant="a", sort_by=sort_by, sort_order=order, limit=size, offset=offset)  # type: ignore[arg-type]
                    paged.extend(r.thread_id for r in page)
                assert paged == await ids(sort_by=sort_by, sort_order=order), (sort_by, order, size)


async def test_search_refuses_an_order_it_does_not_know(stores: ThreadStores) -> None:
    threads = stores.threads
    await threads.create(tenant="a")
    for sort_by in ("metadata", "tenant", "created_at; DROP TABLE switchyard_threads", "state_updated_at", ""):
        with pytest.raises(ValueError, match="sort_by"):
            await threads.search(tenant="a", sort_by=sort_by)  # type: ignore[arg-type]
    for order in ("ASC", "up", "desc, thread_id", ""):
        with pytest.raises(ValueError, match="sort_order"):
            await threads.search(tenant="a", sort_order=order)  # type: ignore[arg-type]
    assert len(await threads.search(tenant="a")) == 1  # the table is still there
