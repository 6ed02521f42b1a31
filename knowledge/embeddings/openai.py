"""`Embedder` over an OpenAI-compatible ``/v1/embeddings`` backend of the gateway
(vLLM's or TEI's embedding models), named by a model alias."""

from __future__ import annotations

import re

from gateway import GatewayError, ModelGateway
from knowledge.errors import EmbeddingError

__all__ = ["GatewayEmbedder", "estimate_tokens"]

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate (the remote model's tokenizer is not here): one token
    per CJK character, one per ~4 other characters."""
    cjk = len(_CJK.findall(text))
    return cjk + max(0, len(text) - cjk + 3) // 4


class GatewayEmbedder:
    """Vectors from the backend behind ``alias``.

    Args:
        gateway: the model gateway (its pooled connections).
        alias: the alias of a backend that declares the ``embeddings`` capability.
        batch_size: texts per request.
        dimensions: the vectors' size, if the registry does not declare it.
    """

    def __init__(self, gateway: ModelGateway, alias: str, *, batch_size: int = 32, dimensions: int | None = None) -> None:
        self._gateway = gateway
        self._alias = alias
        self._batch_size = batch_size
        backend = gateway.backend(alias)
        if not backend.capabilities.embeddings:
            raise EmbeddingError(f"model {alias!r} (backend {backend.id!r}) does not declare the embeddings capability")
        size = dimensions or backend.capabilities.embedding_dimensions
        if size is None:
            raise EmbeddingError(f"set embedding_dimensions for backend {backend.id!r} (or knowledge.embedder.dimensions)")
        self._dimensions = size
        self.name = f"openai:{backend.model}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            batch = texts[start : start + self._batch_size]
            try:
                got = await self._gateway.embed(self._alias, batch)
            except GatewayError as exc:
                raise EmbeddingError(f"embedding backend failed: {exc}") from exc
            for vector in got:
                if len(vector) != self._dimensions:
                    raise EmbeddingError(f"backend returned {len(vector)} dimensions, expected {self._dimensions}")
            vectors.extend(got)
        return vectors

    async def embed_query(self, text: str) -> list[float]:
        return (await self.embed_documents([text]))[0]

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    async def aclose(self) -> None:
        pass  # the gateway owns the connections
