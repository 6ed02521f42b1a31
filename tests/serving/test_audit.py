"""The audit log: requests and runs are recorded in a hash chain, and
``switchyard audit verify`` names the first record that was edited or removed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, SWITCHYARD, ServerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.llm]


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SWITCHYARD), "audit", "verify", str(path)], capture_output=True, text=True, cwd=REPO)


def test_requests_and_runs_are_chained_and_tampering_is_named(server: ServerHandle, tmp_path: Path) -> None:
    body = {"model": "chat-fake", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"x-request-id": "audited-1"})
    assert response.status_code == 200
    for _ in range(3):
        assert httpx.get(server.url + "/v1/models").status_code == 200
    copy = tmp_path / "audit.jsonl"
    copy.write_bytes((server.data_dir / "audit" / "audit.jsonl").read_bytes())
    records = [json.loads(line) for line in copy.read_text().splitlines()]
    mine = [r for r in records if r.get("request_id") == "audited-1"]
    assert {r["type"] for r in mine} == {"request", "run"}
    run = next(r for r in mine if r["type"] == "run")
    assert run["target"] == "chat-fake" and run["outcome"] == "ok" and run["tokens"] == 4 and run["tenant"] == "dev"
    request = next(r for r in mine if r["type"] == "request")
    assert request["route"] == "/v1/chat/completions" and request["status"] == 200

    ok = _verify(copy)
    assert ok.returncode == 0 and f"ok: {len(records)} records" in ok.stdout

    lines = copy.read_text().splitlines()
    assert len(lines) >= 5
    target = len(lines) // 2  # not the last: dropping the tail is only caught against a saved hash
    edited = tmp_path / "edited.jsonl"
    changed = lines[target].replace('"type": "', '"type": "X', 1)  # one record, a small edit
    edited.write_text("\n".join([*lines[:target], changed, *lines[target + 1 :]]) + "\n")
    result = _verify(edited)
    assert result.returncode == 1
    assert f"line {target + 1}: record {target + 1} was altered" in result.stdout

    removed = tmp_path / "removed.jsonl"
    removed.write_text("\n".join([*lines[:target], *lines[target + 1 :]]) + "\n")
    result = _verify(removed)
    assert result.returncode == 1
    assert f"record {target + 1} missing before record {target + 2}" in result.stdout
