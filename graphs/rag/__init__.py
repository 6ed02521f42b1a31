"""The ``rag`` graph: answers from a knowledge collection, with numbered citations."""

from graphs.rag.builder import make_graph

__all__ = ["make_graph"]
