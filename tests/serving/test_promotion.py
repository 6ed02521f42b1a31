"""Eval-gated promotion and rollback (issue 14, item 5) through a real ``switchyard serve``.

Backends are ``bench/scripted_backend.py`` processes: ``a`` (the alias's target) and ``b``
answer " lorem ipsum dolor ..."; ``empty`` answers empty text (a degraded candidate). The
alias's suite is a tiny chat suite written here (``eval.suites``), whose cases expect the
fact "lorem", so each evaluation takes seconds. The evaluation is the real one: the suite
runs through the server's chat graph and run host on each backend alone.

- Promote then roll back while a stream runs on ``a``: the stream completes on ``a``
  untouched, the next requests go to ``b`` and then back to ``a`` (``x-switchyard-backend``),
  the server's pid never changes; the history, ``GET /admin/models`` and the audit log show
  both steps; the second promotion reuses the stored baseline run.
- A failed gate (``empty``) changes nothing: 422 with the failing metric, no history entry,
  traffic stays; the audit log has ``model_promotion_refused``.
- A canary weight; a second promotion while one runs is 409; a rollback with nothing to roll
  back is 409 naming it; unknown backend 400, unknown alias 404; a tenant that is not an
  admin is 403; ``promotions.json`` naming a backend the models file dropped is a refused
  reload (the running registry stays).
- A rollback during a promotion's evaluation (a slow candidate) answers at once, and the
  promotion is then refused with 409, nothing written.
- A canary at 60% (of an alias with two targets: the third is kept, scaled) is finished
  by promoting its backend again, against the heaviest other target.
- A stored baseline with failed cases is not reused; one the gate cannot compare (it
  predates the SLA) is run again.
- An unreachable candidate, an unreachable baseline with nothing stored, and an unwritable
  promotions file are 503 and change nothing.
- The CLI (``switchyard models ...``) through the running server, and in-process with none.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD, create_key
from tests.fakes.openai_backend import free_port
from tests.gateway.traffic import (
    backend_entry,
    gateway_config,
    openai_complete,
    openai_stream,
    running_server,
    server_text,
    splice_problem,
    targets,
    write_models,
)
from tests.scripted import ScriptedBackend, failed_requests, running_scripted_backend

pytestmark = pytest.mark.e2e

DELAY_MS = 10
LONG = 2500
"""Tokens of the stream that spans the promotion and the rollback (25 s at 10 ms a token)."""
CASES = [
    {"id": "en-1", "input": "Say the first word of the placeholder text.", "expected_facts": ["lorem"]},
    {"id": "en-2", "input": "Which word comes second in lorem ipsum?", "expected_facts": ["ipsum"]},
    {"id": "zh-1", "input": "请说出占位文本的第一个词。", "expected_facts": ["lorem"]},
    {"id": "en-3", "input": "Continue: lorem ipsum ...", "expected_facts": ["dolor"]},
]
MAIN = {"main": {"targets": targets(a=100), "fallbacks": [], "sla": {"ttft_s": 10, "total_s": 30}}, "spare": "a"}
"""``main`` is the alias under test; ``spare`` has a suite that does not exist, and no graph."""


def _suite(tmp: Path) -> Path:
    directory = tmp / "suite-tiny"
    directory.mkdir()
    (directory / "suite.yaml").write_text(yaml.safe_dump({"name": "tiny", "graph": "chat", "version": 1}))
    (directory / "cases.jsonl").write_text("".join(json.dumps(case) + "\n" for case in CASES))
    return directory


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[dict[str, ScriptedBackend]]:
    with (
        running_scripted_backend(tmp_path, delay_ms=DELAY_MS, tokens=8) as a,
        running_scripted_backend(tmp_path, delay_ms=DELAY_MS, tokens=8) as b,
        running_scripted_backend(tmp_path, delay_ms=DELAY_MS, tokens=0) as empty,
    ):
        yield {"a": a, "b": b, "empty": empty}


def _config(
    tmp: Path, backends: dict[str, ScriptedBackend], aliases: dict[str, Any] = MAIN, *,
    extra_backends: dict[str, Any] | None = None, **extra: Any,
) -> dict[str, Any]:
    models = write_models(tmp / "models.yaml", backends, aliases, extra_backends=extra_backends)
    suite = str(_suite(tmp))
    return {
        **gateway_config(models, {"chat": "main"}, reload_check_s=0.5),
        "eval": {"suites": {"main": [suite], "spare": [str(tmp / "no-such-suite")], "other": [suite]}},
        **extra,
    }


def _client(url: str, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=5), headers=headers)


def _audit(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "audit" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _of(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]


async def _backends_of(client: httpx.AsyncClient, n: int = 6) -> set[str | None]:
    answers = await asyncio.gather(*(openai_complete(client, "main", max_tokens=2) for _ in range(n)))
    assert all(a.ok for a in answers), [str(a) for a in answers]
    return {a.backend for a in answers}


async def _served_targets(client: httpx.AsyncClient) -> list[tuple[str, int]]:
    state = (await client.get("/admin/models")).json()
    return [(t["backend"], t["weight"]) for t in state["aliases"]["main"]["targets"]]


async def test_promote_and_roll_back_while_a_stream_runs(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    with running_server(tmp_path, _config(tmp_path, backends)) as server:
        pid = server.process.pid
        async with _client(server.url) as client:
            progress: list[int] = [0]
            stream = asyncio.ensure_future(
                openai_stream(client, "main", max_tokens=LONG, on_token=lambda n: progress.__setitem__(0, n))
            )
            while progress[0] < 3:
                assert not stream.done(), str(stream.result())
                await asyncio.sleep(0.02)

            promoted = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert promoted.status_code == 200, promoted.text
            body = promoted.json()
            assert body["promoted"] is True and body["targets"] == [{"backend": "b", "weight": 100}]
            [suite] = body["suites"]
            assert suite["suite"] == "tiny" and suite["passed"] and not suite["baseline_reused"]
            assert {m["metric"] for m in suite["metrics"]} >= {"facts_contained"}
            assert all(Path(p).is_file() for p in [*body["reports"], suite["baseline_run"], suite["candidate_run"]])
            assert any(p.endswith(".md") for p in body["reports"]) and any(p.endswith(".html") for p in body["reports"])
            # At once, no restart: the next requests go to b.
            assert await _backends_of(client) == {"b"}
            assert await _served_targets(client) == [("b", 100)]

            rolled = await client.post("/admin/models/main/rollback")
            assert rolled.status_code == 200, rolled.text
            assert rolled.json()["targets"] == [{"backend": "a", "weight": 100}]
            assert rolled.json()["entry"]["rolls_back"] == 1
            assert await _backends_of(client) == {"a"}
            assert not stream.done(), "the stream ended before the promotion and the rollback were over"

            answer = await asyncio.wait_for(stream, 120)
            assert answer.ok and answer.backend == "a" and len(answer.tokens) == LONG, str(answer)
            assert splice_problem(answer.tokens) is None

            history = (await client.get("/admin/models/main/history")).json()
            assert history["promoted"] is False
            steps = [(e["seq"], e["action"], e["backend"], e["rolls_back"]) for e in history["entries"]]
            assert steps == [(1, "promote", "b", None), (2, "rollback", None, 1)]
            first = history["entries"][0]
            assert first["by"] == body["entry"]["by"] and first["reports"] == body["reports"]
            assert first["scores"]["tiny"]["facts_contained"]["verdict"] == "ok"

            # A second promotion reuses the baseline stored by the first (same dataset hash).
            again = await client.post("/admin/models/main/promote", json={"backend": "b", "weight": 30})
            assert again.status_code == 200, again.text
            assert again.json()["suites"][0]["baseline_reused"] is True
            assert await _served_targets(client) == [("a", 70), ("b", 30)]
            seen = await _backends_of(client, 40)
            assert seen == {"a", "b"}, seen
        assert server.process.poll() is None and server.process.pid == pid
    records = _audit(server.data_dir)
    promoted_records = _of(records, "model_promoted")
    assert [(r["alias"], r["backend"], r["weight"]) for r in promoted_records] == [("main", "b", None), ("main", "b", 30)]
    assert promoted_records[0]["to_targets"] == [{"backend": "b", "weight": 100}] and promoted_records[0]["reports"]
    [rollback] = _of(records, "model_rolled_back")
    assert rollback["to_targets"] == [{"backend": "a", "weight": 100}] and rollback["rolls_back"] == 1
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []


async def test_a_failed_gate_changes_nothing(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    with running_server(tmp_path, _config(tmp_path, backends)) as server:
        async with _client(server.url) as client:
            refused = await client.post("/admin/models/main/promote", json={"backend": "empty"})
            assert refused.status_code == 422, refused.text
            body = refused.json()
            assert body["promoted"] is False and body["entry"] is None and "facts_contained" in body["detail"]
            [suite] = body["suites"]
            failing = {m["metric"]: m for m in suite["metrics"] if m["verdict"] != "ok"}
            assert failing["facts_contained"]["candidate"] == 0.0, failing
            assert all(Path(p).is_file() for p in body["reports"])
            assert await _served_targets(client) == [("a", 100)]
            assert await _backends_of(client) == {"a"}
            history = (await client.get("/admin/models/main/history")).json()
            assert history == {"alias": "main", "promoted": False, "entries": []}
            nothing = await client.post("/admin/models/main/rollback")
            assert nothing.status_code == 409 and "no promotion to roll back" in nothing.json()["detail"], nothing.text
            unknown = await client.post("/admin/models/main/promote", json={"backend": "nope"})
            assert unknown.status_code == 400 and "unknown backend 'nope'" in unknown.json()["detail"], unknown.text
            no_alias = await client.post("/admin/models/nope/promote", json={"backend": "b"})
            assert no_alias.status_code == 404 and "unknown model alias 'nope'" in no_alias.json()["detail"], no_alias.text
            bad_weight = await client.post("/admin/models/main/promote", json={"backend": "b", "weight": 0})
            # A body the schema refuses is the API's usual validation error, naming the field.
            assert bad_weight.status_code == 422 and "weight" in bad_weight.json()["detail"], bad_weight.text
            assert "promoted" not in bad_weight.json()
            assert (await client.get("/admin/models/nope/history")).status_code == 404
            no_suite = await client.post("/admin/models/spare/promote", json={"backend": "b"})
            assert no_suite.status_code == 400 and "no-such-suite" in no_suite.json()["detail"], no_suite.text
            same = await client.post("/admin/models/main/promote", json={"backend": "a"})
            assert same.status_code == 400 and "already the primary" in same.json()["detail"], same.text
    assert not (server.data_dir / "gateway" / "promotions.json").exists()
    records = _audit(server.data_dir)
    [refusal] = _of(records, "model_promotion_refused")
    assert refusal["backend"] == "empty" and any(m["metric"] == "facts_contained" for m in refusal["failing"]["tiny"])
    assert _of(records, "model_promoted") == [] and _of(records, "model_rolled_back") == []
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []


async def test_a_second_promotion_while_one_runs_is_409(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    with running_server(tmp_path, _config(tmp_path, backends)) as server:
        async with _client(server.url) as client:
            first = asyncio.ensure_future(client.post("/admin/models/main/promote", json={"backend": "b"}))
            # Wait until its evaluation runs cases (their run records reach the audit log).
            deadline = time.monotonic() + 60
            while not any(r["type"] == "run" for r in _audit(server.data_dir)):
                assert not first.done(), first.result().text
                assert time.monotonic() < deadline, "the promotion ran no case within 60 s"
                await asyncio.sleep(0.05)
            second = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert not first.done(), "the first promotion ended before the second was sent"
            assert second.status_code == 409 and "already running" in second.json()["detail"], second.text
            assert (await client.post("/admin/models/main/rollback")).status_code == 409
            assert (await first).status_code == 200
            assert await _backends_of(client) == {"b"}


async def test_admin_only(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    roomy = {"graphs": ["*"], "models": ["*"], "limits": {"requests_per_s": 1000, "burst": 1000, "max_concurrent_runs": 50}}
    tenants = {"ops": {**roomy, "admin": True}, "acme": roomy}
    config = {**_config(tmp_path, backends), "auth": {"tenants": tenants}}
    config_file = tmp_path / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **config}))
    keys = {tenant: create_key(config_file, tenant) for tenant in tenants}
    with running_server(tmp_path, config, dev=False) as server:
        async with _client(server.url, **{"x-api-key": keys["acme"]}) as acme:
            for method, path, body in (
                ("POST", "/admin/models/main/promote", {"backend": "b"}),
                ("POST", "/admin/models/main/rollback", None),
                ("GET", "/admin/models/main/history", None),
            ):
                denied = await acme.request(method, path, json=body)
                assert denied.status_code == 403 and "admin" in denied.json()["detail"], (path, denied.text)
        async with _client(server.url) as anonymous:
            assert (await anonymous.post("/admin/models/main/rollback")).status_code == 401
        # The CLI goes through the running server with the admin's key.
        cli = _cli(config_file, "models", "promote", "main", "b", env={"SWITCHYARD_API_KEY": keys["ops"]})
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert "alias main promoted (#1)" in cli.stdout and "suite tiny: pass" in cli.stdout
        denied_cli = _cli(config_file, "models", "rollback", "main", env={"SWITCHYARD_API_KEY": keys["acme"]})
        assert denied_cli.returncode == 1 and "403" in denied_cli.stderr, denied_cli.stderr
        listed = _cli(config_file, "models", "history", "main", "--json", env={"SWITCHYARD_API_KEY": keys["ops"]})
        assert listed.returncode == 0 and json.loads(listed.stdout)["entries"][0]["by"] == "tenant ops", listed.stdout
    records = _audit(server.data_dir)
    assert [r["by"] for r in _of(records, "model_promoted")] == ["tenant ops"]


def _cli(config_file: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config_file), *args],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=600, check=False,
    )


def test_cli_without_a_server_then_the_server_starts_promoted(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    config = _config(tmp_path, backends)
    config_file = tmp_path / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **config}))
    refused = _cli(config_file, "models", "promote", "main", "empty")
    assert refused.returncode == 1 and "refused by the eval gate" in refused.stderr, refused.stdout + refused.stderr
    nothing = _cli(config_file, "models", "rollback", "main")
    assert nothing.returncode == 1 and "no promotion to roll back" in nothing.stderr, nothing.stderr
    promoted = _cli(config_file, "models", "promote", "main", "b", "--weight", "25")
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    assert "[a 100] -> [a 75, b 25]" in promoted.stdout
    history = _cli(config_file, "models", "history", "main")
    assert history.returncode == 0 and "#1" in history.stdout and "promote b at 25%" in history.stdout, history.stdout
    records = _audit(tmp_path / "data")
    assert [r["type"] for r in records if r["type"].startswith("model_")] == ["model_promotion_refused", "model_promoted"]
    with running_server(tmp_path, config) as server:
        state = httpx.get(server.url + "/admin/models", timeout=10).json()["aliases"]["main"]
        assert [(t["backend"], t["weight"]) for t in state["targets"]] == [("a", 75), ("b", 25)]
        assert state["promoted"]["seq"] == 1 and state["promoted"]["backend"] == "b"
        rolled = _cli(config_file, "models", "rollback", "main")  # through the server now
        assert rolled.returncode == 0, rolled.stderr
        state = httpx.get(server.url + "/admin/models", timeout=10).json()["aliases"]["main"]
        assert [(t["backend"], t["weight"]) for t in state["targets"]] == [("a", 100)] and "promoted" not in state


async def test_promotions_naming_a_removed_backend_are_refused(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    with running_server(tmp_path, _config(tmp_path, backends)) as server:
        async with _client(server.url) as client:
            assert (await client.post("/admin/models/main/promote", json={"backend": "b"})).status_code == 200
            assert await _backends_of(client) == {"b"}
            models = Path(yaml.safe_load(server.config.read_text())["gateway"]["models_file"])
            write_models(models, {"a": backends["a"], "empty": backends["empty"]}, MAIN)  # b is gone
            reload = await client.post("/admin/models/reload")
            assert reload.status_code == 400, reload.text
            assert "promoted to backend(s) 'b' that the model registry no longer has" in reload.json()["detail"]
            assert await _backends_of(client) == {"b"}  # the running registry stays
            # Rolling back puts a valid pair of files in force again.
            rolled = await client.post("/admin/models/main/rollback")
            assert rolled.status_code == 200, rolled.text
            assert await _backends_of(client) == {"a"}
    assert "no longer has" in server_text(server)


async def test_an_evaluation_that_cannot_run_refuses(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """A judge (``eval.judge``) that names no model: the promotion is refused with 503 naming
    it, nothing changed, and the audit log says why."""
    config = _config(tmp_path, backends)
    config["eval"]["judge"] = "no-such-judge"
    with running_server(tmp_path, config) as server:
        async with _client(server.url) as client:
            refused = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert refused.status_code == 503 and "no-such-judge" in refused.json()["detail"], refused.text
            assert await _served_targets(client) == [("a", 100)]
            assert (await client.get("/admin/models/main/history")).json()["entries"] == []
    [record] = _of(_audit(server.data_dir), "model_promotion_refused")
    assert "no-such-judge" in record["error"]
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl", allowed=frozenset({503})) == []


def _runs(records: list[dict[str, Any]]) -> int:
    return sum(r["type"] == "run" for r in records)


async def test_a_rollback_during_an_evaluation_wins(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """The rollback does not wait for a promotion that is evaluating (a slow candidate);
    the promotion then finds the alias changed when it commits: 409, nothing written."""
    with running_scripted_backend(tmp_path, delay_ms=250, tokens=8) as slow:
        config = _config(tmp_path, {**backends, "slow": slow})
        with running_server(tmp_path, config) as server:
            async with _client(server.url) as client:
                assert (await client.post("/admin/models/main/promote", json={"backend": "b"})).status_code == 200
                runs_before = _runs(_audit(server.data_dir))
                promoting = asyncio.ensure_future(client.post("/admin/models/main/promote", json={"backend": "slow"}))
                deadline = time.monotonic() + 60
                while _runs(_audit(server.data_dir)) == runs_before:  # the slow candidate runs its cases
                    assert not promoting.done(), promoting.result().text
                    assert time.monotonic() < deadline, "the promotion ran no case within 60 s"
                    await asyncio.sleep(0.05)
                rolled = await client.post("/admin/models/main/rollback")
                assert rolled.status_code == 200, rolled.text
                assert not promoting.done(), "the rollback waited for the evaluation"
                assert rolled.json()["targets"] == [{"backend": "a", "weight": 100}]
                assert await _backends_of(client) == {"a"}
                refused = await promoting
                assert refused.status_code == 409 and "someone else" in refused.json()["detail"], refused.text
                assert await _served_targets(client) == [("a", 100)]
                history = (await client.get("/admin/models/main/history")).json()
                assert [(e["action"], e["backend"]) for e in history["entries"]] == [("promote", "b"), ("rollback", None)]
                assert history["promoted"] is False
    records = _audit(server.data_dir)
    assert [r["backend"] for r in _of(records, "model_promoted")] == ["b"]
    [refusal] = _of(records, "model_promotion_refused")
    assert refusal["backend"] == "slow" and "someone else" in refusal["error"]
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []


async def test_a_canary_of_several_targets_is_finished(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """``main`` is [a 60, empty 40]: a canary of b at 60% keeps ``empty``, scaled; b is then
    the primary, and promoting it again (against a, the heaviest other) finishes it."""
    aliases = {**MAIN, "main": {**MAIN["main"], "targets": targets(a=60, empty=40)}}
    with running_server(tmp_path, _config(tmp_path, backends, aliases)) as server:
        async with _client(server.url) as client:
            canary = await client.post("/admin/models/main/promote", json={"backend": "b", "weight": 60})
            assert canary.status_code == 200, canary.text
            assert await _served_targets(client) == [("a", 24), ("empty", 16), ("b", 60)]
            finished = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert finished.status_code == 200, finished.text
            assert finished.json()["suites"][0]["baseline_reused"] is True  # a's run of the canary
            assert "/a-" in finished.json()["suites"][0]["baseline_run"]
            assert await _served_targets(client) == [("b", 100)]
            again = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert again.status_code == 400 and "already the primary" in again.json()["detail"], again.text
            rolled = await client.post("/admin/models/main/rollback")
            assert rolled.json()["targets"] == [{"backend": "a", "weight": 24}, {"backend": "empty", "weight": 16}, {"backend": "b", "weight": 60}]
    promoted = _of(_audit(server.data_dir), "model_promoted")
    assert [(r["weight"], r["baseline"]) for r in promoted] == [(60, "a"), (None, "a")]


async def test_a_stored_baseline_is_reused_only_when_sound(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """A stored run of the baseline with failed cases is not reused; one the gate cannot
    compare with the candidate's (it predates the alias's SLA: no ``latency_within``) is
    set aside and the baseline runs again."""
    with running_server(tmp_path, _config(tmp_path, backends)) as server:
        async with _client(server.url) as client:

            async def promote_and_roll_back() -> dict[str, Any]:
                promoted = await client.post("/admin/models/main/promote", json={"backend": "b"})
                assert promoted.status_code == 200, promoted.text
                assert (await client.post("/admin/models/main/rollback")).status_code == 200
                [suite] = promoted.json()["suites"]
                return suite

            first = await promote_and_roll_back()
            stored = Path(first["baseline_run"])
            run = json.loads(stored.read_text())
            # A run where the baseline was down for one case.
            run["timings"]["failed_cases"] = 1
            case = run["cases"][0]
            case["values"] = dict.fromkeys(case["values"])
            case["errors"] = dict.fromkeys(case["values"], "the run failed: ConnectError")
            stored.write_text(json.dumps(run))
            second = await promote_and_roll_back()
            assert second["baseline_reused"] is False and second["baseline_run"] != str(stored), second
            assert second["passed"]

            # A sound run of a, written before the alias had an SLA.
            fresh = Path(second["baseline_run"])
            run = json.loads(fresh.read_text())
            for case in run["cases"]:
                case["values"].pop("latency_within")
            fresh.write_text(json.dumps(run))
            third = await promote_and_roll_back()
            assert third["passed"] and third["baseline_reused"] is False, third
            assert third["baseline_rerun"] == str(fresh) and third["baseline_run"] not in (str(fresh), str(stored))
            report = Path(next(p for p in third["reports"] if p.endswith(".md"))).read_text()
            assert "set aside" in report


async def test_what_cannot_run_or_be_written_is_503(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """An unreachable candidate (a dead port), an unreachable baseline with no stored run,
    and a promotions file that cannot be written: 503 naming why, nothing changed, audited."""
    dead = {"dead": {**backend_entry(backends["a"]), "base_url": f"http://127.0.0.1:{free_port()}/v1"}}
    aliases = {**MAIN, "other": {"targets": targets(dead=100), "fallbacks": []}}
    config = _config(tmp_path, backends, aliases, extra_backends=dead)
    with running_server(tmp_path, config) as server:
        async with _client(server.url) as client:
            unreachable = await client.post("/admin/models/main/promote", json={"backend": "dead"})
            assert unreachable.status_code == 503, unreachable.text
            assert "candidate backend 'dead' is unreachable" in unreachable.json()["detail"]
            no_baseline = await client.post("/admin/models/other/promote", json={"backend": "b"})
            assert no_baseline.status_code == 503, no_baseline.text
            assert "baseline backend 'dead' is unreachable" in no_baseline.json()["detail"]

            # promotions.json cannot be written (its lock's path is taken by a directory:
            # chmod does not stop root, and these tests may run as root).
            lock = server.data_dir / "gateway" / "promotions.json.lock"
            lock.mkdir(parents=True)
            unwritable = await client.post("/admin/models/main/promote", json={"backend": "b"})
            assert unwritable.status_code == 503, unwritable.text
            assert "cannot write the promotions file" in unwritable.json()["detail"]
            assert (await client.post("/admin/models/main/rollback")).status_code == 503
            assert await _served_targets(client) == [("a", 100)]
            assert await _backends_of(client) == {"a"}
            assert (await client.get("/admin/models/main/history")).json()["entries"] == []
            lock.rmdir()
            assert (await client.post("/admin/models/main/promote", json={"backend": "b"})).status_code == 200
    assert not list((server.data_dir / "eval" / "runs" / "tiny").glob("dead-*.json"))  # the dead candidate never ran
    refusals = _of(_audit(server.data_dir), "model_promotion_refused")
    assert [r["backend"] for r in refusals] == ["dead", "b", "b"]
    assert "unreachable" in refusals[0]["error"] and "cannot write" in refusals[2]["error"]
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl", allowed=frozenset({503})) == []
