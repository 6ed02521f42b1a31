"""The gateway facade: aliases to backends, and the clients that reach them.

Built once per process (the server's lifespan or a CLI command) and closed on exit.
Later issues add canary weights, fallbacks and circuit breakers here; callers already
go through `ModelGateway` for every model they use.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel

from gateway.chat import build_chat_model, httpx_timeout
from gateway._net import pooled_transport
from gateway._wire import iter_chunks, open_chat, post_json, read_json
from gateway.errors import BackendResponseError, CapabilityError
from gateway.health import BackendHealth, probe
from gateway.registry import Backend, ModelRegistry

__all__ = ["ModelGateway"]

# Connection pools sized for the serving target (50 concurrent streams per replica).
_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)


class ModelGateway:
    """Hands out chat models and relays OpenAI requests by alias, one pool per backend."""

    def __init__(self, registry: ModelRegistry, *, probe_timeout_s: float = 2.0) -> None:
        """Args:
            registry: the loaded model registry.
            probe_timeout_s: limit for one readiness probe.
        """
        self.registry = registry
        self._probe_timeout_s = probe_timeout_s
        self._pools: dict[str, httpx.AsyncClient] = {}
        self._chat_models: dict[str, BaseChatModel] = {}
        self._probe_client: httpx.AsyncClient | None = None

    def _pool(self, backend: Backend) -> httpx.AsyncClient:
        pool = self._pools.get(backend.id)
        if pool is None:
            pool = httpx.AsyncClient(timeout=httpx_timeout(backend), transport=pooled_transport(_LIMITS))
            self._pools[backend.id] = pool
        return pool

    def backend(self, alias: str) -> Backend:
        """The backend serving ``alias``.

        Raises:
            UnknownModelError: not a registered alias.
        """
        return self.registry.resolve(alias)

    def chat_model(self, alias: str) -> BaseChatModel:
        """The LangChain chat model for ``alias``, built once and shared.

        Per-request parameters (temperature, max tokens) are bound by the caller with
        ``.bind(...)``; the shared instance is never mutated.
        """
        model = self._chat_models.get(alias)
        if model is None:
            backend = self.registry.resolve(alias)
            model = build_chat_model(backend, http_async_client=self._pool(backend))
            self._chat_models[alias] = model
        return model

    async def _open(self, alias: str, body: Mapping[str, Any]) -> tuple[Backend, httpx.Response]:
        backend = self.registry.resolve(alias)
        self.check_capabilities(backend, body)
        payload = {**body, "model": backend.model}
        if backend.default_max_tokens and "max_tokens" not in body and "max_completion_tokens" not in body:
            payload["max_tokens"] = backend.default_max_tokens
        response = await open_chat(self._pool(backend), backend.id, backend.base_url, backend.api_key or "not-needed", payload)
        return backend, response

    async def embed(self, alias: str, texts: list[str]) -> list[list[float]]:
        """Vectors for ``texts`` from the alias's ``/v1/embeddings`` backend, in order.

        Raises:
            UnknownModelError: not a registered alias.
            CapabilityError: the backend does not declare ``embeddings``.
            BackendUnavailableError, BackendResponseError: the call failed.
        """
        vectors, _ = await self.embed_with_usage(alias, texts)
        return vectors

    async def embed_with_usage(self, alias: str, texts: list[str]) -> tuple[list[list[float]], int]:
        """Like `embed`, plus the prompt tokens the backend reports (0 if it reports none)."""
        backend = self.registry.resolve(alias)
        if not backend.capabilities.embeddings:
            raise CapabilityError(
                backend.id, "embeddings", "model", f"backend {backend.id!r} does not declare the embeddings capability"
            )
        answer = await post_json(
            self._pool(backend), backend.id, f"{backend.base_url}/embeddings", backend.api_key or "not-needed",
            {"model": backend.model, "input": texts, "encoding_format": "float"},
        )
        try:
            rows = sorted(answer["data"], key=lambda row: row["index"])
            vectors = [list(map(float, row["embedding"])) for row in rows]
            usage = answer.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BackendResponseError(backend.id, 502, f"not an embeddings answer: {exc!r}") from None
        if len(vectors) != len(texts):
            raise BackendResponseError(backend.id, 502, f"{len(vectors)} vectors for {len(texts)} inputs")
        return vectors, prompt_tokens

    async def complete_chat(self, alias: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Relay a non-streamed chat completion to the alias's backend.

        Args:
            alias: the model alias the client named.
            body: OpenAI request fields; ``model`` is replaced by the served name.

        Returns:
            The backend's JSON answer, ``model`` set back to ``alias``.

        Raises:
            UnknownModelError, CapabilityError: before anything is sent.
            BackendUnavailableError: the backend could not be reached.
            BackendResponseError: the backend answered an error status.
        """
        backend, response = await self._open(alias, {**body, "stream": False})
        answer = await read_json(response, backend.id)
        answer["model"] = alias
        return answer

    async def stream_chat(self, alias: str, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Relay a streamed chat completion; yields the backend's chunks as dicts.

        The connection is opened before the first chunk is yielded, so an unreachable or
        refusing backend raises on the first ``anext`` (before any byte goes to the
        client). Closing the iterator closes the backend response, which makes the
        server stop generating. Usage is always requested for the last chunk.

        Raises:
            The same errors as `complete_chat`; after the first chunk, a broken stream
            raises `BackendUnavailableError`.
        """
        backend, response = await self._open(
            alias, {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        async with aclosing(iter_chunks(response, backend.id)) as chunks:
            async for chunk in chunks:
                chunk["model"] = alias
                yield chunk

    @staticmethod
    def check_capabilities(backend: Backend, request: Mapping[str, Any]) -> None:
        """Refuse a chat request that the backend's contract cannot serve.

        Args:
            backend: the target.
            request: OpenAI chat-completions fields (``tools``, ``response_format``,
                ``max_tokens`` / ``max_completion_tokens``).

        Raises:
            CapabilityError: naming the request field and the missing capability.
        """
        caps = backend.capabilities
        if request.get("tools") and not caps.tools:
            raise CapabilityError(
                backend.id, "tools", "tools", f"model backend {backend.id!r} does not support tool calls"
            )
        response_format = request.get("response_format") or {}
        if response_format.get("type") == "json_schema" and not caps.json_schema:
            raise CapabilityError(
                backend.id,
                "json_schema",
                "response_format",
                f"model backend {backend.id!r} does not support json_schema output",
            )
        for field in ("max_completion_tokens", "max_tokens"):
            value = request.get(field)
            if value is not None and value > caps.context_window:
                raise CapabilityError(
                    backend.id,
                    "context_window",
                    field,
                    f"{field}={value} exceeds the context window of {backend.id!r} ({caps.context_window} tokens)",
                )

    async def probe(self, backend_ids: list[str] | None = None) -> list[BackendHealth]:
        """Probe backends concurrently (default: every backend an alias points at)."""
        ids = backend_ids if backend_ids is not None else sorted(set(self.registry.aliases.values()))
        backends = [self.registry.backends[i] for i in ids]
        if self._probe_client is None:
            self._probe_client = httpx.AsyncClient()
        client = self._probe_client
        return list(
            await asyncio.gather(*(probe(b, client, self._probe_timeout_s) for b in backends))
        )

    async def aclose(self) -> None:
        """Close every connection pool."""
        for pool in self._pools.values():
            await pool.aclose()
        if self._probe_client is not None:
            await self._probe_client.aclose()
            self._probe_client = None
        self._pools.clear()
        self._chat_models.clear()
