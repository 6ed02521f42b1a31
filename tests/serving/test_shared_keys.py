"""API keys shared by replicas through PostgreSQL (issue 17, item 2): created with the
CLI or ``POST /admin/keys`` on one app, a key works at once on another app over the same
database; a revoked key is refused within ``state.reload_s``; with the database gone,
keys already loaded keep working and unknown keys get 503 (never 500); a ``keys.yaml``
is imported into an empty store once.

The apps run in this process (the real app factory and lifespan over the real
PostgreSQL of the ``postgres_dsn`` fixture, requests through httpx's ASGI transport); the
two-process version (``tests/replicas.py``) is at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from fastapi import FastAPI

import serving.auth
import serving.shared.keys as shared_keys
from serving.app import create_app
from serving.auth import AuthSettings, KeyRecord, hash_key
from serving.errors import ServingError
from serving.shared.keys import KeyStoreBusyError, PostgresKeyStore, SharedAuthenticator, SharedConnection
from serving.settings import load_settings
from tests.conftest import REPO, SWITCHYARD, write_models_file
from tests.replicas import create_key as replica_key
from tests.replicas import start_replicas, stop_replicas

pytestmark = [pytest.mark.integration]

RELOAD_S = 0.5
"""``state.reload_s`` of these apps: the promised bound for a revocation."""
MARGIN_S = 1.5
"""Slack for a shared, busy machine."""
TENANTS = {
    "acme": {"limits": {"requests_per_s": 1000, "burst": 1000}},
    "ops": {"admin": True, "limits": {"requests_per_s": 1000, "burst": 1000}},
}
TENANTS_SETTINGS = AuthSettings(tenants=TENANTS).tenants


def shared_config(
    tmp: Path, name: str, dsn: str, fake_url: str, *, state: dict[str, Any] | None = None, **extra: Any
) -> Path:
    """A config file for one replica: its own data directory, the shared database."""
    tmp.mkdir(parents=True, exist_ok=True)
    models = tmp / "models.yaml"
    if not models.exists():
        write_models_file(models, None, fake_url, chat_default="fake-ok")
    config = tmp / f"{name}.yaml"
    body: dict[str, Any] = {
        "data_dir": str(tmp / f"data-{name}"),
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
        "threads": {"postgres_dsn": dsn},
        "state": {"reload_s": RELOAD_S, "replica_id": name, **(state or {})},
        "auth": {"tenants": TENANTS},
        **extra,
    }
    config.write_text(yaml.safe_dump(body))
    return config


@asynccontextmanager
async def running(config: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app of ``config`` with its lifespan running, and a client to it."""
    app = create_app(load_settings(config))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=30) as client:
            yield app, client


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "keys", *args],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), check=False, timeout=60,
    )


def admin_key(config: Path) -> str:
    result = cli(config, "create", "--tenant", "ops")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


async def models(client: httpx.AsyncClient, key: str) -> int:
    return (await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code


async def within(seconds: float, probe: Callable[[], Any], expected: Any) -> float:
    """Seconds until ``await probe()`` equals ``expected``; fails after ``seconds``."""
    started = time.monotonic()
    while True:
        got = await probe()
        if got == expected:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"still {got!r} after {seconds} s (wanted {expected!r})"
        await asyncio.sleep(0.05)


def test_cli_writes_the_shared_store(tmp_path: Path, postgres_dsn: str, fake_backend_url: str) -> None:
    """`switchyard keys create|list|revoke` on the database, not the keys file."""
    config = shared_config(tmp_path, "cli", postgres_dsn, fake_backend_url)
    created = cli(config, "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert "switchyard_api_keys" in created.stderr
    assert not (tmp_path / "data-cli" / "keys.yaml").exists()
    with psycopg.connect(postgres_dsn) as connection:
        rows = connection.execute("SELECT id, tenant, sha256 FROM switchyard_api_keys").fetchall()
        version = connection.execute("SELECT version FROM switchyard_api_keys_version").fetchone()
    assert [(tenant, sha) for _, tenant, sha in rows] == [("acme", hash_key(key))]
    assert version == (1,)
    key_id = rows[0][0]
    listed = cli(config, "list")
    assert listed.returncode == 0 and key_id in listed.stdout and key not in listed.stdout
    unknown = cli(config, "create", "--tenant", "nobody")
    assert unknown.returncode != 0 and "unknown tenant 'nobody'" in unknown.stderr
    assert cli(config, "revoke", key_id).returncode == 0
    again = cli(config, "revoke", key_id)
    assert again.returncode != 0 and f"no key '{key_id}'" in again.stderr
    assert key_id not in cli(config, "list").stdout


async def test_key_created_through_one_app_works_on_the_other(tmp_path: Path, postgres_dsn: str, fake_backend_url: str) -> None:
    """POST /admin/keys on A: B accepts the key at once; DELETE on B: A refuses it within
    reload_s. Listing shows ids, never keys or hashes; bad requests are named."""
    config_a = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url)
    config_b = shared_config(tmp_path, "B", postgres_dsn, fake_backend_url)
    admin = admin_key(config_a)
    async with AsyncExitStack() as stack:
        _, a = await stack.enter_async_context(running(config_a))
        _, b = await stack.enter_async_context(running(config_b))
        for client in (a, b):  # warm: both replicas have loaded the store
            assert await models(client, admin) == 200
        created = await a.post("/admin/keys", json={"tenant": "acme"}, headers={"x-api-key": admin})
        assert created.status_code == 201, created.text
        body = created.json()
        key, key_id = body["key"], body["id"]
        assert body["tenant"] == "acme" and key.startswith("sy-")
        assert await models(b, key) == 200  # at once: no waiting for a reload
        assert await models(a, key) == 200

        listing = await b.get("/admin/keys", headers={"x-api-key": admin})
        assert listing.status_code == 200
        assert key_id in {k["id"] for k in listing.json()["keys"]}
        assert key not in listing.text and hash_key(key) not in listing.text
        assert "switchyard_api_keys" in listing.json()["store"]

        unknown = await a.post("/admin/keys", json={"tenant": "nobody"}, headers={"x-api-key": admin})
        assert unknown.status_code == 400 and "nobody" in unknown.json()["detail"]
        missing = await a.delete("/admin/keys/nope", headers={"x-api-key": admin})
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]
        not_admin = await a.post("/admin/keys", json={"tenant": "acme"}, headers={"x-api-key": key})
        assert not_admin.status_code == 403

        revoked = await b.delete(f"/admin/keys/{key_id}", headers={"x-api-key": admin})
        assert revoked.status_code == 200 and revoked.json()["id"] == key_id
        assert await models(b, key) == 401  # the replica that revoked it: at once
        took = await within(RELOAD_S + MARGIN_S, lambda: models(a, key), 401)
        assert took <= RELOAD_S + MARGIN_S
    audit = (tmp_path / "data-A" / "audit" / "audit.jsonl").read_text()
    assert '"type": "key_created"' in audit and key_id in audit


async def test_cli_revoke_is_refused_within_reload_s(tmp_path: Path, postgres_dsn: str, fake_backend_url: str) -> None:
    """A key revoked by the CLI (no server involved) is refused by a running app within
    reload_s."""
    config = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url)
    async with running(config) as (_, client):
        created = cli(config, "create", "--tenant", "acme")  # after the app started: found at once
        key = created.stdout.strip()
        assert await models(client, key) == 200
        key_id = next(line.split("\t")[0] for line in cli(config, "list").stdout.splitlines() if "acme" in line)
        assert cli(config, "revoke", key_id).returncode == 0
        took = await within(RELOAD_S + MARGIN_S, lambda: models(client, key), 401)
        assert took <= RELOAD_S + MARGIN_S
    # The app closed every connection it opened (key store, promotions, threads, runs).
    # A closed connection's server process leaves pg_stat_activity a moment after the
    # client hung up (it exits asynchronously), so the check waits a few seconds; a
    # connection the app kept open stays listed past that.
    assert await _connections_gone(postgres_dsn, within_s=5) == []


async def test_settings_keys_keep_working(tmp_path: Path, postgres_dsn: str, fake_backend_url: str) -> None:
    """Keys in ``auth.keys`` work beside the shared ones, are listed as such, and cannot
    be revoked at run time (409 naming where they are)."""
    settings_key = "sy-from-the-settings"
    auth = {"tenants": TENANTS, "keys": [{"id": "cfg1", "tenant": "ops", "sha256": hash_key(settings_key)}]}
    config = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url, auth=auth)
    async with running(config) as (_, client):
        headers = {"x-api-key": settings_key}
        assert await models(client, settings_key) == 200
        listing = (await client.get("/admin/keys", headers=headers)).json()["keys"]
        assert {"id": "cfg1", "tenant": "ops", "created_at": "", "source": "settings"} in listing
        refused = await client.delete("/admin/keys/cfg1", headers=headers)
        assert refused.status_code == 409 and "auth.keys" in refused.json()["detail"]
        assert await models(client, settings_key) == 200


async def _connections_gone(dsn: str, *, within_s: float) -> list[tuple[str, str, str]]:
    """The other sessions on the test's database, polled until there are none or
    ``within_s`` has passed (then the ones still there)."""
    deadline = time.monotonic() + within_s
    while True:
        with psycopg.connect(dsn) as connection:
            others = connection.execute(
                "SELECT application_name, state, query FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        if not others or time.monotonic() >= deadline:
            return others
        await asyncio.sleep(0.1)


def _database(dsn: str) -> tuple[str, str]:
    base, name = dsn.rsplit("/", 1)
    return base + "/postgres", name


def _cut_off(dsn: str, allow: bool) -> None:
    """Make the test's database refuse connections (and end its sessions), or accept again."""
    admin, name = _database(dsn)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


async def test_database_down_keeps_loaded_keys(
    tmp_path: Path, postgres_dsn: str, fake_backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database unreachable: a loaded key still works, an unknown key gets 503
    naming the key store (never 500 or 401), logged once; back: all works again."""
    config = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url)
    key = admin_key(config)
    async with running(config) as (app, client):
        assert await models(client, key) == 200
        caplog.clear()
        _cut_off(postgres_dsn, allow=False)
        try:
            for _ in range(3):
                assert await models(client, key) == 200
                answer = await client.get("/v1/models", headers={"Authorization": "Bearer sy-not-a-key"})
                assert answer.status_code == 503, answer.text
                assert "key store" in answer.text
            await asyncio.sleep(RELOAD_S * 3)  # the follower fails too, quietly after the first time
            outage_logs = [r for r in caplog.records if r.name == "serving.shared.keys" and r.levelname in ("ERROR", "WARNING")]
            assert len(outage_logs) == 1, [r.getMessage() for r in outage_logs]
        finally:
            _cut_off(postgres_dsn, allow=True)
        fresh = cli(config, "create", "--tenant", "acme").stdout.strip()
        await within(10, lambda: models(client, fresh), 200)
        assert await models(client, "sy-not-a-key") == 401
        assert await models(client, key) == 200


class CountingKeyStore(PostgresKeyStore):
    """The real store, counting its lookups (and able to make each one slow)."""

    def __init__(self, *args: Any, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finds = 0
        self.delay_s = delay_s

    def find(self, sha256: str) -> KeyRecord | None:
        self.finds += 1
        time.sleep(self.delay_s)
        return super().find(sha256)


@asynccontextmanager
async def authenticator(store: PostgresKeyStore) -> AsyncIterator[SharedAuthenticator]:
    store.open()
    auth = SharedAuthenticator(AuthSettings(tenants=TENANTS), store, reload_s=RELOAD_S)
    await auth.start()
    try:
        yield auth
    finally:
        await auth.aclose()


async def _status(auth: SharedAuthenticator, key: str) -> int:
    try:
        await auth.authenticate(None, key)
    except ServingError as exc:
        return exc.status
    return 200


async def test_unknown_keys_cost_one_query_each_and_never_an_outage(postgres_dsn: str) -> None:
    """200 requests at once with one unknown key make one query; a flood of different
    unknown keys gets 401 or 503 busy, never marks the store down, and leaves the loop's
    default executor free; a key created meanwhile works at once after it."""
    store = CountingKeyStore(postgres_dsn, TENANTS, delay_s=0.01)
    async with authenticator(store) as auth:
        assert await asyncio.gather(*(_status(auth, "sy-unknown") for _ in range(200))) == [401] * 200
        assert store.finds == 1
        assert await _status(auth, "sy-unknown") == 401 and store.finds == 1  # remembered

        flood = asyncio.gather(*(_status(auth, f"sy-flood-{i}") for i in range(300)))
        started = time.monotonic()
        assert await asyncio.to_thread(lambda: 42) == 42  # the default executor is not queued behind the lookups
        assert time.monotonic() - started < 0.5
        statuses = await flood
        assert set(statuses) <= {401, 503} and statuses.count(401) >= 32, sorted(set(statuses))
        assert store.finds <= 1 + 300 and not auth._down
        key, _ = await asyncio.to_thread(store.create, "acme")
        assert await _status(auth, key) == 200


async def test_a_busy_connection_is_not_an_outage(postgres_dsn: str) -> None:
    """Lookups that wait longer than the timeout for the store's one connection (held by
    another call) get 503 "busy", and the store is not marked down: once free, an
    unknown key is looked up again (401, or 200 for a new key)."""
    store = PostgresKeyStore(postgres_dsn, TENANTS, timeout_s=0.3)
    async with authenticator(store) as auth:
        held, release = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def hold() -> None:
            with store._connection_of.use():  # another call (an admin's create, a poll) in progress
                loop.call_soon_threadsafe(held.set)
                asyncio.run_coroutine_threadsafe(release.wait(), loop).result()

        holder = asyncio.create_task(asyncio.to_thread(hold))
        await held.wait()
        try:
            with pytest.raises(KeyStoreBusyError) as busy:
                await auth.authenticate(None, "sy-while-busy")
            assert busy.value.status == 503 and "busy" in str(busy.value)
            assert not auth._down
        finally:
            release.set()
            await holder
        assert await _status(auth, "sy-while-busy") == 401
        key, _ = await asyncio.to_thread(store.create, "acme")
        assert await _status(auth, key) == 200


async def test_the_memory_of_unknown_keys_is_bounded(postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_keys, "_NEGATIVE_MAX", 5)
    async with authenticator(PostgresKeyStore(postgres_dsn, TENANTS)) as auth:
        for i in range(12):
            assert await _status(auth, f"sy-unknown-{i}") == 401
        assert list(auth._unknown) == [hash_key(f"sy-unknown-{i}") for i in range(7, 12)]  # the newest


async def test_a_stored_key_of_a_tenant_this_replica_lacks_is_401(postgres_dsn: str) -> None:
    async with authenticator(PostgresKeyStore(postgres_dsn, TENANTS)) as auth:
        with psycopg.connect(postgres_dsn, autocommit=True) as connection:
            connection.execute(
                "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES ('ghost1', 'ghost', %s, '')",
                (hash_key("sy-ghost"),),
            )
        assert await _status(auth, "sy-ghost") == 401


def _draws(monkeypatch: pytest.MonkeyPatch, *ids: str) -> None:
    """The next key ids `serving.auth.new_key` draws (then random ones again)."""
    queue = list(ids)
    real = serving.auth.secrets.token_hex
    monkeypatch.setattr(serving.auth.secrets, "token_hex", lambda n=None: queue.pop(0) if queue else real(n))


def test_a_new_key_never_takes_an_id_in_use(postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drawn id that a stored key has (unique violation) or a settings key has is drawn
    again, in the database and in the keys file; the key is created, not a 503."""
    store = PostgresKeyStore(postgres_dsn, TENANTS, reserved=frozenset({"cafe0001"}))
    store.open()
    try:
        _draws(monkeypatch, "dead0001")
        _, first = store.create("acme")
        _draws(monkeypatch, "dead0001", "cafe0001", "beef0002")
        key, second = store.create("acme")
        assert (first.id, second.id) == ("dead0001", "beef0002")
        assert [r.id for r in store.list()] == ["dead0001", "beef0002"]
        assert store.find(hash_key(key)) == second
    finally:
        store.close()
    keys_file = tmp_path / "keys.yaml"
    _draws(monkeypatch, "dead0001")
    serving.auth.create_key(keys_file, "acme", TENANTS_SETTINGS)
    _draws(monkeypatch, "dead0001", "cafe0001", "beef0002")
    _, record = serving.auth.create_key(keys_file, "acme", TENANTS_SETTINGS, reserved={"cafe0001"})
    assert record.id == "beef0002"


async def test_a_stored_key_with_a_settings_key_id_is_refused(postgres_dsn: str, tmp_path: Path) -> None:
    """A stored key (or a keys-file key) with the id of a settings key would share its
    rate-limit bucket and audit name: refused (401), the settings key keeps working."""
    settings_key = KeyRecord(id="prometheus", tenant="acme", sha256=hash_key("sy-settings"))
    settings = AuthSettings(tenants=TENANTS, keys=(settings_key,))
    setup = PostgresKeyStore(postgres_dsn, TENANTS)
    setup.open()  # the tables
    setup.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES ('prometheus', 'acme', %s, '')",
            (hash_key("sy-stored-early"),),
        )
    store = PostgresKeyStore(postgres_dsn, TENANTS)
    store.open()
    auth = SharedAuthenticator(settings, store, reload_s=RELOAD_S)
    await auth.start()
    try:
        assert await _status(auth, "sy-settings") == 200
        assert await _status(auth, "sy-stored-early") == 401  # loaded at start: left out
        with psycopg.connect(postgres_dsn, autocommit=True) as connection:
            connection.execute("DELETE FROM switchyard_api_keys")
            connection.execute(
                "INSERT INTO switchyard_api_keys (id, tenant, sha256, created_at) VALUES ('prometheus', 'acme', %s, '')",
                (hash_key("sy-stored-late"),),
            )
        assert await _status(auth, "sy-stored-late") == 401  # looked up: refused too
    finally:
        await auth.aclose()
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(yaml.safe_dump([{"id": "prometheus", "tenant": "acme", "sha256": hash_key("sy-file")}]))
    file_auth = serving.auth.Authenticator(settings, keys_file, enabled=True)
    assert (await file_auth.authenticate(None, "sy-settings")).key_id == "prometheus"
    with pytest.raises(ServingError) as refused:
        await file_auth.authenticate(None, "sy-file")
    assert refused.value.status == 401


def test_connections_use_tcp_keepalives(postgres_dsn: str) -> None:
    """A server gone without closing the connection (a failover) is noticed by the
    keys' and promotions' connections within seconds, not the kernel's ~15 min."""
    connection = SharedConnection(postgres_dsn, timeout_s=2)
    try:
        with connection.use() as open_connection:
            parameters = open_connection.info.get_parameters()
        expected = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
                    "connect_timeout": "2", "tcp_user_timeout": "25000"}
        assert {k: parameters.get(k) for k in expected} == expected, parameters
    finally:
        connection.close()


async def test_keys_file_is_imported_once(tmp_path: Path, postgres_dsn: str, fake_backend_url: str) -> None:
    """An empty store takes the data directory's keys.yaml once; a store emptied by
    revocations is not refilled from it."""
    # Made in file mode first (no DSN), as a single server would have.
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data-A"), "auth": {"tenants": TENANTS}}))
    key = cli(plain, "create", "--tenant", "acme").stdout.strip()
    assert (tmp_path / "data-A" / "keys.yaml").exists()
    config = shared_config(tmp_path, "A", postgres_dsn, fake_backend_url)
    async with running(config) as (_, client):
        assert await models(client, key) == 200
    key_id = yaml.safe_load((tmp_path / "data-A" / "keys.yaml").read_text())[0]["id"]
    assert cli(config, "revoke", key_id).returncode == 0
    async with running(config) as (_, client):  # the file is still there: not imported again
        assert await models(client, key) == 401


@pytest.mark.e2e
def test_two_processes_a_key_created_through_a_works_on_b(
    tmp_path: Path, postgres_dsn: str, redis_url: str, fake_backend_url: str
) -> None:
    """Two ``switchyard serve`` processes over one PostgreSQL and one Redis: a key made by
    ``POST /admin/keys`` on A works on B at once; revoked through A, B refuses it within
    its reload interval."""
    models_file = write_models_file(tmp_path / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    replicas = start_replicas(tmp_path, dsn=postgres_dsn, redis_url=redis_url, models_file=models_file)
    try:
        a, b = replicas
        admin = {"x-api-key": replica_key(a, "ops")}
        created = httpx.post(a.url + "/admin/keys", json={"tenant": "acme"}, headers=admin, timeout=30)
        assert created.status_code == 201, created.text
        key, key_id = created.json()["key"], created.json()["id"]
        bearer = {"Authorization": f"Bearer {key}"}
        assert httpx.get(b.url + "/v1/models", headers=bearer, timeout=30).status_code == 200
        assert httpx.delete(f"{a.url}/admin/keys/{key_id}", headers=admin, timeout=30).status_code == 200
        started = time.monotonic()
        while httpx.get(b.url + "/v1/models", headers=bearer, timeout=30).status_code != 401:
            assert time.monotonic() - started < 0.5 + MARGIN_S, "B still accepts the revoked key"
            time.sleep(0.05)
    finally:
        stop_replicas(replicas)
