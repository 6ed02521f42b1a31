"""Structured logs: with ``log_format: json`` every line is a JSON object carrying the
request id, and lines logged inside a run carry its run id; neither format lets a
logged value start a line of its own (issue 11, 9a)."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import httpx
import pytest

from serving.observability import JsonFormatter, TextFormatter
from tests.conftest import start_server, stop_server, write_models_file

@pytest.mark.e2e
def test_json_logs_carry_request_and_run_ids(tmp_path: Path, fake_backend_url: str) -> None:
    models = write_models_file(tmp_path / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    server = start_server(
        tmp_path,
        {
            "log_format": "json",
            "gateway": {"models_file": str(models)},
            "graphs": {"crash": {"path": "tests.fakes.graphs:make_crashing_graph", "model": "fake-ok"}},
        },
    )
    try:
        body = {"assistant_id": "crash", "input": {"messages": [{"role": "user", "content": "hi"}]}}
        result = httpx.post(server.url + "/runs/wait", json=body, headers={"x-request-id": "json-log-1"}).json()
        assert result["__error__"]["error"] == "InternalError"  # the detail is in the log only (issue 11, 9b)
    finally:
        stop_server(server)
    lines = [json.loads(line) for line in server.log_file.read_text().splitlines()]  # every line is JSON
    assert all({"ts", "level", "logger", "request_id", "run_id", "message"} <= set(line) for line in lines)
    failure = next(line for line in lines if "failed" in line["message"] and line["request_id"] == "json-log-1")
    assert failure["level"] == "ERROR" and failure["run_id"] != "-" and failure["run_id"] in failure["message"]


FORGED = "x\nFAKE LOG LINE\r\n2026-01-01 00:00:00,000 INFO forged [-] FAKE\u2028FAKE\x85FAKE\x1b[2K"


def _log_with(formatter: logging.Formatter) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tests.forged")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("model=%s", FORGED)
        try:
            raise ValueError(FORGED)
        except ValueError:
            logger.exception("failed on %r", {"model": FORGED})
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_text_logs_cannot_be_forged() -> None:
    text = _log_with(TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    starts = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (WARNING|ERROR) tests\.forged ")
    records = 0
    for line in text.splitlines():  # also splits on \u2028, \x85, \x1c-\x1e
        if starts.match(line):
            records += 1
        else:
            assert line.startswith("  "), line  # a traceback's line, indented
        assert "\x1b" not in line
    assert records == 2
    assert "model=x\\nFAKE LOG LINE\\r\\n2026-01-01" in text


def test_json_logs_cannot_be_forged() -> None:
    lines = _log_with(JsonFormatter()).splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["message"] == f"model={FORGED}"
    assert FORGED in json.loads(lines[1])["exception"]
