"""What a graph builder receives: long-lived clients, built once per process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from langchain_core.language_models import BaseChatModel

from knowledge import KnowledgeBase, KnowledgeGraph
from tools import ToolRegistry

__all__ = ["ChatModelProvider", "GraphDeps"]


class ChatModelProvider(Protocol):
    """Gives chat models by alias (the gateway's `ModelGateway` is one)."""

    def chat_model(self, alias: str) -> BaseChatModel:
        """The shared chat model for a model alias."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphDeps:
    """Dependencies handed to a graph builder ``make_graph(deps)``.

    Builders keep what they need in closures; they must not mutate these objects.
    """

    graph_id: str
    """The id the graph is registered under."""
    model: BaseChatModel
    """The chat model for the model alias declared next to the graph in the config."""
    models: ChatModelProvider
    """Other aliases, for graphs that use more than one model."""
    knowledge: KnowledgeBase | None = None
    """The knowledge base (collections, search), for retrieval graphs."""
    graph: KnowledgeGraph | None = None
    """The knowledge graph (entity linking, k-hop facts with their chunks), for the
    ``graphrag`` graph; None when the process has no graph store."""
    tools: ToolRegistry | None = None
    """The tools that exist, for tool-calling graphs."""
    tool_names: tuple[str, ...] = ()
    """The graph's own tool allow-list (``graphs.<id>.tools`` in the config)."""
