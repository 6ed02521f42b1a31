"""The audit log against a crash mid-write and against someone who can rewrite the data
directory (issue 11): a torn last line no longer stops the server, and a re-chained,
forged log fails verification under the key or against an anchor."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from serving.audit import GENESIS, AuditLog, load_key, parse_anchor, verify

KEY = b"k" * 32


def _write(path: Path, count: int, **kwargs: Any) -> AuditLog:
    audit = AuditLog(path, **kwargs)
    for index in range(count):
        audit.append("request", route="/v1/models", status=200 if index % 2 else 500, request_id=f"r{index}")
    return audit


def _rechain(records: list[dict[str, Any]], key: bytes | None = None) -> str:
    """What an attacker who can write the file does: recompute every hash."""
    import hmac  # noqa: PLC0415

    prev, lines = GENESIS, []
    for seq, record in enumerate(records, start=1):
        body = {k: v for k, v in record.items() if k != "hash"}
        body["seq"], body["prev"] = seq, prev
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        message = (prev + canonical).encode()
        prev = hmac.new(key, message, hashlib.sha256).hexdigest() if key else hashlib.sha256(message).hexdigest()
        lines.append(json.dumps({**body, "hash": prev}))
    return "\n".join(lines) + "\n"


def test_a_torn_last_line_is_set_aside_and_recorded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the server could not open a log whose last record was half written."""
    path = tmp_path / "audit.jsonl"
    _write(path, 3).close()
    torn = b'{"seq": 4, "ts": "2026-12-01T00:00:00+00:00", "type": "requ'
    with path.open("ab") as file:
        file.write(torn)

    report = verify(path)  # not reopened yet: reported, not called tampering
    assert report.ok and report.records == 3
    assert any("torn last line" in note for note in report.notes)

    with caplog.at_level(logging.WARNING, logger="serving.audit"):
        audit = AuditLog(path)
    audit.append("request", route="/v1/models", status=200, request_id="after")
    audit.close()
    assert "torn record" in caplog.text
    [saved] = tmp_path.glob("audit.jsonl.torn-*")
    assert saved.read_bytes() == torn
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    recovered = records[3]
    assert recovered["type"] == "audit_recovered" and recovered["saved_to"] == saved.name
    assert recovered["torn_bytes"] == len(torn) and recovered["torn_sha256"] == hashlib.sha256(torn).hexdigest()
    report = verify(path)
    assert report.ok and report.records == 5
    assert any("torn record cut off" in note for note in report.notes)


def test_a_garbled_last_line_does_not_stop_the_log(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write(path, 2).close()
    with path.open("ab") as file:
        file.write(b"\x00\x00\x00\n")  # what a lost page can leave
    audit = AuditLog(path)
    audit.close()
    assert verify(path).ok and [json.loads(x)["type"] for x in path.read_text().splitlines()][-1] == "audit_recovered"


def test_without_a_key_a_rechained_log_verifies_but_an_anchor_catches_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = _write(path, 6)
    anchor = audit.head
    audit.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    forged = [dict(r, status=200) for r in records if r["request_id"] != "r2"]  # a record deleted, 500s made 200
    path.write_text(_rechain(forged))

    assert verify(path).ok  # the chain alone cannot tell
    report = verify(path, anchors=[anchor])
    assert not report.ok and "record 6 of an anchor is missing" in (report.problem or "")
    seq, digest = parse_anchor(f"{records[3]['seq']}:{records[3]['hash']}")
    report = verify(path, anchors=[(seq, digest)])
    assert not report.ok and "does not match the anchor" in (report.problem or "")


def test_with_a_key_a_rechained_log_fails(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write(path, 5, key=KEY).close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(r["mac"] == "hmac-sha256" for r in records)
    assert verify(path, key=KEY).ok
    assert "verify it with its key" in (verify(path).problem or "")

    forged = [dict(r, status=200) for r in records]
    path.write_text(_rechain(forged, key=b"x" * 32))  # a guessed key
    report = verify(path, key=KEY)
    assert not report.ok and "record 1 was altered" in (report.problem or "")

    downgraded = [{k: v for k, v in r.items() if k != "mac"} for r in forged]
    path.write_text(_rechain(downgraded))  # plain hashes instead of MACs
    report = verify(path, key=KEY)
    assert not report.ok and "record 1 has no MAC" in (report.problem or "")


def test_turning_the_key_on_or_changing_it_starts_a_new_file(tmp_path: Path) -> None:
    """One file, one key: each file verifies as a whole, and the new one names the old
    one's head (before, a log keyed half-way never verified again, with or without the key)."""
    path = tmp_path / "audit.jsonl"
    old = _write(path, 2)
    old_head = old.head
    old.close()
    _write(path, 2, key=KEY).close()
    [moved] = [p for p in tmp_path.glob("audit.jsonl.*") if "torn" not in p.name]
    assert verify(moved).ok and verify(moved).records == 2
    report = verify(path, key=KEY)
    assert report.ok and report.records == 3
    first = json.loads(path.read_text().splitlines()[0])
    assert first["type"] == "audit_rotated" and first["previous_file"] == moved.name
    assert first["previous_head"] == f"{old_head[0]}:{old_head[1]}"
    assert verify(moved, anchors=[parse_anchor(first["previous_head"])]).ok

    other = b"o" * 32
    _write(path, 1, key=other).close()  # the key changed
    assert verify(path, key=other).ok
    assert len([p for p in tmp_path.glob("audit.jsonl.*") if "torn" not in p.name]) == 2
    rotated = sorted(p for p in tmp_path.glob("audit.jsonl.*") if "torn" not in p.name)[-1]
    assert verify(rotated, key=KEY).ok
    report = verify(rotated, key=other)
    assert not report.ok and "made with another key" in (report.problem or "")


def test_binary_key_material_keeps_every_byte(tmp_path: Path) -> None:
    """``head -c 32 /dev/urandom`` can begin or end with a whitespace byte: it is key."""
    binary = tmp_path / "binary.key"
    binary.write_bytes(b"\n" + bytes(range(200, 231)))
    assert load_key(binary) == b"\n" + bytes(range(200, 231))
    text = tmp_path / "text.key"
    text.write_text("ab" * 32 + "\n")
    assert load_key(text) == b"ab" * 32


def test_the_key_must_live_outside_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    inside = data / "audit.key"
    inside.write_bytes(KEY)
    with pytest.raises(ValueError, match="inside the data directory"):
        load_key(inside, data_dir=data)
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="holds 3 bytes; at least 32"):
        load_key(short, data_dir=data)
    with pytest.raises(ValueError, match="cannot be read"):
        load_key(tmp_path / "missing.key", data_dir=data)
    good = tmp_path / "audit.key"
    good.write_bytes(KEY + b"\n")
    assert load_key(good, data_dir=data) == KEY


def test_the_head_is_logged_and_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    heads: list[tuple[int, str]] = []
    with caplog.at_level(logging.INFO, logger="serving.audit"):
        audit = _write(tmp_path / "audit.jsonl", 4, anchor_every=2, on_head=lambda seq, digest: heads.append((seq, digest)))
        audit.close()
    seq, digest = audit.head
    assert seq == 4 and heads[-1] == (4, digest)
    assert f"4:{digest}" in caplog.text and "audit head (every)" in caplog.text
    assert verify(tmp_path / "audit.jsonl", anchors=[parse_anchor(f"4:{digest}")]).ok
    with pytest.raises(ValueError, match="not SEQ:HASH"):
        parse_anchor("4:nothex")


# --- the server and the CLI ------------------------------------------------------------


@pytest.mark.e2e
def test_a_keyed_server_log_verifies_only_with_its_key_and_anchor(tmp_path: Path, fake_backend_url: str) -> None:
    """End to end: a server given ``audit.key_file`` writes MACs, logs its head and
    reports it in the metrics; ``switchyard audit verify`` needs the key, and an anchor
    from the server log catches records cut from the end. A torn tail left by a crash
    does not stop the next start."""
    import re  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    import httpx  # noqa: PLC0415

    from tests.conftest import REPO, SWITCHYARD, start_server, stop_server, write_models_file  # noqa: PLC0415

    key_file = tmp_path / "secrets" / "audit.key"
    key_file.parent.mkdir()
    key_file.write_bytes(KEY)
    models = write_models_file(tmp_path / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    config = {"gateway": {"models_file": str(models)}, "audit": {"key_file": str(key_file), "anchor_every": 2}}
    server = start_server(tmp_path, config)
    try:
        for _ in range(4):
            assert httpx.get(server.url + "/v1/models").status_code == 200
        metrics = httpx.get(server.url + "/metrics").text
        assert re.search(r"^switchyard_audit_head_seq [1-9]", metrics, re.M)
    finally:
        stop_server(server)
    log = server.data_dir / "audit" / "audit.jsonl"
    heads = re.findall(r"audit head \(close\): (\d+:[0-9a-f]{64})", server.log_file.read_text())
    assert heads, "the head is logged at stop"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SWITCHYARD), "audit", "verify", str(log), *args], capture_output=True, text=True, cwd=REPO)

    ok = run("--key-file", str(key_file), "--anchor", heads[-1])
    assert ok.returncode == 0 and "every record's MAC checked" in ok.stdout, ok.stdout + ok.stderr
    unkeyed = run()
    assert unkeyed.returncode == 1 and "verify it with its key" in unkeyed.stdout
    bad = run("--anchor", "7:xyz")
    assert bad.returncode == 2 and "not SEQ:HASH" in bad.stderr

    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1]) + "\n")  # the last record cut off
    cut = run("--key-file", str(key_file), "--anchor", heads[-1])
    assert cut.returncode == 1 and "of an anchor is missing" in cut.stdout

    with log.open("a") as file:
        file.write('{"seq": 99, "ty')  # a crash mid-write
    server = start_server(tmp_path, config)
    stop_server(server)
    assert [json.loads(line)["type"] for line in log.read_text().splitlines()][len(lines) - 1] == "audit_recovered"
    assert run("--key-file", str(key_file)).returncode == 0


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_records_naming_an_api_key_do_not_rotate_the_log_on_reopen(tmp_path: Path, keyed: bool) -> None:
    # Request, run and tool records carry the API key's id as `key_id`; the MAC's key id is
    # `mac_key_id`. Reading one as the other rotated the log at every server start.
    path = tmp_path / "audit.jsonl"
    key = b"k" * 32 if keyed else None
    log = AuditLog(path, key=key)
    log.append("run", key_id="api-key-1", outcome="ok")
    log.close()
    reopened = AuditLog(path, key=key)
    reopened.append("run", key_id="api-key-2", outcome="ok")
    reopened.close()
    assert [p.name for p in tmp_path.iterdir()] == ["audit.jsonl"]  # nothing moved aside
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == [1, 2]
    assert [r["key_id"] for r in records] == ["api-key-1", "api-key-2"]  # kept under a key too
    assert verify(path, key=key).ok
