"""Does the eval gate block degraded candidates and pass the baseline? Counted, not assumed.

Issue 14's measurement: a baseline run of the local model (SmolLM2 through llama-server), then
``--repeats`` times each pairing gated against it with ``switchyard eval gate``:

- ``rerun``: the same local model again (must pass: the gate tells noise from a drop);
- ``sabotage``, ``idk``, ``empty``, ``slow``, ``short``: the degraded candidates of
  ``bench/degraded_backend.py`` (a sabotaged system prompt; always "I don't know."; empty
  text; the first token after the alias's SLA; ``max_tokens`` 5). Each must be blocked
  (exit 1).

Everything runs through the real CLI (``switchyard eval run`` / ``eval gate``) as an operator
or a CI job would, with a scratch data directory and a models file written here: the local
backend (started here once, on a free loopback port), one backend per degraded mode, and the
alias ``chat-default`` with an SLA (``--sla-ttft``, ``--sla-total``). Prints a Markdown table of
pass/block counts and writes ``bench/results/eval-gate-<time>.json`` (every gate's exit code and
the metrics that decided it).

    .venv/bin/python bench/eval_gate.py [--suite chat] [--repeats 5] [--modes rerun,sabotage,...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway import load_registry  # noqa: E402
from gateway.local import start_backend, stop_backend  # noqa: E402

SWITCHYARD = Path(sys.executable).with_name("switchyard")
DEGRADED = ("sabotage", "idk", "empty", "slow", "short")
EXPECT = {"rerun": 0, **{mode: 1 for mode in DEGRADED}}
"""The gate's expected exit code per pairing: 0 pass, 1 blocked."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the degraded backend exited ({process.returncode}) before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


def _write_config(root: Path, local_url: str, proxy_port: int, sla_ttft: float, sla_total: float) -> Path:
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    local = {**source["backends"]["local"], "base_url": local_url}
    backends: dict[str, Any] = {"local": local}
    for mode in DEGRADED:
        backends[f"degraded-{mode}"] = {
            "kind": "vllm",
            "base_url": f"http://127.0.0.1:{proxy_port}/{mode}/v1",
            "model": local["model"],
            "timeouts": {"connect_s": 5, "read_s": 120},
            "default_max_tokens": local.get("default_max_tokens", 512),
            "capabilities": local["capabilities"],
            # A degraded candidate is measured, not failed over: never open its breaker.
            "breaker": {"failures": 100000},
        }
    aliases = {"chat-default": {"targets": [{"backend": "local", "weight": 100}], "sla": {"ttft_s": sla_ttft, "total_s": sla_total}}}
    models = root / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": backends, "aliases": aliases}, sort_keys=False))
    settings = root / "switchyard.yaml"
    base = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())
    base.update({"data_dir": str(root / "data"), "gateway": {**base.get("gateway", {}), "models_file": str(models)}})
    # The local model's thresholds (config/switchyard.yaml names them), by absolute path.
    base["eval"] = {**base.get("eval", {}), "thresholds": str(REPO / base.get("eval", {}).get("thresholds", "eval/thresholds.yaml"))}
    settings.write_text(yaml.safe_dump(base, sort_keys=False))
    return settings


def _run(settings: Path, suite: str, model: str, out: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(settings), "eval", "run", suite, "--model", model, "--json", str(out)],
        env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0 or not out.exists():
        raise RuntimeError(f"eval run --model {model} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return time.perf_counter() - started


def _gate(settings: Path, baseline: Path, candidate: Path, report: Path, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(settings), "eval", "gate", "--baseline", str(baseline), "--candidate", str(candidate),
         "--json", str(report)],
        env=env, capture_output=True, text=True, check=False,
    )
    decided: list[str] = []
    if report.exists():
        document = json.loads(report.read_text())
        decided = [m["metric"] for m in document.get("metrics", []) if m.get("verdict") == "regressed"]
    return {"exit": result.returncode, "regressed": decided, "stderr": result.stderr[-500:] if result.returncode == 2 else ""}


def _subset(name: str, count: int, root: Path) -> str:
    """A copy of suite ``name`` with ``count`` of its cases, evenly spaced (so English,
    Chinese and unanswerable cases keep their shares), its corpus by absolute path."""
    from eval.datasets import load_suite

    suite = load_suite(name)
    step = max(1, len(suite.cases) // count)
    picked = {case.id for case in suite.cases[::step][:count]}
    directory = root / f"{suite.name}-{count}"
    directory.mkdir()
    config = yaml.safe_load((suite.directory / "suite.yaml").read_text(encoding="utf-8"))
    config["name"] = f"{suite.name}-{count}"
    if suite.corpus is not None:
        config["corpus"] = str(suite.corpus.resolve())
    (directory / "suite.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    lines = (suite.directory / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["id"] in picked]
    (directory / "cases.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="chat", help="the suite to run (eval/datasets/<name> or a directory)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default=",".join(EXPECT), help="pairings to run, comma separated")
    parser.add_argument("--sla-ttft", type=float, default=5.0, help="the alias's SLA: seconds to the first token")
    parser.add_argument("--sla-total", type=float, default=60.0, help="the alias's SLA: seconds to the last token")
    parser.add_argument("--slow-s", type=float, default=6.0, help="the slow candidate's delay (above --sla-ttft)")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--keep", type=Path, help="copy the run files and gate reports here")
    parser.add_argument("--cases", type=int, help="run an evenly spaced subset of this many of the suite's cases")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in EXPECT]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(EXPECT)}")

    with TemporaryDirectory(prefix="eval-gate-") as tmp:
        root = Path(tmp)
        port = _free_port()
        env = {**os.environ, "SWITCHYARD_LOCAL_BACKEND_PORT": str(port)}
        os.environ["SWITCHYARD_LOCAL_BACKEND_PORT"] = str(port)
        local = load_registry(REPO / "config/models.yaml").backends["local"]
        start_backend(local, root / "backend")
        proxy_port = _free_port()
        proxy = subprocess.Popen(
            [sys.executable, str(REPO / "bench/degraded_backend.py"), "--upstream", local.base_url,
             "--port", str(proxy_port), "--slow-s", str(args.slow_s)],
        )
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        timings: dict[str, list[float]] = {"baseline": []}
        try:
            _wait_http(f"http://127.0.0.1:{proxy_port}/health", proxy)
            settings = _write_config(root, local.base_url, proxy_port, args.sla_ttft, args.sla_total)
            suite = _subset(args.suite, args.cases, root) if args.cases else args.suite
            baseline = root / "baseline.json"
            timings["baseline"].append(_run(settings, suite, "local", baseline, env))
            print(f"baseline: {timings['baseline'][0]:.0f}s", flush=True)
            for repeat in range(args.repeats):
                for mode in modes:
                    model = "local" if mode == "rerun" else f"degraded-{mode}"
                    candidate = root / f"{mode}-{repeat}.json"
                    timings.setdefault(mode, []).append(_run(settings, suite, model, candidate, env))
                    outcome = _gate(settings, baseline, candidate, root / f"{mode}-{repeat}.gate.json", env)
                    results[mode].append(outcome)
                    print(f"repeat {repeat + 1} {mode}: exit {outcome['exit']} {outcome['regressed']}", flush=True)
        finally:
            proxy.terminate()
            proxy.wait(10)
            stop_backend(local, root / "backend")
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for kept in root.glob("*.json"):
                    kept.replace(args.keep / kept.name)

    lines = ["| pairing | expected | runs | passed (exit 0) | blocked (exit 1) | could not evaluate (2) | as expected | metrics that blocked |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        outcomes = results[mode]
        exits = [o["exit"] for o in outcomes]
        blocked_by = sorted({m for o in outcomes for m in o["regressed"]})
        lines.append(
            f"| {mode} | {'pass' if EXPECT[mode] == 0 else 'blocked'} | {len(exits)} | {exits.count(0)} | {exits.count(1)} | "
            f"{exits.count(2)} | {sum(e == EXPECT[mode] for e in exits)}/{len(exits)} | {', '.join(blocked_by) or '-'} |"
        )
    table = "\n".join(lines)
    print(table)
    if not args.no_save:
        out = REPO / "bench" / "results" / f"eval-gate-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps({
            "suite": args.suite, "cases": args.cases, "repeats": args.repeats, "sla": {"ttft_s": args.sla_ttft, "total_s": args.sla_total},
            "slow_s": args.slow_s, "results": results, "run_seconds": timings, "table": table,
        }, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
