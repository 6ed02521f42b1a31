"""Key revocation on a running server (issue 11, finding 1): a key removed from the
keys file, by ``switchyard keys revoke`` or by editing the file, is refused (401) on
both APIs within ``auth.keys_reload_s``; a malformed file keeps the last good keys."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD, ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

RELOAD_S = 1.0
"""The server's auth.keys_reload_s in these tests: the promised bound."""
MARGIN_S = 1.5
"""Slack for a shared, busy machine (request and scheduling time)."""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("keys")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
            "auth": {"tenants": {"acme": {"limits": {"requests_per_s": 1000, "burst": 1000}}}, "keys_reload_s": RELOAD_S},
        },
        dev=False,
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def _statuses(server: ServerHandle, key: str) -> tuple[int, int]:
    """(OpenAI API, LangGraph API) answers to this key."""
    openai = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    langgraph = httpx.post(server.url + "/assistants/search", json={}, headers={"x-api-key": key}, timeout=10)
    return openai.status_code, langgraph.status_code


def _key_id(server: ServerHandle, key: str) -> str:
    """The id of the newest key (the one just made), from the keys file."""
    records = yaml.safe_load((server.data_dir / "keys.yaml").read_text())
    return str(records[-1]["id"])


def _refused_within(server: ServerHandle, key: str, seconds: float) -> float:
    """Seconds until both APIs answer 401 to ``key``; fails after ``seconds``."""
    started = time.monotonic()
    while True:
        statuses = _statuses(server, key)
        elapsed = time.monotonic() - started
        if statuses == (401, 401):
            return elapsed
        assert elapsed < seconds, f"revoked key still answered {statuses} after {elapsed:.1f} s"
        time.sleep(0.05)


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "keys", *args],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), check=False,
    )


def test_a_key_revoked_by_the_cli_is_refused_on_both_apis(secured: ServerHandle) -> None:
    key = create_key(secured.config, "acme")
    other = create_key(secured.config, "acme")
    assert _statuses(secured, key) == (200, 200)
    assert _statuses(secured, other) == (200, 200)  # both keys loaded before the revocation
    key_id = yaml.safe_load((secured.data_dir / "keys.yaml").read_text())[-2]["id"]
    revoked = _cli(secured.config, "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    assert key_id in revoked.stdout
    _refused_within(secured, key, RELOAD_S + MARGIN_S)
    assert _statuses(secured, other) == (200, 200)  # only that key
    listed = _cli(secured.config, "list")
    assert key_id not in listed.stdout and _key_id(secured, other) in listed.stdout
    again = _cli(secured.config, "revoke", key_id)
    assert again.returncode == 1 and "no key" in again.stderr


def test_a_key_removed_by_editing_the_file_is_refused(secured: ServerHandle) -> None:
    keys_file = secured.data_dir / "keys.yaml"
    key = create_key(secured.config, "acme")
    key_id = _key_id(secured, key)
    assert _statuses(secured, key) == (200, 200)
    time.sleep(RELOAD_S + 0.2)  # the server's last check is older than the interval
    # An in-place rewrite (same inode), as an editor or `sed -i`-less script does.
    records = [r for r in yaml.safe_load(keys_file.read_text()) if r["id"] != key_id]
    with keys_file.open("r+") as handle:
        handle.seek(0)
        handle.write(yaml.safe_dump(records, sort_keys=False))
        handle.truncate()
    _refused_within(secured, key, RELOAD_S + MARGIN_S)


def test_a_malformed_file_keeps_the_last_good_keys(secured: ServerHandle) -> None:
    keys_file = secured.data_dir / "keys.yaml"
    key = create_key(secured.config, "acme")
    assert _statuses(secured, key) == (200, 200)
    good = keys_file.read_text()
    try:
        keys_file.write_text("- {id: broken\n")  # not YAML
        time.sleep(RELOAD_S + 0.2)
        assert _statuses(secured, key) == (200, 200)
        keys_file.write_text(yaml.safe_dump([{"id": "x", "tenant": "nobody", "sha256": "0" * 64}]))  # unknown tenant
        time.sleep(RELOAD_S + 0.2)
        assert _statuses(secured, key) == (200, 200)
    finally:
        keys_file.write_text(good)
    log = secured.log_file.read_text()
    assert "not reloaded, the last good keys stay in force" in log
    assert "unknown tenant 'nobody'" in log
