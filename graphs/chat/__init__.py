"""The ``chat`` graph: the conversation goes to the model, the answer streams back."""

from graphs.chat.builder import make_graph

__all__ = ["make_graph"]
