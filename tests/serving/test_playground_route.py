"""The playground's routes (serving/playground), in process over ASGI: the page and
its two assets with their security headers, nothing else under ``/assets``, ``/``
opening the page in dev mode only, no key needed for the page while the API needs
one, and the tool decision the page reads from a tool message's artifact.

The page's behaviour in a browser is tested by tests/playground (Chromium).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI
from pydantic import BaseModel

from serving.app import create_app
from serving.langgraph_api.service import dumps
from serving.playground import ASSETS, CONTENT_SECURITY_POLICY
from serving.settings import load_settings
from tools import Tool, ToolContext, ToolExecutor, ToolPolicy, ToolRegistry, ToolsSettings

STATIC = Path(__file__).resolve().parents[2] / "serving" / "playground" / "static"

# The ids and attributes the browser tests (tests/playground) rely on.
DOM_IDS = [
    "auth", "api-key", "save-key", "forget-key", "graph-select", "thread-select", "new-thread",
    "message-input", "send", "stop", "messages", "approval", "graph-mermaid", "graph-diagram", "error", "status",
]


def _app(tmp_path: Path, *, dev: bool) -> FastAPI:
    """The app of a small config: one chat graph on a backend nobody answers (these
    tests never run a graph)."""
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({
        "backends": {"nowhere": {
            "kind": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "nothing", "capabilities": {"context_window": 2048},
        }},
        "aliases": {"chat-default": "nowhere"},
    }))
    config = tmp_path / "switchyard.yaml"
    body: dict[str, object] = {
        "data_dir": str(tmp_path / "data"),
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "server": {"dev": dev},
    }
    if not dev:
        body["auth"] = {"tenants": {"acme": {"graphs": ["*"], "models": ["*"]}}}
    config.write_text(yaml.safe_dump(body))
    return create_app(load_settings(config))


@pytest.fixture
async def dev_client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=_app(tmp_path, dev=True), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


async def test_the_page_is_served_with_a_strict_policy(dev_client: httpx.AsyncClient) -> None:
    response = await dev_client.get("/playground")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    policy = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'" and policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["form-action"] == "'none'"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-cache"
    html = response.text
    for name in DOM_IDS:
        assert f'id="{name}"' in html, name
    for action in ("approve", "edit", "reject"):
        assert f'data-action="{action}"' in html
    assert 'id="api-key" type="password"' in html


def test_the_page_runs_under_its_policy() -> None:
    """Nothing the policy forbids: no inline script or style, no event-handler
    attributes, no other origin; the script never parses data as HTML."""
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/playground/assets/app.js" defer>']
    assert "<style" not in html and " style=" not in html
    assert not re.search(r"\son[a-z]+=", html)
    script = (STATIC / "app.js").read_text()
    for forbidden in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute(\"style\""):
        assert forbidden not in script, forbidden
    for text in (html, script, (STATIC / "style.css").read_text()):
        origins = set(re.findall(r"https?://[^\s\"'`)]+", text))
        assert origins <= {"http://www.w3.org/2000/svg"}, origins  # the SVG namespace is a name, not a fetch


@pytest.mark.parametrize("name", sorted(ASSETS))
async def test_assets_are_served(dev_client: httpx.AsyncClient, name: str) -> None:
    response = await dev_client.get(f"/playground/assets/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == ASSETS[name]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.content == (STATIC / name).read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/playground/assets/index.html",            # a static file, but not an asset
        "/playground/assets/nope.js",
        "/playground/assets/..%2F__init__.py",
        "/playground/assets/%2e%2e%2f%2e%2e%2fapp.py",
        "/playground/assets/..%5C__init__.py",
        "/playground/assets/static%2Fapp.js",
        "/playground/assets/",
    ],
)
async def test_anything_else_under_assets_is_a_404(dev_client: httpx.AsyncClient, path: str) -> None:
    response = await dev_client.get(path)
    assert response.status_code == 404, path
    assert "import" not in response.text and "def " not in response.text  # no Python source leaked


async def test_an_unknown_asset_names_the_assets(dev_client: httpx.AsyncClient) -> None:
    response = await dev_client.get("/playground/assets/app.jsx")
    assert response.status_code == 404
    assert response.json() == {"detail": "no playground asset 'app.jsx'; the assets are: app.js, style.css"}


async def test_dev_mode_opens_the_playground_at_the_root(dev_client: httpx.AsyncClient) -> None:
    response = await dev_client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/playground"


async def test_with_keys_the_page_needs_none_but_the_api_does(tmp_path: Path) -> None:
    """With keys on, ``/`` stays a 404 and the page loads without a key (it holds no
    data); the API it calls still refuses a request without one."""
    app = _app(tmp_path, dev=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            root = await client.get("/")
            page = await client.get("/playground")
            asset = await client.get("/playground/assets/app.js")
            api = await client.post("/assistants/search", json={})
    assert root.status_code == 404
    assert page.status_code == 200 and asset.status_code == 200
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert api.status_code == 401


class _Args(BaseModel):
    n: int


async def test_tool_decisions_reach_the_wire_in_the_artifact() -> None:
    """The page reads ``artifact.decision`` of ``type == "tool"`` messages, as the
    LangGraph API sends them (`serving.langgraph_api.service.dumps`)."""

    async def double(args: _Args, context: ToolContext) -> str:
        return str(args.n * 2)

    async def broken(args: _Args, context: ToolContext) -> str:
        raise ValueError("no")

    registry = ToolRegistry(
        [
            Tool(name="double", description="", args_schema=_Args, run=double),  # type: ignore[arg-type]
            Tool(name="broken", description="", args_schema=_Args, run=broken),  # type: ignore[arg-type]
            Tool(name="slow", description="", args_schema=_Args, run=double, timeout_s=0.0),  # type: ignore[arg-type]
        ],
        ToolsSettings(),
    )
    names = ["double", "broken", "slow"]
    executor = ToolExecutor(registry, ToolPolicy.intersect(names, names, registry.names()), ToolContext())
    messages = [
        await executor.run("a", "double", {"n": 21}),
        await executor.run("b", "double", {"n": "many"}),
        await executor.run("c", "broken", {"n": 1}),
        await executor.run("d", "slow", {"n": 1}),
        executor.refuse("e", "double", {"n": 1}, "a person declined this call"),
    ]
    wire = [json.loads(dumps(m)) for m in messages]
    assert [w["type"] for w in wire] == ["tool"] * 5
    assert [w["tool_call_id"] for w in wire] == ["a", "b", "c", "d", "e"]
    assert [w["artifact"]["decision"] for w in wire] == ["executed", "refused", "failed", "timed_out", "refused"]
    assert wire[0]["content"] == "42" and wire[0]["artifact"]["reason"] == ""
    assert "invalid arguments for 'double'" in wire[1]["artifact"]["reason"]
    assert wire[2]["artifact"]["reason"] == "ValueError: no"
    assert wire[4]["artifact"]["reason"] == "a person declined this call"


def _js_regex(script: str, name: str) -> re.Pattern[str]:
    """A regular expression literal of app.js (``const NAME = /.../flags;``) as Python's
    (the page's patterns use only syntax both share)."""
    match = re.search(rf"const {name} = /(.+)/([a-z]*);\n", script)
    assert match, name
    return re.compile(match.group(1), re.IGNORECASE if "i" in match.group(2) else 0)


def test_the_page_tells_a_backend_down_from_other_outages() -> None:
    """The page classifies a 503 or a stream error by the server's own wording: a model
    backend's errors name it (``backend_down``), an embedder's are told apart (they may
    quote the model backend under them), and a store's outage is no backend's even when
    its reason says "Connection"."""
    from gateway import BackendResponseError, BackendUnavailableError
    from serving.threads import ThreadStoreError

    script = (STATIC / "app.js").read_text()
    model_backend, embedder = _js_regex(script, "MODEL_BACKEND"), _js_regex(script, "EMBEDDER")
    down = str(BackendUnavailableError("local", "connection refused"))
    failed = str(BackendResponseError("local", 500, "out of memory"))
    for message in (down, failed):
        named = model_backend.search(message)
        assert named and named.group(1) == "local" and not embedder.search(message), message
    # knowledge/embeddings: what a down or misconfigured embedder says
    for message in (
        f"embedding backend failed: {down}",
        "model 'embed' (backend 'emb') does not declare the embeddings capability",
        "unknown local embedding model 'x' (packaged models: use-multilingual-v3)",
        "backend returned 384 dimensions, expected 512",
    ):
        assert embedder.search(message), message
    store = str(ThreadStoreError("create", "ConnectionRefusedError: [Errno 111] Connection refused"))
    assert not model_backend.search(store) and not embedder.search(store)
    assert "EmbedderUnavailable" in script and "ThreadStoreUnavailable" in script


def test_the_key_is_kept_for_the_tab_unless_remembered() -> None:
    """The key goes to sessionStorage unless "remember on this browser" is ticked
    (localStorage is readable by every page of the origin); "forget" clears both."""
    html = (STATIC / "index.html").read_text()
    assert 'id="remember-key" type="checkbox"' in html
    assert re.search(r'id="remember-key"[^>]*\bchecked\b', html) is None  # not remembered by default
    script = (STATIC / "app.js").read_text()
    assert "sessionStorage" in script
    forget = script[script.index("function forgetStoredKey"):]
    forget = forget[: forget.index("\n  }\n")]
    assert "store(STORE.key, null, area)" in forget and "store(STORE.key, null);" in forget
