"""The graph registry: graph id -> a compiled LangGraph graph.

Graphs are registered by configuration, as ``langgraph.json`` does, so a graph in any
module appears in the API and the CLI without touching Switchyard's code::

    graphs:
      chat:
        path: graphs.chat:make_graph          # importable module:attribute
        model: chat-default                   # the model alias it calls
      summarize:
        path: my_graphs/summarize.py:make_graph   # or a file, relative to the cwd

The attribute is a builder ``make_graph(deps: GraphDeps)`` returning a ``StateGraph``
(compiled here) or a compiled graph; a ``StateGraph`` or compiled graph object also works.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from pydantic import BaseModel, ConfigDict, Field, field_validator

from knowledge import KnowledgeBase
from knowledge.knowledge_graph import KnowledgeGraph
from tools import ToolRegistry
from graphs.deps import ChatModelProvider, GraphDeps
from graphs.errors import GraphLoadError, UnknownGraphError

__all__ = ["GraphRegistry", "GraphSpec", "RegisteredGraph", "load_target"]

_GRAPH_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class GraphSpec(BaseModel):
    """One entry under ``graphs:`` in ``config/switchyard.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    """``package.module:attribute`` or ``relative/file.py:attribute``."""
    model: str = "chat-default"
    """The model alias the graph's builder receives as ``deps.model``."""
    description: str = ""
    """Shown by ``switchyard graphs list`` and the API."""
    tools: tuple[str, ...] = Field(default=())
    """Tools the graph may call (``*``: all), intersected with the caller's tenant's."""

    @field_validator("path")
    @classmethod
    def _has_attribute(cls, value: str) -> str:
        module, sep, attribute = value.rpartition(":")
        if not sep or not module or not attribute.isidentifier():
            raise ValueError(f"must be 'module:attribute' or 'file.py:attribute', got {value!r}")
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisteredGraph:
    """A loaded graph and the entry it came from."""

    graph_id: str
    spec: GraphSpec
    graph: Pregel[Any, Any, Any, Any]
    """The compiled graph, without a checkpointer: for stateless runs."""
    threaded: Pregel[Any, Any, Any, Any] | None = None
    """The same graph with a checkpointer, for runs on a thread (its state persists
    between runs); set by `GraphRegistry.with_checkpointer`."""


def _import_module(graph_id: str, target: str, path: str) -> ModuleType:
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise GraphLoadError(graph_id, path, f"file {file} not found (relative to {Path.cwd()})")
        name = f"switchyard_user_graphs.{graph_id.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise GraphLoadError(graph_id, path, "not a loadable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # boundary: user code; report which graph broke and why
            sys.modules.pop(name, None)
            raise GraphLoadError(graph_id, path, f"import failed: {exc!r}") from exc
        return module
    try:
        return importlib.import_module(target)
    except Exception as exc:  # boundary: user code
        raise GraphLoadError(graph_id, path, f"import failed: {exc!r}") from exc


def load_target(graph_id: str, path: str) -> Any:
    """Import ``module:attribute`` (or ``file.py:attribute``) and return the attribute.

    Raises:
        GraphLoadError: the module does not import or lacks the attribute.
    """
    target, _, attribute = path.rpartition(":")
    module = _import_module(graph_id, target, path)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise GraphLoadError(graph_id, path, f"{target} has no attribute {attribute!r}") from None


def _compile(graph_id: str, spec: GraphSpec, obj: Any, deps: GraphDeps) -> Pregel[Any, Any, Any, Any]:
    if callable(obj) and not isinstance(obj, (StateGraph, Pregel)):
        try:
            obj = obj(deps)
        except Exception as exc:  # boundary: user builder
            raise GraphLoadError(graph_id, spec.path, f"builder raised {exc!r}") from exc
    if isinstance(obj, StateGraph):
        obj = obj.compile(name=graph_id)
    if not isinstance(obj, Pregel):
        raise GraphLoadError(
            graph_id, spec.path, f"expected a StateGraph, a compiled graph or a builder returning one, got {type(obj).__name__}"
        )
    return obj


class GraphRegistry:
    """Loads every configured graph once and serves them by id."""

    def __init__(self, graphs: Mapping[str, RegisteredGraph]) -> None:
        self._graphs = dict(graphs)

    @classmethod
    def load(
        cls,
        specs: Mapping[str, GraphSpec],
        models: ChatModelProvider,
        *,
        knowledge: KnowledgeBase | None = None,
        tools: ToolRegistry | None = None,
        graph: KnowledgeGraph | None = None,
    ) -> GraphRegistry:
        """Import, build and compile each configured graph.

        Args:
            specs: graph id -> entry, from the ``graphs`` config section.
            models: the provider of chat models by alias (the gateway).
            knowledge: the knowledge base, for retrieval graphs.
            tools: the tool registry, for tool-calling graphs.
            graph: the knowledge graph, for GraphRAG graphs.

        Raises:
            GraphLoadError: naming the first graph that failed and why (bad id, unknown
                model alias, import error, builder error, wrong return type).
        """
        loaded: dict[str, RegisteredGraph] = {}
        for graph_id, spec in specs.items():
            if not _GRAPH_ID.match(graph_id):
                raise GraphLoadError(graph_id, spec.path, "id must be lowercase letters, digits, '-' or '_'")
            try:
                model = models.chat_model(spec.model)
            except Exception as exc:  # the gateway's UnknownModelError, reported per graph
                raise GraphLoadError(graph_id, spec.path, f"model: {exc}") from exc
            deps = GraphDeps(
                graph_id=graph_id,
                model=model,
                models=models,
                knowledge=knowledge,
                graph=graph,
                tools=tools,
                tool_names=tuple(spec.tools),
            )
            compiled = _compile(graph_id, spec, load_target(graph_id, spec.path), deps)
            loaded[graph_id] = RegisteredGraph(graph_id=graph_id, spec=spec, graph=compiled)
        return cls(loaded)

    def with_checkpointer(self, checkpointer: BaseCheckpointSaver[Any]) -> GraphRegistry:
        """The same graphs, each with a ``threaded`` copy that keeps state in
        ``checkpointer`` (the stateless ``graph`` is left as it is)."""
        return GraphRegistry(
            {
                graph_id: replace(entry, threaded=entry.graph.copy(update={"checkpointer": checkpointer}))
                for graph_id, entry in self._graphs.items()
            }
        )

    def get(self, graph_id: str) -> RegisteredGraph:
        """The graph registered under ``graph_id``.

        Raises:
            UnknownGraphError: listing the registered ids.
        """
        try:
            return self._graphs[graph_id]
        except KeyError:
            raise UnknownGraphError(graph_id, self._graphs) from None

    def __contains__(self, graph_id: object) -> bool:
        return graph_id in self._graphs

    def __iter__(self) -> Iterator[RegisteredGraph]:
        return iter(self._graphs.values())

    def ids(self) -> list[str]:
        return list(self._graphs)
