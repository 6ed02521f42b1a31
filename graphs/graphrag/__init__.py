"""The ``graphrag`` graph: answers from a collection's knowledge graph and its chunks,
with numbered citations; the facts used go to clients next to the citations."""

from graphs.graphrag.builder import make_graph

__all__ = ["make_graph"]
