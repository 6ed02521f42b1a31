"""Searches against a running server while ``switchyard ingest`` sends a large
collection through it, and while the server then optimises that collection: the user
path of "concurrent readers while the CLI ingests" on the embedded Qdrant Edge store.

A real ``switchyard serve --dev`` on a fresh data directory (loopback only); a small
collection ``probe`` (the sample corpus) is searched over HTTP
(``POST /v1/collections/probe/search``, hybrid, the query embedded by the server) by
``--readers`` clients, each every ``--interval-s``; meanwhile the real CLI ingests
``--copies`` copies of the sample corpus into ``big`` (it finds the server in
``<data_dir>/run/server.json`` and uploads through the API). Phases, told apart by what
the data directory shows: ``idle`` (before), ``ingest`` (the CLI running),
``wait`` (ingest done, optimisation not started: the quiet time),
``optimise`` (the optimiser's copy exists), ``after`` (the optimised shard is live).
Reports each phase's search p50/p95/max and every non-200 answer.

    .venv/bin/python bench/edge_serving.py [--copies 116] [--readers 2] [--interval-s 0.05]

Writes bench/results/edge-serving-<UTC time>.json. Bounded: the server and the CLI are
stopped at the end, or after ``--timeout-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "eval" / "datasets" / "corpus"
SWITCHYARD = REPO / ".venv" / "bin" / "switchyard"
QUESTIONS = REPO / "eval" / "datasets" / "corpus-questions.jsonl"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _copies(target: Path, copies: int) -> None:
    """``copies`` distinct copies of the sample corpus's Markdown, text and HTML files."""
    for index in range(copies):
        folder = target / f"copy-{index:04d}"
        folder.mkdir(parents=True)
        for source in CORPUS.iterdir():
            if source.suffix in (".md", ".txt"):
                (folder / source.name).write_text(source.read_text() + f"\n\nCopy {index} of {source.stem}.\n")
            elif source.suffix == ".html":
                (folder / source.name).write_text(source.read_text().replace("</body>", f"<p>Copy {index}.</p></body>"))


def _phase(data_dir: Path, ingest_running: bool, ingest_started: bool) -> str:
    big = data_dir / "vectors" / "big"
    if not ingest_started:
        return "idle"
    if ingest_running:
        return "ingest"
    if list(big.glob("*.building-*")):
        return "optimise"
    meta = big / "collection.json"
    if meta.is_file() and json.loads(meta.read_text())["shard"] != "shard-000001":
        return "after"
    return "wait"


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    questions = [json.loads(line)["q"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    work = Path(tempfile.mkdtemp(prefix="edge-serving-"))
    data_dir = work / "data"
    source = work / "big"
    _copies(source, args.copies)
    port, backend_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "SWITCHYARD_DATA_DIR": str(data_dir),
        "SWITCHYARD_LOCAL_BACKEND_PORT": str(backend_port),
        "SWITCHYARD_KNOWLEDGE__EDGE__OPTIMIZE_MIN_POINTS": str(args.optimize_min_points),
    }
    env.pop("SWITCHYARD_API_KEY", None)
    server = subprocess.Popen(
        [str(SWITCHYARD), "serve", "--dev", "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    latencies: dict[str, list[float]] = {}
    failures: list[dict[str, Any]] = []
    timeline: list[tuple[float, str]] = []
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() - started > 120:
                    raise SystemExit("the server did not start")
                await asyncio.sleep(0.5)
            probe = subprocess.run(
                [str(SWITCHYARD), "ingest", str(CORPUS), "--collection", "probe", "--json"],
                env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
            )
            state = {"running": False, "started": False, "stop": False}

            async def reader(offset: int) -> None:
                turn = offset
                while not state["stop"]:
                    question = questions[turn % len(questions)]
                    turn += 1
                    phase = _phase(data_dir, state["running"], state["started"])
                    began = time.perf_counter()
                    response = await client.post("/v1/collections/probe/search", json={"query": question, "k": 5})
                    took = time.perf_counter() - began
                    if response.status_code != 200:
                        failures.append({"phase": phase, "status": response.status_code, "body": response.text[:200]})
                    else:
                        latencies.setdefault(phase, []).append(took)
                    await asyncio.sleep(args.interval_s)

            readers = [asyncio.create_task(reader(i * 7)) for i in range(args.readers)]
            await asyncio.sleep(args.idle_s)
            state["started"] = state["running"] = True
            ingest_began = time.monotonic()
            ingest = await asyncio.create_subprocess_exec(
                str(SWITCHYARD), "ingest", str(source), "--collection", "big", "--json",
                env=env, cwd=str(REPO), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(ingest.communicate(), timeout=args.timeout_s)
            state["running"] = False
            ingest_seconds = time.monotonic() - ingest_began
            if ingest.returncode != 0:
                raise SystemExit(f"ingest failed: {err.decode()[-500:]}")
            report = json.loads(out.decode())
            # The optimisation starts after the quiet time (5 s by default) and takes
            # seconds to minutes; a collection under the threshold is never optimised.
            deadline = time.monotonic() + args.timeout_s
            previous = ""
            while time.monotonic() < deadline:
                if previous == "wait" and time.monotonic() - ingest_began - ingest_seconds > 60:
                    timeline.append((round(time.monotonic() - ingest_began, 2), "no optimisation within 60 s"))
                    break
                phase = _phase(data_dir, False, True)
                if phase != previous:
                    timeline.append((round(time.monotonic() - ingest_began, 2), phase))
                    previous = phase
                if phase == "after":
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(args.idle_s)
            state["stop"] = True
            await asyncio.gather(*readers)
    finally:
        with_group = os.getpgid(server.pid)
        os.killpg(with_group, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(with_group, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "copies": args.copies,
        "readers": args.readers,
        "interval_s": args.interval_s,
        "optimize_min_points": args.optimize_min_points,
        "probe_ingest": json.loads(probe.stdout),
        "big_ingest": {k: report[k] for k in ("added", "chunks", "failed", "seconds")},
        "ingest_wall_s": round(ingest_seconds, 1),
        "timeline_s_after_ingest_start": timeline,
        "search_by_phase": {phase: _stats(values) for phase, values in latencies.items()},
        "failures": failures,
        "loadavg_after": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=116)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=0.05)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--optimize-min-points", type=int, default=5000, help="knowledge.edge.optimize_min_points")
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    # A SIGTERM (timeout(1), a CI cancel) unwinds through the finally that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = asyncio.run(_main(args))
    print(json.dumps(result, indent=2))
    if not args.no_save:
        out = REPO / "bench" / "results" / f"edge-serving-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
