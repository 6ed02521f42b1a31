"""Run files: round-trip through write_run/load_run; malformed files name the file and the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from eval.metrics import CaseScore
from eval.runs import RunFile, RunFileError, load_run, write_run


def _run(**overrides: object) -> RunFile:
    fields: dict[str, object] = {
        "suite": "rag",
        "dataset_hash": "sha256:abc",
        "model": "default",
        "backend": "local-llamacpp",
        "started_at": datetime(2026, 12, 2, 0, 0, tzinfo=UTC),
        "judge": None,
        "cases": [
            CaseScore(case_id="a", values={"mrr": 1.0, "recall_at_k": None}),
            CaseScore(case_id="b", values={"mrr": 0.5}, errors={"faithfulness": "judge returned unparseable JSON"}),
        ],
        "timings": {"total_s": 1.5},
    }
    fields.update(overrides)
    return RunFile.model_validate(fields)


def test_round_trip(tmp_path: Path) -> None:
    run = _run()
    path = tmp_path / "run.json"
    write_run(run, path)
    assert load_run(path) == run
    assert load_run(path).by_case()["b"].errors == {"faithfulness": "judge returned unparseable JSON"}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left


def test_write_replaces_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_run(_run(suite="first"), path)
    write_run(_run(suite="second"), path)
    assert load_run(path).suite == "second"


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _valid_dict() -> dict[str, object]:
    return json.loads(_run().model_dump_json())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("dataset_hash"), "dataset_hash"),
        (lambda d: d.update(format=2), "format"),
        (lambda d: d.update(started_at="yesterday"), "started_at"),
        (lambda d: d["cases"][1]["values"].update(mrr="high"), "cases.1.values.mrr"),
        (lambda d: d["cases"][0].update(case_id=""), "cases.0.case_id"),
        (lambda d: d.update(extra_key=1), "extra_key"),
        (lambda d: d["cases"].append(d["cases"][0]), "cases"),
    ],
)
def test_invalid_field_is_named(tmp_path: Path, change, field: str) -> None:
    data = _valid_dict()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(RunFileError) as info:
        load_run(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{field}:" in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(RunFileError, match="nope.json: cannot read"):
        load_run(path)


def test_not_json_and_not_object(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(RunFileError, match="bad.json: not valid JSON"):
        load_run(path)
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(RunFileError, match="bad.json: expected a JSON object"):
        load_run(path)
