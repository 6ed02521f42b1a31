"""Tenants, API keys and limits on a server started without --dev: keys from
``switchyard keys create``, 401 without a valid key, 403 for a graph the tenant may not
use, 404 for another tenant's thread, 429 past a key's rate or concurrency limit or the
server's, 413 for an oversized body."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError, NotFoundError, PermissionDeniedError

from gateway import Backend
from tests.conftest import REPO, ServerHandle, create_key, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

TENANTS = {
    "acme": {"graphs": ["chat"], "models": [], "blocked_terms": ["secret"]},
    "globex": {"graphs": ["*"], "models": ["*"]},
    "tiny": {"limits": {"requests_per_s": 0.5, "burst": 3, "max_concurrent_runs": 1}},
}
LONG = {"model": "chat", "max_tokens": 400, "stream": True,
        "messages": [{"role": "user", "content": "Continue this list forever: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}]}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, local_backend: Backend) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("auth")
    settings = {
        "data_dir": str(tmp / "data"),
        "gateway": {"models_file": str(REPO / "config/models.yaml")},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph"},
            "chat-too": {"path": "graphs.chat:make_graph"},
        },
        "auth": {"tenants": TENANTS},
        "server": {"max_concurrent_runs": 2, "max_body_bytes": 65536},
        "guardrails": {"blocked_terms": ["project nightjar"]},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump(settings))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    stored = (tmp / "data" / "keys.yaml").read_text()
    assert all(key not in stored for key in keys.values())  # only hashes are kept
    handle = start_server(tmp, {k: v for k, v in settings.items() if k != "data_dir"}, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


def test_missing_or_wrong_key_is_401_except_health(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/readyz").status_code == 200
    for path in ("/v1/models", "/metrics", "/info"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers={"Authorization": "Bearer sy-wrong"}).status_code == 401
    denied = httpx.post(server.url + "/threads/search", json={})
    assert denied.status_code == 401 and "API key" in denied.json()["detail"]
    ok = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {keys['globex']}"})
    assert ok.status_code == 200
    assert httpx.get(server.url + "/metrics", headers={"x-api-key": keys["globex"]}).status_code == 200


def test_tenants_see_only_what_they_may_use(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    acme = {"Authorization": f"Bearer {keys['acme']}"}
    models = httpx.get(server.url + "/v1/models", headers=acme).json()["data"]
    assert [m["id"] for m in models] == ["chat"]
    body = {"model": "chat-too", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    forbidden = httpx.post(server.url + "/v1/chat/completions", json=body, headers=acme)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "invalid_request_error"
    alias = httpx.post(server.url + "/v1/chat/completions", json={**body, "model": "chat-default"}, headers=acme)
    assert alias.status_code == 403
    allowed = httpx.post(server.url + "/v1/chat/completions", json={**body, "model": "chat"}, headers=acme)
    assert allowed.status_code == 200


async def test_another_tenants_thread_is_404(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    acme = get_client(url=server.url, api_key=keys["acme"])
    globex = get_client(url=server.url, api_key=keys["globex"])
    assert [a["graph_id"] for a in await acme.assistants.search()] == ["chat"]
    with pytest.raises(PermissionDeniedError):
        await acme.assistants.get("chat-too")
    thread = await acme.threads.create(metadata={"owner": "acme"})
    tid = thread["thread_id"]
    await acme.runs.wait(tid, "chat", input={"messages": [{"role": "user", "content": "hi"}]},
                         context={"model_params": {"max_tokens": 8}})
    assert (await acme.threads.get(tid))["status"] == "idle"
    with pytest.raises(NotFoundError):
        await globex.threads.get(tid)
    with pytest.raises(NotFoundError):
        await globex.threads.get_state(tid)
    assert tid not in [t["thread_id"] for t in await globex.threads.search(limit=100)]
    with pytest.raises(httpx.HTTPStatusError) as run:
        await globex.runs.wait(tid, "chat", input={"messages": [{"role": "user", "content": "hi"}]})
    assert run.value.response.status_code == 404
    with pytest.raises(ConflictError, match="already exists$"):  # taken, by someone: no owner revealed
        await globex.threads.create(thread_id=tid, if_exists="do_nothing")
    for client in (acme, globex):
        await client.http.client.aclose()


def test_a_key_created_while_the_server_runs_works_at_once(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, _ = secured
    fresh = create_key(server.config, "globex")
    response = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {fresh}"})
    assert response.status_code == 200


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_oversized_bodies_are_413(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    big = {"model": "chat", "messages": [{"role": "user", "content": "x" * 70_000}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=big, headers=_bearer(keys["globex"]))
    assert response.status_code == 413 and "65536" in response.json()["error"]["message"]
    assert response.json()["error"]["code"] == "request_too_large"  # the OpenAI shape on /v1
    assert response.headers["x-request-id"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "chat", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 8192
        yield b'"}]}'

    chunked = httpx.post(server.url + "/v1/chat/completions", content=chunks(),
                         headers={**_bearer(keys["globex"]), "content-type": "application/json"})
    assert chunked.status_code == 413
    metrics = httpx.get(server.url + "/metrics", headers=_bearer(keys["globex"])).text
    assert re.search(r'^switchyard_rejections_total\{reason="body_size"\} 2\.0$', metrics, re.MULTILINE)


def test_a_key_over_its_rate_gets_429_while_others_are_served(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    tiny = create_key(server.config, "tiny")
    statuses = [httpx.get(server.url + "/v1/models", headers=_bearer(tiny)) for _ in range(6)]
    assert [r.status_code for r in statuses[:3]] == [200, 200, 200]  # the burst
    limited = [r for r in statuses[3:] if r.status_code == 429]
    assert limited, [r.status_code for r in statuses]
    assert int(limited[0].headers["Retry-After"]) >= 1
    assert limited[0].json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(server.url + "/v1/models", headers=_bearer(keys["globex"])).status_code == 200
    metrics = httpx.get(server.url + "/metrics", headers=_bearer(keys["globex"])).text
    assert re.search(r'^switchyard_rejections_total\{reason="rate"\} [1-9]', metrics, re.MULTILINE)


def test_concurrent_runs_are_capped_per_key_and_per_server(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured
    tiny = create_key(server.config, "tiny")
    url = server.url + "/v1/chat/completions"
    with httpx.Client(timeout=60) as first, httpx.Client(timeout=60) as second:
        with first.stream("POST", url, json=LONG, headers=_bearer(tiny)) as held:
            assert held.status_code == 200
            held_lines = held.iter_lines()  # kept: dropping the iterator would close the stream
            next(held_lines)
            again = httpx.post(url, json=LONG, headers=_bearer(tiny))
            assert again.status_code == 429 and "concurrent runs" in again.json()["error"]["message"]
            with second.stream("POST", url, json=LONG, headers=_bearer(keys["globex"])) as other:
                assert other.status_code == 200  # another key is not held back by tiny's cap
                other_lines = other.iter_lines()
                next(other_lines)
                full = httpx.post(url, json=LONG, headers=_bearer(keys["globex"]))
                assert full.status_code == 429 and "server is at its limit of 2" in full.json()["error"]["message"]
    # Both streams closed: their slots are free again.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        answer = httpx.post(url, json={**LONG, "stream": False, "max_tokens": 4}, headers=_bearer(keys["globex"]), timeout=60)
        if answer.status_code == 200:
            break
        time.sleep(0.2)
    assert answer.status_code == 200, answer.text


def test_the_input_filter_refuses_blocked_terms_with_the_reason(secured: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = secured

    def ask(key: str, text: str) -> httpx.Response:
        body = {"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
        return httpx.post(server.url + "/v1/chat/completions", json=body, headers=_bearer(key), timeout=60)

    refused = ask(keys["acme"], "Tell me the SECRET plan")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "content_blocked" and "'SECRET'" in error["message"] and "tenant 'acme'" in error["message"]
    assert ask(keys["acme"], "Call my secretary").status_code == 200  # whole words only
    assert ask(keys["globex"], "Tell me the secret plan").status_code == 200  # acme's list is acme's
    for key in keys.values():
        blocked = ask(key, "What is Project  Nightjar?".replace("  ", " "))
        assert blocked.status_code == 400 and "global list" in blocked.json()["error"]["message"]
    thread = httpx.post(server.url + "/threads", json={}, headers=_bearer(keys["acme"])).json()
    run = httpx.post(
        server.url + f"/threads/{thread['thread_id']}/runs/wait",
        json={"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "the secret"}]}},
        headers=_bearer(keys["acme"]),
    )
    assert run.status_code == 400 and "blocked term" in run.json()["detail"]
