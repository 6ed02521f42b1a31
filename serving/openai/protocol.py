"""Wire models of the OpenAI chat-completions protocol (the subset Switchyard serves).

Requests accept unknown fields (newer clients send more than we know) and the service
logs them; responses are exactly the OpenAI shapes, which the official ``openai``
client parses in the tests.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from serving._json import json_problem

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Choice",
    "ChunkChoice",
    "Delta",
    "Embedding",
    "EmbeddingList",
    "EmbeddingRequest",
    "EmbeddingUsage",
    "ErrorBody",
    "ErrorResponse",
    "MAX_EMBEDDING_INPUTS",
    "ModelCard",
    "ModelList",
    "NULL_USAGE",
    "ResponseMessage",
    "StreamOptions",
    "Usage",
]

NULL_USAGE = "null_usage"
"""Serialization context key of `ChatCompletionChunk`: true when the client asked for
``stream_options.include_usage``, so chunks without usage say ``"usage": null``."""

# Sampling fields a graph run forwards to its model call (through the run context).
SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "response_format")


class OpenAIBaseModel(BaseModel):
    """Base of request models: unknown fields are kept (and logged by the service)."""

    model_config = ConfigDict(extra="allow")


class ChatMessage(OpenAIBaseModel):
    """One message of the conversation sent by the client."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """Text, or content parts (``[{"type": "text", "text": ...}]``)."""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """On assistant messages: the calls the model made earlier."""
    tool_call_id: str | None = None
    """On tool messages: which call this answers."""


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    """Send a last chunk with empty ``choices`` and the ``usage``; every other chunk then
    says ``"usage": null``. Without it no chunk carries ``usage``."""


class ChatCompletionRequest(OpenAIBaseModel):
    """``POST /v1/chat/completions``."""

    model: str
    """A graph id (``chat``) or a model alias (``chat-default``), as ``GET /v1/models`` lists."""
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    """Request tags (OpenAI's field). ``metadata.task_type`` picks the route of a
    ``model: "auto"`` request explicitly; not sent on to a backend."""
    collection: str | None = Field(default=None, min_length=1, max_length=64)
    """Switchyard extension, for retrieval graphs (``rag``): the knowledge collection to
    search (default: ``knowledge.default_collection``)."""

    @model_validator(mode="after")
    def _storable(self) -> ChatCompletionRequest:
        # A lone surrogate or a 70-bit seed cannot be sent to a backend as JSON: refused
        # here, naming where it is.
        problem = json_problem({name: getattr(self, name) for name in self.model_fields_set})
        if problem is not None:
            raise ValueError(problem)
        return self

    def completion_limit(self) -> int | None:
        """``max_completion_tokens``, or the legacy ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def sampling_params(self) -> dict[str, Any]:
        """The parameters a graph binds onto its model call."""
        params = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        if (limit := self.completion_limit()) is not None:
            params["max_tokens"] = limit
        return params


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Citation(BaseModel):
    """A source a retrieval graph gave the model: ``[index]`` in the answer."""

    index: int
    doc_id: str
    chunk_id: str
    title: str | None = None
    source: str = ""
    heading: str = ""
    text: str
    relevance: float
    """Cosine similarity of the chunk to the question."""


class FactOut(BaseModel):
    """A knowledge-graph fact a retrieval graph gave the model (the ``graphrag`` graph):
    ``subject RELATION object``, with the sources that state it."""

    text: str
    """The fact as the model read it: ``Separation Certificate (Document) ISSUED_BY
    Labour Arbitration Office (Office)``."""
    subject: str
    relation: str
    object: str
    subject_type: str
    object_type: str
    hops: int
    """Distance from the question's nearest linked entity (1: it touches one)."""
    score: float
    """The graph retrieval's ranking score (higher first)."""
    doc_id: str | None
    """The first document that states it."""
    doc_ids: list[str]
    chunk_ids: list[str]
    cited_as: list[int]
    """The ``index`` of each citation (source chunk) that states it: ``[n]`` in the answer."""


class ToolResultOut(BaseModel):
    """What a tool call the graph executed (or refused) returned to the model."""

    tool_call_id: str
    name: str
    content: str
    status: str
    """``success``, or ``error`` (refused, timed out, failed)."""


class ChatCompletion(BaseModel):
    """A whole (non-streamed) answer."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    citations: list[Citation] | None = None
    """Switchyard extension: the sources of a retrieval graph's answer, numbered as the
    answer cites them (absent for other graphs and aliases)."""
    facts: list[FactOut] | None = None
    """Switchyard extension: the knowledge-graph facts the answer was given (``graphrag``),
    each naming the citations that state it (absent for other graphs and aliases)."""
    tool_results: list[ToolResultOut] | None = None
    """Switchyard extension: the results of the tools a graph executed, in order
    (absent when none ran). The model's calls are in ``message.tool_calls``."""

    @model_serializer(mode="wrap")
    def _drop_no_citations(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("citations", "facts", "tool_results"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class Delta(BaseModel):
    """What a chunk adds to the answer; only the fields it carries are sent."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    """One streamed piece of an answer."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    """Only on the last chunk (empty ``choices``), and only if the client asked for
    ``stream_options.include_usage``; then ``null`` on every other chunk, omitted if not
    asked (serialize with the `NULL_USAGE` context key)."""
    citations: list[Citation] | None = None
    """Switchyard extension: a retrieval graph's sources, on one chunk (empty delta)
    sent before the answer's first token (omitted elsewhere)."""
    facts: list[FactOut] | None = None
    """Switchyard extension: the ``graphrag`` graph's facts, on one chunk (empty delta)
    right after the citations' (omitted elsewhere)."""
    tool_results: list[ToolResultOut] | None = None
    """Switchyard extension: a tool result, on its own chunk (empty delta) right after
    the tool ran; the calls themselves stream as ``delta.tool_calls``."""

    @model_serializer(mode="wrap")
    def _drop_empty_fields(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        null_usage = bool(info.context and info.context.get(NULL_USAGE))
        for key in ("citations", "facts", "tool_results") if null_usage else ("usage", "citations", "facts", "tool_results"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class ModelCard(BaseModel):
    """An entry of ``GET /v1/models``: a graph or a model alias."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str
    """``switchyard-graph`` for graphs, ``switchyard-alias`` for model aliases."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody


class EmbeddingRequest(OpenAIBaseModel):
    """``POST /v1/embeddings``. ``input`` is checked by the service, so that a bad item
    is a 400 naming it (``input.3``); token-array inputs are refused."""

    model: str
    input: Any
    """One string, or a list of strings (at most `MAX_EMBEDDING_INPUTS`)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    """Accepted only when it equals the backend's declared ``embedding_dimensions``."""
    user: str | None = None
    """Ignored."""


MAX_EMBEDDING_INPUTS = 2048
"""OpenAI's limit on the number of inputs of one embeddings request."""


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    """Floats, or with ``encoding_format: base64`` their little-endian float32 bytes."""


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
