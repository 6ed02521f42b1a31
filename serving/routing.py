"""Routing rules behind ``model: "auto"``: a request to a graph and a model alias.

A ``routing:`` section of ``config/switchyard.yaml`` names routes; each route points at
a graph (and optionally an alias other than the graph's own model) and carries example
utterances and task types::

    routing:
      default: chitchat          # used when nothing else decides
      threshold: 0.35            # cosine similarity below which the default is used
      routes:
        math:
          graph: agent
          description: Arithmetic and unit conversions (the agent has a calculator).
          task_types: [calculation]
          examples: ["What is 17 times 23?", "把 5 英里换算成公里"]
        docs:
          graph: rag
          examples: ["What does our travel policy say about hotels?", "根据文档，报销流程是什么？"]
        chitchat:
          graph: chat
          alias: chat-small      # default: the graph's own model alias
          examples: ["Hi, how are you?", "你好，最近怎么样？"]

`SemanticRouter` decides per request, in this order:

1. an explicit ``metadata.task_type``: the route whose ``task_types`` lists it, or whose
   name it is, wins; a task type no route knows is a 400 naming ``metadata.task_type``;
2. otherwise the text of the last user message is embedded (the knowledge layer's
   `Embedder`) and compared with every route's examples by cosine similarity; a route
   scores the best similarity among its examples, and the best route wins;
3. a best score below ``threshold``, an empty last user message, or no user message at
   all picks the ``default`` route.

The examples are embedded once (`SemanticRouter.prepare`); a decision costs one text
embedding and a matrix-vector product (``bench/routing.py`` measures it), and decisions
that arrive together share one embedding batch.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from knowledge.embeddings.base import Embedder
from knowledge.embeddings.local import LocalEmbedder
from knowledge.errors import EmbeddingError
from serving.errors import RequestError

__all__ = [
    "AUTO_MODEL",
    "RouteDecision",
    "RouteSpec",
    "RoutingConfigError",
    "RoutingSettings",
    "SemanticRouter",
    "last_user_text",
    "packaged_embedder",
]

AUTO_MODEL = "auto"
"""The ``model`` (OpenAI API) or ``assistant_id`` value that asks for a routed answer."""

MAX_EXAMPLES_PER_ROUTE = 200
"""Example utterances one route may carry (all are embedded at start and compared on
every decision)."""
MAX_EXAMPLE_CHARS = 500
"""An example utterance's length limit: examples are short, typical requests."""
MAX_EXAMPLES_TOTAL = 2000
"""Examples over all routes together."""

_ROUTE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
"""Route names are spelled like graph ids (`graphs.registry`): they go into the
``x-switchyard-route`` header and metric labels."""
_TASK_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")

Reason = Literal["task_type", "semantic", "default"]


class RoutingConfigError(ValueError):
    """The routing table names graphs or aliases that do not exist (`SemanticRouter.check`).

    Attributes:
        problems: one ``"routing.routes.<name>.<field>: message"`` line per problem.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid routing table: " + "; ".join(problems))


class RouteSpec(BaseModel):
    """One entry under ``routing.routes``: where a routed request goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    graph: str
    """The graph id (a key of ``graphs:``) that answers requests on this route."""
    alias: str | None = None
    """The model alias the graph calls for these requests; None: the graph's own
    ``model`` from its ``graphs:`` entry."""
    description: str = ""
    """What the route is for (shown to operators; not used for the decision)."""
    examples: tuple[str, ...] = ()
    """Example utterances: requests whose last user message is close to one of them
    take this route. Write them in every language the route must understand."""
    task_types: tuple[str, ...] = ()
    """Values of ``metadata.task_type`` that pick this route outright (the route's name
    always does too)."""

    @field_validator("examples")
    @classmethod
    def _sane_examples(cls, examples: tuple[str, ...]) -> tuple[str, ...]:
        if len(examples) > MAX_EXAMPLES_PER_ROUTE:
            raise ValueError(f"at most {MAX_EXAMPLES_PER_ROUTE} examples per route, got {len(examples)}")
        cleaned: list[str] = []
        for number, example in enumerate(examples):
            text = example.strip()
            if not text:
                raise ValueError(f"example {number} is empty")
            if len(text) > MAX_EXAMPLE_CHARS:
                raise ValueError(f"example {number} is {len(text)} characters long (at most {MAX_EXAMPLE_CHARS})")
            if text in cleaned:
                raise ValueError(f"example {number} repeats an earlier one: {text!r}")
            cleaned.append(text)
        return tuple(cleaned)

    @field_validator("task_types")
    @classmethod
    def _task_type_names(cls, task_types: tuple[str, ...]) -> tuple[str, ...]:
        for task_type in task_types:
            if not _TASK_TYPE.match(task_type):
                raise ValueError(
                    f"task type {task_type!r}: use letters, digits, '_', '.', ':' or '-' (1 to 64 characters, "
                    "starting with a letter or digit)"
                )
        if len(set(task_types)) != len(task_types):
            raise ValueError("task types repeat")
        return task_types


class RoutingSettings(BaseModel):
    """The ``routing:`` section: routes for ``model: "auto"``. No routes: ``auto`` is
    not served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    routes: dict[str, RouteSpec] = Field(default_factory=dict)
    """Route name -> where it goes (names spelled like graph ids)."""
    default: str | None = None
    """The route taken when no task type is given and no route's examples are close
    enough (or the last user message is empty). Required when ``routes`` is not empty."""
    threshold: float = Field(default=0.35, ge=0.0, le=1.0)
    """Cosine similarity (0..1) the best example must reach for its route to win;
    below it the default route is used. The scale is the embedder's: with the packaged
    ``use-multilingual-v3``, requests that belong to a route scored 0.33 to 0.75 against
    its closest example and unrelated requests 0.16 to 0.37 (19 of 20 under 0.35;
    ``tests/serving/test_routing.py``), so 0.5 would send about four in ten routable
    requests to the default. Re-measure when the embedder changes."""
    max_chars: int = Field(default=500, ge=50, le=20_000)
    """Characters of the last user message that are embedded: a longer message is cut
    to its first and last ``max_chars / 2``, which bounds a decision's cost. The
    embedder's cost grows with tokens: on 2 cores about 7 ms per 1,000 characters of
    English, and about 30 ms per 1,000 of Chinese (a token per character or so)."""

    @model_validator(mode="after")
    def _consistent(self) -> RoutingSettings:
        problems: list[str] = []
        for name in self.routes:
            if not _ROUTE_NAME.match(name):
                problems.append(
                    f"routes.{name}: a route name is lowercase letters, digits, '-' or '_', "
                    "starting with a letter (like a graph id)"
                )
        if self.routes:
            if self.default is None:
                problems.append(f"default: name the route used when nothing else decides (one of: {', '.join(self.routes)})")
            elif self.default not in self.routes:
                problems.append(f"default: {self.default!r} is not a route (routes: {', '.join(self.routes)})")
        elif self.default is not None:
            problems.append(f"default: {self.default!r} names a route but routes is empty")
        claimed: dict[str, str] = {name: name for name in self.routes}  # a route's name is its own task type
        for name, spec in self.routes.items():
            if not spec.examples and not spec.task_types and name != self.default:
                problems.append(
                    f"routes.{name}.examples: give at least one example utterance, or task_types if the route "
                    "is only chosen by metadata.task_type"
                )
            for task_type in spec.task_types:
                owner = claimed.get(task_type)
                if owner is not None and owner != name:
                    problems.append(
                        f"routes.{name}.task_types: {task_type!r} already picks route {owner!r}"
                        + (" (its name)" if owner == task_type else "")
                    )
                claimed.setdefault(task_type, name)
        total = sum(len(spec.examples) for spec in self.routes.values())
        if total > MAX_EXAMPLES_TOTAL:
            problems.append(f"routes: {total} examples in all, at most {MAX_EXAMPLES_TOTAL}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def task_type_routes(self) -> dict[str, str]:
        """Every accepted ``metadata.task_type`` -> its route (route names included)."""
        table = {name: name for name in self.routes}
        for name, spec in self.routes.items():
            for task_type in spec.task_types:
                table.setdefault(task_type, name)
        return table


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteDecision:
    """Where a routed request goes, and why."""

    route: str
    """The route's name (sent as ``x-switchyard-route``)."""
    graph: str
    """The graph id to run."""
    alias: str | None
    """The model alias to use; None: the graph's own."""
    reason: Reason
    """``task_type``: ``metadata.task_type`` picked it; ``semantic``: the closest
    examples; ``default``: nothing else decided."""
    score: float | None
    """The best cosine similarity found (also for a default chosen because it was under
    the threshold); None when no embedding was made."""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _is_user(message: Any) -> bool:
    if isinstance(message, str):
        return True
    if isinstance(message, Mapping):
        role = message.get("role", message.get("type"))
    else:  # a LangChain message object
        role = getattr(message, "type", None)
    return role in ("user", "human")


def last_user_text(messages: str | Sequence[Any]) -> str:
    """The text of the last user message, stripped.

    Args:
        messages: OpenAI-style dicts (``role: user``), LangGraph input dicts (``role``
            or ``type``: ``user``/``human``), LangChain message objects, or plain strings
            (each one a user message); a single string is the user's text itself. A
            content list contributes its text parts (images and other parts are skipped).

    Returns:
        The text, or ``""`` when there is no user message or it has no text.
    """
    if isinstance(messages, str):
        return messages.strip()
    for message in reversed(messages):
        if _is_user(message):
            if isinstance(message, str):
                return message.strip()
            content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
            return _text_of(content).strip()
    return ""


def _normalised(vectors: Any) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def packaged_embedder() -> LocalEmbedder:
    """The router's own embedder: the packaged ``use-multilingual-v3`` with one BLAS thread.

    One thread, not the package's two: a waiting OpenBLAS thread spins, and on a 2-core
    host with another core's worth of work (the server under load) a two-thread encode
    of one short text took 13 to 110 ms of CPU and p95 ~140 ms, against 2.2 ms and
    p95 2.6 ms with one thread (``docs/performance.md``, issue 13). It costs about
    115 MB of memory beside the knowledge base's embedder.

    Raises:
        knowledge.EmbeddingError: the package that ships the model is not installed.
    """
    return LocalEmbedder.packaged("use-multilingual-v3", threads=1)


class _QueryBatches:
    """Embeds request texts, putting the ones that arrive while an embedding runs into
    the next batch.

    The packaged embedder encodes one batch at a time on a worker thread; one text at a
    time, 50 requests arriving together would wait for 50 encodes in a row (about
    90 ms for the last), where one batch of 50 takes about 27 ms (``bench/routing.py``).
    The first text is embedded at once; texts that come while it runs go together in
    the next call. Texts go through ``embed_documents``, like the examples they are
    compared with (utterance against utterance is a symmetric comparison).

    The batches run in one task the router owns (`SemanticRouter.aclose` cancels it);
    a caller that is cancelled while it waits just leaves its batch.
    """

    def __init__(self, embedder: Embedder, max_batch: int) -> None:
        self._embedder = embedder
        self._max_batch = max_batch
        self._pending: list[tuple[str, asyncio.Future[list[float]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def embed(self, text: str) -> list[float]:
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._pending.append((text, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="switchyard-routing-embed")
        return await future  # cancelling the caller cancels only its own future

    async def _run(self) -> None:
        batch: list[tuple[str, asyncio.Future[list[float]]]] = []
        try:
            while self._pending:
                batch = [item for item in self._pending[: self._max_batch] if not item[1].done()]
                del self._pending[: self._max_batch]
                if not batch:
                    continue
                try:
                    vectors = await self._embedder.embed_documents([text for text, _ in batch])
                except Exception as exc:  # handed to every waiting caller, who raises it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
        finally:
            # Closed while batches were waiting: their callers get an error, not a hang.
            for _, future in batch + self._pending:
                if not future.done():
                    future.set_exception(EmbeddingError("the router was closed while this request was routed"))
            self._pending.clear()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class SemanticRouter:
    """Decides a routed request's graph and alias (see the module docstring).

    Args:
        settings: the ``routing:`` section.
        embedder: embeds the examples and each request's last user message: any
            knowledge-layer `Embedder`; normally `packaged_embedder` (the packaged
            ``use-multilingual-v3`` with one BLAS thread).

    The router only reads its settings; a new routing table is a new router.
    """

    def __init__(self, settings: RoutingSettings, embedder: Embedder) -> None:
        self.settings = settings
        self._embedder = embedder
        self._task_types = settings.task_type_routes()
        self._names = [name for name, spec in settings.routes.items() if spec.examples]
        self._matrix: np.ndarray | None = None
        self._bounds: list[tuple[int, int]] = []
        self._lock = asyncio.Lock()
        self._queries = _QueryBatches(embedder, max_batch=64)

    @property
    def embedder(self) -> Embedder:
        """The embedder it was built with (its owner closes it)."""
        return self._embedder

    @property
    def enabled(self) -> bool:
        """Whether there is a routing table at all (else ``model: "auto"`` is refused)."""
        return bool(self.settings.routes)

    @property
    def task_types(self) -> list[str]:
        """The accepted ``metadata.task_type`` values, sorted."""
        return sorted(self._task_types)

    def check(self, graph_ids: Iterable[str], aliases: Iterable[str]) -> None:
        """Check the routes against the served graphs and the model registry's aliases
        (at server start, and again after the registry is reloaded).

        Raises:
            RoutingConfigError: a route names an unknown graph or alias, or a graph or
                an alias is itself called ``auto`` (which would shadow routing).
        """
        graphs = set(graph_ids)
        known_aliases = set(aliases)
        problems: list[str] = []
        if self.enabled and AUTO_MODEL in graphs:
            problems.append(f"graphs.{AUTO_MODEL}: the graph id {AUTO_MODEL!r} is reserved for routing; rename the graph")
        if self.enabled and AUTO_MODEL in known_aliases:
            problems.append(f"aliases.{AUTO_MODEL}: the alias {AUTO_MODEL!r} is reserved for routing; rename the alias")
        for name, spec in self.settings.routes.items():
            if spec.graph not in graphs:
                problems.append(
                    f"routing.routes.{name}.graph: unknown graph {spec.graph!r} (graphs: {', '.join(sorted(graphs)) or 'none'})"
                )
            if spec.alias is not None and spec.alias not in known_aliases:
                problems.append(
                    f"routing.routes.{name}.alias: unknown model alias {spec.alias!r} "
                    f"(aliases: {', '.join(sorted(known_aliases)) or 'none'})"
                )
        if problems:
            raise RoutingConfigError(problems)

    async def prepare(self) -> None:
        """Embed every route's examples (once; later calls return at once).

        Raises:
            knowledge.EmbeddingError: the embedder failed.
        """
        if self._matrix is not None:
            return
        async with self._lock:
            if self._matrix is not None:
                return
            texts: list[str] = []
            bounds: list[tuple[int, int]] = []
            for name in self._names:
                examples = self.settings.routes[name].examples
                bounds.append((len(texts), len(texts) + len(examples)))
                texts.extend(examples)
            vectors = await self._embedder.embed_documents(texts) if texts else []
            self._bounds = bounds
            self._matrix = _normalised(vectors) if texts else np.zeros((0, 0), dtype=np.float32)

    def _route(self, name: str, reason: Reason, score: float | None) -> RouteDecision:
        spec = self.settings.routes[name]
        return RouteDecision(route=name, graph=spec.graph, alias=spec.alias, reason=reason, score=score)

    def _clip(self, text: str) -> str:
        limit = self.settings.max_chars
        if len(text) <= limit:
            return text
        half = limit // 2
        return text[:half] + "\n" + text[-(limit - half) :]

    async def scores(self, text: str) -> dict[str, float]:
        """Each route's best cosine similarity with ``text`` (routes with examples only)."""
        await self.prepare()
        assert self._matrix is not None
        if not self._names:
            return {}
        query = _normalised(await self._queries.embed(self._clip(text)))[0]
        similarities = self._matrix @ query
        return {name: float(similarities[start:end].max()) for name, (start, end) in zip(self._names, self._bounds)}

    async def aclose(self) -> None:
        """Stop embedding (decisions still waiting fail with `EmbeddingError`). The
        embedder is the caller's, and stays open."""
        await self._queries.aclose()

    async def decide(self, messages: str | Sequence[Any], task_type: Any = None) -> RouteDecision:
        """Pick the route for one request.

        Args:
            messages: the request's messages (see `last_user_text`), or the user's text.
            task_type: the request's ``metadata.task_type``, if it carried one.

        Returns:
            The route, its graph and alias, and why it was chosen.

        Raises:
            serving.errors.RequestError: no routing table is configured (``param``:
                ``model``), or ``task_type`` is not a string any route accepts
                (``param``: ``metadata.task_type``, the message lists the valid ones).
            knowledge.EmbeddingError: the embedder failed.
        """
        if not self.enabled:
            raise RequestError(
                f'model "{AUTO_MODEL}" needs routes: this server has no routing table (routing.routes in its configuration)',
                param="model",
                code="routing_not_configured",
            )
        if task_type is not None:
            route = self._task_types.get(task_type) if isinstance(task_type, str) else None
            if route is None:
                shown = repr(task_type)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise RequestError(
                    f"unknown task type {shown} (valid task types: {', '.join(self.task_types)})",
                    param="metadata.task_type",
                    code="invalid_value",
                )
            return self._route(route, "task_type", None)
        default = self.settings.default
        assert default is not None  # RoutingSettings requires it when routes exist
        text = last_user_text(messages)
        if not text:
            return self._route(default, "default", None)
        scores = await self.scores(text)
        if not scores:
            return self._route(default, "default", None)
        best = max(scores, key=lambda name: scores[name])
        if scores[best] < self.settings.threshold:
            return self._route(default, "default", scores[best])
        return self._route(best, "semantic", scores[best])
