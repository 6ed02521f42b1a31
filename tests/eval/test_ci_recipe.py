"""The CI recipe: deploy/ci/eval-gate.yml is a valid workflow that runs deploy/ci/eval-gate.sh,
and the script checks its settings before it installs or starts anything.

The script never installs here: its checks exit early, ``DRY_RUN=1`` prints the commands it
would run, and with ``INSTALL=0`` and a stored baseline it runs for real against the FAKE
scripted backend (one ``eval run`` per test), down to its exit status and reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from eval.datasets import hash_dataset, load_dataset
from eval.metrics import FACTS_CONTAINED, CaseScore
from eval.runs import RunFile, write_run
from tests.conftest import SWITCHYARD, _fake
from tests.fakes.openai_backend import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "ci" / "eval-gate.sh"
WORKFLOW = ROOT / "deploy" / "ci" / "eval-gate.yml"

SETTINGS = (
    "CANDIDATE",
    "BASELINE",
    "BASELINE_RUN",
    "SUITES",
    "MODELS_FILE",
    "BASELINE_MODELS_FILE",
    "THRESHOLDS",
    "JUDGE",
    "OUT_DIR",
    "DATA_DIR",
    "START_BACKENDS",
    "INSTALL",
    "SWITCHYARD",
    "DRY_RUN",
)


def gate_script(env: dict[str, str], *args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The script with exactly these settings (none inherited from the test's environment)."""
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS and not k.startswith("SWITCHYARD_")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def commands(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The commands a dry run printed, in order."""
    return [line[2:] for line in result.stderr.splitlines() if line.startswith("+ ")]


# --- the script -----------------------------------------------------------------------------


def test_script_is_valid_bash_and_executable() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")


def test_help_documents_every_setting() -> None:
    result = gate_script({}, "--help")
    assert result.returncode == 0
    for name in SETTINGS:
        assert re.search(rf"^  {name}\b", result.stdout, re.M), f"{name} is not documented"
    assert "Exit status" in result.stdout


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({}, (), "CANDIDATE is not set"),
        ({"CANDIDATE": "next"}, ("--candidate",), "unexpected argument '--candidate'"),
        ({"CANDIDATE": "next", "SUITES": "  "}, (), "SUITES is empty"),
        ({"CANDIDATE": "next", "INSTALL": "yes"}, (), "INSTALL must be 0 or 1, not 'yes'"),
        ({"CANDIDATE": "next", "MODELS_FILE": "config/nope.yaml"}, (), "MODELS_FILE=config/nope.yaml: no such file"),
        ({"CANDIDATE": "next", "THRESHOLDS": "nope.yaml"}, (), "THRESHOLDS=nope.yaml: no such file"),
        ({"CANDIDATE": "next", "BASELINE_RUN": "nope.json"}, (), "BASELINE_RUN=nope.json: no such file or directory"),
        (
            {"CANDIDATE": "next", "BASELINE_RUN": "eval/thresholds.yaml", "SUITES": "rag chat"},
            (),
            "is one run file but SUITES has 2 suites",
        ),
    ],
)
def test_bad_settings_exit_2_before_installing(env: dict[str, str], args: tuple[str, ...], message: str) -> None:
    result = gate_script({"DRY_RUN": "1", **env}, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "make install" not in result.stderr


def test_baseline_run_directory_needs_every_suite(tmp_path: Path) -> None:
    (tmp_path / "rag.json").write_text("{}")
    result = gate_script({"DRY_RUN": "1", "CANDIDATE": "next", "BASELINE_RUN": str(tmp_path), "SUITES": "rag chat"})
    assert result.returncode == 2
    assert f"BASELINE_RUN={tmp_path} has no chat.json for suite 'chat'" in result.stderr


def test_outside_the_repository_root_exits_2(tmp_path: Path) -> None:
    result = gate_script({"CANDIDATE": "next"}, cwd=tmp_path)
    assert result.returncode == 2
    assert "run from the Switchyard repository root" in result.stderr


def test_dry_run_plans_install_backend_runs_and_gates(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    result = gate_script(
        {
            "DRY_RUN": "1",
            "CANDIDATE": "next",
            "SUITES": "rag eval/datasets/chat",
            "OUT_DIR": str(out),
            "THRESHOLDS": "eval/thresholds.yaml",
        }
    )
    assert result.returncode == 0, result.stderr
    sy = ".venv/bin/switchyard"
    run = lambda role, model, suite, name: (  # noqa: E731
        f"{sy} eval run {suite} --model {model} --json {out}/{name}/{role}.json --html {out}/{name}/{role}.html"
    )
    gate = lambda name: (  # noqa: E731
        f"{sy} eval gate --baseline {out}/{name}/baseline.json --candidate {out}/{name}/candidate.json "
        f"--thresholds eval/thresholds.yaml --json {out}/{name}/gate.json --markdown {out}/{name}/gate.md "
        f"--html {out}/{name}/gate.html"
    )
    # config/models.yaml launches the local llama.cpp backend: each side starts and stops it.
    assert commands(result) == [
        "make install",
        f"{sy} backend start local",
        run("baseline", "chat-default", "rag", "rag"),
        run("baseline", "chat-default", "eval/datasets/chat", "chat"),
        f"{sy} backend stop local",
        f"{sy} backend start local",
        run("candidate", "next", "rag", "rag"),
        run("candidate", "next", "eval/datasets/chat", "chat"),
        f"{sy} backend stop local",
        gate("rag"),
        gate("chat"),
    ]
    assert (out / "summary.md").read_text().startswith("# Eval gate: `next` against `chat-default`")


def test_dry_run_with_a_stored_baseline_a_vllm_models_file_and_a_dataset_file(tmp_path: Path) -> None:
    stored = tmp_path / "stored"
    stored.mkdir()
    (stored / "mine.json").write_text("{}")
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text("")
    out = tmp_path / "reports"
    result = gate_script(
        {
            "DRY_RUN": "1",
            "INSTALL": "0",
            "CANDIDATE": "vllm",
            "BASELINE_RUN": str(stored),
            "SUITES": str(dataset),
            "MODELS_FILE": "config/models.vllm.yaml",
            "OUT_DIR": str(out),
            "JUDGE": "chat-default",
        }
    )
    assert result.returncode == 0, result.stderr
    sy = ".venv/bin/switchyard"
    # No install, no baseline run, and nothing to start: Switchyard never starts vLLM.
    assert commands(result) == [
        f"cp {stored}/mine.json {out}/mine/baseline.json",
        f"{sy} eval run --dataset {dataset} --model vllm --json {out}/mine/candidate.json --html {out}/mine/candidate.html",
        f"{sy} eval gate --baseline {out}/mine/baseline.json --candidate {out}/mine/candidate.json "
        f"--json {out}/mine/gate.json --markdown {out}/mine/gate.md --html {out}/mine/gate.html",
    ]


def test_dry_run_without_starting_backends(tmp_path: Path) -> None:
    result = gate_script({"DRY_RUN": "1", "INSTALL": "0", "START_BACKENDS": "0", "CANDIDATE": "next", "SUITES": "chat", "OUT_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert not [c for c in commands(result) if " backend " in c]


# --- the script for real, against the FAKE backend (tests/fakes/openai_backend.py) -----------
# No install, and the baseline is a stored run file, so each test makes one `eval run`.


@pytest.fixture
def stored_baseline(tmp_path: Path, fake_backend_url: str) -> dict[str, str]:
    """A dataset the fake answers right ("Hello from the fake"), a good baseline run of it
    in a BASELINE_RUN directory, and a models file with a good, a broken and a dead backend."""
    dataset = tmp_path / "hello.jsonl"
    dataset.write_text(
        "".join(json.dumps({"id": f"case-{i}", "input": "Say hello.", "expected_facts": ["fake"]}) + "\n" for i in range(6))
    )
    stored = tmp_path / "stored"
    stored.mkdir()
    write_run(
        RunFile(
            suite="hello",
            dataset_hash=hash_dataset(load_dataset(dataset)),
            model="chat-default",
            backend="good",
            started_at=datetime(2026, 12, 2, tzinfo=UTC),
            cases=[CaseScore(case_id=f"case-{i}", values={FACTS_CONTAINED: 1.0}) for i in range(6)],
        ),
        stored / "hello.json",
    )
    models = tmp_path / "models.yaml"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    models.write_text(
        yaml.safe_dump(
            {
                "backends": {
                    "good": _fake(fake_backend_url, "fake-ok"),
                    # Drops every stream after three chunks: every case fails.
                    "broken": {**_fake(fake_backend_url, "fake-break"), "breaker": {"failures": 1000}},
                    "dead": {**_fake(dead, "nothing"), "timeouts": {"connect_s": 1, "read_s": 2}},
                },
                "aliases": {"chat-default": "good"},
            }
        )
    )
    return {
        "INSTALL": "0",
        "SWITCHYARD": str(SWITCHYARD),
        "SUITES": str(dataset),
        "BASELINE_RUN": str(stored),
        "MODELS_FILE": str(models),
        "OUT_DIR": str(tmp_path / "reports"),
        "DATA_DIR": str(tmp_path / "data"),
    }


@pytest.mark.integration
def test_a_failing_candidate_exits_1_with_every_report(stored_baseline: dict[str, str]) -> None:
    result = gate_script({**stored_baseline, "CANDIDATE": "broken"}, timeout=600)
    assert result.returncode == 1, result.stderr
    out = Path(stored_baseline["OUT_DIR"])
    reports = sorted(p.name for p in (out / "hello").iterdir())
    assert reports == [
        "baseline.json", "candidate.html", "candidate.json", "gate.html", "gate.json", "gate.md"
    ]  # fmt: skip
    assert json.loads((out / "hello" / "gate.json").read_text())["exit_code"] == 1
    summary = (out / "summary.md").read_text()
    assert summary.startswith(f"# Eval gate: `broken` against `{stored_baseline['BASELINE_RUN']}`")
    assert "## Suite `hello`" in summary and "**Gate: REGRESSION**" in summary
    assert "REGRESSION" in (out / "hello" / "gate.html").read_text()


@pytest.mark.integration
def test_an_unreachable_candidate_exits_2(stored_baseline: dict[str, str]) -> None:
    result = gate_script({**stored_baseline, "CANDIDATE": "dead"}, timeout=600)
    assert result.returncode == 2, result.stderr
    assert "unreachable" in result.stderr
    assert "hello: not gated: a run file is missing" in result.stderr
    out = Path(stored_baseline["OUT_DIR"])
    assert "**COULD NOT EVALUATE**" in (out / "summary.md").read_text()
    assert not (out / "hello" / "gate.json").exists()


# --- the workflow ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    document = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(document, dict)
    return document


def test_workflow_triggers(workflow: dict[Any, Any]) -> None:
    # YAML 1.1 reads the key `on` as true.
    triggers = workflow.get("on", workflow.get(True))
    inputs = triggers["workflow_dispatch"]["inputs"]
    assert inputs["candidate"]["required"] is True
    assert {"baseline", "suites", "models_file", "judge", "thresholds"} <= inputs.keys()
    assert set(triggers["pull_request"]["paths"]) == {"config/models*.yaml", "eval/**"}


def test_workflow_runs_the_script_uploads_reports_and_writes_the_summary(workflow: dict[Any, Any]) -> None:
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    gate = next(step for step in steps if "deploy/ci/eval-gate.sh" in step.get("run", ""))
    assert 'exit "$code"' in gate["run"]  # the job fails on 1 and 2
    assert {"CANDIDATE", "BASELINE", "SUITES", "JUDGE", "THRESHOLDS"} <= gate["env"].keys()
    assert {"OUT_DIR", "MODELS_FILE"} <= job["env"].keys()
    for name in (*gate["env"], *job["env"]):
        assert name.startswith("EVAL_") or name in SETTINGS, f"{name} is not a setting of the script"

    after = steps[steps.index(gate) + 1 :]
    summary = next(step for step in after if "GITHUB_STEP_SUMMARY" in step.get("run", ""))
    assert summary["if"] == "always()"
    assert "summary.md" in summary["run"]
    upload = next(step for step in after if str(step.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    assert job["env"]["OUT_DIR"] in upload["with"]["path"]


def test_workflow_steps_are_well_formed(workflow: dict[Any, Any]) -> None:
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] and job["timeout-minutes"] > 0
    assert workflow["permissions"] == {"contents": "read"}
    for step in job["steps"]:
        assert ("uses" in step) != ("run" in step), step
        assert "name" in step
        if "run" in step:  # each run block is valid bash (GitHub's ${{ }} is replaced first)
            script = re.sub(r"\$\{\{.*?\}\}", "x", step["run"])
            result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
            assert result.returncode == 0, (step["name"], result.stderr)
