"""Model promotions shared by replicas through PostgreSQL (issue 17, item 2): a promotion
through app A is served by app B within ``state.reload_s`` (B's ``/admin/models`` and a
chat routed to the new target), a rollback through B likewise reaches A, the CLI reads
and writes the same history, a stale writer is refused, and the database unreachable
keeps the running registry (503 on a reload, never 500).

The evaluation is the real one (`tests.serving.test_promotion`'s tiny suite on scripted
backends ``a`` and ``b``); the apps run in this process over the real PostgreSQL of the
``postgres_dsn`` fixture. The two-process version (``tests/replicas.py``) is at the end.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.promotions import PromotionConflictError, PromotionStore, promotions_path
from gateway.registry import AliasTarget
from serving.shared.promotions import PostgresPromotionStore
from tests.conftest import REPO, SWITCHYARD
from tests.gateway.traffic import openai_complete, targets, write_models
from tests.replicas import create_key, start_replicas, stop_replicas
from tests.scripted import ScriptedBackend, running_scripted_backend
from tests.serving.test_promotion import _suite
from tests.serving.test_shared_keys import MARGIN_S, RELOAD_S, _cut_off, admin_key, running, shared_config, within

pytestmark = [pytest.mark.integration]

ALIASES = {"main": {"targets": targets(a=100), "fallbacks": [], "sla": {"ttft_s": 10, "total_s": 30}}}


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[dict[str, ScriptedBackend]]:
    with (
        running_scripted_backend(tmp_path, delay_ms=10, tokens=8) as a,
        running_scripted_backend(tmp_path, delay_ms=10, tokens=8) as b,
    ):
        yield {"a": a, "b": b}


def _configs(tmp: Path, dsn: str, backends: dict[str, ScriptedBackend], fake_url: str) -> tuple[Path, Path, Path]:
    """Replicas A and B, and C: a CLI's, with a data directory no server holds."""
    models = write_models(tmp / "promoted-models.yaml", backends, ALIASES)
    suite = str(_suite(tmp))
    extra: dict[str, Any] = {
        "gateway": {"models_file": str(models), "reload_check_s": 5},  # the shared version is polled every reload_s
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "main"}},
        "eval": {"suites": {"main": [suite]}},
    }
    return (
        shared_config(tmp, "A", dsn, fake_url, **extra),
        shared_config(tmp, "B", dsn, fake_url, **extra),
        shared_config(tmp, "C", dsn, fake_url, **extra),
    )


async def _served(client: httpx.AsyncClient, admin: str) -> tuple[list[tuple[str, int]], bool]:
    state = (await client.get("/admin/models", headers={"x-api-key": admin})).json()["aliases"]["main"]
    return [(t["backend"], t["weight"]) for t in state["targets"]], "promoted" in state


async def _backend_of_chat(client: httpx.AsyncClient, admin: str) -> str | None:
    client.headers["Authorization"] = f"Bearer {admin}"
    answer = await openai_complete(client, "main", max_tokens=2)
    assert answer.ok, str(answer)
    return answer.backend


def _models_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "models", *args],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=120,
    )


async def test_promotion_through_a_is_served_by_b(
    tmp_path: Path, postgres_dsn: str, backends: dict[str, ScriptedBackend], fake_backend_url: str
) -> None:
    """Promote through A: B serves the new target within reload_s; roll back through B:
    A is back within reload_s; the CLI (no server) sees and changes the same history."""
    config_a, config_b, config_c = _configs(tmp_path, postgres_dsn, backends, fake_backend_url)
    admin = admin_key(config_a)
    async with AsyncExitStack() as stack:
        _, a = await stack.enter_async_context(running(config_a))
        _, b = await stack.enter_async_context(running(config_b))
        assert await _served(b, admin) == ([("a", 100)], False)
        assert await _backend_of_chat(b, admin) == "a"

        promoted = await a.post("/admin/models/main/promote", json={"backend": "b"}, headers={"x-api-key": admin},
                                timeout=120)
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["promoted"] is True
        assert await _served(a, admin) == ([("b", 100)], True)  # the replica that promoted: at once
        took = await within(RELOAD_S + MARGIN_S, lambda: _served(b, admin), ([("b", 100)], True))
        assert took <= RELOAD_S + MARGIN_S
        assert await _backend_of_chat(b, admin) == "b"
        history = (await b.get("/admin/models/main/history", headers={"x-api-key": admin})).json()
        assert [e["action"] for e in history["entries"]] == ["promote"] and history["promoted"] is True

        rolled = await b.post("/admin/models/main/rollback", headers={"x-api-key": admin})
        assert rolled.status_code == 200, rolled.text
        await within(RELOAD_S + MARGIN_S, lambda: _served(a, admin), ([("a", 100)], False))
        assert await _backend_of_chat(a, admin) == "a"

        # The CLI with no server for its data directory reads and writes the database.
        listed = _models_cli(config_c, "history", "main", "--json")
        assert listed.returncode == 0, listed.stderr
        assert '"rollback"' in listed.stdout and '"promote"' in listed.stdout
        again = _models_cli(config_c, "rollback", "main")
        assert again.returncode != 0 and "no promotion to roll back" in again.stderr
    assert not promotions_path(tmp_path / "data-A").exists()  # nothing written to the files


def _promote(store: PromotionStore, expected: tuple[AliasTarget, ...] | None, seq: int, to: str) -> None:
    store.record_promotion(
        "main", expected_override=expected, expected_seq=seq, from_targets=(AliasTarget(backend="a", weight=100),),
        to_targets=(AliasTarget(backend=to, weight=100),), by="test", backend=to, weight=None,
    )


def test_a_stale_writer_is_refused(postgres_dsn: str, tmp_path: Path) -> None:
    """Two replicas decide on the same view: the first write wins, the second is
    refused and changes nothing; the version moves once per change."""
    first = PostgresPromotionStore(postgres_dsn).open()
    second = PostgresPromotionStore(postgres_dsn).open()
    try:
        assert first.version() == 0
        view = second.alias("main")
        _promote(first, None, 0, "b")
        assert first.version() == 1
        with pytest.raises(PromotionConflictError, match="someone else"):
            _promote(second, view.targets, len(view.history), "c")
        assert second.version() == 1
        version, document = second.snapshot()
        assert version == 1 and document.aliases["main"].targets == (AliasTarget(backend="b", weight=100),)
        entry = second.record_rollback("main", current_targets=None, by="test")
        assert entry.action == "rollback" and first.version() == 2
        assert [e.action for e in first.history("main")] == ["promote", "rollback"]
    finally:
        first.close()
        second.close()


def test_promotions_file_is_imported_once(postgres_dsn: str, tmp_path: Path) -> None:
    """A single server's promotions.json is taken into an empty shared store once."""
    path = promotions_path(tmp_path)
    file_store = PromotionStore(path)
    _promote(file_store, None, 0, "b")
    store = PostgresPromotionStore(postgres_dsn, import_file=path).open()
    try:
        assert store.version() == 1 and store.alias("main").targets == (AliasTarget(backend="b", weight=100),)
        store.record_rollback("main", current_targets=None, by="test")
    finally:
        store.close()
    again = PostgresPromotionStore(postgres_dsn, import_file=path).open()
    try:
        assert again.version() == 2 and again.alias("main").targets is None  # not imported again
    finally:
        again.close()


async def test_database_down_keeps_the_registry(
    tmp_path: Path, postgres_dsn: str, backends: dict[str, ScriptedBackend], fake_backend_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database unreachable: the served registry stays, chats still work, a reload or
    a rollback answers 503 naming the shared promotions; back: changes arrive again."""
    config_a, _, _ = _configs(tmp_path, postgres_dsn, backends, fake_backend_url)
    admin = admin_key(config_a)
    async with running(config_a) as (_, a):
        assert await _backend_of_chat(a, admin) == "a"
        caplog.clear()
        _cut_off(postgres_dsn, allow=False)
        try:
            reload = await a.post("/admin/models/reload", headers={"x-api-key": admin})
            assert reload.status_code == 503 and "shared promotions" in reload.json()["detail"]
            rollback = await a.post("/admin/models/main/rollback", headers={"x-api-key": admin})
            assert rollback.status_code == 503, rollback.text
            assert await _backend_of_chat(a, admin) == "a"
            assert await _served(a, admin) == ([("a", 100)], False)
            await asyncio.sleep(RELOAD_S * 4)  # the reloader's polls fail: logged once
            polls = [r for r in caplog.records if r.name == "serving.models_admin" and r.levelname == "ERROR"]
            assert len(polls) == 1 and "shared promotions" in polls[0].getMessage()
        finally:
            _cut_off(postgres_dsn, allow=True)
        store = PostgresPromotionStore(postgres_dsn).open()
        try:
            _promote(store, None, 0, "b")
        finally:
            store.close()
        await within(10, lambda: _served(a, admin), ([("b", 100)], True))


@pytest.mark.e2e
async def test_two_processes_a_promotion_through_a_is_served_by_b(
    tmp_path: Path, postgres_dsn: str, redis_url: str, backends: dict[str, ScriptedBackend]
) -> None:
    """Two ``switchyard serve`` processes over one PostgreSQL: a promotion through A is
    served by B (its ``/admin/models`` and a chat's backend) within B's reload interval."""
    models_file = write_models(tmp_path / "promoted-models.yaml", backends, ALIASES)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "main"}},
        "eval": {"suites": {"main": [str(_suite(tmp_path))]}},
    }))
    replicas = start_replicas(tmp_path, dsn=postgres_dsn, redis_url=redis_url, models_file=models_file, config=overlay)
    try:
        a, b = replicas
        admin = create_key(a, "ops")
        async with httpx.AsyncClient(base_url=a.url, timeout=120) as on_a, httpx.AsyncClient(base_url=b.url, timeout=60) as on_b:
            assert await _served(on_b, admin) == ([("a", 100)], False)
            promoted = await on_a.post("/admin/models/main/promote", json={"backend": "b"}, headers={"x-api-key": admin})
            assert promoted.status_code == 200, promoted.text
            took = await within(0.5 + MARGIN_S, lambda: _served(on_b, admin), ([("b", 100)], True))
            assert took <= 0.5 + MARGIN_S
            assert await _backend_of_chat(on_b, admin) == "b"
    finally:
        stop_replicas(replicas)
