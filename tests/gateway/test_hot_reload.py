"""Hot reload (issue 13): the models file rewritten under live traffic, through a real
``switchyard serve``.

Weights go from 100/0 to 0/100 while 20 streams run on the old target: no stream fails and
each finishes on the backend it started on, and requests started 2 s after the write (the
watcher checks every 0.5 s) all go to the new target. An invalid file (an alias naming an
unknown backend) changes nothing: traffic goes where it went, the server log names the error
and ``POST /admin/models/reload`` answers 400 with it. With the watcher off, ``POST
/admin/models/reload`` (200) and SIGHUP reload the file.

The file is always replaced atomically (write a temporary file, rename it over), as a deploy
tool does.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ServerHandle, create_key
from tests.gateway.traffic import (
    Answer,
    gateway_config,
    langgraph_stream,
    langgraph_wait,
    new_thread,
    openai_complete,
    openai_stream,
    run_metadata,
    running_backends,
    running_server,
    server_text,
    splice_problem,
    targets,
    write_models,
)
from tests.promql import wait_for
from tests.scripted import ScriptedBackend, error_log_lines, failed_requests

pytestmark = pytest.mark.e2e

DELAY_MS = 40
LONG = 150
"""Tokens per stream: 6 s at 40 ms a token, so every stream spans the write and the 2 s after."""
OPENAI_STREAMS = 14
LANGGRAPH_STREAMS = 6
SETTLE_S = 2.0
"""Requests started this long after the write must all see the new file."""
UNKNOWN = "no-such-backend"
OLD = {"main": {"targets": targets(a=100, b=0)}}
NEW = {"main": {"targets": targets(a=0, b=100)}}
ONLY_B = {"main": {"targets": targets(b=100)}}
"""The new file drops backend ``a`` altogether: the streams on it must still finish there."""
INVALID = {"main": {"targets": [{"backend": UNKNOWN, "weight": 100}]}}


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[dict[str, ScriptedBackend]]:
    with running_backends(tmp_path, ("a", "b"), delay_ms=DELAY_MS, tokens=LONG) as running:
        yield running


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, connect=5), limits=httpx.Limits(max_connections=100))


def _bad(answers: list[Answer]) -> str:
    return "\n  ".join(str(a) for a in answers[:10])


async def _short_mix(client: httpx.AsyncClient, n: int = 10) -> list[Answer]:
    """``n`` short requests at once over both APIs (OpenAI whole and streamed, LangGraph runs)."""
    threads = [await new_thread(client) for _ in range(n // 5)]
    return list(await asyncio.gather(
        *(openai_complete(client, "main", max_tokens=2) for _ in range(n - 2 * (n // 5))),
        *(openai_stream(client, "main", max_tokens=2) for _ in range(n // 5)),
        *(langgraph_wait(client, tid, "chat", max_tokens=2) for tid in threads),
    ))


def _all_on(answers: list[Answer], backend: str) -> str | None:
    wrong = [a for a in answers if not a.ok or a.backend != backend or a.tokens != [" lorem", " ipsum"]]
    return f"{len(wrong)} of {len(answers)} not answered whole by {backend}:\n  {_bad(wrong)}" if wrong else None


async def _reload(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/admin/models/reload")


def _no_server_errors(server: ServerHandle) -> None:
    assert failed_requests(server.data_dir / "audit" / "audit.jsonl") == []
    crashes = [line for line in error_log_lines(server.log_file) if "Exception in ASGI" in line]
    assert crashes == [], "\n".join(crashes)


@pytest.mark.parametrize("change", ["weights", "a-removed"])
async def test_weights_flip_under_load(tmp_path: Path, backends: dict[str, ScriptedBackend], change: str) -> None:
    models = write_models(tmp_path / "models.yaml", backends, OLD)
    with running_server(tmp_path, gateway_config(models, {"chat": "main"}, reload_check_s=0.5)) as server:
        async with _client(server.url) as client:
            progress: dict[int, int] = {}

            def counter(i: int) -> Callable[[int], None]:
                return lambda n: progress.__setitem__(i, n)

            threads = [await new_thread(client) for _ in range(LANGGRAPH_STREAMS)]
            streams = [asyncio.ensure_future(openai_stream(client, "main", max_tokens=LONG, on_token=counter(i)))
                       for i in range(OPENAI_STREAMS)]
            streams += [asyncio.ensure_future(langgraph_stream(client, tid, "chat", max_tokens=LONG,
                                                               on_token=counter(OPENAI_STREAMS + i)))
                        for i, tid in enumerate(threads)]
            deadline = time.monotonic() + 30
            while (sum(n >= 3 for n in progress.values()) < len(streams) and not any(s.done() for s in streams)
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.02)
            early = [s.result() for s in streams if s.done()]
            assert early == [] and len(progress) == len(streams), (
                f"only {len(progress)} of {len(streams)} streams produced tokens within 30 s; ended:\n  {_bad(early)}")

            if change == "weights":
                write_models(models, backends, NEW)
            else:
                write_models(models, {"b": backends["b"]}, ONLY_B)
            written_at = time.monotonic()
            await asyncio.sleep(SETTLE_S)
            assert not any(s.done() for s in streams), "a stream ended before the 2 s after the write were over"
            after = await _short_mix(client, 20)
            try:
                async with asyncio.timeout(60):
                    finished: list[Answer] = await asyncio.gather(*streams)
            except TimeoutError:
                pytest.fail("the streams did not end within 60 s (hung)")
            metadata = [(await run_metadata(client, a.thread_id, a.run_id)).get("switchyard_backend")
                        for a in finished if a.kind == "langgraph-stream" and a.thread_id and a.run_id]
            print(f"\n[reload] streams across the write: {Counter((a.kind, a.backend, a.ok) for a in finished)}, "
                  f"last ended {time.monotonic() - written_at:.1f} s after the write; "
                  f"requests {SETTLE_S:.0f} s after it: {Counter(a.backend for a in after)}")

            # No stream failed; each ended whole on the backend it started on.
            failed = [a for a in finished if not a.ok or a.backend != "a" or len(a.tokens) != LONG
                      or splice_problem(a.tokens) or a.finish_reason != "length"]
            assert failed == [], f"{len(failed)} of {len(finished)} streams across the reload failed:\n  " + _bad(failed)
            assert metadata == ["a"] * LANGGRAPH_STREAMS, f"the streamed runs' metadata.switchyard_backend: {metadata}"
            # Requests started 2 s after the write: all on the new target.
            problem = _all_on(after, "b")
            assert problem is None, problem

            # An invalid file changes nothing; the log names the error; POST says it too.
            write_models(models, backends, INVALID)
            logged = wait_for(lambda: UNKNOWN in server_text(server), 10)
            await asyncio.sleep(SETTLE_S)
            still = await _short_mix(client)
            refused = await _reload(client)
            print(f"[reload] invalid file: POST -> {refused.status_code} {refused.text[:300]}")
            assert logged, f"the server log does not name {UNKNOWN!r} 10 s after the invalid file was written"
            problem = _all_on(still, "b")
            assert problem is None, "after an invalid file: " + problem
            assert refused.status_code == 400, (refused.status_code, refused.text)
            detail = refused.json().get("detail")
            assert isinstance(detail, str) and UNKNOWN in detail, refused.text
            problem = _all_on(await _short_mix(client), "b")
            assert problem is None, "after a refused POST /admin/models/reload: " + problem
            assert server.process.poll() is None
        _no_server_errors(server)


async def test_reload_by_post_and_sighup(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """The watcher is off (it would check once an hour): only ``POST /admin/models/reload``
    and SIGHUP read the file. A POST answers once the new registry is in place, so the next
    request already follows it."""
    models = write_models(tmp_path / "models.yaml", backends, OLD)
    with running_server(tmp_path, gateway_config(models, {"chat": "main"}, reload_check_s=3600)) as server:
        async with _client(server.url) as client:
            problem = _all_on(await _short_mix(client), "a")
            assert problem is None, problem

            write_models(models, backends, NEW)
            await asyncio.sleep(SETTLE_S)
            problem = _all_on(await _short_mix(client), "a")
            assert problem is None, "the file was read without a reload being asked for: " + problem
            reloaded = await _reload(client)
            print(f"\n[reload] POST -> {reloaded.status_code} {reloaded.text[:300]}")
            assert reloaded.status_code == 200, (reloaded.status_code, reloaded.text)
            body: dict[str, Any] = reloaded.json()
            assert body.get("reloaded") is True and "main" in (body.get("aliases") or {}), body
            problem = _all_on(await _short_mix(client), "b")
            assert problem is None, "right after a 200 from POST /admin/models/reload: " + problem

            write_models(models, backends, OLD)
            signalled_at = time.monotonic()
            server.process.send_signal(signal.SIGHUP)
            moved: list[Answer] = []
            for _ in range(50):  # 10 s
                moved.append(await openai_complete(client, "main", max_tokens=2))
                if moved[-1].backend == "a" or not moved[-1].ok:
                    break
                await asyncio.sleep(0.2)
            print(f"[reload] SIGHUP: back on a after {time.monotonic() - signalled_at:.1f} s, {len(moved)} requests")
            assert server.process.poll() is None, f"SIGHUP ended the server (exit {server.process.returncode})"
            assert all(a.ok for a in moved), _bad([a for a in moved if not a.ok])
            assert moved[-1].backend == "a", f"10 s after SIGHUP, requests still go to {moved[-1].backend}"
            problem = _all_on(await _short_mix(client), "a")
            assert problem is None, "after SIGHUP: " + problem

            # An invalid file, by SIGHUP then by POST: refused, nothing changes.
            write_models(models, backends, INVALID)
            server.process.send_signal(signal.SIGHUP)
            logged = wait_for(lambda: UNKNOWN in server_text(server), 10)
            assert server.process.poll() is None, f"SIGHUP with an invalid file ended the server (exit {server.process.returncode})"
            assert logged, f"the server log does not name {UNKNOWN!r} 10 s after SIGHUP with an invalid file"
            refused = await _reload(client)
            assert refused.status_code == 400 and UNKNOWN in str(refused.json().get("detail")), (refused.status_code, refused.text)
            problem = _all_on(await _short_mix(client), "a")
            assert problem is None, "after an invalid file: " + problem

            # Other broken files: refused with a 400 naming the problem, nothing changes.
            broken = {
                "yaml-syntax": "aliases: [main\n",
                "negative-weight": None,
                "empty": "",
            }
            for name, text in broken.items():
                if text is None:
                    write_models(models, backends, {"main": {"targets": targets(a=100, b=-1)}})
                else:
                    scratch = models.with_name("scratch.yaml")
                    scratch.write_text(text)
                    scratch.replace(models)
                answer = await _reload(client)
                print(f"[reload] {name}: POST -> {answer.status_code} {answer.text[:200]}")
                assert answer.status_code == 400, (name, answer.status_code, answer.text)
                assert isinstance(answer.json().get("detail"), str) and answer.json()["detail"], (name, answer.text)
            models.unlink()
            answer = await _reload(client)
            print(f"[reload] file removed: POST -> {answer.status_code} {answer.text[:200]}")
            assert answer.status_code == 400 and str(models) in str(answer.json().get("detail")), answer.text
            problem = _all_on(await _short_mix(client), "a")
            assert problem is None, "after the broken files: " + problem
            assert server.process.poll() is None
        _no_server_errors(server)


async def test_admin_routes_need_an_admin_tenant(tmp_path: Path, backends: dict[str, ScriptedBackend]) -> None:
    """With keys (no ``--dev``): no key is 401, a tenant without ``admin: true`` is 403 and
    the registry stays; an admin tenant's reload is 200."""
    models = write_models(tmp_path / "models.yaml", backends, OLD)
    roomy = {"graphs": ["*"], "models": ["*"], "limits": {"requests_per_s": 1000, "burst": 1000, "max_concurrent_runs": 50}}
    tenants = {"ops": {**roomy, "admin": True}, "acme": roomy}
    config = {**gateway_config(models, {"chat": "main"}, reload_check_s=3600), "auth": {"tenants": tenants}}
    config_file = tmp_path / "switchyard.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **config}))
    keys = {tenant: create_key(config_file, tenant) for tenant in tenants}
    with running_server(tmp_path, config, dev=False) as server:
        write_models(models, backends, NEW)
        async with _client(server.url) as anonymous:
            assert (await _reload(anonymous)).status_code == 401
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers={"x-api-key": keys["acme"]}) as acme:
            denied = await _reload(acme)
            assert denied.status_code == 403 and isinstance(denied.json().get("detail"), str), (denied.status_code, denied.text)
            assert (await acme.get("/admin/models")).status_code == 403
            problem = _all_on(await _short_mix(acme), "a")
            assert problem is None, "after a refused reload by a tenant that is not admin: " + problem
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers={"x-api-key": keys["ops"]}) as ops:
            assert (await ops.get("/admin/models")).status_code == 200
            allowed = await _reload(ops)
            assert allowed.status_code == 200 and allowed.json().get("reloaded") is True, (allowed.status_code, allowed.text)
            problem = _all_on(await _short_mix(ops), "b")
            assert problem is None, "after an admin's reload: " + problem
        _no_server_errors(server)
