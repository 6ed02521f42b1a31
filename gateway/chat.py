"""LangChain chat models for graphs, one per backend kind.

Every backend speaks the OpenAI protocol, so graphs get a ``ChatOpenAI``. Differences
between servers are absorbed here, never in graphs: llama.cpp, for instance, cannot
force one named tool, so a ``tool_choice`` naming a function becomes ``"required"``
with only that tool offered, which has the same effect.

An answer cut by ``max_tokens`` (or by a content filter) is an answer, whatever the
``response_format``: its text comes back with ``finish_reason`` ``length`` (or
``content_filter``), as OpenAI's API returns it. The OpenAI SDK's structured-output
helpers, which ``ChatOpenAI`` uses whenever a ``response_format`` is set, raise
``LengthFinishReasonError`` instead; here they are used only for a response format
they must parse (a pydantic class), and their error becomes the answer it carries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
import openai
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, BaseMessageChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI

from gateway._wire import iter_chunks, open_chat
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

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        *,
        stream_usage: bool | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Stream over the gateway's pooled connection, parsing chunks as plain dicts.

        Same request and same chunks as ``ChatOpenAI._astream``, without the SDK's
        per-chunk object model. A ``response_format`` given as a dict (``json_object``,
        a ``json_schema``: what clients send) is one more request field here, so an
        answer cut by ``max_tokens`` ends like any other, with its ``finish_reason`` and
        usage. Only a response format the SDK must parse into an object (a pydantic
        class) keeps the SDK's path, which assembles and parses the final answer.
        """
        kwargs["stream"] = True
        if self._should_stream_usage(stream_usage, **kwargs):
            kwargs["stream_options"] = {"include_usage": True}
        payload = self._get_request_payload(messages, stop=stop, **kwargs)
        parsed_format = "response_format" in payload and not isinstance(payload["response_format"], dict)
        if self.http_async_client is None or parsed_format or self._use_responses_api(payload):
            try:
                async for generation in super()._astream(
                    messages, stop=stop, run_manager=run_manager, stream_usage=stream_usage, **kwargs
                ):
                    yield generation
            except openai.APIError as exc:
                raise self._translate(exc) from exc
            except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
                # Raised at the chunk that carries the finish reason: the text before it
                # has been streamed; end the stream as that chunk would have.
                if exc.completion is None:
                    raise
                final = self._last_chunk(exc.completion)
                if run_manager:
                    await run_manager.on_llm_new_token(final.text, chunk=final)
                yield final
            return
        api_key = self.openai_api_key.get_secret_value() if self.openai_api_key else "not-needed"
        response = await open_chat(
            self.http_async_client, self.backend_id, str(self.openai_api_base), api_key, payload
        )
        chunk_class: type[BaseMessageChunk] = AIMessageChunk
        async with aclosing(iter_chunks(response, self.backend_id)) as chunks:
            async for chunk in chunks:
                generation = self._convert_chunk_to_generation_chunk(chunk, chunk_class, {})
                if generation is None:
                    continue
                chunk_class = generation.message.__class__
                if run_manager:
                    logprobs = (generation.generation_info or {}).get("logprobs")
                    await run_manager.on_llm_new_token(generation.text, chunk=generation, logprobs=logprobs)
                yield generation

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        try:
            return await super()._agenerate(*args, **kwargs)
        except openai.APIError as exc:
            raise self._translate(exc) from exc
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            # ``ChatOpenAI`` asks for any ``response_format`` through the SDK's
            # ``parse``, which refuses an answer cut short; the whole completion, usage
            # included, is in the error.
            if exc.completion is None:
                raise
            return self._create_chat_result(exc.completion)

    def _last_chunk(self, completion: openai.BaseModel) -> ChatGenerationChunk:
        """The closing chunk of a stream the SDK cut off at its finish reason: no new
        text, the finish reason, and usage if the backend had sent it."""
        result = self._create_chat_result(completion)
        generation = result.generations[0]
        usage = generation.message.usage_metadata if isinstance(generation.message, AIMessage) else None
        info = {**(result.llm_output or {}), **(generation.generation_info or {})}
        info.pop("token_usage", None)
        return ChatGenerationChunk(message=AIMessageChunk(content="", usage_metadata=usage), generation_info=info)


class LlamaCppChatModel(GatewayChatModel):
    """``ChatOpenAI`` for llama.cpp's ``llama-server``.

    Rewrites a named-function ``tool_choice`` (unsupported by llama.cpp) into
    ``"required"`` over just that tool, and always streams from the server, even
    for a caller that wants the whole answer: llama-server stops generating when a
    streamed request's client goes away, but not a non-streamed one, so a cancelled
    run would otherwise leave the backend generating to its token limit.
    """

    streaming: bool = True

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
        "max_tokens": backend.default_max_tokens,
        **overrides,
    }
    if cls is LlamaCppChatModel:
        params.setdefault("streaming", True)
    if http_async_client is not None:
        params["http_async_client"] = http_async_client
    return cls(**params)
