"""Built-in tools: ``calculator``, ``current_time``, ``knowledge_search``, ``graph_neighbors``, ``http_get``."""

from tools.builtin.calculator import calculator
from tools.builtin.clock import current_time
from tools.builtin.graph import graph_neighbors
from tools.builtin.http import http_get
from tools.builtin.search import knowledge_search

__all__ = ["calculator", "current_time", "graph_neighbors", "http_get", "knowledge_search"]
