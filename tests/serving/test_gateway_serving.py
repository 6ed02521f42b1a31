"""How the serving layer exposes the model gateway (issue 13), on real ``switchyard serve``
processes.

Two scripted backends (``bench/scripted_backend.py`` processes, ids ``sa`` and ``sb``) serve
the alias ``pair`` 50/50; which one a request lands on follows from its sticky key (the
``x-request-id`` we send, or the thread id), so each test knows the backend to expect and
checks that the answer names it: the ``x-switchyard-backend`` header on both APIs, the run's
metadata and the ``switchyard_runs_total`` counter. Failures before the first token come
from a port nothing listens on, the FAKE backend's ``fake-500`` (tests/fakes) and a real
400 from llama-server (a prompt past its slot's context, which the registry is told is far
larger). ``model: "auto"``, the admin routes, CORS and ``/readyz`` run on the same kind of
server, the admin routes with keys on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from langgraph_sdk import get_client

from gateway import Backend
from gateway.balancer import attempt_order
from gateway.registry import Alias, AliasTarget
from tests.conftest import ServerHandle, create_key, start_server, stop_server
from tests.fakes import openai_backend
from tests.fakes.openai_backend import free_port
from tests.promql import sample
from tests.scripted import ScriptedBackend, failed_requests, start_scripted_backend

pytestmark = [pytest.mark.e2e, pytest.mark.llm]

BACKEND = "x-switchyard-backend"
ROUTE = "x-switchyard-route"
ALLOWED_ORIGIN = "https://ui.example.com"
WORDS = [" lorem", " ipsum", " dolor", " sit"]
"""What a scripted backend answers to ``max_tokens: 4``."""
PAIR = Alias(name="pair", targets=(AliasTarget(backend="sa", weight=50), AliasTarget(backend="sb", weight=50)))
RETRY_WEIGHTED = Alias(
    name="dead-or-b", targets=(AliasTarget(backend="dead", weight=50), AliasTarget(backend="sb", weight=50))
)
WEATHER = "What will the weather be like in Paris tomorrow?"


def _first(alias: Alias, key: str) -> str:
    """The backend the gateway tries first for ``key`` (the product's own choice)."""
    return attempt_order(alias, key)[0]


def _key_for(alias: Alias, backend: str, prefix: str) -> str:
    """A sticky key (request or thread id) whose first choice is ``backend``."""
    for n in range(1000):
        key = f"{prefix}-{n}"
        if _first(alias, key) == backend:
            return key
    raise AssertionError(f"no key picks {backend}")


def _scripted(backend: ScriptedBackend, *, tools: bool = False, window: int = 4096) -> dict[str, Any]:
    return {
        "kind": "vllm",
        "base_url": backend.base_url,
        "model": "scripted",
        "timeouts": {"connect_s": 2, "read_s": 10},
        "capabilities": {"context_window": window, "tools": tools, "json_schema": False},
    }


def _fake(url: str, served: str, window: int = 4096) -> dict[str, Any]:
    return {
        "kind": "vllm",
        "base_url": url,
        "model": served,
        "timeouts": {"connect_s": 2, "read_s": 10},
        "capabilities": {"context_window": window, "tools": True, "json_schema": True},
    }


def _dead() -> dict[str, Any]:
    return {**_fake(f"http://127.0.0.1:{free_port()}/v1", "nothing"), "timeouts": {"connect_s": 1, "read_s": 2}}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ScriptedBackend]]:
    tmp = tmp_path_factory.mktemp("gw-scripted")
    running: dict[str, ScriptedBackend] = {}
    try:
        for name in ("sa", "sb"):
            running[name] = start_scripted_backend(tmp, delay_ms=1, tokens=8)
        yield running
    finally:
        for backend in running.values():
            backend.stop()


def _main_models(path: Path, scripted: dict[str, ScriptedBackend], fake_url: str, local: Backend) -> Path:
    backends = {
        "sa": _scripted(scripted["sa"], tools=False),
        "sb": _scripted(scripted["sb"], tools=True),
        "dead": _dead(),
        "f500": _fake(fake_url, "fake-500"),
        "tiny-a": _fake(fake_url, "gw-tiny", window=64),
        "tiny-b": _fake(fake_url, "gw-tiny", window=64),
        # The real llama-server, declared with a context window far past its slot's
        # (8192 KV tokens over 4 slots): a long prompt passes our check and the backend
        # itself answers 400.
        "big-local": {
            "kind": "llamacpp",
            "base_url": local.base_url,
            "model": local.model,
            "timeouts": {"connect_s": 5, "read_s": 60},
            "default_max_tokens": 8,
            "capabilities": {"context_window": 100_000, "tools": True, "json_schema": True},
        },
    }
    aliases = {
        "pair": {"targets": [{"backend": "sa", "weight": 50}, {"backend": "sb", "weight": 50}]},
        "only-a": "sa",
        "only-b": "sb",
        "dead-only": "dead",
        "dead-then-b": {"targets": [{"backend": "dead", "weight": 1}], "fallbacks": ["sb"]},
        "dead-or-b": {"targets": [{"backend": "dead", "weight": 50}, {"backend": "sb", "weight": 50}]},
        "f500-then-b": {"targets": [{"backend": "f500", "weight": 1}], "fallbacks": ["sb"]},
        "local-then-b": {"targets": [{"backend": "big-local", "weight": 1}], "fallbacks": ["sb"]},
        "small": {"targets": [{"backend": "tiny-a", "weight": 1}, {"backend": "tiny-b", "weight": 1}]},
    }
    # Breakers stay closed through the module: every request really tries the failing one.
    path.write_text(yaml.safe_dump({"breaker": {"failures": 1000, "cooldown_s": 1}, "backends": backends, "aliases": aliases}))
    return path


ROUTING = {
    "default": "plain",
    "routes": {
        "plain": {"graph": "chat-a", "task_types": ["plain-task"], "description": "the graph's own alias"},
        "special": {
            "graph": "chat-a",
            "alias": "only-b",
            "task_types": ["special-task"],
            "examples": [WEATHER, "Is it going to rain in Berlin this weekend?"],
        },
    },
}


@pytest.fixture(scope="module")
def main(
    tmp_path_factory: pytest.TempPathFactory,
    scripted: dict[str, ScriptedBackend],
    fake_backend_url: str,
    local_backend: Backend,
) -> Iterator[ServerHandle]:
    """--dev; graphs over ``pair`` (chat), ``only-a`` (chat-a) and ``small`` (chat-small);
    routes ``plain`` (chat-a as is) and ``special`` (chat-a on ``only-b``)."""
    tmp = tmp_path_factory.mktemp("gw-main")
    models = _main_models(tmp / "models.yaml", scripted, fake_backend_url, local_backend)
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models), "reload_check_s": 3600},
            "graphs": {
                "chat": {"path": "graphs.chat:make_graph", "model": "pair"},
                "chat-a": {"path": "graphs.chat:make_graph", "model": "only-a"},
                "chat-small": {"path": "graphs.chat:make_graph", "model": "small"},
                "chat-f500": {"path": "graphs.chat:make_graph", "model": "f500-then-b"},
                "chat-dead": {"path": "graphs.chat:make_graph", "model": "dead-then-b"},
                "chat-local": {"path": "graphs.chat:make_graph", "model": "local-then-b"},
            },
            "routing": ROUTING,
        },
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def _chat(model: str, text: str = "hello", *, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}


def _openai(url: str, body: dict[str, Any], request_id: str | None = None, headers: dict[str, str] | None = None) -> tuple[httpx.Response, str]:
    """POST /v1/chat/completions; for a stream, the text of its content deltas (the
    stream read to its end)."""
    sent = {**({"x-request-id": request_id} if request_id else {}), **(headers or {})}
    if not body.get("stream"):
        response = httpx.post(url + "/v1/chat/completions", json=body, headers=sent, timeout=60)
        text = ""
        if response.status_code == 200:
            text = response.json()["choices"][0]["message"]["content"] or ""
        return response, text
    parts: list[str] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=sent, timeout=60) as response:
        if response.status_code != 200:
            response.read()
            return response, ""
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return response, "".join(parts)


def _lg_body(assistant: str, text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "assistant_id": assistant,
        "input": {"messages": [{"role": "user", "content": text}]},
        "context": {"model_params": {"max_tokens": 4}},
        **extra,
    }


def _lg_stream(url: str, path: str, body: dict[str, Any], request_id: str | None = None) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    """POST a LangGraph ``.../runs/stream``; its events, parsed by hand."""
    events: list[tuple[str, Any]] = []
    headers = {"x-request-id": request_id} if request_id else {}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=60) as response:
        if response.status_code != 200:
            response.read()
            return response, events
        name, data = "message", []
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                events.append((name, json.loads("\n".join(data))))
                name, data = "message", []
    return response, events


def _new_thread(url: str, thread_id: str) -> str:
    response = httpx.post(url + "/threads", json={"thread_id": thread_id}, timeout=10)
    assert response.status_code == 200, response.text
    return str(response.json()["thread_id"])


def _metrics(url: str, headers: dict[str, str] | None = None) -> str:
    response = httpx.get(url + "/metrics", headers=headers or {}, timeout=10)
    assert response.status_code == 200
    return response.text


def _ai_text(values: dict[str, Any]) -> str:
    last = values["messages"][-1]
    assert last["type"] == "ai", values
    return str(last["content"])


# ---- 1. who served it -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", ["pair", "chat"], ids=["alias-relay", "graph-run"])
def test_openai_answers_name_the_backend(main: ServerHandle, model: str, stream: bool) -> None:
    """Both backends of ``pair``, each picked by its request id: the header names the
    one the gateway chose, and the answer is that backend's tokens."""
    for expected in ("sa", "sb"):
        request_id = _key_for(PAIR, expected, f"oa-{model}-{stream}")
        response, text = _openai(main.url, _chat(model, stream=stream), request_id)
        assert response.status_code == 200, response.text
        assert response.headers.get(BACKEND) == expected, (request_id, dict(response.headers))
        assert ROUTE not in response.headers  # no route chose it
        assert text.split() == [w.strip() for w in WORDS]


def test_langgraph_thread_runs_name_the_backend_in_header_and_metadata(main: ServerHandle) -> None:
    """Thread runs are sticky on the thread id: stream and wait on a thread of each backend;
    the run's metadata says the same as the header."""
    for expected in ("sa", "sb"):
        thread_id = _new_thread(main.url, _uuid_for(expected))
        response, events = _lg_stream(main.url, f"/threads/{thread_id}/runs/stream", _lg_body("chat", stream_mode=["values"]))
        assert response.status_code == 200, response.text
        assert response.headers.get(BACKEND) == expected
        assert [name for name, _ in events][0] == "metadata"
        assert "error" not in [name for name, _ in events], events
        run_id = response.headers["content-location"].rsplit("/", 1)[-1]
        run = httpx.get(main.url + f"/threads/{thread_id}/runs/{run_id}", timeout=10).json()
        assert run["metadata"].get("switchyard_backend") == expected, run

        # A run the server keeps going if the client leaves: the same header.
        resumable, events = _lg_stream(
            main.url, f"/threads/{thread_id}/runs/stream", _lg_body("chat", stream_mode=["values"], stream_resumable=True)
        )
        assert resumable.status_code == 200 and resumable.headers.get(BACKEND) == expected, resumable.text
        assert "error" not in [name for name, _ in events], events

        waited = httpx.post(main.url + f"/threads/{thread_id}/runs/wait", json=_lg_body("chat"), timeout=60)
        assert waited.status_code == 200, waited.text
        assert waited.headers.get(BACKEND) == expected
        assert _ai_text(waited.json()).split() == [w.strip() for w in WORDS]
        wait_run_id = waited.headers["content-location"].rsplit("/", 1)[-1]
        assert wait_run_id != run_id


async def test_sdk_reads_the_backend_from_the_run(main: ServerHandle) -> None:
    """The same metadata through the real langgraph_sdk client."""
    thread_id = _new_thread(main.url, _uuid_for("sb"))
    client = get_client(url=main.url)
    result = await client.runs.wait(thread_id, "chat", input=_lg_body("chat")["input"], context={"model_params": {"max_tokens": 4}})
    assert isinstance(result, dict) and "__error__" not in result, result
    runs = await client.runs.list(thread_id)
    assert [r["metadata"].get("switchyard_backend") for r in runs] == ["sb"]


def _uuid_for(backend: str) -> str:
    """A new thread id (a UUID, as the API wants) whose sticky choice on ``pair`` is ``backend``."""
    while True:
        candidate = str(uuid.uuid4())
        if _first(PAIR, candidate) == backend:
            return candidate


def test_stateless_runs_name_the_backend(main: ServerHandle) -> None:
    """``/runs/stream`` and ``/runs/wait`` have no kept thread: sticky on the request id."""
    for expected in ("sa", "sb"):
        request_id = _key_for(PAIR, expected, "stateless")
        response, events = _lg_stream(main.url, "/runs/stream", _lg_body("chat", stream_mode=["values"]), request_id)
        assert response.status_code == 200, response.text
        assert response.headers.get(BACKEND) == expected
        assert events and "error" not in [name for name, _ in events], events
        waited = httpx.post(main.url + "/runs/wait", json=_lg_body("chat"), headers={"x-request-id": request_id}, timeout=60)
        assert waited.status_code == 200, waited.text
        assert waited.headers.get(BACKEND) == expected
        assert _ai_text(waited.json()).split() == [w.strip() for w in WORDS]


def test_runs_total_is_labelled_by_backend(main: ServerHandle) -> None:
    before = _metrics(main.url)
    counts = {"sa": 0, "sb": 0}
    for expected in ("sa", "sb", "sb"):
        request_id = _key_for(PAIR, expected, f"metric-{counts[expected]}")
        counts[expected] += 1
        response, _ = _openai(main.url, _chat("pair", stream=True), request_id)  # time to first token: streams
        assert response.headers.get(BACKEND) == expected
        response, _ = _openai(main.url, _chat("chat"), request_id)
        assert response.headers.get(BACKEND) == expected
        response = httpx.post(main.url + "/runs/wait", json=_lg_body("chat"), headers={"x-request-id": request_id}, timeout=60)
        assert response.headers.get(BACKEND) == expected
    after = _metrics(main.url)
    for backend, count in counts.items():
        labels = {"kind": "alias", "backend": backend}
        name = "switchyard_time_to_first_token_seconds_count"
        assert sample(after, name, **labels) - sample(before, name, **labels) == count, labels
        for kind, target in (("alias", "pair"), ("graph", "chat"), ("langgraph", "chat")):
            labels = {"kind": kind, "target": target, "outcome": "ok", "backend": backend}
            grown = sample(after, "switchyard_runs_total", **labels) - sample(before, "switchyard_runs_total", **labels)
            assert grown == count, (labels, grown)


# ---- 2. retry before the first token ----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("alias", ["dead-then-b", "dead-or-b", "f500-then-b"])
def test_failure_before_first_token_is_passed_over(main: ServerHandle, alias: str, stream: bool) -> None:
    """A refused connection (as the only target, or as the weighted pick) and a 500 are
    retried on ``sb``: the client gets a 200 from ``sb``, and the retry is counted."""
    failing = "f500" if alias.startswith("f500") else "dead"
    request_id = _key_for(RETRY_WEIGHTED, "dead", f"retry-{stream}") if alias == "dead-or-b" else None
    before = _metrics(main.url)
    response, text = _openai(main.url, _chat(alias, stream=stream), request_id)
    assert response.status_code == 200, response.text
    assert response.headers.get(BACKEND) == "sb"
    assert text.split() == [w.strip() for w in WORDS]
    after = _metrics(main.url)
    labels = {"alias": alias, "backend": failing}
    assert sample(after, "switchyard_gateway_retries_total", **labels) - sample(
        before, "switchyard_gateway_retries_total", **labels) == 1
    assert failed_requests(main.data_dir / "audit" / "audit.jsonl") == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_no_backend_left_is_503_not_a_200(main: ServerHandle, stream: bool) -> None:
    """Nothing to pass over to: the client gets a JSON 503 naming what was tried, never a
    200 stream that then fails."""
    response, _ = _openai(main.url, _chat("dead-only", stream=stream))
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "backend_unavailable" and "dead" in error["message"], error


@pytest.mark.parametrize("graph", ["chat-dead", "chat-f500"])
def test_graph_runs_are_passed_over_too(main: ServerHandle, graph: str) -> None:
    """A graph's routed chat model retries like a relay: both APIs answer from ``sb``."""
    failing = "f500" if graph == "chat-f500" else "dead"
    alias = "f500-then-b" if graph == "chat-f500" else "dead-then-b"
    before = _metrics(main.url)
    for stream in (False, True):
        response, text = _openai(main.url, _chat(graph, stream=stream))
        assert response.status_code == 200 and response.headers.get(BACKEND) == "sb", response.text
        assert text.split() == [w.strip() for w in WORDS]
    waited = httpx.post(main.url + "/runs/wait", json=_lg_body(graph), timeout=60)
    assert waited.status_code == 200 and waited.headers.get(BACKEND) == "sb", waited.text
    assert _ai_text(waited.json()).split() == [w.strip() for w in WORDS]
    response, events = _lg_stream(main.url, "/runs/stream", _lg_body(graph, stream_mode=["values"]))
    assert response.status_code == 200 and response.headers.get(BACKEND) == "sb", response.text
    assert "error" not in [name for name, _ in events], events
    labels = {"alias": alias, "backend": failing}
    grown = sample(_metrics(main.url), "switchyard_gateway_retries_total", **labels) - sample(
        before, "switchyard_gateway_retries_total", **labels)
    assert grown == 4, grown


def test_graph_run_backend_400_is_not_retried(main: ServerHandle) -> None:
    """The graph's model call gets llama-server's 400: the run fails, ``sb`` never answers."""
    long_prompt = "one two three four five six seven eight nine ten " * 600
    before = _metrics(main.url)
    response, _ = _openai(main.url, _chat("chat-local", long_prompt))
    assert response.status_code == 400, response.text
    assert "big-local" in response.json()["error"]["message"], response.text
    waited = httpx.post(main.url + "/runs/wait", json=_lg_body("chat-local", long_prompt), timeout=60)
    assert waited.status_code == 200 and "__error__" in waited.json(), waited.text
    assert waited.headers.get(BACKEND) != "sb"
    labels = {"alias": "local-then-b"}
    assert sample(_metrics(main.url), "switchyard_gateway_retries_total", **labels) == sample(
        before, "switchyard_gateway_retries_total", **labels)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_backend_400_is_not_retried(main: ServerHandle, stream: bool) -> None:
    """llama-server refuses a prompt past its slot's context with a 400: that is the
    request's fault, not the backend's, so the client sees it (no answer from ``sb``)."""
    before = _metrics(main.url)
    long_prompt = "one two three four five six seven eight nine ten " * 600  # ~6,000 tokens, 30 KB
    response, _ = _openai(main.url, _chat("local-then-b", long_prompt, stream=stream))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_rejected", error
    assert "big-local" in error["message"] and "400" in error["message"], error  # the backend's own refusal
    assert response.headers.get(BACKEND) in (None, "big-local")
    after = _metrics(main.url)
    labels = {"alias": "local-then-b"}
    assert sample(after, "switchyard_gateway_retries_total", **labels) == sample(before, "switchyard_gateway_retries_total", **labels)


# ---- 3. capability filters --------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tools_go_only_to_the_backend_that_has_them(main: ServerHandle, stream: bool) -> None:
    """``sa`` declares no tools: a request with ``tools`` whose sticky pick is ``sa`` is
    served by ``sb``; without tools the same request id goes to ``sa``."""
    request_id = _key_for(PAIR, "sa", f"tools-{stream}")
    response, _ = _openai(main.url, _chat("pair", stream=stream, tools=TOOLS), request_id)
    assert response.status_code == 200, response.text
    assert response.headers.get(BACKEND) == "sb"
    plain, _ = _openai(main.url, _chat("pair", stream=stream), request_id)
    assert plain.headers.get(BACKEND) == "sa"
    refused, _ = _openai(main.url, _chat("only-a", stream=stream, tools=TOOLS))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "tools"
    # Neither scripted backend declares json_schema; the tiny ones do.
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    no_schema, _ = _openai(main.url, _chat("pair", stream=stream, response_format=schema))
    assert no_schema.status_code == 400 and no_schema.json()["error"]["param"] == "response_format", no_schema.text
    with_schema, _ = _openai(main.url, _chat("small", "hi", stream=stream, response_format=schema))
    assert with_schema.status_code == 200 and with_schema.headers.get(BACKEND) in ("tiny-a", "tiny-b"), with_schema.text


def _tiny_calls() -> int:
    return sum(1 for body in openai_backend.RECEIVED if body.get("model") == "gw-tiny")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_prompt_past_every_context_window_is_400_before_any_call(main: ServerHandle, stream: bool) -> None:
    calls = _tiny_calls()
    response, _ = _openai(main.url, _chat("small", "word " * 200, stream=stream))  # ~250 tokens by the estimate
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages", error
    assert "64" in error["message"] and "context window" in error["message"], error
    too_long, _ = _openai(main.url, _chat("small", "hi", max_tokens=100, stream=stream))
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["param"] == "max_tokens"
    assert "64" in too_long.json()["error"]["message"]
    # A graph on the same alias: refused the same way on both APIs.
    graph, _ = _openai(main.url, _chat("chat-small", "word " * 200, stream=stream))
    assert graph.status_code == 400 and graph.json()["error"]["param"] == "messages", graph.text
    lg_body = {**_lg_body("chat-small"), "context": {"model_params": {"max_tokens": 100}}}
    lg = httpx.post(main.url + "/runs/wait", json=lg_body, timeout=30)
    assert lg.status_code == 400 and "max_tokens" in lg.json()["detail"] and "64" in lg.json()["detail"], lg.text
    assert _tiny_calls() == calls, "a refused request reached the backend"
    # A prompt that fits is sent (the check is not refusing everything).
    fits, _ = _openai(main.url, _chat("small", "hi", stream=stream))
    assert fits.status_code == 200 and fits.headers.get(BACKEND) in ("tiny-a", "tiny-b"), fits.text
    assert _tiny_calls() == calls + 1


def test_langgraph_prompt_past_every_context_window_is_400(main: ServerHandle) -> None:
    calls = _tiny_calls()
    lg = httpx.post(main.url + "/runs/wait", json=_lg_body("chat-small", "word " * 200), timeout=30)
    assert _tiny_calls() == calls, "a refused request reached the backend"
    assert lg.status_code == 400, lg.text
    assert "messages" in lg.json()["detail"] and "64" in lg.json()["detail"], lg.text


# ---- 4. model "auto" -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_auto_names_the_route_and_its_alias_moves_the_run(main: ServerHandle, stream: bool) -> None:
    """``special`` runs ``chat-a`` on ``only-b`` (sb), ``plain`` on the graph's own ``only-a``
    (sa); the semantic router picks ``special`` for its own example, a task type wins."""
    semantic, text = _openai(main.url, _chat("auto", WEATHER, stream=stream))
    assert semantic.status_code == 200, semantic.text
    assert (semantic.headers.get(ROUTE), semantic.headers.get(BACKEND)) == ("special", "sb")
    assert text.split() == [w.strip() for w in WORDS]
    told, _ = _openai(main.url, _chat("auto", WEATHER, stream=stream, metadata={"task_type": "plain-task"}))
    assert told.status_code == 200, told.text
    assert (told.headers.get(ROUTE), told.headers.get(BACKEND)) == ("plain", "sa")
    by_name, _ = _openai(main.url, _chat("auto", "hello", stream=stream, metadata={"task_type": "special"}))
    assert (by_name.headers.get(ROUTE), by_name.headers.get(BACKEND)) == ("special", "sb")
    default, _ = _openai(main.url, _chat("auto", "", stream=stream))
    assert (default.headers.get(ROUTE), default.headers.get(BACKEND)) == ("plain", "sa"), default.text
    # The graph itself, asked for by name, is on its own alias and no route.
    direct, _ = _openai(main.url, _chat("chat-a", WEATHER, stream=stream))
    assert direct.headers.get(BACKEND) == "sa" and ROUTE not in direct.headers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_unknown_task_type_is_400_naming_it(main: ServerHandle, stream: bool) -> None:
    response, _ = _openai(main.url, _chat("auto", stream=stream, metadata={"task_type": "poetry"}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "metadata.task_type", error
    assert "poetry" in error["message"] and "plain-task" in error["message"], error


def test_models_list_auto_first_when_routes_exist(main: ServerHandle) -> None:
    ids = [m["id"] for m in httpx.get(main.url + "/v1/models", timeout=10).json()["data"]]
    assert ids[0] == "auto" and ids.count("auto") == 1, ids
    assert {"chat", "chat-a", "pair", "only-b"} <= set(ids)


def test_reload_may_not_drop_a_routes_alias(main: ServerHandle) -> None:
    """``only-b`` is called by no graph, only by the route ``special``: a registry without
    it is refused (--dev is an admin), and the route still runs on ``sb``."""
    models = Path(yaml.safe_load(main.config.read_text())["gateway"]["models_file"])
    good = models.read_text()
    try:
        data = yaml.safe_load(good)
        del data["aliases"]["only-b"]
        models.write_text(yaml.safe_dump(data))
        refused = httpx.post(main.url + "/admin/models/reload", timeout=10)
        assert refused.status_code == 400, refused.text
        assert "only-b" in refused.json()["detail"] and "special" in refused.json()["detail"], refused.json()
        routed, _ = _openai(main.url, _chat("auto", metadata={"task_type": "special-task"}))
        assert (routed.headers.get(ROUTE), routed.headers.get(BACKEND)) == ("special", "sb"), routed.text
    finally:
        models.write_text(good)
        assert httpx.post(main.url + "/admin/models/reload", timeout=10).status_code == 200


def test_route_to_unknown_graph_stops_the_server(tmp_path: Path, main: ServerHandle) -> None:
    routing = {"default": "plain", "routes": {"plain": {"graph": "no-such-graph", "task_types": ["x"]}}}
    config = yaml.safe_load(main.config.read_text())
    with pytest.raises(RuntimeError) as failed:
        start_server(tmp_path, {"gateway": config["gateway"], "graphs": config["graphs"], "routing": routing})
    message = str(failed.value)
    assert "exited" in message, message
    assert "routing.routes.plain.graph" in message and "no-such-graph" in message, message


# ---- 5-7. keys on: admin, CORS, readiness, auto without routes -------------------------------

TENANTS = {"user": {"graphs": ["*"], "models": ["*"]}, "ops": {"graphs": ["*"], "models": ["*"], "admin": True}}


def _secured_models(path: Path, scripted: dict[str, ScriptedBackend], *, primary: Any = None) -> Path:
    backends = {"sb": _scripted(scripted["sb"]), "dead": _dead()}
    aliases = {"primary": primary or {"targets": [{"backend": "dead", "weight": 1}], "fallbacks": ["sb"]}, "only-b": "sb"}
    # One failure opens a breaker, for long: its state is visible to the admin route.
    path.write_text(yaml.safe_dump({"breaker": {"failures": 1, "cooldown_s": 600}, "backends": backends, "aliases": aliases}))
    return path


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, scripted: dict[str, ScriptedBackend]
) -> Iterator[tuple[ServerHandle, dict[str, dict[str, str]], Path]]:
    """Keys on, one allowed CORS origin; ``chat`` calls ``primary``: a dead target, ``sb``
    as its fallback. start_server waits for /readyz: the fallback makes it ready."""
    tmp = tmp_path_factory.mktemp("gw-secured")
    models = _secured_models(tmp / "models.yaml", scripted)
    settings = {
        "gateway": {"models_file": str(models), "reload_check_s": 3600},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "primary"}},
        "auth": {"tenants": TENANTS},
        "server": {"cors_origins": [ALLOWED_ORIGIN]},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: {"Authorization": f"Bearer {create_key(config, tenant)}"} for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys, models
    finally:
        stop_server(handle)


def test_readyz_is_ready_when_the_fallback_is_up(secured: tuple[ServerHandle, dict[str, dict[str, str]], Path]) -> None:
    server, _, _ = secured
    response = httpx.get(server.url + "/readyz", timeout=10)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["backends"]["sb"] == "ok" and body["backends"]["dead"] != "ok", body


def test_graph_run_on_a_dead_target_is_served_by_the_fallback(
    secured: tuple[ServerHandle, dict[str, dict[str, str]], Path],
) -> None:
    server, keys, _ = secured
    for stream in (False, True):
        response, text = _openai(server.url, _chat("chat", stream=stream), headers=keys["user"])
        assert response.status_code == 200, response.text
        assert response.headers.get(BACKEND) == "sb" and text.split() == [w.strip() for w in WORDS]
    waited = httpx.post(server.url + "/runs/wait", json=_lg_body("chat"), headers=keys["user"], timeout=60)
    assert waited.status_code == 200 and waited.headers.get(BACKEND) == "sb", waited.text
    # A thread run: the header and the run's metadata name the fallback.
    thread = httpx.post(server.url + "/threads", json={}, headers=keys["user"], timeout=10).json()["thread_id"]
    with httpx.stream("POST", server.url + f"/threads/{thread}/runs/stream", json=_lg_body("chat"),
                      headers=keys["user"], timeout=60) as response:
        assert response.status_code == 200 and response.headers.get(BACKEND) == "sb"
        assert "event: error" not in response.read().decode()
    run_id = response.headers["content-location"].rsplit("/", 1)[-1]
    run = httpx.get(server.url + f"/threads/{thread}/runs/{run_id}", headers=keys["user"], timeout=10).json()
    assert run["metadata"].get("switchyard_backend") == "sb", run


def test_admin_routes_need_an_admin_tenant(secured: tuple[ServerHandle, dict[str, dict[str, str]], Path]) -> None:
    server, keys, _ = secured
    for method, path in (("POST", "/admin/models/reload"), ("GET", "/admin/models")):
        assert httpx.request(method, server.url + path, timeout=10).status_code == 401
        denied = httpx.request(method, server.url + path, headers=keys["user"], timeout=10)
        assert denied.status_code == 403, denied.text
        assert "admin" in denied.json()["detail"]
    reloaded = httpx.post(server.url + "/admin/models/reload", headers=keys["ops"], timeout=10)
    assert reloaded.status_code == 200, reloaded.text
    body = reloaded.json()
    assert body["reloaded"] is True
    assert body["aliases"]["primary"]["targets"] == [{"backend": "dead", "weight": 1}]
    assert body["aliases"]["primary"]["fallbacks"] == ["sb"]


def test_admin_models_shows_aliases_and_breakers(secured: tuple[ServerHandle, dict[str, dict[str, str]], Path]) -> None:
    """One request through ``primary`` fails on ``dead`` (one failure opens its breaker)."""
    server, keys, _ = secured
    response, _ = _openai(server.url, _chat("primary"), headers=keys["user"])
    assert response.status_code == 200 and response.headers.get(BACKEND) == "sb", response.text
    state = httpx.get(server.url + "/admin/models", headers=keys["ops"], timeout=10)
    assert state.status_code == 200, state.text
    body = state.json()
    assert set(body["aliases"]) == {"primary", "only-b"}
    assert body["aliases"]["only-b"]["targets"] == [{"backend": "sb", "weight": 1}]
    assert body["backends"]["dead"]["breaker"] == "open", body
    assert body["backends"]["sb"]["breaker"] == "closed", body
    assert sample(_metrics(server.url, keys["ops"]), "switchyard_backend_breaker_state", backend="dead") == 2


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("aliases: [unclosed", "not valid YAML"),
        (None, "nowhere"),  # an alias targets a backend that does not exist
        ("drop-primary", "primary"),  # a graph calls the alias the new file drops
    ],
    ids=["not-yaml", "unknown-backend", "drops-used-alias"],
)
def test_invalid_models_file_is_400_and_traffic_stays(
    secured: tuple[ServerHandle, dict[str, dict[str, str]], Path],
    scripted: dict[str, ScriptedBackend],
    content: str | None,
    named: str,
) -> None:
    server, keys, models = secured
    good = models.read_text()
    try:
        if content is None:
            _secured_models(models, scripted, primary={"targets": [{"backend": "nowhere", "weight": 1}]})
        elif content == "drop-primary":
            data = yaml.safe_load(good)
            del data["aliases"]["primary"]
            models.write_text(yaml.safe_dump(data))
        else:
            models.write_text(content)
        refused = httpx.post(server.url + "/admin/models/reload", headers=keys["ops"], timeout=10)
        assert refused.status_code == 400, refused.text
        assert named in refused.json()["detail"], refused.json()
        for model in ("primary", "chat"):
            response, _ = _openai(server.url, _chat(model), headers=keys["user"])
            assert response.status_code == 200 and response.headers.get(BACKEND) == "sb", response.text
        still = httpx.get(server.url + "/admin/models", headers=keys["ops"], timeout=10).json()
        assert still["aliases"]["primary"]["fallbacks"] == ["sb"]
    finally:
        models.write_text(good)
        assert httpx.post(server.url + "/admin/models/reload", headers=keys["ops"], timeout=10).status_code == 200


def test_cors_exposes_the_backend_header(secured: tuple[ServerHandle, dict[str, dict[str, str]], Path]) -> None:
    server, keys, _ = secured
    origin = {"Origin": ALLOWED_ORIGIN, **keys["user"]}
    for stream in (False, True):
        response, _ = _openai(server.url, _chat("only-b", stream=stream), headers=origin)
        assert response.status_code == 200, response.text
        assert response.headers.get("access-control-allow-origin") == ALLOWED_ORIGIN
        exposed = {h.strip().lower() for h in response.headers.get("access-control-expose-headers", "").split(",")}
        assert {BACKEND, ROUTE} <= exposed, exposed
        assert response.headers.get(BACKEND) == "sb"


def test_auto_without_routes_is_400_naming_model(secured: tuple[ServerHandle, dict[str, dict[str, str]], Path]) -> None:
    server, keys, _ = secured
    for stream in (False, True):
        response, _ = _openai(server.url, _chat("auto", stream=stream), headers=keys["user"])
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "model", response.json()
    ids = [m["id"] for m in httpx.get(server.url + "/v1/models", headers=keys["user"], timeout=10).json()["data"]]
    assert "auto" not in ids and "chat" in ids and "primary" in ids, ids
