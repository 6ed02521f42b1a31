"""The composition root's object graph: settings -> gateway -> knowledge (vectors and
the knowledge graph) -> graphs.

Built once by the server's lifespan, by CLI commands and by test fixtures; never at
import time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway import ModelGateway, load_registry
from graphs import GraphRegistry
from knowledge import KnowledgeBase, StoreLockedError, open_knowledge
from knowledge.knowledge_graph import KnowledgeGraph, open_knowledge_graph
from tools import ToolRegistry
from serving.settings import Settings

__all__ = ["Platform"]

log = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class Platform:
    """Long-lived clients and registries shared by every request."""

    settings: Settings
    gateway: ModelGateway
    knowledge: KnowledgeBase | None
    """None only in a CLI process whose data directory a server holds."""
    tools: ToolRegistry
    graphs: GraphRegistry
    graph: KnowledgeGraph | None = None
    """The knowledge graph over ``knowledge``; None when ``knowledge`` is, or in a CLI
    process whose data directory a server holds."""

    @classmethod
    def build(cls, settings: Settings, *, knowledge_optional: bool = False) -> Platform:
        """Load the model registry, open the knowledge base, build every configured graph.

        Args:
            settings: the loaded settings.
            knowledge_optional: a CLI process: if another process (a server) holds the
                knowledge store, build the graphs that do not need it.

        Raises:
            RegistryError: the model registry is invalid.
            StoreLockedError: the vector store's directory is in use by another process.
            EmbeddingError: the embedder cannot be loaded.
            GraphLoadError: a graph cannot be imported or built.
        """
        gateway = ModelGateway(load_registry(settings.gateway.models_file), probe_timeout_s=settings.gateway.probe_timeout_s)
        knowledge: KnowledgeBase | None
        try:
            knowledge = open_knowledge(settings.knowledge, settings.data_dir, gateway)
        except StoreLockedError as exc:
            if not knowledge_optional:
                raise
            log.warning("%s: graphs that need the knowledge base cannot run in this process", exc)
            knowledge = None
        graph: KnowledgeGraph | None = None
        try:
            if knowledge is not None:
                try:
                    graph = open_knowledge_graph(settings.knowledge, settings.data_dir, knowledge, gateway)
                except StoreLockedError as exc:
                    if not knowledge_optional:
                        raise
                    log.warning("%s: graphs that need the knowledge graph cannot run in this process", exc)
            tools = ToolRegistry.builtin(settings.tools, knowledge, graph=graph)
            graphs = GraphRegistry.load(settings.graphs, gateway, knowledge=knowledge, tools=tools, graph=graph)
        except BaseException:
            if graph is not None:
                graph.close_now()
            if knowledge is not None:
                knowledge.close_now()
            raise
        return cls(settings=settings, gateway=gateway, knowledge=knowledge, tools=tools, graphs=graphs, graph=graph)

    def graph_aliases(self) -> dict[str, list[str]]:
        """The model aliases the registered graphs call, each with the backends it may
        use (what readiness waits for: one of them per alias)."""
        registry = self.gateway.registry
        return {alias: [b.id for b in registry.candidates(alias)] for alias in {g.spec.model for g in self.graphs}}

    async def aclose(self) -> None:
        if self.graph is not None:
            await self.graph.aclose()
        if self.knowledge is not None:
            await self.knowledge.aclose()
        await self.gateway.aclose()
