"""The chat model graphs call: one per alias, routed per call.

A graph's builder receives `RoutedChatModel` for its alias. It holds no backend: each
call asks the gateway which backends to try (weights, the sticky key, capability
contracts, circuit breakers), then streams from the first one that produces a first
token through that backend's own chat model (`gateway.chat`). A registry reload or an
opened breaker therefore applies to the next model call of every graph, with no
rebuild.

The run's routing (`gateway.balancer.RouteScope`: its sticky key, and where the
backends that served it are recorded) travels in the LangChain run config, under
``configurable[ROUTE_SCOPE]``, which LangGraph hands down to every node and model
call. Without one, the thread id in the config is the sticky key; without that, the
choice is random.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import agenerate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import RunnableConfig, var_child_runnable_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from gateway.balancer import RouteScope
from gateway.registry import Backend

__all__ = ["ROUTE_SCOPE", "RoutedChatModel", "current_scope"]

ROUTE_SCOPE = "__switchyard_route_scope"
"""The ``configurable`` key of a run's `RouteScope` (double underscore: LangGraph
keeps such keys out of checkpoint metadata)."""


_SCOPE_KWARG = "switchyard_route_scope"
"""The call keyword that carries a scope taken from a direct call's own config."""


def current_scope(config: RunnableConfig | None = None) -> RouteScope | None:
    """The routing of the run this call belongs to: from ``config`` when given, else
    from the LangChain run config of the graph node or chain making the call."""
    if config is None:
        config = var_child_runnable_config.get() or {}
    configurable = config.get("configurable") or {}
    scope = configurable.get(ROUTE_SCOPE)
    if isinstance(scope, RouteScope):
        return scope
    thread_id = configurable.get("thread_id")
    return RouteScope(key=str(thread_id)) if thread_id else None


def _request(messages: Sequence[BaseMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the capability contract is checked against: the bound call fields and
    the prompt's messages."""
    return {**kwargs, "messages": messages}


def _is_token(chunk: ChatGenerationChunk) -> bool:
    """Whether a chunk carries part of the answer, not just the opening role."""
    message = chunk.message
    if message.content or (chunk.generation_info or {}).get("finish_reason"):
        return True
    if isinstance(message, AIMessageChunk) and (message.tool_call_chunks or message.usage_metadata):
        return True
    return bool(message.additional_kwargs or message.response_metadata.get("finish_reason"))


class RoutedChatModel(BaseChatModel):
    """A chat model for an alias whose backend is chosen by the gateway at each call.

    Tools are bound as ``ChatOpenAI`` binds them (OpenAI function schemas); sampling
    parameters bound with ``.bind(...)`` reach the chosen backend's request.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    alias: str
    """The model alias."""
    gateway: Any = Field(exclude=True, repr=False)
    """The `gateway.ModelGateway` that chooses (typed loosely: it imports this module)."""

    @property
    def _llm_type(self) -> str:
        return "switchyard-routed"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"alias": self.alias}

    def _backend_model(self, backend: Backend) -> BaseChatModel:
        model: BaseChatModel = self.gateway.backend_chat_model(backend)
        return model

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Stream from the first backend that produces a first chunk; a failure before
        it is retried on the next backend, a failure after it is raised."""

        scope = kwargs.pop(_SCOPE_KWARG, None) or current_scope()

        def start(backend: Backend) -> AsyncIterator[ChatGenerationChunk]:
            return self._backend_model(backend)._astream(messages, stop=stop, run_manager=run_manager, **kwargs)

        alias = scope.aliases.get(self.alias, self.alias) if scope is not None else self.alias
        async for chunk in self.gateway.routed(alias, scope, _request(messages, kwargs), start, _is_token):
            yield chunk

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """A whole answer, streamed from the backend and assembled: the same retry
        before the first token as `_astream`, and a cancelled call stops the backend's
        generation (a server stops generating when a streaming client goes away)."""
        return await agenerate_from_stream(self._astream(messages, stop=stop, run_manager=run_manager, **kwargs))

    @staticmethod
    def _scoped(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with the scope of a call's own ``config`` (a direct call outside a
        graph, which LangChain does not make the current run config)."""
        if config and (scope := current_scope(config)) is not None:
            return {**kwargs, _SCOPE_KWARG: scope}
        return kwargs

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AIMessage:
        return await super().ainvoke(input, config, stop=stop, **self._scoped(config, kwargs))

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        async for chunk in super().astream(input, config, stop=stop, **self._scoped(config, kwargs)):
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("Switchyard's chat models are async: use ainvoke/astream")

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise NotImplementedError("Switchyard's chat models are async: use ainvoke/astream")

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as OpenAI function schemas; ``tool_choice`` may name a tool,
        ``auto``, ``none``, ``required`` (``any`` and ``True`` mean ``required``)."""
        formatted = [convert_to_openai_tool(tool, strict=strict) for tool in tools]
        names = {tool["function"]["name"] for tool in formatted if "function" in tool}
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        if tool_choice:
            if tool_choice is True or tool_choice == "any":
                tool_choice = "required"
            elif isinstance(tool_choice, str) and tool_choice in names:
                tool_choice = {"type": "function", "function": {"name": tool_choice}}
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)
