"""Settings: ``config/switchyard.yaml`` plus ``SWITCHYARD_*`` environment overrides.

Each package owns its section's model (``gateway.GatewaySettings``,
``graphs.GraphSpec`` entries); this module, part of the composition root, assembles
them. Precedence, highest first: explicit overrides (CLI flags), environment
(``SWITCHYARD_SERVER__PORT=9000``, nested keys joined by ``__``), the YAML file,
defaults. Nothing is built at import time: `load_settings` is called by the CLI, the
app factory's caller, and test fixtures.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from eval.settings import EvalSettings
from gateway import GatewaySettings
from graphs import GraphSpec
from knowledge import KnowledgeSettings
from tools import ToolsSettings
from serving.audit import AuditSettings
from serving.auth import AuthSettings
from serving.guardrails import GuardrailSettings
from serving.persistence import ThreadSettings
from serving.routing import RoutingSettings
from serving.shared.settings import StateSettings

__all__ = ["ConfigError", "ServerSettings", "Settings", "TracingSettings", "load_settings"]

DEFAULT_CONFIG = Path("config/switchyard.yaml")


class ConfigError(Exception):
    """The configuration is invalid; the message names each bad key.

    Attributes:
        source: the YAML file (or ``"defaults"``) the settings were read from.
        problems: one ``"key.path: message"`` line per problem.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid configuration ({source}): " + "; ".join(problems))


class TracingSettings(BaseModel):
    """OpenTelemetry tracing (`serving.tracing`): off unless ``otlp_endpoint`` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = None
    """An OTLP/HTTP (protobuf) collector, e.g. ``http://127.0.0.1:4318``; spans go to
    ``<endpoint>/v1/traces``. Unset: no tracing and no cost."""
    service_name: str = "switchyard"
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of new traces recorded; a caller's sampled ``traceparent`` is always followed."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every export (a collector's auth header)."""
    export_timeout_s: float = Field(default=10.0, gt=0)


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#@]+")


class ServerSettings(BaseModel):
    """The ``server`` section: the HTTP listener."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default."""
    port: int = Field(default=8000, ge=1, le=65535)
    dev: bool = False
    """Local single-user mode (``serve --dev``): no API keys, one implicit tenant.
    Refused on a non-loopback ``host`` unless ``allow_remote_dev``."""
    allow_remote_dev: bool = False
    """Let ``dev`` (no keys) listen on a non-loopback interface (``serve
    --allow-remote-dev``): anyone who reaches the port can use every graph and model.
    The server still warns at start. In ``dev`` a request's ``Host`` must be a loopback
    name or address (a page that re-points its name at the server, DNS rebinding, would
    otherwise drive it); with this on, ``host`` is accepted too, and when ``host`` is
    ``0.0.0.0`` or ``::`` any IP address: reach a remote dev server by its address, or
    set ``host`` to the name you type (``devbox.lan``)."""
    public_api_docs: bool = False
    """With keys on: also serve ``/openapi.json``, ``/docs`` and ``/redoc`` without a
    key. Default: ``/openapi.json`` needs a key and the ``/docs``/``/redoc`` pages
    (which cannot send one) are not served. In ``dev`` all three are open."""
    keepalive_s: float = Field(default=15.0, gt=0)
    """Interval of SSE keepalive comments on idle streams."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Larger request bodies get 413."""
    max_header_bytes: int = Field(default=65_536, ge=1024, le=16 << 20)
    """A request's line and header fields together; larger heads get 431 and the
    connection is closed (nothing past the limit is buffered; `serving.http`). Also
    bounds a chunked body's framing: a trailer section or one chunk-size line, and all
    framing of a request beyond an eighth of its body."""
    max_headers: int = Field(default=100, ge=16, le=10_000)
    """Header fields per request, chunked trailers included; more get 431."""
    header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A request's head must arrive within this long (from the connection's opening,
    or from the request's first byte on a kept-alive connection): else 408 and the
    connection is closed (a connection that sent nothing is closed)."""
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """A request's body must arrive within this long of its head, stalled or
    trickled: else 408 (or the connection is closed if an answer has started)."""
    max_concurrent_runs: int = Field(default=128, ge=1)
    """Runs in progress at once on this server, all keys together (429 beyond)."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: stop accepting, let running streams finish for this long, then
    cancel them with an error event."""
    run_deadline_s: float = Field(default=300.0, gt=0)
    """A run still going after this long is cancelled and the client gets a timeout
    error. A request may lower it with the ``x-run-deadline-s`` header."""
    history_max_bytes: int = Field(default=8 << 20, ge=1024)
    """Thread history answers stop adding states past this many bytes of JSON (at
    least one state is sent); clients page on with ``before``."""
    replay_max_bytes: int = Field(default=1 << 20, ge=1024)
    """SSE frames a background or resumable run keeps for clients that rejoin its
    stream (older frames are dropped first)."""
    replay_total_bytes: int = Field(default=64 << 20, ge=1024)
    """Frames all finished runs keep together (the oldest runs' go first)."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API cross-origin, each exact
    (``https://chat.example.com``, scheme and host and an optional port, no path), or
    ``["*"]`` for any origin. ``*`` is acceptable because callers authenticate with a
    header key, never a cookie; it cannot be combined with ``cors_allow_credentials``.
    In ``dev`` the local origins (``http://localhost:<port>``,
    ``http://127.0.0.1:<port>``) are allowed as well."""
    cors_origin_regex: str | None = None
    """Also allow origins this regular expression matches in full
    (``https://[a-z0-9-]+\\.example\\.com``)."""
    cors_allow_credentials: bool = False
    """Send ``Access-Control-Allow-Credentials: true`` (only useful to browsers that
    send cookies or HTTP auth, which this API does not read); refused with ``*``."""
    proxy_text_bodies: bool = False
    """Read a keyed LangGraph API request's ``text/plain`` (or unlabelled) body as JSON,
    as LangGraph Server does. Turn on only behind a proxy you guard that forwards bodies
    as text, e.g. Agent Chat UI's production passthrough (its ``/api`` route), and
    make that proxy check ``Origin`` / ``Sec-Fetch-Site``: it adds the key itself, so
    a hostile page's form or ``no-cors`` fetch to it would otherwise arrive keyed.
    Even on, only ``x-api-key`` or ``authorization: Bearer`` counts as a key, and a
    request a browser marks as simple or cross-site (``sec-fetch-mode: navigate`` /
    ``no-cors``, ``sec-fetch-site: cross-site``) is not relabelled (see
    ``serving/langgraph_api/bodies.py``). Off: such bodies get 422."""

    @field_validator("cors_origins")
    @classmethod
    def _exact_origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] with no path or trailing "
                    "slash (https://chat.example.com), or * for any origin"
                )
        return origins

    @field_validator("cors_origin_regex")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return pattern

    @model_validator(mode="after")
    def _no_wildcard_with_credentials(self) -> ServerSettings:
        if "*" in self.cors_origins and self.cors_allow_credentials:
            raise ValueError(
                "cors_origins '*' cannot be combined with cors_allow_credentials: list the exact "
                "origins, or turn cors_allow_credentials off (API keys travel in headers, not cookies)"
            )
        return self


def _default_graphs() -> dict[str, GraphSpec]:
    return {
        "chat": GraphSpec(
            path="graphs.chat:make_graph",
            model="chat-default",
            description="Chat with the default model; answers stream token by token.",
        ),
        "rag": GraphSpec(
            path="graphs.rag:make_graph",
            model="chat-default",
            description="Answers from a knowledge collection, with numbered citations.",
        ),
        "agent": GraphSpec(
            path="graphs.agent:make_graph",
            model="chat-default",
            description="A model that calls tools (calculator, clock, knowledge search) under the tool policy.",
            tools=("calculator", "current_time", "knowledge_search"),
        ),
    }


class Settings(BaseSettings):
    """All of Switchyard's settings."""

    model_config = SettingsConfigDict(
        env_prefix="SWITCHYARD_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    data_dir: Path = Path("data")
    """Every piece of local state: databases, logs, pid files (``SWITCHYARD_DATA_DIR``).
    Two servers run side by side with their own data directories, ports and local
    backend ports."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    """``json``: one object per line with request and run ids, for log shippers."""
    server: ServerSettings = ServerSettings()
    gateway: GatewaySettings = GatewaySettings()
    graphs: dict[str, GraphSpec] = Field(default_factory=_default_graphs)
    """Graph id -> entry. Replaces the defaults when given in the YAML file."""
    auth: AuthSettings = AuthSettings()
    """Tenants and API keys (required unless ``server.dev``)."""
    threads: ThreadSettings = ThreadSettings()
    """Where threads persist: SQLite in the data directory, or PostgreSQL."""
    state: StateSettings = StateSettings()
    """What replicas share (run records, keys, promotions, rate limits)."""
    guardrails: GuardrailSettings = GuardrailSettings()
    knowledge: KnowledgeSettings = KnowledgeSettings()
    """The vector store (Qdrant local mode in the data directory, or a server), the
    embedder, chunking and retrieval defaults."""
    tools: ToolsSettings = ToolsSettings()
    routing: RoutingSettings = RoutingSettings()
    """Routes for ``model: "auto"``: a graph and model alias per kind of request, picked
    by ``metadata.task_type`` or by the semantic router (`serving.routing`)."""
    """Built-in tools' settings (``http_get``'s allow-list), approvals, per-run budgets."""
    tracing: TracingSettings = TracingSettings()
    """OpenTelemetry spans per request, run, node, model and tool call (off by default)."""
    audit_file: Path | None = None
    """The hash-chained audit log (JSON Lines); default ``<data_dir>/audit/audit.jsonl``."""
    audit: AuditSettings = AuditSettings()
    """The audit log's HMAC key (kept outside the data directory) and how often its
    head is logged."""
    eval: EvalSettings = EvalSettings()
    """The eval runs' judge, seed, gate thresholds, run files and promotion suites."""

    @property
    def eval_runs_dir(self) -> Path:
        """Where promotion keeps run files and reports."""
        return self.eval.runs_dir or self.data_dir / "eval"

    @property
    def audit_path(self) -> Path:
        return self.audit_file or self.data_dir / "audit" / "audit.jsonl"

    @property
    def shared_dsn(self) -> str | None:
        """The PostgreSQL database replicas share state in (None: a single replica)."""
        return self.state.postgres_dsn or self.threads.postgres_dsn

    @property
    def keys_file(self) -> Path:
        """Where ``switchyard keys create`` stores key hashes."""
        return self.auth.keys_file or self.data_dir / "keys.yaml"


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["the top level must be a mapping of sections"])
    return data


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Read the settings.

    Args:
        config_file: the YAML file; default ``$SWITCHYARD_CONFIG``, else
            ``config/switchyard.yaml`` if it exists, else defaults only.
        **overrides: highest-precedence values (CLI flags), nested as dicts.

    Raises:
        ConfigError: an unknown key, a bad value or an unreadable file, naming each
            key (``server.port: Input should be ...``).
    """
    if config_file is None and os.environ.get("SWITCHYARD_CONFIG"):
        config_file = os.environ["SWITCHYARD_CONFIG"]
    if config_file is None and DEFAULT_CONFIG.is_file():
        config_file = DEFAULT_CONFIG
    source = str(config_file) if config_file is not None else "defaults"
    data = _read_yaml(Path(config_file)) if config_file is not None else {}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, _YamlSource(settings_cls, data)

    try:
        return _Loaded(**overrides)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(source, problems) from None
