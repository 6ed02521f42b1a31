"""Structured logs: with ``log_format: json`` every line is a JSON object carrying the
request id, and lines logged inside a run carry its run id."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]


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
