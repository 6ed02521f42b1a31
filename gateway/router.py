"""The gateway facade: aliases to backends, and the clients that reach them.

Built once per process (the server's lifespan or a CLI command) and closed on exit.
Every model call goes through it: a graph's chat model (`gateway.routed`) and an
alias relay alike ask it, per call, which backends to try (`gateway.balancer`):
weights, stickiness, capability contracts and circuit breakers apply to both, and a
failure before the first token moves on to the next backend. `reload` swaps the
registry atomically; calls in flight finish on the backend they started on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, TypeVar

import httpx
from langchain_core.language_models import BaseChatModel

from gateway.balancer import Breakers, RouteScope, attempt_order, capable
from gateway.chat import build_chat_model, httpx_timeout
from gateway._net import pooled_transport
from gateway._wire import iter_chunks, open_chat, post_json, read_json
from gateway.errors import BackendResponseError, BackendUnavailableError, CapabilityError, GatewayError, RegistryError
from gateway.health import BackendHealth, probe
from gateway.registry import Backend, ModelRegistry

__all__ = ["ModelGateway", "estimate_prompt_tokens"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Connection pools sized for the serving target (50 concurrent streams per replica).
_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)


def estimate_prompt_tokens(request: Mapping[str, Any]) -> int:
    """A low estimate of a chat request's prompt tokens: UTF-8 bytes of its messages'
    text over 4. English runs about 4 characters a token and other scripts use more
    bytes per token, so a prompt this estimate puts past a context window is past it."""
    total = 0
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        if isinstance(content, str):
            total += len(content.encode("utf-8"))
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, Mapping) else part if isinstance(part, str) else None
                if isinstance(text, str):
                    total += len(text.encode("utf-8"))
    return total // 4


def _is_token_chunk(chunk: Mapping[str, Any]) -> bool:
    """Whether a relayed chunk carries part of the answer (text, reasoning, a tool
    call, a finish reason, usage), not just the opening role."""
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or ():
        if choice.get("finish_reason"):
            return True
        delta = choice.get("delta") or {}
        if any(delta.get(field) for field in ("content", "tool_calls", "reasoning_content", "reasoning", "refusal")):
            return True
    return False


def _retryable(exc: BaseException) -> bool:
    """A failure another backend may not have: unreachable, timed out, 5xx, overloaded."""
    if isinstance(exc, BackendUnavailableError):
        return True
    return isinstance(exc, BackendResponseError) and (exc.status >= 500 or exc.status in (408, 429))


def _backend_fault(exc: BaseException) -> bool:
    """A failure that counts against the backend's breaker (429 is load, not a fault)."""
    if isinstance(exc, BackendUnavailableError):
        return True
    return isinstance(exc, BackendResponseError) and exc.status >= 500


class ModelGateway:
    """Hands out routed chat models and relays OpenAI requests by alias."""

    def __init__(self, registry: ModelRegistry, *, probe_timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Args:
            registry: the loaded model registry.
            probe_timeout_s: limit for one readiness probe.
            clock: the breakers' clock (monotonic seconds).
        """
        self.registry = registry
        self.breakers = Breakers(clock=clock)
        self.retries: Counter[tuple[str, str]] = Counter()
        """Failures passed over before a first token, by (alias, failed backend)."""
        self.served: Counter[tuple[str, str]] = Counter()
        """Calls that produced a first token (or a whole answer), by (alias, backend)."""
        self._probe_timeout_s = probe_timeout_s
        self._pools: dict[Backend, httpx.AsyncClient] = {}
        self._backend_models: dict[Backend, BaseChatModel] = {}
        self._chat_models: dict[str, BaseChatModel] = {}
        self._probe_client: httpx.AsyncClient | None = None
        self._load: Callable[[str], float | None] | None = None

    # ---- the registry ------------------------------------------------------------------

    def reload(self, registry: ModelRegistry, *, required: Mapping[str, str] | None = None) -> None:
        """Serve from ``registry`` from now on (one assignment: a call sees the old
        registry or the new one, never a mix). Calls in flight finish where they are.

        Args:
            registry: the new registry.
            required: aliases that must stay, with who uses them (``"graph chat"``);
                every alias a routed chat model was handed out for is required too.

        Raises:
            RegistryError: ``registry`` lacks a required alias; the current registry stays.
        """
        users = {name: "a graph" for name in self._chat_models} | dict(required or {})
        missing = sorted(set(users) - set(registry.aliases))
        if missing:
            raise RegistryError(
                "the new registry", [f"aliases.{name}: missing, but {users[name]} calls it" for name in missing]
            )
        old = self.registry
        self.registry = registry
        self.breakers.forget(set(registry.backends))
        changes = [
            f"{name}: {_describe(registry, name)}"
            for name in registry.aliases
            if name not in old.aliases or old.aliases[name] != registry.aliases[name]
        ]
        log.info("model registry reloaded; %s", "; ".join(changes) or "no alias changed")

    def set_load_source(self, load: Callable[[str], float | None] | None) -> None:
        """Where ``balance: least_loaded`` reads a backend's load (the vLLM scraper)."""
        self._load = load

    def _pool(self, backend: Backend) -> httpx.AsyncClient:
        pool = self._pools.get(backend)
        if pool is None:
            pool = httpx.AsyncClient(timeout=httpx_timeout(backend), transport=pooled_transport(_LIMITS))
            self._pools[backend] = pool
        return pool

    def backend(self, alias: str) -> Backend:
        """The alias's primary backend (its heaviest target).

        Raises:
            UnknownModelError: not a registered alias.
        """
        return self.registry.resolve(alias)

    def backend_chat_model(self, backend: Backend) -> BaseChatModel:
        """The LangChain chat model bound to one backend, built once per definition."""
        model = self._backend_models.get(backend)
        if model is None:
            model = build_chat_model(backend, http_async_client=self._pool(backend))
            self._backend_models[backend] = model
        return model

    def chat_model(self, alias: str) -> BaseChatModel:
        """The routed chat model for ``alias`` (`gateway.routed.RoutedChatModel`),
        shared: each call asks the gateway which backend serves it.

        Per-request parameters (temperature, max tokens) are bound by the caller with
        ``.bind(...)``; the shared instance is never mutated.

        Raises:
            UnknownModelError: not a registered alias.
        """
        model = self._chat_models.get(alias)
        if model is None:
            from gateway.routed import RoutedChatModel  # routed imports this module

            self.registry.alias(alias)
            model = RoutedChatModel(alias=alias, gateway=self)
            self._chat_models[alias] = model
        return model

    # ---- choosing backends ---------------------------------------------------------------

    def attempts(
        self, alias: str, key: str | None, request: Mapping[str, Any], *, pinned: str | None = None
    ) -> list[Backend]:
        """The backends to try for one request, in order (breakers not yet asked).

        Args:
            alias: the model alias.
            key: the sticky key (thread or request id), None for a random choice.
            request: OpenAI chat fields the contract is checked against (``tools``,
                ``response_format``, ``max_tokens``, ``messages``).
            pinned: the backend that already served this run; tried first while the
                alias still lists it (a target of any weight, or a fallback), so a run
                in flight finishes where it started across reloads, weight changes and
                a target coming back after a fallback.

        Raises:
            UnknownModelError: not a registered alias.
            CapabilityError: no backend of the alias can serve the request.
        """
        registry = self.registry
        entry = registry.alias(alias)
        order = attempt_order(entry, key, load=self._load)
        if pinned is not None and order[0] != pinned and (
            pinned in entry.fallbacks or any(t.backend == pinned for t in entry.targets)
        ):
            order = [pinned, *(b for b in order if b != pinned)]
        refusals: dict[str, CapabilityError] = {}

        def refusal(backend: Backend) -> str | None:
            error = self.refusal(backend, request)
            if error is not None:
                refusals[backend.id] = error
            return str(error) if error else None

        kept, _ = capable(registry.backends, order, refusal)
        if not kept:
            raise self._none_capable(alias, registry, list(refusals.values()))
        return [registry.backends[i] for i in kept]

    def check_alias(self, alias: str, request: Mapping[str, Any]) -> None:
        """Refuse a request no backend of ``alias`` can serve (before anything is sent).

        Raises:
            UnknownModelError, CapabilityError.
        """
        registry = self.registry
        errors = [e for b in registry.candidates(alias) if (e := self.refusal(b, request)) is not None]
        if len(errors) == len(registry.candidates(alias)):
            raise self._none_capable(alias, registry, errors)

    @staticmethod
    def _none_capable(alias: str, registry: ModelRegistry, errors: list[CapabilityError]) -> CapabilityError:
        if len(errors) > 1 and all(e.capability == "context_window" and e.param == "messages" for e in errors):
            largest = max(b.capabilities.context_window for b in registry.candidates(alias))
            first = errors[0]
            return CapabilityError(
                first.backend_id, "context_window", "messages",
                f"the prompt (about {first.needed} tokens) is longer than the context window of every backend "
                f"of model {alias!r} (the largest is {largest} tokens)",
                needed=first.needed,
            )
        return errors[0]

    @staticmethod
    def refusal(backend: Backend, request: Mapping[str, Any]) -> CapabilityError | None:
        """Why ``backend``'s contract cannot serve the chat request, or None."""
        caps = backend.capabilities
        if request.get("tools") and not caps.tools:
            return CapabilityError(
                backend.id, "tools", "tools", f"model backend {backend.id!r} does not support tool calls"
            )
        response_format = request.get("response_format") or {}
        if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema" and not caps.json_schema:
            return CapabilityError(
                backend.id,
                "json_schema",
                "response_format",
                f"model backend {backend.id!r} does not support json_schema output",
            )
        for field in ("max_completion_tokens", "max_tokens"):
            value = request.get(field)
            if value is not None and value > caps.context_window:
                return CapabilityError(
                    backend.id,
                    "context_window",
                    field,
                    f"{field}={value} exceeds the context window of {backend.id!r} ({caps.context_window} tokens)",
                )
        if request.get("messages"):
            prompt = estimate_prompt_tokens(request)
            if prompt > caps.context_window:
                return CapabilityError(
                    backend.id, "context_window", "messages",
                    f"the prompt (about {prompt} tokens) is longer than the context window of {backend.id!r} "
                    f"({caps.context_window} tokens)",
                    needed=prompt,
                )
        return None

    @classmethod
    def check_capabilities(cls, backend: Backend, request: Mapping[str, Any]) -> None:
        """Refuse a chat request that ``backend``'s contract cannot serve.

        Raises:
            CapabilityError: naming the request field and the missing capability.
        """
        error = cls.refusal(backend, request)
        if error is not None:
            raise error

    # ---- calling backends -----------------------------------------------------------------

    def _take(self, backend: Backend, tried: list[str]) -> bool | None:
        """Ask the backend's breaker: None (refused), True (this call is the half-open
        probe), False (an ordinary call)."""
        breaker = self.breakers.get(backend.id, self.registry.breaker_for(backend))
        if breaker.allow():
            return breaker.state == "half_open"
        tried.append(f"{backend.id}: circuit open")
        return None

    def _release(self, backend: Backend, probe: bool) -> None:
        """A call ended without a verdict on the backend (cancelled, 429)."""
        if probe:
            self.breakers.get(backend.id, self.registry.breaker_for(backend)).release()

    def _failed(
        self, backend: Backend, alias: str, exc: BaseException, scope: RouteScope | None, tried: list[str], probe: bool
    ) -> None:
        breaker = self.breakers.get(backend.id, self.registry.breaker_for(backend))
        if _backend_fault(exc):
            breaker.failure(str(exc))
        else:
            self._release(backend, probe)
        self.retries[(alias, backend.id)] += 1
        if scope is not None:
            scope.retried.append(backend.id)
        tried.append(f"{backend.id}: {exc}")
        log.warning("model %s: backend %s failed before its first token, trying the next: %s", alias, backend.id, exc)

    def _succeeded(self, backend: Backend, alias: str, scope: RouteScope | None) -> None:
        self.breakers.get(backend.id, self.registry.breaker_for(backend)).success()
        self.served[(alias, backend.id)] += 1
        if scope is not None:
            scope.record(backend.id)

    @staticmethod
    def _exhausted(alias: str, backends: list[Backend], tried: list[str], last: BaseException | None) -> GatewayError:
        if isinstance(last, BackendResponseError) and len(tried) == 1:
            return last
        backend_id = backends[-1].id if backends else alias
        return BackendUnavailableError(backend_id, f"no backend of model {alias!r} could answer ({'; '.join(tried)})")

    async def routed(
        self,
        alias: str,
        scope: RouteScope | None,
        request: Mapping[str, Any],
        start: Callable[[Backend], AsyncIterator[T]],
        is_token: Callable[[T], bool] = lambda item: True,
    ) -> AsyncIterator[T]:
        """The items of ``start(backend)`` for the first backend that produces a token.

        Backends are tried in `attempts` order, skipping open breakers; a retryable
        failure before the first token (unreachable, timeout, 5xx, 429, a stream broken
        after only its opening role chunk) moves on to the next, dropping what that
        backend sent. Items before the first token (``is_token`` false: the role
        chunk servers send while they prefill) are held back until it comes. From the
        first token on the stream is the client's: a failure then is raised (and
        counted against the backend), never continued elsewhere.

        Raises:
            UnknownModelError, CapabilityError: before any backend is called.
            BackendUnavailableError: every backend failed or is open (naming each).
            BackendResponseError: a backend refused the request itself (4xx).
        """
        backends = self.attempts(
            alias, scope.key if scope else None, request, pinned=scope.backend if scope else None
        )
        tried: list[str] = []
        last: BaseException | None = None
        for backend in backends:
            probe = self._take(backend, tried)
            if probe is None:
                continue
            stream = start(backend)
            held: list[T] = []
            try:
                while not held or not is_token(held[-1]):
                    held.append(await anext(stream))
            except StopAsyncIteration:
                self._succeeded(backend, alias, scope)
                for item in held:
                    yield item
                return
            except GatewayError as exc:
                await stream.aclose()
                if not _retryable(exc):
                    if isinstance(exc, BackendResponseError):  # it answered: alive
                        self._succeeded(backend, alias, scope)
                    raise
                self._failed(backend, alias, exc, scope, tried, probe)
                last = exc
                continue
            except BaseException:
                await stream.aclose()
                self._release(backend, probe)
                raise
            self._succeeded(backend, alias, scope)
            async with aclosing(stream):
                for item in held:
                    yield item
                try:
                    async for item in stream:
                        yield item
                except GatewayError as exc:
                    if _backend_fault(exc):
                        self.breakers.get(backend.id, self.registry.breaker_for(backend)).failure(f"after the first token: {exc}")
                    raise
            return
        raise self._exhausted(alias, backends, tried, last)

    async def called(
        self,
        alias: str,
        scope: RouteScope | None,
        request: Mapping[str, Any],
        call: Callable[[Backend], Awaitable[T]],
    ) -> T:
        """``call(backend)`` for the first backend that answers; the same order,
        breakers and retries as `routed`, for whole (non-streamed) answers."""

        async def start(backend: Backend) -> AsyncIterator[T]:
            yield await call(backend)

        async with aclosing(self.routed(alias, scope, request, start)) as answers:
            async for answer in answers:
                return answer
        raise AssertionError("routed() ends with an answer or an error")  # pragma: no cover

    # ---- alias relays ---------------------------------------------------------------------

    def _payload(self, backend: Backend, body: Mapping[str, Any]) -> dict[str, Any]:
        payload = {**body, "model": backend.model}
        if backend.default_max_tokens and "max_tokens" not in body and "max_completion_tokens" not in body:
            payload["max_tokens"] = backend.default_max_tokens
        return payload

    async def _open(self, backend: Backend, body: Mapping[str, Any]) -> httpx.Response:
        return await open_chat(
            self._pool(backend), backend.id, backend.base_url, backend.api_key or "not-needed", self._payload(backend, body)
        )

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

    async def complete_chat(
        self, alias: str, body: Mapping[str, Any], scope: RouteScope | None = None
    ) -> dict[str, Any]:
        """Relay a non-streamed chat completion to the alias's backends (`called`).

        Args:
            alias: the model alias the client named.
            body: OpenAI request fields; ``model`` is replaced by the served name.
            scope: the run's routing (sticky key; records the backend that answered).

        Returns:
            The backend's JSON answer, ``model`` set back to ``alias``.

        Raises:
            UnknownModelError, CapabilityError: before anything is sent.
            BackendUnavailableError: no backend could be reached.
            BackendResponseError: the backend answered an error status.
        """
        request = {**body, "stream": False}

        async def call(backend: Backend) -> dict[str, Any]:
            return await read_json(await self._open(backend, request), backend.id)

        answer = await self.called(alias, scope, request, call)
        answer["model"] = alias
        return answer

    async def stream_chat(
        self, alias: str, body: Mapping[str, Any], scope: RouteScope | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Relay a streamed chat completion; yields the backend's chunks as dicts.

        The first chunk comes from the first backend that produced one (`routed`): an
        unreachable or failing backend is passed over before any byte goes to the
        client, and a request no backend can take raises on the first ``anext``.
        Closing the iterator closes the backend response, which makes the server stop
        generating. Usage is always requested for the last chunk.

        Raises:
            The same errors as `complete_chat`; after the first chunk, a broken stream
            raises `BackendUnavailableError`.
        """
        request = {**body, "stream": True, "stream_options": {"include_usage": True}}

        async def start(backend: Backend) -> AsyncIterator[dict[str, Any]]:
            response = await self._open(backend, request)
            async with aclosing(iter_chunks(response, backend.id)) as chunks:
                async for chunk in chunks:
                    yield chunk

        async with aclosing(self.routed(alias, scope, request, start, _is_token_chunk)) as chunks:
            async for chunk in chunks:
                chunk["model"] = alias
                yield chunk

    async def probe(self, backend_ids: list[str] | None = None) -> list[BackendHealth]:
        """Probe backends concurrently (default: every backend an alias points at)."""
        registry = self.registry
        ids = backend_ids if backend_ids is not None else sorted({b for a in registry.aliases.values() for b in a.backend_ids})
        backends = [registry.backends[i] for i in ids]
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
        self._backend_models.clear()
        self._chat_models.clear()


def _describe(registry: ModelRegistry, name: str) -> str:
    alias = registry.aliases[name]
    targets = ", ".join(f"{t.backend}={t.weight}" for t in alias.targets)
    return targets + (f" (fallbacks: {', '.join(alias.fallbacks)})" if alias.fallbacks else "")
