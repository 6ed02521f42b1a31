"""The tools of a process, by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tools.base import Tool
from tools.errors import UnknownToolError
from tools.policy import NetworkPolicy
from tools.settings import ToolsSettings

if TYPE_CHECKING:
    from knowledge import KnowledgeBase, KnowledgeGraph

__all__ = ["ToolRegistry"]


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool], settings: ToolsSettings | None = None) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self.settings = settings or ToolsSettings()
        """Budgets and approvals the runs of this registry's tools get."""

    @classmethod
    def builtin(
        cls, settings: ToolsSettings, knowledge: KnowledgeBase | None = None, graph: KnowledgeGraph | None = None
    ) -> ToolRegistry:
        """The built-in tools (``knowledge_search`` when there is a knowledge base,
        ``graph_neighbors`` when there is a knowledge graph)."""
        from tools.builtin import calculator, current_time, graph_neighbors, http_get, knowledge_search

        fetch = settings.http_get
        network = NetworkPolicy.from_config(fetch.allowed_networks, fetch.allowed_ports)
        tools = [
            calculator,
            current_time,
            http_get(fetch.allowed_domains, max_bytes=fetch.max_bytes, timeout_s=fetch.timeout_s, network=network),
        ]
        if knowledge is not None:
            tools.append(knowledge_search(knowledge))
        if graph is not None:
            tools.append(graph_neighbors(graph))
        return cls(tools, settings)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(name, list(self._tools)) from None

    def find(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def with_tools(self, *extra: Tool) -> ToolRegistry:
        """A registry with more tools (tests, graphs that bring their own)."""
        return ToolRegistry([*self._tools.values(), *extra], self.settings)
