"""LangChain chat models for graphs, one per backend kind.

Every backend speaks the OpenAI protocol, so graphs get a ``ChatOpenAI``. Differences
between servers are absorbed here, never in graphs: llama.cpp, for instance, cannot
force one named tool, so a ``tool_choice`` naming a function becomes ``"required"``
with only that tool offered, which has the same effect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
from langchain_core.language_models import LanguageModelInput
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI

from gateway.errors import BackendResponseError, BackendUnavailableError, GatewayError
from gateway.registry import Backend

__all__ = ["GatewayChatModel", "LlamaCppChatModel", "build_chat_model", "httpx_timeout"]


def httpx_timeout(backend: Backend) -> httpx.Timeout:
    """The client timeout for a backend: connect and per-read limits, no total cap
    (a long generation that keeps streaming is fine; a stalled one is not)."""
    return httpx.Timeout(
        connect=backend.timeouts.connect_s,
        read=backend.timeouts.read_s,
        write=backend.timeouts.read_s,
        pool=backend.timeouts.connect_s,
    )


class GatewayChatModel(ChatOpenAI):
    """``ChatOpenAI`` that reports failures as gateway errors naming the backend.

    Graphs and the serving layer then handle one error family whatever SDK sits
    underneath: an unreachable backend is `BackendUnavailableError`, an error status
    `BackendResponseError`.
    """

    backend_id: str = ""

    def _translate(self, exc: openai.APIError) -> GatewayError:
        if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError)):
            return BackendUnavailableError(self.backend_id, f"{exc.__class__.__name__}: {exc}")
        if isinstance(exc, openai.APIStatusError):
            return BackendResponseError(self.backend_id, exc.status_code, exc.message)
        return BackendResponseError(self.backend_id, 502, str(exc))

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        try:
            async for chunk in super()._astream(*args, **kwargs):
                yield chunk
        except openai.APIError as exc:
            raise self._translate(exc) from exc

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        try:
            return await super()._agenerate(*args, **kwargs)
        except openai.APIError as exc:
            raise self._translate(exc) from exc


class LlamaCppChatModel(GatewayChatModel):
    """``ChatOpenAI`` for llama.cpp's ``llama-server``.

    Rewrites a named-function ``tool_choice`` (unsupported by llama.cpp) into
    ``"required"`` over just that tool.
    """

    def _get_request_payload(
        self,
        input_: LanguageModelInput,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        choice = payload.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            name = choice.get("function", {}).get("name")
            payload["tool_choice"] = "required"
            payload["tools"] = [
                tool for tool in payload.get("tools", []) if tool.get("function", {}).get("name") == name
            ]
        return payload


def build_chat_model(
    backend: Backend,
    *,
    http_async_client: httpx.AsyncClient | None = None,
    **overrides: Any,
) -> ChatOpenAI:
    """A chat model bound to one backend.

    Args:
        backend: the registry entry.
        http_async_client: a shared connection pool; one per backend is enough.
        **overrides: more ``ChatOpenAI`` fields (``temperature``, ``max_tokens``...).

    Returns:
        A streaming-capable model that reports token usage on streams, with retries
        left to the caller (the gateway's router decides fallbacks, not the SDK).
    """
    cls = LlamaCppChatModel if backend.kind == "llamacpp" else GatewayChatModel
    params: dict[str, Any] = {
        "backend_id": backend.id,
        "model": backend.model,
        "base_url": backend.base_url,
        "api_key": backend.api_key or "not-needed",
        "timeout": httpx_timeout(backend),
        "max_retries": 0,
        "stream_usage": True,
        **overrides,
    }
    if http_async_client is not None:
        params["http_async_client"] = http_async_client
    return cls(**params)
