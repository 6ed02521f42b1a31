"""The `Embedder` port: texts to dense vectors."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Embedder"]


class Embedder(Protocol):
    """Turns texts into dense vectors of a fixed size.

    Implementations batch internally and never block the event loop.
    """

    name: str
    """What produced the vectors (stored with a collection: vectors of different
    models must never be mixed in one)."""

    @property
    def dimensions(self) -> int:
        """The vectors' size."""
        ...

    async def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Vectors for chunks to store, in order."""
        ...

    async def embed_query(self, text: str) -> list[float]:
        """The vector for a search query."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer (what chunk sizes are measured in)."""
        ...

    async def aclose(self) -> None:
        """Release the model or the connection."""
        ...
