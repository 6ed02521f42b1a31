"""The chat-completions service: one request in, one answer or a chunk stream out.

``model`` names either a graph (the request runs through LangGraph and its events are
encoded as chunks) or a model alias (the request is relayed through the gateway to
the alias's backend). Both paths produce the same chunk stream shape, OpenAI's: role in
the first chunk, ``finish_reason`` in the last chunk with choices; with
``stream_options.include_usage``, every chunk carries ``"usage": null`` except a final
one with empty ``choices`` that carries the usage, and without it no chunk has
``usage`` (counting usage from two chunks would double it, as LangChain's
``stream_usage`` does).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages
from langgraph.store.base import BaseStore

from gateway import ModelGateway, RouteScope
from graphs import (
    Citations,
    Finish,
    GraphEvent,
    GraphRegistry,
    OutputBlockedError,
    TextDelta,
    ToolCallDelta,
    ToolResult,
    message_events,
)
from graphs.events import Facts
from serving._tasks import RunDeadlineError
from serving.auth import Principal
from serving.errors import RequestError, ServingError
from serving.guardrails import OutputGuard
from serving.routing import AUTO_MODEL, SemanticRouter
from serving.runs import ActiveRun, RunChecks, RunHost, RunPlan
from serving.store import tenant_graph
from serving.openai.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    Citation,
    ChunkChoice,
    Delta,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    FactOut,
    MAX_EMBEDDING_INPUTS,
    ModelCard,
    ModelList,
    NULL_USAGE,
    ResponseMessage,
    ToolResultOut,
    Usage,
)

__all__ = ["ChatCompletionService"]

log = logging.getLogger(__name__)


def _to_langchain(messages: list[ChatMessage]) -> list[BaseMessage]:
    """OpenAI messages to LangChain messages; a message LangChain cannot take is a 400
    naming it (``messages.3``), not a 500."""
    converted: list[BaseMessage] = []
    for index, message in enumerate(messages):
        data = message.model_dump(exclude_none=True)
        data.setdefault("content", "")  # assistant turns that only carry tool_calls
        if message.role == "tool" and not message.tool_call_id:
            raise RequestError("a tool message needs tool_call_id", param=f"messages.{index}.tool_call_id")
        try:
            converted.extend(convert_to_messages([data]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RequestError(f"cannot use this message: {exc}", param=f"messages.{index}") from None
    return converted


def _usage(prompt: int, completion: int) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _wants_usage(request: ChatCompletionRequest) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)


def _embedding_inputs(value: Any) -> list[str]:
    """``input`` as a list of non-empty strings, or a 400 naming the bad part."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise RequestError("input must be a string or a list of strings", param="input")
    if not value:
        raise RequestError("input must not be empty", param="input")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise RequestError(f"input has {len(value)} items; at most {MAX_EMBEDDING_INPUTS} are allowed", param="input")
    for index, item in enumerate(value):
        if isinstance(item, (int, list)) and not isinstance(item, bool):
            raise RequestError("token arrays are not supported: send the text as strings", param=f"input.{index}")
        if not isinstance(item, str):
            raise RequestError(f"must be a string, got {type(item).__name__}", param=f"input.{index}")
        if not item:
            raise RequestError("must not be an empty string", param=f"input.{index}")
    return list(value)


class _ChunkEncoder:
    """Encodes one stream's chunks as JSON. Content deltas, the hot path, reuse a JSON
    template rendered once from the pydantic model.

    With ``include_usage`` every chunk says ``"usage": null`` (OpenAI's shape) and
    `usage` renders the final usage-only chunk; without it no chunk has ``usage``.
    """

    def __init__(self, completion_id: str, created: int, model: str, *, include_usage: bool) -> None:
        self.completion_id, self.created, self.model = completion_id, created, model
        self._context = {NULL_USAGE: include_usage}
        marker = "\x00"
        template = self.chunk(Delta(content=marker))
        self._before, self._after = template.split('"\\u0000"')

    def _dump(self, chunk: ChatCompletionChunk) -> str:
        return chunk.model_dump_json(context=self._context)

    def chunk(self, delta: Delta, finish_reason: str | None = None) -> str:
        return self._dump(
            ChatCompletionChunk(
                id=self.completion_id,
                created=self.created,
                model=self.model,
                choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)],
            )
        )

    def content(self, text: str) -> str:
        return self._before + json.dumps(text) + self._after

    def extension(self, **fields: Any) -> str:
        """A chunk with an empty delta carrying Switchyard's extension fields
        (``citations``, ``facts``, ``tool_results``)."""
        chunk = ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=[ChunkChoice(delta=Delta())], **fields
        )
        return self._dump(chunk)

    def usage(self, usage: Usage) -> str:
        """The last chunk of a stream that asked for usage: no choices, the usage."""
        chunk = ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=[], usage=usage
        )
        return self._dump(chunk)


_REASONING = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers put a reasoning model's thinking (llama.cpp and
vLLM: ``reasoning_content``; newer vLLM: ``reasoning``): text like the answer, checked
like it."""

_LOGPROB_FIELDS = ("logprobs", "top_logprobs")
"""Request fields asking for ``logprobs``. Their tokens are the answer's own text,
unchecked: under an output policy they are not asked for, and dropped if sent."""


def _alias_body(request: ChatCompletionRequest, guard: OutputGuard) -> dict[str, Any]:
    """The request as relayed to an alias's backend (unknown fields kept). With the
    output guard active, ``logprobs``/``top_logprobs`` are not forwarded: the tokens
    they list are the unredacted answer, which the guard cannot check token by token."""
    body = request.model_dump(exclude_none=True, exclude={"model", "stream", "stream_options", "metadata"})
    if guard.active:
        for field in _LOGPROB_FIELDS:
            body.pop(field, None)
    return body


def _guard_alias_chunk(chunk: dict[str, Any], guard: OutputGuard) -> dict[str, Any] | None:
    """A relayed chunk with each choice's content, reasoning and tool-call arguments
    checked, and its ``logprobs`` removed (``None``: nothing left to send yet). Raises
    `OutputBlockedError`."""
    choices = []
    for choice in chunk["choices"]:
        # logprobs list the answer's tokens unchecked: never relayed under a policy
        # (not asked for, see `_alias_body`; dropped if a backend sends them anyway).
        choice = {key: value for key, value in choice.items() if key != "logprobs"}
        delta = dict(choice.get("delta") or {})
        index = choice.get("index", 0)
        finish = choice.get("finish_reason")
        content = delta.get("content")
        if isinstance(content, str):
            content = guard.feed(index, content)
        texts: dict[str, str] = {}
        for field in _REASONING:
            text = delta.get(field)
            if isinstance(text, str):
                texts[field] = guard.feed((index, field), text)
        calls = _guard_alias_calls(delta.get("tool_calls"), index, guard)
        if finish:
            content = (content or "") + guard.flush(index)
            for field in _REASONING:
                if (index, field) in guard.pending():
                    texts[field] = texts.get(field, "") + guard.flush((index, field))
            calls = _flush_alias_calls(calls, index, guard)
        if isinstance(content, str):
            delta["content"] = content
        delta.update(texts)
        if calls is not None:
            delta["tool_calls"] = calls
        if isinstance(content, str) or calls is not None or texts:
            checked = {"content", "tool_calls", *_REASONING}
            empty = not content and not calls and not any(texts.values()) and not (set(delta) - checked)
            if empty and not finish:
                continue  # held back entirely
        choices.append({**choice, "delta": delta})
    return {**chunk, "choices": choices} if choices else None


def _tool_result(event: ToolResult, guard: OutputGuard) -> ToolResultOut:
    """Raises `OutputBlockedError`."""
    content = guard.check_value(event.content)
    return ToolResultOut(tool_call_id=event.tool_call_id, name=event.name, content=content, status=event.status)


def _citations(event: Citations, guard: OutputGuard) -> list[Citation]:
    """The sources as cited, their texts checked. Raises `OutputBlockedError`."""
    return [Citation(**c) for c in guard.check_value(event.sources)]


def _facts(event: Facts, guard: OutputGuard) -> list[FactOut]:
    """The facts as given to the model, their texts checked. Raises `OutputBlockedError`."""
    return [FactOut.model_validate(f) for f in guard.check_value(event.facts)]


def _flush_arguments(encoder: _ChunkEncoder, guard: OutputGuard, keys: list[Any]) -> Iterator[str]:
    """The held-back rest of streamed tool-call arguments (``("args", index)`` keys)."""
    for key in keys:
        if rest := guard.flush(key):
            call = {"index": key[1], "function": {"arguments": rest}}
            yield encoder.chunk(Delta(tool_calls=[call]))


def _guard_alias_calls(calls: Any, index: int, guard: OutputGuard) -> list[dict[str, Any]] | None:
    """A relayed delta's tool calls with their argument pieces checked (one stream per
    choice and call). Raises `OutputBlockedError`."""
    if not isinstance(calls, list):
        return None
    checked = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            key = (index, "args", call.get("index", 0))
            if call.get("id") and key in guard.pending():  # a new call at this index
                checked.append({"index": key[2], "function": {"arguments": guard.flush(key)}})
            call = {**call, "function": {**function, "arguments": guard.feed(key, arguments)}}
            if not call["function"]["arguments"] and set(call) <= {"index", "function"} and set(function) == {"arguments"}:
                continue  # held back entirely
        checked.append(call)
    return checked


def _flush_alias_calls(calls: list[dict[str, Any]] | None, index: int, guard: OutputGuard) -> list[dict[str, Any]] | None:
    """``calls`` plus the held-back rest of choice ``index``'s tool-call arguments."""
    for key in guard.pending():
        if isinstance(key, tuple) and len(key) == 3 and key[0] == index and key[1] == "args" and (rest := guard.flush(key)):
            calls = [*(calls or []), {"index": key[2], "function": {"arguments": rest}}]
    return calls


def _check_alias_answer(answer: dict[str, Any], guard: OutputGuard) -> None:
    """Check each choice's content, reasoning and tool-call arguments of a relayed
    whole answer, and remove its ``logprobs`` (see `_guard_alias_chunk`), in place."""
    for choice in answer.get("choices") or []:
        choice.pop("logprobs", None)
        message = choice.get("message") or {}
        content = message.get("content")
        index = choice.get("index", 0)
        try:
            if isinstance(content, str):
                message["content"] = guard.feed(index, content) + guard.flush(index)
            for field in _REASONING:
                if isinstance(message.get(field), str):
                    message[field] = guard.check_value(message[field])
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                if isinstance(function.get("arguments"), str):
                    function["arguments"] = guard.check_value(function["arguments"])
        except OutputBlockedError as exc:
            message.update(content=str(exc), tool_calls=None)
            for field in _REASONING:
                message.pop(field, None)
            choice["finish_reason"] = "content_filter"


def _has_output(chunk: dict[str, Any]) -> bool:
    """Whether a relayed chunk carries text (an answer's or its reasoning's) or a tool
    call, not only the role."""
    for choice in chunk.get("choices") or ():
        delta = (choice.get("delta") or {}) if isinstance(choice, dict) else {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


def _relayed(chunk: dict[str, Any], include_usage: bool) -> str:
    """A relayed chunk with choices, as sent: ``"usage": null`` if the client asked for
    usage (it comes on the last chunk), no ``usage`` if not."""
    return json.dumps({**chunk, "usage": None} if include_usage else chunk)


def _content_filter_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    choices = [{"index": c.get("index", 0), "delta": {}, "finish_reason": "content_filter"} for c in chunk["choices"]]
    return {**chunk, "choices": choices}


class ChatCompletionService:
    """Serves ``/v1/chat/completions`` and ``/v1/models`` from the platform's graphs
    and model aliases; every run goes through the `RunHost`."""

    def __init__(
        self,
        gateway: ModelGateway,
        graphs: GraphRegistry,
        host: RunHost,
        checks: RunChecks,
        *,
        store: BaseStore | None = None,
        router: SemanticRouter | None = None,
    ) -> None:
        """Args:
            store: the server's LangGraph store; a graph run's nodes get their tenant's
                view of it as ``runtime.store`` (`serving.store.tenant_graph`).
            router: the routes that serve ``model: "auto"`` (`serving.routing`).
        """
        self._router = router
        self._store = store
        self._gateway = gateway
        self._graphs = graphs
        self._host = host
        self._checks = checks

    def models(self, principal: Principal) -> ModelList:
        """Graphs first (``auto`` when routes are configured), then model aliases, those
        the caller may use."""
        allowed = principal.settings
        cards = [ModelCard(id=g, owned_by="switchyard-graph") for g in self._graphs.ids() if allowed.allows_graph(g)]
        if self._router is not None and self._router.enabled:
            cards.insert(0, ModelCard(id=AUTO_MODEL, owned_by="switchyard-router"))
        cards += [
            ModelCard(id=a, owned_by="switchyard-alias") for a in self._gateway.registry.aliases if allowed.allows_model(a)
        ]
        return ModelList(data=cards)

    async def embeddings(self, request: EmbeddingRequest, principal: Principal) -> EmbeddingList:
        """``/v1/embeddings`` through an alias whose backend declares ``embeddings``;
        the tenant's allowed models apply as on chat completions."""
        texts = _embedding_inputs(request.input)
        if request.model in self._graphs:
            raise RequestError(
                f"model {request.model!r} is a graph; embeddings need a model alias whose backend serves embeddings",
                param="model", code="unsupported_capability",
            )
        backend = self._gateway.backend(request.model)  # raises UnknownModelError naming what exists
        if not principal.settings.allows_model(request.model):
            raise ServingError(403, f"tenant {principal.tenant!r} may not use model {request.model!r}")
        if not backend.capabilities.embeddings:
            raise RequestError(
                f"model {request.model!r} does not serve embeddings (its backend {backend.id!r} does not declare the embeddings capability)",
                param="model", code="unsupported_capability",
            )
        declared = backend.capabilities.embedding_dimensions
        if request.dimensions is not None and request.dimensions != declared:
            raise RequestError(
                f"model {request.model!r} cannot shorten its vectors: dimensions must be omitted"
                + (f" or equal {declared}" if declared else ""),
                param="dimensions", code="unsupported_capability",
            )
        vectors, prompt_tokens = await self._gateway.embed_with_usage(request.model, texts)
        if request.encoding_format == "base64":
            data = [
                Embedding(index=i, embedding=base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii"))
                for i, v in enumerate(vectors)
            ]
        else:
            data = [Embedding(index=i, embedding=v) for i, v in enumerate(vectors)]
        return EmbeddingList(
            data=data, model=request.model, usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        )

    async def _route(
        self, request: ChatCompletionRequest, principal: Principal, routing: RouteScope | None
    ) -> tuple[ChatCompletionRequest, RouteScope | None]:
        """A ``model: "auto"`` request as the graph its route chose (``metadata.task_type``
        if given, else the semantic router), the route's alias set on ``routing``;
        any other request as it is."""
        if request.model != AUTO_MODEL:
            return request, routing
        if self._router is None or not self._router.enabled:
            raise RequestError(
                "model 'auto' needs routes: the server has no routing section", param="model", code="routing_not_configured"
            )
        self._checks.messages(request.model_dump(include={"messages"})["messages"], principal, param="messages")
        task_type = (request.metadata or {}).get("task_type")
        decision = await self._router.decide(request.model_dump(include={"messages"})["messages"], task_type)
        routing = routing or RouteScope()
        routing.route = decision.route
        graph_alias = self._graphs.get(decision.graph).spec.model
        if decision.alias and decision.alias != graph_alias:
            routing.aliases[graph_alias] = decision.alias
        log.info("model auto: route %s (%s, score %s) -> graph %s", decision.route, decision.reason, decision.score, decision.graph)
        return request.model_copy(update={"model": decision.graph}), routing

    def _plan(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        principal: Principal,
        deadline_s: float | None,
        routing: RouteScope | None = None,
    ) -> tuple[RunPlan, list[BaseMessage]]:
        """Check the request (nothing is taken yet) and describe its run; for a graph,
        its messages as LangChain messages."""
        self._checks.messages(request.model_dump(include={"messages"})["messages"], principal, param="messages")
        messages: list[BaseMessage] = []
        if request.model in self._graphs:
            kind: Any = "graph"
            if request.n != 1:
                raise RequestError("a graph answers once: only n=1 is supported", param="n")
            if request.model_extra:
                log.info("graph run ignores request fields: %s", ", ".join(sorted(request.model_extra)))
            if request.tools:
                raise RequestError(
                    f"graph {request.model!r} brings its own tools; send client tools to a model alias instead",
                    param="tools",
                )
            dumped = request.model_dump(include={"messages"}, exclude_none=True)["messages"]
            alias = routing.aliases.get(self._graphs.get(request.model).spec.model) if routing else None
            self._checks.graph(request.model, principal, request.sampling_params(), dumped, alias=alias)
            messages = _to_langchain(request.messages)
        else:
            kind = "alias"
            self._gateway.registry.alias(request.model)  # raises UnknownModelError naming what exists
            if not principal.settings.allows_model(request.model):
                raise ServingError(403, f"tenant {principal.tenant!r} may not use model {request.model!r}")
            # No backend of the alias can take it: a 400 before a slot is taken.
            self._gateway.check_alias(
                request.model,
                request.model_dump(
                    exclude_none=True, include={"messages", "tools", "response_format", "max_tokens", "max_completion_tokens"}
                ),
            )
        plan = RunPlan(
            protocol="openai",
            kind=kind,
            target=request.model,
            principal=principal,
            request_id=request_id,
            run_id=f"chatcmpl-{uuid.uuid4().hex}",
            deadline_s=deadline_s,
            model_params=request.sampling_params(),
            collection=request.collection,
            attributes={"switchyard.stream": bool(request.stream)},
            routing=routing,
        )
        return plan, messages

    def _run_events(self, request: ChatCompletionRequest, messages: list[BaseMessage], run: ActiveRun) -> AsyncIterator[GraphEvent]:
        """Start the graph run for a request; its events, in the caller's task."""
        graph = tenant_graph(self._graphs.get(request.model).graph, self._store, run.plan.principal.tenant)
        stream = graph.astream(
            {"messages": messages},
            run.config({"callbacks": run.span.callbacks} if run.span.callbacks else None),
            context=run.context(),
            # `updates` only for graphs that report sources (citations): it costs ~2 ms a run.
            stream_mode=["messages", "updates"] if "sources" in graph.channels else ["messages"],
            version="v2",
        )
        return run.events(message_events(stream))

    # ---- streaming -------------------------------------------------------------------

    async def stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        principal: Principal,
        deadline_s: float | None = None,
        routing: RouteScope | None = None,
    ) -> AsyncIterator[str]:
        """The SSE ``data:`` payloads of a streamed answer, ending with ``[DONE]``.

        Raises before yielding anything if the request is invalid or the backend is
        down (callers turn that into a JSON error with its status); after the first
        payload, errors are the caller's to encode as a final error event.
        """
        request, routing = await self._route(request, principal, routing)
        plan, messages = self._plan(request, request_id, principal, deadline_s, routing)
        async with self._host.open(plan) as run:
            chunks = self._graph_chunks(request, messages, run) if plan.kind == "graph" else self._alias_chunks(request, run)
            async with aclosing(chunks) as payloads:
                async for payload in payloads:
                    yield payload
            yield "[DONE]"

    async def _graph_chunks(
        self, request: ChatCompletionRequest, messages: list[BaseMessage], run: ActiveRun
    ) -> AsyncIterator[str]:
        encoder = _ChunkEncoder(run.plan.run_id, int(time.time()), request.model, include_usage=_wants_usage(request))
        guard = run.guard
        role_sent = False
        async with aclosing(self._run_events(request, messages, run)) as events:
            try:
                async for event in events:
                    for chunk in self._encode(event, encoder, request, run, guard):
                        if not role_sent:
                            yield encoder.chunk(Delta(role="assistant", content=""))
                            role_sent = True
                        yield chunk
            except OutputBlockedError:
                # The run stops here (closing its events cancels it); nothing of the
                # blocked answer past what was already safe has been sent.
                if not role_sent:
                    yield encoder.chunk(Delta(role="assistant", content=""))
                yield encoder.chunk(Delta(), finish_reason="content_filter")

    @staticmethod
    def _encode(
        event: GraphEvent, encoder: _ChunkEncoder, request: ChatCompletionRequest, run: ActiveRun, guard: OutputGuard
    ) -> Iterator[str]:
        """The payloads of one event (a plain generator: no await per token).

        Raises:
            OutputBlockedError: the output check blocked the answer.
        """
        # Time to first token: the first text or tool call the model streams, not the
        # role chunk or a retrieval graph's citations, which go out before it answers.
        if isinstance(event, TextDelta):
            text = guard.feed(0, event.text)
            if text:
                if not run.first_at:
                    run.token()
                yield encoder.content(text)
            return
        if isinstance(event, ToolCallDelta):
            key = ("args", event.index)
            if event.id and key in guard.pending():  # a new call at this index: the last one ended
                yield from _flush_arguments(encoder, guard, [key])
            arguments = guard.feed(key, event.arguments)
            if not (arguments or event.id or event.name):
                return  # held back entirely
            call: dict[str, Any] = {"index": event.index, "function": {"arguments": arguments}}
            if event.id:
                call.update(id=event.id, type="function")
            if event.name:
                call["function"]["name"] = event.name
            if not run.first_at:
                run.token()
            yield encoder.chunk(Delta(tool_calls=[call]))
            return
        # Any other event comes after the model's message has ended: the rest of its
        # tool calls' arguments goes out first.
        yield from _flush_arguments(encoder, guard, [k for k in guard.pending() if isinstance(k, tuple)])
        if isinstance(event, ToolResult):
            yield encoder.extension(tool_results=[_tool_result(event, guard)])
        elif isinstance(event, Citations):
            yield encoder.extension(citations=_citations(event, guard))
        elif isinstance(event, Facts):
            yield encoder.extension(facts=_facts(event, guard))
        elif isinstance(event, Finish):
            if rest := guard.flush(0):
                if not run.first_at:
                    run.token()  # all of the text was held back by the output check until now
                yield encoder.content(rest)
            run.tokens = event.completion_tokens
            yield encoder.chunk(Delta(), finish_reason=event.reason)
            if _wants_usage(request):
                yield encoder.usage(_usage(event.prompt_tokens, event.completion_tokens))

    async def _alias_chunks(self, request: ChatCompletionRequest, run: ActiveRun) -> AsyncIterator[str]:
        body = _alias_body(request, run.guard)
        include_usage = _wants_usage(request)
        guard = run.guard
        # The gateway always asks the backend for usage, and backends differ in where
        # they put it: a usage-only chunk at the end (OpenAI), also on the finish chunk
        # (some llama.cpp versions), on every chunk (vLLM's continuous usage stats).
        # Each relayed chunk is normalised: its usage is taken off (``null`` if the
        # client asked for usage, absent if not) and the last one seen goes out once,
        # on a final chunk with empty choices, if the client asked.
        usage: Any = None
        last: dict[str, Any] | None = None
        async with aclosing(run.events(self._gateway.stream_chat(request.model, body, run.routing))) as chunks:
            async for chunk in chunks:
                usage = chunk.pop("usage", None) or usage
                if not chunk.get("choices"):
                    last = chunk  # the usage-only chunk: sent last, below
                    continue
                if guard.active:
                    try:
                        checked = _guard_alias_chunk(chunk, guard)
                    except OutputBlockedError:
                        yield _relayed(_content_filter_chunk(chunk), include_usage)
                        return  # closing the relay closes the backend's stream
                    if checked is None:
                        continue
                    chunk = checked
                if not run.first_at and _has_output(chunk):
                    run.token()
                yield _relayed(chunk, include_usage)
                last = chunk
        if usage:
            run.tokens = int(usage.get("completion_tokens", 0))
            if include_usage and last is not None:
                yield json.dumps({**last, "choices": [], "usage": usage})

    # ---- whole answers ---------------------------------------------------------------

    async def complete(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        principal: Principal,
        deadline_s: float | None = None,
        routing: RouteScope | None = None,
    ) -> ChatCompletion | dict[str, Any]:
        """A whole answer (``stream: false``)."""
        request, routing = await self._route(request, principal, routing)
        plan, messages = self._plan(request, request_id, principal, deadline_s, routing)
        async with self._host.open(plan) as run:
            if plan.kind == "alias":
                body = _alias_body(request, run.guard)
                try:
                    answer: ChatCompletion | dict[str, Any] = await asyncio.wait_for(
                        self._gateway.complete_chat(request.model, body, run.routing), deadline_s
                    )
                except TimeoutError:
                    raise RunDeadlineError(deadline_s or 0) from None
                run.tokens = int((answer.get("usage") or {}).get("completion_tokens", 0))
                if run.guard.active:
                    _check_alias_answer(answer, run.guard)
            else:
                answer = await self._complete_graph(request, messages, run)
                run.tokens = answer.usage.completion_tokens if answer.usage else 0
            return answer

    async def _complete_graph(self, request: ChatCompletionRequest, messages: list[BaseMessage], run: ActiveRun) -> ChatCompletion:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish = Finish(reason="stop", prompt_tokens=0, completion_tokens=0)
        citations: list[Citation] | None = None
        tool_results: list[ToolResultOut] = []
        sources: list[dict[str, Any]] | None = None
        facts: list[FactOut] | None = None
        found: list[dict[str, Any]] | None = None
        results: list[ToolResult] = []
        async with aclosing(self._run_events(request, messages, run)) as events:
            async for event in events:
                if isinstance(event, Citations):
                    sources = event.sources
                elif isinstance(event, Facts):
                    found = event.facts
                elif isinstance(event, ToolResult):
                    results.append(event)
                elif isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    call = calls.setdefault(
                        event.index, {"id": event.id, "type": "function", "function": {"name": event.name, "arguments": ""}}
                    )
                    call["id"] = call["id"] or event.id
                    call["function"]["name"] = call["function"]["name"] or event.name
                    call["function"]["arguments"] += event.arguments
                elif isinstance(event, Finish):
                    finish = event
        content = "".join(text)
        reason = finish.reason
        guard = run.guard
        try:
            content = guard.feed(0, content) + guard.flush(0)
            for call in calls.values():
                call["function"]["arguments"] = guard.check_value(call["function"]["arguments"])
            citations = _citations(Citations(sources=sources), guard) if sources is not None else None
            facts = _facts(Facts(facts=found), guard) if found is not None else None
            tool_results = [_tool_result(result, guard) for result in results]
        except OutputBlockedError as exc:
            content, reason, calls, citations, facts, tool_results = str(exc), "content_filter", {}, None, None, []
        message = ResponseMessage(content=content or None, tool_calls=[calls[i] for i in sorted(calls)] or None)
        return ChatCompletion(
            id=run.plan.run_id,
            created=int(time.time()),
            model=request.model,
            choices=[Choice(message=message, finish_reason=reason)],
            usage=_usage(finish.prompt_tokens, finish.completion_tokens),
            citations=citations,
            facts=facts,
            tool_results=tool_results or None,
        )
