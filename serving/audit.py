"""An append-only, hash-chained audit log (JSON Lines).

Each record carries a sequence number, the hash of the record before it (``prev``)
and its own hash (``hash``: SHA-256 over ``prev`` and the record's canonical JSON
without ``hash``). Editing, removing or reordering a record breaks the chain from
there on; `verify` reports the first record that does not fit. (An attacker who can
rewrite the whole file can forge a new chain; ship the file, or its latest hash, to
a store they cannot write to if that matters.)

Records: ``request`` (every API request: method, route, status, tenant, key id,
request id), ``run`` (every finished run: kind, target, outcome, tokens), and, as the
layers arrive, tool decisions and model swaps.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["AuditLog", "VerifyReport", "tool_call_sink", "verify"]

GENESIS = "0" * 64


def _digest(prev: str, body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((prev + canonical).encode()).hexdigest()


class AuditLog:
    """Appends chained records to one file. One writer per file (the server)."""

    def __init__(self, path: Path) -> None:
        """Open ``path`` for appending, continuing the chain already in it."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._seq, self._prev = 0, GENESIS
        if path.is_file() and path.stat().st_size:
            last = _last_line(path)
            record = json.loads(last)
            self._seq, self._prev = int(record["seq"]), str(record["hash"])
        self._file = path.open("a", encoding="utf-8")

    def append(self, record_type: str, /, **fields: Any) -> None:
        """Write one record of ``type`` ``record_type`` (synchronously: a line of a few
        hundred bytes, so records keep the order of the events that made them)."""
        self._seq += 1
        body = {"seq": self._seq, "ts": datetime.now(UTC).isoformat(), "type": record_type, **fields, "prev": self._prev}
        body["hash"] = self._prev = _digest(self._prev, body)
        self._file.write(json.dumps(body, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def _last_line(path: Path) -> str:
    with path.open("rb") as file:
        file.seek(0, os.SEEK_END)
        position = file.tell()
        chunk = b""
        while position > 0 and chunk.count(b"\n") < 2:
            step = min(4096, position)
            position -= step
            file.seek(position)
            chunk = file.read(step) + chunk
    return chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """The outcome of `verify`."""

    records: int
    """Records that checked out before the first problem (all of them if ok)."""
    problem: str | None = None
    """The first problem, naming the line and the record, or None."""

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify(path: Path) -> VerifyReport:
    """Walk the chain and report the first record that is missing, altered or out of
    place."""
    prev, expected, good = GENESIS, 1, 0
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            try:
                record = json.loads(line)
                seq, claimed = int(record["seq"]), str(record["hash"])
            except (ValueError, KeyError, TypeError):
                return VerifyReport(records=good, problem=f"line {number}: not a valid audit record")
            if seq != expected:
                if seq > expected:
                    missing = f"record {expected}" if seq == expected + 1 else f"records {expected}-{seq - 1}"
                    return VerifyReport(records=good, problem=f"line {number}: {missing} missing before record {seq}")
                return VerifyReport(records=good, problem=f"line {number}: record {seq} out of order (expected {expected})")
            if record.get("prev") != prev:
                return VerifyReport(records=good, problem=f"line {number}: record {seq} does not follow record {seq - 1}")
            body = {k: v for k, v in record.items() if k != "hash"}
            if _digest(prev, body) != claimed:
                return VerifyReport(records=good, problem=f"line {number}: record {seq} was altered")
            prev, expected, good = claimed, expected + 1, good + 1
    return VerifyReport(records=good)


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
