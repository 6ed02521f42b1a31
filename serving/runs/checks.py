"""The checks every run request passes before it takes anything.

Both protocols call `RunChecks.check` with what their request asks for; it refuses a
graph the tenant may not use, sampling parameters the graph's model backend cannot
serve (its capability contract), and input the input filter blocks, in every form a
message can take. Nothing here awaits: a refused request holds no slot, no thread
and no run record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway import ModelGateway
from graphs import GraphRegistry
from serving.auth import Principal
from serving.errors import RequestError, ServingError
from serving._json import INT64, json_problem
from serving.guardrails import Guardrails, message_texts

__all__ = ["RunChecks", "SamplingParams", "json_problem", "parse_sampling", "run_messages"]



class SamplingParams(BaseModel):
    """Sampling parameters a client may set for a graph's model calls (the LangGraph
    API's ``context.model_params``; the OpenAI API has them as request fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = Field(default=None, max_length=16)
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def as_params(self) -> dict[str, Any]:
        """The set parameters, ``max_completion_tokens`` as ``max_tokens`` (what the
        chat models bind)."""
        params = self.model_dump(exclude_none=True)
        if (limit := params.pop("max_completion_tokens", None)) is not None:
            params["max_tokens"] = limit
        return params


def parse_sampling(params: Any, *, param: str) -> dict[str, Any]:
    """A client's sampling parameters, checked.

    Raises:
        RequestError: naming the first wrong field (``model`` in particular: a graph
            run's model is the graph's, never the client's).
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise RequestError(f"{param} must be an object", param=param)
    if "model" in params:
        raise RequestError(
            "a graph's runs use the graph's model; it cannot be changed per request", param=f"{param}.model"
        )
    try:
        return SamplingParams.model_validate(params).as_params()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in (param, *first["loc"]))
        raise RequestError(f"{where}: {first['msg']}", param=where) from None


def run_messages(value: Any, *, param: str) -> list[BaseMessage]:
    """Messages in any form LangGraph's ``add_messages`` takes (one or a list of:
    message dicts, ``[role, content]`` pairs, strings, message objects), as
    LangChain messages.

    Raises:
        RequestError: naming the message that is not a message.
    """
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    converted: list[BaseMessage] = []
    for index, item in enumerate(items):
        where = f"{param}.{index}" if isinstance(value, list) else param
        if isinstance(item, (int, float, bool)) or item is None:
            raise RequestError(f"{where} is not a message: {type(item).__name__}", param=where)
        try:
            converted.extend(convert_to_messages([item]))
        except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
            raise RequestError(f"{where} is not a message: {exc}", param=where) from None
    return converted


class RunChecks:
    """The one validation of run requests, for both protocols."""

    def __init__(self, gateway: ModelGateway, graphs: GraphRegistry, guardrails: Guardrails) -> None:
        self._gateway = gateway
        self._graphs = graphs
        self._guardrails = guardrails

    def graph(
        self,
        graph_id: str,
        principal: Principal,
        model_params: Mapping[str, Any],
        messages: Iterable[Any] = (),
        *,
        alias: str | None = None,
    ) -> None:
        """A run of graph ``graph_id`` with these sampling parameters.

        Raises:
            ServingError: 403 for a graph the tenant may not use.
            CapabilityError: no backend of the graph's model alias can serve the
                parameters (``max_tokens`` past its context window, ``json_schema``
                output on a backend without it) or the prompt ``messages`` (OpenAI
                dicts), which are longer than every such backend's context window.
                ``alias`` replaces the graph's own (a route chose it).
        """
        if not principal.settings.allows_graph(graph_id):
            raise ServingError(403, f"tenant {principal.tenant!r} may not use graph {graph_id!r}")
        request = dict(model_params)
        if messages:
            request["messages"] = list(messages)
        self._gateway.check_alias(alias or self._graphs.get(graph_id).spec.model, request)

    def input(self, texts: Iterable[str], principal: Principal, *, param: str) -> None:
        """The input filter over the texts a run would send to a model.

        Raises:
            RequestError: naming the blocked term and its list.
        """
        self._guardrails.check_input(texts, principal, param=param)

    def messages(self, messages: Iterable[Any], principal: Principal, *, param: str) -> None:
        """The input filter over messages (objects or dicts)."""
        self.input(message_texts(messages), principal, param=param)
