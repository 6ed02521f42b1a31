"""``switchyard eval run`` as a real subprocess, against real backends: the
failure-injection fake (in this process, reached over HTTP), a dead port, a running
Switchyard server holding the data directory, and the local model started by the command."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from eval.datasets import load_suite
from eval.metrics import FACTS_CONTAINED, RECALL_AT_K
from eval.runs import load_run
from tests.conftest import REPO, SWITCHYARD, start_server, stop_server, write_models_file
from tests.fakes.openai_backend import free_port

pytestmark = pytest.mark.integration

CASES = [
    {"id": "hello", "input": "Say hello.", "expected_facts": ["hello"]},
    {"id": "fake", "input": "Who are you?", "expected_facts": ["the fake"]},
    {"id": "from", "input": "Where from?", "expected_facts": ["from"]},
    {"id": "wide", "input": "Loud.", "expected_facts": ["ＨＥＬＬＯ"]},
    {"id": "zh", "input": "你好", "expected_facts": ["hello from"]},
    {"id": "miss", "input": "Say bye.", "expected_facts": ["goodbye"]},
]


def _config(tmp: Path, fake_url: str) -> Path:
    models = write_models_file(tmp / "models.yaml", None, fake_url, chat_default="fake-ok")
    data = yaml.safe_load(models.read_text())
    data["backends"]["dead"] = {**data["backends"]["fake-ok"], "base_url": f"http://127.0.0.1:{free_port()}/v1"}
    models.write_text(yaml.safe_dump(data))
    graphs = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())["graphs"]
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), "gateway": {"models_file": str(models)}, "graphs": graphs}))
    return config


def _dataset(tmp: Path, cases: list[dict[str, object]] = CASES) -> Path:
    path = tmp / "mine.jsonl"
    path.write_text("".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases), encoding="utf-8")
    return path


def _eval(config: Path, *args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "eval", *(str(a) for a in args)],
        capture_output=True, text=True, timeout=600, cwd=cwd,
    )


def _stored(result: subprocess.CompletedProcess[str]) -> Path:
    """The run file the command says it stored under the runs directory."""
    return Path(next(line for line in result.stdout.splitlines() if line.startswith("run file: ")).removeprefix("run file: "))


def test_dataset_run_writes_its_files_and_the_gate_takes_two(tmp_path: Path, fake_backend_url: str) -> None:
    config = _config(tmp_path, fake_backend_url)
    dataset = _dataset(tmp_path)
    first = _eval(config, "run", "--dataset", dataset, "--model", "chat-default", "--json", tmp_path / "a.json", "--html", tmp_path / "a.html")
    assert first.returncode == 0, first.stderr
    assert "facts_contained" in first.stdout and "6 cases, 0 failed" in first.stdout
    stored = _stored(first)
    assert stored.parent == tmp_path / "data" / "eval" / "runs" / "mine" and stored.name.startswith("chat-default-")
    run = load_run(tmp_path / "a.json")
    assert load_run(stored) == run
    assert run.suite == "mine" and run.model == "chat-default" and run.judge is None
    assert run.outputs is not None and {o["backend"] for o in run.outputs.values()} == {"fake-ok"}
    assert {c.case_id: c.values[FACTS_CONTAINED] for c in run.cases} == {
        "hello": 1.0, "fake": 1.0, "from": 1.0, "wide": 1.0, "zh": 1.0, "miss": 0.0
    }
    assert "<html" in (tmp_path / "a.html").read_text().lower()

    second = _eval(config, "run", "--dataset", dataset, "--model", "fake-ok", "--json", tmp_path / "b.json")
    assert second.returncode == 0, second.stderr
    gate = _eval(config, "gate", "--baseline", tmp_path / "a.json", "--candidate", tmp_path / "b.json", "--html", tmp_path / "gate.html")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "PASS" in gate.stdout and (tmp_path / "gate.html").is_file()


def test_bad_dataset_lines_are_named(tmp_path: Path, fake_backend_url: str) -> None:
    config = _config(tmp_path, fake_backend_url)
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"id": "ok", "input": "hi"}\n{"id": "empty", "input": ""}\nnot json\n')
    result = _eval(config, "run", "--dataset", dataset, "--model", "chat-default")
    assert result.returncode == 2
    assert f"{dataset}:2: input" in result.stderr and f"{dataset}:3: not valid JSON" in result.stderr
    assert not (tmp_path / "data" / "eval" / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuch", "--model", "chat-default"], "no such suite"),
        (["chat", "--model", "nope"], "unknown model 'nope'"),
        (["chat", "--model", "backend:chat-default"], "unknown model 'backend:chat-default'"),
        (["chat", "--model", "dead"], "model 'dead' is unreachable"),
        (["chat", "--model", "down"], "model 'down' is unreachable"),
        (["chat", "--model", "fake-ok", "--graph", "summarize"], "--graph"),
        (["--model", "fake-ok"], "give a SUITE"),
    ],
)
def test_could_not_run_is_exit_2(tmp_path: Path, fake_backend_url: str, args: list[str], message: str) -> None:
    config = _config(tmp_path, fake_backend_url)
    result = _eval(config, "run", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def _tiny_suite(tmp: Path) -> Path:
    corpus = tmp / "corpus"
    corpus.mkdir()
    source = load_suite("rag").corpus
    assert source is not None
    for name in ("01-harbor-tides.md", "02-tram-network.md", "08-brannock-bakery.md"):
        shutil.copy(source / name, corpus / name)
    suite = tmp / "tiny"
    suite.mkdir()
    (suite / "suite.yaml").write_text(
        yaml.safe_dump({"name": "tiny", "graph": "rag", "corpus": str(corpus), "collection": "eval-tiny"})
    )
    rag = {c.id: c for c in load_suite("rag").cases}
    cases = [rag["en-harbor-neap"], rag["en-harbor-deep-berth"]]
    (suite / "cases.jsonl").write_text("".join(c.model_dump_json() + "\n" for c in cases))
    return suite


def test_eval_run_while_a_server_holds_the_data_directory(tmp_path: Path, fake_backend_url: str) -> None:
    config = _config(tmp_path, fake_backend_url)
    suite = _tiny_suite(tmp_path)
    graphs = yaml.safe_load(config.read_text())["graphs"]
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    # The server on the same data directory: it holds <data>/qdrant (Qdrant's local mode).
    server = start_server(
        server_dir,
        {"data_dir": str(tmp_path / "data"), "gateway": {"models_file": str(tmp_path / "models.yaml")}, "graphs": graphs},
    )
    try:
        result = _eval(config, "run", suite, "--model", "chat-default")
        assert result.returncode == 0, result.stdout + result.stderr
        run = load_run(_stored(result))
        assert all(case.values[RECALL_AT_K] == 1.0 for case in run.cases)
        # A dataset without a corpus asks the user's own collections: the server holds them.
        refused = _eval(config, "run", "--dataset", suite / "cases.jsonl", "--collection", "mine", "--model", "fake-ok")
        assert refused.returncode == 2
        assert "ask your own collections" in refused.stderr and server.url in refused.stderr
        # The server still serves, and its store never got the scratch collection.
        listed = httpx.get(server.url + "/v1/collections", timeout=10)
        assert listed.status_code == 200
        assert "eval-tiny" not in listed.text
    finally:
        stop_server(server)
    assert (tmp_path / "data" / "eval" / "vectors").is_dir()


@pytest.mark.llm
def test_a_managed_local_backend_is_started_and_stopped(tmp_path: Path, fake_backend_url: str) -> None:
    """The local model, not running: the command starts it for the run and stops it after."""
    port = free_port()
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    local = {**source["backends"]["local"], "base_url": f"http://127.0.0.1:{port}/v1"}
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": {"local": local}, "aliases": {"chat-default": "local"}}))
    graphs = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())["graphs"]
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "gateway": {"models_file": str(models)}, "graphs": graphs}))
    dataset = _dataset(tmp_path, [{"id": "add", "input": "What is 2 + 2? Reply with the number only.", "expected_facts": ["4"]}])
    result = _eval(config, "run", "--dataset", dataset, "--model", "local")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stopping local backend local" in result.stderr
    run = load_run(_stored(result))
    assert run.outputs is not None and run.outputs["add"]["backend"] == "local" and run.outputs["add"]["answer"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_judge_that_answers_no_json_is_scored_errors(tmp_path: Path, fake_backend_url: str) -> None:
    """--judge: the judged metrics come from DeepEval on the judge alias; the fake answers
    prose, so each judged metric is a counted error, not a crash. DeepEval's files stay
    under the eval directory, none in the working directory."""
    config = _config(tmp_path, fake_backend_url)
    work = tmp_path / "cwd"
    work.mkdir()
    result = _eval(config, "run", "--dataset", _dataset(tmp_path, CASES[:2]), "--model", "fake-ok", "--judge", "fake-ok", cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(_stored(result))
    assert run.judge == "fake-ok -> fake-ok (fake-ok)"  # the alias and the model behind it
    for case in run.cases:
        assert case.values[FACTS_CONTAINED] == 1.0
        assert {"answer_relevancy", "correctness"} <= set(case.errors)
    assert "correctness" in result.stdout
    assert not (work / ".deepeval").exists() and list(work.iterdir()) == []
    assert (tmp_path / "data" / "eval" / "deepeval").is_dir()


def test_a_dataset_for_the_users_own_collection(tmp_path: Path, fake_backend_url: str) -> None:
    """No corpus: the cases ask a collection of the data directory's store (ingested by
    the user), which the eval reads and does not write."""
    config = _config(tmp_path, fake_backend_url)
    suite = _tiny_suite(tmp_path)
    ingested = subprocess.run(
        [str(SWITCHYARD), "--config", str(config), "ingest", str(tmp_path / "corpus"), "--collection", "mydocs"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert ingested.returncode == 0, ingested.stderr
    result = _eval(config, "run", "--dataset", suite / "cases.jsonl", "--collection", "mydocs", "--model", "fake-ok")
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(_stored(result))
    assert run.suite == "cases" and all(case.values[RECALL_AT_K] == 1.0 for case in run.cases)
    assert not (tmp_path / "data" / "eval" / "vectors").exists()  # the scratch store was not needed
