"""The ``agent`` graph: a model that calls tools, under an enforced tool policy."""

from graphs.agent.builder import make_graph

__all__ = ["make_graph"]
