"""``POST /v1/embeddings`` over the real server with the real ``openai`` client: one
string and a list, base64 equal to the floats, chat-only aliases, graphs and unknown
models refused, tenants' allowed models applied, malformed bodies a 400 naming the
field. The embeddings backend is a FAKE OpenAI-compatible server defined here (its
vectors are a deterministic function of the text), since the fake in tests/fakes
serves only chat completions."""

from __future__ import annotations

import base64
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.conftest import ServerHandle, create_key, start_server, stop_server
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.e2e]

DIMENSIONS = 4


def _fake_vector(text: str) -> list[float]:
    # Exactly representable in float32, so base64 (float32) equals the float answer.
    return [float(len(text)), ord(text[0]) / 2, 0.25, -1.5]


async def _fake_embeddings(request: Request) -> Response:
    """FAKE: an OpenAI-compatible /v1/embeddings answer, one token per character."""
    body = await request.json()
    texts = body["input"]
    data = [{"object": "embedding", "index": i, "embedding": _fake_vector(t)} for i, t in enumerate(texts)]
    tokens = sum(len(t) for t in texts)
    return JSONResponse({"object": "list", "data": data, "model": body["model"],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def _health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


@pytest.fixture(scope="module")
def fake_embeddings_url() -> Iterator[str]:
    """FAKE embeddings backend on a free loopback port, in a thread."""
    app = Starlette(routes=[Route("/v1/embeddings", _fake_embeddings, methods=["POST"]), Route("/health", _health)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake embeddings backend did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


TENANTS = {
    "everything": {"graphs": ["*"], "models": ["*"]},
    "chat-only-tenant": {"graphs": ["*"], "models": ["chat-only"]},
}


@pytest.fixture(scope="module")
def embed_server(
    tmp_path_factory: pytest.TempPathFactory, fake_embeddings_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("embeddings")
    models = {
        "backends": {
            "emb": {"kind": "vllm", "base_url": fake_embeddings_url, "model": "fake-embedder",
                    "capabilities": {"context_window": 512, "embeddings": True, "embedding_dimensions": DIMENSIONS}},
            "chat": {"kind": "vllm", "base_url": fake_embeddings_url, "model": "fake-chat",
                     "capabilities": {"context_window": 512}},
        },
        "aliases": {"embed-default": "emb", "chat-only": "chat"},
    }
    (tmp / "models.yaml").write_text(yaml.safe_dump(models))
    settings = {
        "gateway": {"models_file": str(tmp / "models.yaml")},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-only"}},
        "auth": {"tenants": TENANTS},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


def _client(server: ServerHandle, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def _post(server: ServerHandle, key: str, body: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_one_string_and_a_list(embed_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = embed_server
    client = _client(server, keys["everything"])
    one = client.embeddings.create(model="embed-default", input="ferry", encoding_format="float")
    assert one.object == "list" and one.model == "embed-default"
    assert [(d.object, d.index) for d in one.data] == [("embedding", 0)]
    assert one.data[0].embedding == _fake_vector("ferry")
    assert (one.usage.prompt_tokens, one.usage.total_tokens) == (5, 5)
    many = client.embeddings.create(model="embed-default", input=["a", "bread", "dawn"], encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    assert [d.embedding for d in many.data] == [_fake_vector(t) for t in ("a", "bread", "dawn")]
    assert many.usage.total_tokens == 10


def test_base64_decodes_to_the_same_floats(embed_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = embed_server
    raw = _post(server, keys["everything"], {"model": "embed-default", "input": ["ab", "c"], "encoding_format": "base64"})
    assert raw.status_code == 200
    decoded = [list(struct.unpack(f"<{DIMENSIONS}f", base64.b64decode(d["embedding"]))) for d in raw.json()["data"]]
    assert decoded == [_fake_vector("ab"), _fake_vector("c")]
    # The openai client asks for base64 by default and decodes it itself.
    default = _client(server, keys["everything"]).embeddings.create(model="embed-default", input=["ab", "c"])
    assert [d.embedding for d in default.data] == decoded
    # Declared dimensions are honoured; others are refused.
    same = _client(server, keys["everything"]).embeddings.create(model="embed-default", input="x", dimensions=DIMENSIONS)
    assert len(same.data[0].embedding) == DIMENSIONS


def _error(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]  # type: ignore[no-any-return]


def test_models_that_cannot_embed_are_refused(embed_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = embed_server
    client = _client(server, keys["everything"])
    with pytest.raises(openai.BadRequestError, match="'chat-only' does not serve embeddings"):
        client.embeddings.create(model="chat-only", input="x")
    with pytest.raises(openai.BadRequestError, match="'chat' is a graph"):
        client.embeddings.create(model="chat", input="x")
    with pytest.raises(openai.NotFoundError, match="gpt-17"):
        client.embeddings.create(model="gpt-17", input="x")
    error = _error(_post(server, keys["everything"], {"model": "gpt-17", "input": "x"}), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found" and "embed-default" in error["message"]
    error = _error(_post(server, keys["everything"], {"model": "chat-only", "input": "x"}), 400)
    assert error["param"] == "model"


def test_tenant_without_the_alias_is_refused(embed_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = embed_server
    with pytest.raises(openai.PermissionDeniedError, match="tenant 'chat-only-tenant' may not use model 'embed-default'"):
        _client(server, keys["chat-only-tenant"]).embeddings.create(model="embed-default", input="x")
    assert httpx.post(server.url + "/v1/embeddings", json={"model": "embed-default", "input": "x"}).status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "embed-default"}, "input"),
        ({"model": "embed-default", "input": []}, "input"),
        ({"model": "embed-default", "input": ""}, "input.0"),
        ({"model": "embed-default", "input": ["ok", 3]}, "input.1"),
        ({"model": "embed-default", "input": ["ok", None]}, "input.1"),
        ({"model": "embed-default", "input": [[1, 2, 3]]}, "input.0"),
        ({"model": "embed-default", "input": {"text": "x"}}, "input"),
        ({"model": "embed-default", "input": ["x"] * 2049}, "input"),
        ({"model": "embed-default", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "embed-default", "input": "x", "dimensions": 2}, "dimensions"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(
    embed_server: tuple[ServerHandle, dict[str, str]], body: dict[str, object], param: str
) -> None:
    server, keys = embed_server
    error = _error(_post(server, keys["everything"], body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
