"""The graph registry: config entries to compiled graphs, and errors naming the graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import ModelGateway, load_registry
from graphs import GraphLoadError, GraphRegistry, GraphSpec, UnknownGraphError
from tests.conftest import REPO



@pytest.fixture
async def gateway() -> ModelGateway:
    # Building chat models opens no connection: no backend is needed here.
    gw = ModelGateway(load_registry(REPO / "config/models.yaml"))
    yield gw  # type: ignore[misc]
    await gw.aclose()


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "custom_graph.py"
    path.write_text(body)
    return str(path)


async def test_chat_graph_compiles_with_its_node(gateway: ModelGateway) -> None:
    registry = GraphRegistry.load({"chat": GraphSpec(path="graphs.chat:make_graph")}, gateway)
    graph = registry.get("chat").graph
    assert set(graph.get_graph().nodes) == {"__start__", "call_model", "__end__"}
    assert registry.ids() == ["chat"]


async def test_file_path_entry_and_prebuilt_objects(gateway: ModelGateway, tmp_path: Path) -> None:
    file = _write(
        tmp_path,
        "from graphs.chat import make_graph as _make\n"
        "def builder(deps):\n    return _make(deps).compile()\n",
    )
    registry = GraphRegistry.load({"mine": GraphSpec(path=f"{file}:builder")}, gateway)
    assert "call_model" in registry.get("mine").graph.get_graph().nodes


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("graphs.nowhere:make_graph", r"graphs\.broken \(graphs\.nowhere:make_graph\): import failed"),
        ("graphs.chat:missing", r"graphs\.chat has no attribute 'missing'"),
        ("/no/such/file.py:make_graph", r"file /no/such/file\.py not found"),
        ("graphs.chat.prompts:SYSTEM_PROMPT", r"expected a StateGraph, a compiled graph or a builder"),
    ],
)
async def test_load_errors_name_the_graph(gateway: ModelGateway, path: str, message: str) -> None:
    with pytest.raises(GraphLoadError, match=message):
        GraphRegistry.load({"broken": GraphSpec(path=path)}, gateway)


async def test_builder_errors_and_unknown_alias(gateway: ModelGateway, tmp_path: Path) -> None:
    file = _write(tmp_path, "def make_graph(deps):\n    raise RuntimeError('no prompt file')\n")
    with pytest.raises(GraphLoadError, match="builder raised RuntimeError\\('no prompt file'\\)"):
        GraphRegistry.load({"bad": GraphSpec(path=f"{file}:make_graph")}, gateway)
    with pytest.raises(GraphLoadError, match="model: unknown model 'gpt-9'"):
        GraphRegistry.load({"chat": GraphSpec(path="graphs.chat:make_graph", model="gpt-9")}, gateway)
    with pytest.raises(GraphLoadError, match="id must be lowercase"):
        GraphRegistry.load({"Chat Graph": GraphSpec(path="graphs.chat:make_graph")}, gateway)


async def test_unknown_graph_lists_registered(gateway: ModelGateway) -> None:
    registry = GraphRegistry.load({"chat": GraphSpec(path="graphs.chat:make_graph")}, gateway)
    with pytest.raises(UnknownGraphError, match="registered: chat"):
        registry.get("rag")
