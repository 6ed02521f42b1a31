"""``switchyard eval gate`` as a real subprocess on run files written here."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from eval.metrics import (
    CITATIONS_VALID,
    FACTS_CONTAINED,
    LATENCY_WITHIN,
    MRR,
    NO_ANSWER_DETECTED,
    RECALL_AT_K,
    TOOLS_MATCH,
    CaseScore,
)
from eval.runs import RunFile, write_run
from tests.conftest import SWITCHYARD

CASES = 40


def _run(tmp_path: Path, name: str, *, facts: float = 1.0, dataset_hash: str = "sha256:same") -> Path:
    """A run where every gated metric scores 1 on every case, except ``facts_contained`` on
    every other case (``facts``)."""
    cases = [
        CaseScore(
            case_id=f"case-{i}",
            values={
                RECALL_AT_K: 1.0,
                MRR: 1.0,
                FACTS_CONTAINED: facts if i % 2 else 1.0,
                CITATIONS_VALID: 1.0,
                NO_ANSWER_DETECTED: 1.0 if i >= CASES - 8 else None,
                TOOLS_MATCH: 1.0,
                LATENCY_WITHIN: 1.0,
            },
        )
        for i in range(CASES)
    ]
    run = RunFile(
        suite="rag",
        dataset_hash=dataset_hash,
        model=name,
        backend=f"{name}-backend",
        started_at=datetime(2026, 12, 2, tzinfo=UTC),
        cases=cases,
    )
    path = tmp_path / f"{name}.json"
    write_run(run, path)
    return path


def _gate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "eval", "gate", *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_identical_runs_pass_and_print_the_table(tmp_path: Path) -> None:
    base = _run(tmp_path, "base")
    again = _run(tmp_path, "again")
    result = _gate("--baseline", base, "--candidate", again)
    assert result.returncode == 0, result.stderr
    assert "**Gate: PASS**" in result.stdout
    assert "| metric | baseline | candidate | delta |" in result.stdout
    assert "| facts_contained | 1.000 | 1.000 | +0.000 |" in result.stdout


def test_degraded_candidate_exits_1_naming_the_metric(tmp_path: Path) -> None:
    base = _run(tmp_path, "base")
    worse = _run(tmp_path, "worse", facts=0.0)
    json_out = tmp_path / "out" / "gate.json"
    json_out.parent.mkdir()
    markdown_out = tmp_path / "out" / "gate.md"
    result = _gate("--baseline", base, "--candidate", worse, "--json", json_out, "--markdown", markdown_out)
    assert result.returncode == 1, result.stderr
    assert "**Gate: REGRESSION**" in result.stdout
    assert "| facts_contained | 1.000 | 0.500 | -0.500 |" in result.stdout
    assert "- **facts_contained**: regressed:" in result.stdout
    assert "- **mrr**: ok:" in result.stdout
    document = json.loads(json_out.read_text(encoding="utf-8"))
    assert document["exit_code"] == 1 and document["passed"] is False
    verdicts = {m["metric"]: m["verdict"] for m in document["metrics"]}
    assert verdicts[FACTS_CONTAINED] == "regressed"
    assert [v for m, v in verdicts.items() if m != FACTS_CONTAINED and v != "not_applicable"] == ["ok"] * 6
    assert [m for m, v in verdicts.items() if v == "not_applicable"] == ["faithfulness", "answer_relevancy", "correctness"]
    assert document["baseline"]["model"] == "base" and document["candidate"]["backend"] == "worse-backend"
    assert document["candidate"]["dataset_hash"] == "sha256:same"
    assert markdown_out.read_text(encoding="utf-8") == result.stdout


def test_different_datasets_exit_2(tmp_path: Path) -> None:
    base = _run(tmp_path, "base", dataset_hash="sha256:one")
    other = _run(tmp_path, "other", dataset_hash="sha256:two")
    result = _gate("--baseline", base, "--candidate", other)
    assert result.returncode == 2
    assert "not the same dataset" in result.stderr
    assert "sha256:one" in result.stderr and "sha256:two" in result.stderr


def test_missing_file_exits_2_naming_it(tmp_path: Path) -> None:
    # A malformed file goes through the same path: tests/eval/test_runs.py checks its message.
    base = _run(tmp_path, "base")
    missing = tmp_path / "missing.json"
    result = _gate("--baseline", base, "--candidate", missing)
    assert result.returncode == 2
    assert f"{missing}: cannot read" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_bad_thresholds_exit_2_naming_the_key(tmp_path: Path) -> None:
    base = _run(tmp_path, "base")
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text("metrics:\n  mrr:\n    floor: 1.5\n    max_drop: 0.05\n", encoding="utf-8")
    result = _gate("--baseline", base, "--candidate", base, "--thresholds", thresholds)
    assert result.returncode == 2
    assert "metrics.mrr.floor" in result.stderr
    assert result.stdout == ""


def test_without_thresholds_the_settings_name_them(tmp_path: Path) -> None:
    base, cand = _run(tmp_path, "base"), _run(tmp_path, "cand", facts=0.9)
    strict = tmp_path / "strict.yaml"
    strict.write_text("metrics:\n  facts_contained: {floor: 0.99, max_drop: 0.5}\n", encoding="utf-8")
    config = tmp_path / "switchyard.yaml"
    config.write_text(f"eval:\n  thresholds: {strict}\n", encoding="utf-8")
    args = ("--baseline", base, "--candidate", cand, "--json", tmp_path / "gate.json")

    def gate(*options: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SWITCHYARD), *(str(o) for o in options), "eval", "gate", *(str(a) for a in args)],
            capture_output=True, text=True, check=False, timeout=120,
        )

    refused = gate("--config", config)
    assert refused.returncode == 1 and "under the floor 0.990" in refused.stdout, refused.stdout + refused.stderr
    assert json.loads((tmp_path / "gate.json").read_text())["thresholds"] == str(strict)
    # --thresholds wins over the settings.
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "eval", "gate", *(str(a) for a in args), "--thresholds",
         str(Path(__file__).resolve().parents[2] / "eval" / "thresholds.yaml")],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Settings that do not load: exit 2, saying so.
    config.write_text("eval:\n  thresholds: [not, a, path]\n", encoding="utf-8")
    broken = gate("--config", config)
    assert broken.returncode == 2 and "eval.thresholds" in broken.stderr, broken.stderr
