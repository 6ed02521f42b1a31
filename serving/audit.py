"""An append-only, hash-chained audit log (JSON Lines).

Each record carries a sequence number, the hash of the record before it (``prev``)
and its own hash (``hash``, over ``prev`` and the record's canonical JSON without
``hash``). Editing, removing or reordering a record breaks the chain from there on;
`verify` reports the first record that does not fit.

What the chain alone cannot show is a whole file rewritten by someone who can write
the data directory: they can re-chain a forged log. Two things here make that
detectable, against something such an attacker cannot rewrite:

- **A key** (``audit.key_file``, outside the data directory): each hash is then an
  HMAC-SHA256 under that key (``"mac": "hmac-sha256"`` on the record), so a forged
  chain cannot be made to verify without the key, and `verify` given the key refuses
  records without a MAC (no downgrade to plain hashes).
- **Anchors**: the head of the chain (sequence number and hash) goes to the server's
  log at start, every ``anchor_every`` records and at stop, and the sequence number
  to the metrics. ``switchyard audit verify --anchor SEQ:HASH`` checks a log against
  an anchor taken from there, which also catches records removed from the end.

A crash can leave a torn last line (a record half written). On open, a last line that
is not a whole record is moved to a side file beside the log, the log is cut back to its last whole record
and the chain goes on with an ``audit_recovered`` record that names the side file and
the torn bytes' size and SHA-256; `verify` reports a torn last line of a log that was
not reopened since, instead of calling it tampering.

One file is written under one key: when the key is turned on, off or changed, the log
is moved aside (``audit.jsonl.<time>``) and the new file's first record,
``audit_rotated``, names it and its head, so each file verifies as a whole.

Records: ``request`` (every API request: method, route, status, tenant, key id,
request id), ``run`` (every finished run: kind, target, outcome, tokens), tool
decisions (``tool_call``), ``audit_recovered`` and ``audit_rotated``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AuditLog",
    "AuditSettings",
    "VerifyReport",
    "key_id",
    "load_key",
    "parse_anchor",
    "tool_call_sink",
    "verify",
]

log = logging.getLogger(__name__)

GENESIS = "0" * 64
_MAC = "hmac-sha256"
_MIN_KEY_BYTES = 32


class AuditSettings(BaseModel):
    """The ``audit`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_file: Path | None = None
    """A file holding at least 32 bytes of secret key material, outside the data
    directory (``SWITCHYARD_AUDIT__KEY_FILE``): records are then chained with
    HMAC-SHA256 under it. Create one with ``openssl rand -hex 32 > FILE`` (text is
    stripped of surrounding whitespace; binary material is used as is). Turning the key
    on, off or changing it starts a new log file whose first record names the old one
    and its head."""
    anchor_every: int = Field(default=1000, ge=1)
    """Log the chain's head (sequence number and hash) every this many records."""


def load_key(path: Path, *, data_dir: Path | None = None) -> bytes:
    """The key material in ``path``.

    Raises:
        ValueError: the file is missing, shorter than 32 bytes, or inside ``data_dir``
            (whoever can rewrite the log could then read the key).
    """
    if data_dir is not None and path.resolve().is_relative_to(data_dir.resolve()):
        raise ValueError(f"audit key file {path} is inside the data directory {data_dir}: keep it elsewhere")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"audit key file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        key = raw.decode("ascii").strip().encode()  # text (hex, base64): a newline is not key
    except UnicodeDecodeError:
        key = raw  # binary key material: every byte counts, whitespace included
    if len(key) < _MIN_KEY_BYTES:
        raise ValueError(f"audit key file {path} holds {len(key)} bytes; at least {_MIN_KEY_BYTES} are needed")
    return key


def key_id(key: bytes) -> str:
    """A short public fingerprint of a key (records carry it; it does not reveal the key)."""
    return hashlib.sha256(b"switchyard audit key id\0" + key).hexdigest()[:16]


def _digest(prev: str, body: dict[str, Any], key: bytes | None) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    message = (prev + canonical).encode()
    if key is not None:
        return hmac.new(key, message, hashlib.sha256).hexdigest()
    return hashlib.sha256(message).hexdigest()


class AuditLog:
    """Appends chained records to one file. One writer per file (the server)."""

    def __init__(
        self,
        path: Path,
        *,
        key: bytes | None = None,
        anchor_every: int = 1000,
        on_head: Callable[[int, str], None] | None = None,
    ) -> None:
        """Open ``path`` for appending, continuing the chain already in it (after cutting
        off a torn last line, see the module docstring).

        Args:
            key: HMAC key for the records written from now on.
            anchor_every: log the head every this many records.
            on_head: told the head (sequence number, hash) after every record.
        """
        self.path = path
        self._key = key
        self._anchor_every = anchor_every
        self._on_head = on_head
        path.parent.mkdir(parents=True, exist_ok=True)
        self._key_id = key_id(key) if key is not None else None
        self._seq, self._prev = 0, GENESIS
        torn = _cut_torn_tail(path)
        rotated: dict[str, Any] | None = None
        if path.is_file() and path.stat().st_size:
            record = json.loads(_last_line(path))
            if _mac_key_id(record) != self._key_id:
                # The key was turned on, off or changed: one file, one key, so that each
                # file verifies as a whole. The new file starts by naming the old head.
                rotated = _rotate(path, record, self._key_id)
            else:
                self._seq, self._prev = int(record["seq"]), str(record["hash"])
        self._file = path.open("a", encoding="utf-8")
        if rotated is not None:
            self.append("audit_rotated", **rotated)
            log.warning(
                "audit log %s: the key changed (%s -> %s); the old log is %s, ending at %s",
                path, rotated["previous_key_id"], self._key_id, rotated["previous_file"], rotated["previous_head"],
            )
        if torn is not None:
            self.append("audit_recovered", **torn)
            log.warning(
                "audit log %s ended with a torn record (%d bytes, a crash mid-write): moved to %s",
                path, torn["torn_bytes"], torn["saved_to"],
            )
        self._anchor("open")

    @property
    def head(self) -> tuple[int, str]:
        """The last record's sequence number and hash (0 and the genesis hash if none)."""
        return self._seq, self._prev

    def append(self, record_type: str, /, **fields: Any) -> None:
        """Write one record of ``type`` ``record_type`` (synchronously: a line of a few
        hundred bytes, so records keep the order of the events that made them)."""
        self._seq += 1
        body = {"seq": self._seq, "ts": datetime.now(UTC).isoformat(), "type": record_type, **fields}
        if self._key is not None:
            # Not "key_id": records carry the API key's id under that name.
            body["mac"], body["mac_key_id"] = _MAC, self._key_id
        body["prev"] = self._prev
        body["hash"] = self._prev = _digest(self._prev, body, self._key)
        self._file.write(json.dumps(body, ensure_ascii=False) + "\n")
        self._file.flush()
        if self._on_head is not None:
            self._on_head(self._seq, self._prev)
        if self._seq % self._anchor_every == 0:
            self._anchor("every")

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._anchor("close")

    def _anchor(self, when: str) -> None:
        seq, head = self.head
        log.info("audit head (%s): %s:%s in %s", when, seq, head, self.path)
        if self._on_head is not None:
            self._on_head(seq, head)


def _mac_key_id(record: dict[str, Any]) -> str | None:
    """The id of the HMAC key a record was made under (None: a plain hash).

    ``mac_key_id``; logs written before it existed kept it in ``key_id`` on records with a
    MAC, a name the ``request``, ``run`` and ``tool_call`` records also use for the API key,
    so a plain record's ``key_id`` is never read as a MAC key.
    """
    if "mac_key_id" in record:
        return record["mac_key_id"]
    return record.get("key_id") if "mac" in record else None


def _rotate(path: Path, last: dict[str, Any], new_key_id: str | None) -> dict[str, Any]:
    """Move a log written under another key aside; what the new log's first record says."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    moved = path.with_name(f"{path.name}.{stamp}")
    path.rename(moved)
    return {
        "previous_file": moved.name,
        "previous_head": f"{last.get('seq')}:{last.get('hash')}",
        "previous_key_id": _mac_key_id(last),
        "key_id_now": new_key_id,
    }


def _cut_torn_tail(path: Path) -> dict[str, Any] | None:
    """Move a torn last line to a side file and cut the log back to its last whole
    record; what was moved, or None if the log ends cleanly."""
    if not path.is_file():
        return None
    with path.open("rb") as file:
        data_end = file.seek(0, os.SEEK_END)
        if data_end == 0:
            return None
        start = _last_line_start(file, data_end)
        file.seek(start)
        tail = file.read()
    if tail.endswith(b"\n") and _whole_record(tail):
        return None
    # Half a record, or a line that is not one (a crash can also leave NUL bytes).
    saved = path.with_name(f"{path.name}.torn-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}")
    saved.write_bytes(tail)
    with path.open("r+b") as file:
        file.truncate(start)
        file.flush()
        os.fsync(file.fileno())
    return {"torn_bytes": len(tail), "torn_sha256": hashlib.sha256(tail).hexdigest(), "saved_to": saved.name}


def _whole_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
        return isinstance(record, dict) and "seq" in record and "hash" in record
    except ValueError:
        return False


def _last_line_start(file: Any, end: int) -> int:
    """Where the file's last line (the text after its last-but-final newline) starts."""
    position, chunk = end, b""
    while position > 0:
        step = min(4096, position)
        position -= step
        file.seek(position)
        chunk = file.read(step) + chunk
        cut = chunk.rstrip(b"\n").rfind(b"\n") if chunk.endswith(b"\n") else chunk.rfind(b"\n")
        if cut >= 0:
            return position + cut + 1
    return 0


def _last_line(path: Path) -> str:
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        file.seek(_last_line_start(file, end))
        return file.read().rstrip(b"\n").decode()


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """The outcome of `verify`."""

    records: int
    """Records that checked out before the first problem (all of them if ok)."""
    problem: str | None = None
    """The first problem, naming the line and the record, or None."""
    notes: tuple[str, ...] = ()
    """What is worth knowing but is not tampering: a torn last line, recoveries."""

    @property
    def ok(self) -> bool:
        return self.problem is None


def parse_anchor(text: str) -> tuple[int, str]:
    """``SEQ:HASH`` (as the server logs it) as a pair.

    Raises:
        ValueError: naming what is wrong with it.
    """
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"anchor {text!r} is not SEQ:HASH (a record number and a 64-digit hex hash)")
    return int(seq), digest


def verify(path: Path, *, key: bytes | None = None, anchors: Iterable[tuple[int, str]] = ()) -> VerifyReport:
    """Walk the chain and report the first record that is missing, altered or out of
    place.

    Args:
        key: the log's HMAC key: every record must then carry a MAC under it.
        anchors: (sequence number, hash) pairs the log must contain, as logged by the
            server; an anchor past the log's end means records were removed from it.
    """
    wanted = dict(anchors)
    prev, expected, good = GENESIS, 1, 0
    notes: list[str] = []

    def problem(text: str) -> VerifyReport:
        return VerifyReport(records=good, problem=text, notes=tuple(notes))

    with path.open("rb") as file:
        lines = file.read().split(b"\n")
    last = len(lines) - 1  # the text after the final newline ("" if the file ends with one)
    for number, raw in enumerate(lines, start=1):
        if number - 1 == last:
            if raw:
                notes.append(f"line {number}: torn last line ({len(raw)} bytes, a crash mid-write?), not counted")
            break
        try:
            record = json.loads(raw)
            seq, claimed = int(record["seq"]), str(record["hash"])
        except (ValueError, KeyError, TypeError):
            return problem(f"line {number}: not a valid audit record")
        if seq != expected:
            if seq > expected:
                missing = f"record {expected}" if seq == expected + 1 else f"records {expected}-{seq - 1}"
                return problem(f"line {number}: {missing} missing before record {seq}")
            return problem(f"line {number}: record {seq} out of order (expected {expected})")
        if record.get("prev") != prev:
            return problem(f"line {number}: record {seq} does not follow record {seq - 1}")
        body = {k: v for k, v in record.items() if k != "hash"}
        if key is not None and record.get("mac") != _MAC:
            return problem(f"line {number}: record {seq} has no MAC under the key")
        if key is not None and _mac_key_id(record) != key_id(key):
            return problem(f"line {number}: record {seq} was made with another key (key id {_mac_key_id(record)})")
        if key is None and "mac" in record:
            return problem(f"line {number}: record {seq} carries a MAC: verify it with its key (--key-file)")
        if not hmac.compare_digest(_digest(prev, body, key), claimed):
            return problem(f"line {number}: record {seq} was altered" + (" (or not made with this key)" if key else ""))
        if seq in wanted and wanted.pop(seq) != claimed:
            return problem(f"line {number}: record {seq} does not match the anchor: the log was rewritten")
        if record.get("type") == "audit_recovered":
            notes.append(f"line {number}: record {seq} notes a torn record cut off at a restart ({record.get('saved_to')})")
        prev, expected, good = claimed, expected + 1, good + 1
    if wanted:
        first = min(wanted)
        return problem(f"record {first} of an anchor is missing: the log ends at record {expected - 1}")
    return VerifyReport(records=good, notes=tuple(notes))


def tool_call_sink(audit: AuditLog, counter: Any, **fields: Any) -> Callable[[Any], None]:
    """A run's receiver of `tools.ToolCallRecord`s: one ``tool_call`` audit record per
    attempt (with ``fields``: request id, graph, tenant...) and the metric
    ``switchyard_tool_calls_total{tool, decision}``."""

    def record(call: Any) -> None:
        counter.labels(call.tool, call.decision).inc()
        audit.append(
            "tool_call",
            **fields,
            tool=call.tool,
            call_id=call.call_id,
            args_hash=call.args_hash,
            decision=call.decision,
            reason=call.reason,
            ms=call.duration_ms,
        )

    return record
