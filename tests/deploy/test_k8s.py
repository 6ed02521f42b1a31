"""The Kubernetes manifests (deploy/k8s): schemas, drain, probes, scaling, vLLM, secrets.

No cluster runs here, so the manifests are checked the way a cluster would read them:
each overlay is rendered with ``kubectl kustomize`` (skipped, with the reason, where
kubectl is missing; the manifest files themselves are validated either way) and every
object is validated against the Kubernetes 1.32 JSON schemas vendored in
``deploy/schemas/kubernetes`` (strict: an unknown field is an error). Then our own
checks tie the manifests to the code they deploy: the probes' paths and ports, the
grace period against the app's drain, the HPA's metric against what the app exports,
vLLM's arguments against ``switchyard backend vllm-args``, every ``SWITCHYARD_*`` name
against the settings model, and the settings files against ``load_settings``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from pydantic import BaseModel
from referencing import Registry, Resource

from gateway.registry import load_registry
from serving.observability import ServingMetrics
from serving.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
SCHEMAS = ROOT / "deploy/schemas/kubernetes"
OVERLAYS = ("cpu", "gpu")
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl (with its built-in kustomize) is not installed: the overlays cannot be rendered here "
    "(each manifest file is still validated by test_manifest_file_is_valid)",
)
# Kinds from CRDs have no Kubernetes schema; each is checked by a test of its own.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "test_servicemonitors_scrape_the_services"}
# Not settings fields, read elsewhere: SWITCHYARD_CONFIG by load_settings (the file to read).
NON_FIELD_ENV = {"SWITCHYARD_CONFIG": ROOT / "serving/settings.py"}
# The app image's working directory: Dockerfile `COPY config/ config/` under `WORKDIR /app`.
IMAGE_CONFIG = "/app/config/"


# ---------------------------------------------------------------------------------------
# Loading and rendering


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def _is_object(doc: Any) -> bool:
    """A Kubernetes object (not a kustomization, a Helm values file or a settings file)."""
    return (
        isinstance(doc, dict)
        and "apiVersion" in doc
        and "kind" in doc
        and not str(doc["apiVersion"]).startswith("kustomize.config.k8s.io/")
    )


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if any(_is_object(d) for d in _documents(p)))


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@functools.cache
def _rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(_kustomize(K8S / "overlays" / overlay))


def _one(objects: Any, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def _config_map(objects: Any, prefix: str) -> dict[str, Any]:
    """A generated ConfigMap by its name before kustomize's hash suffix."""
    named = re.compile(rf"{prefix}(-[a-z0-9]+)?")
    found = [o for o in objects if o["kind"] == "ConfigMap" and named.fullmatch(o["metadata"]["name"])]
    assert len(found) == 1, f"expected one ConfigMap {prefix}, found {len(found)}"
    return found[0]


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] != "Deployment":
        return []
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _app(objects: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = _one(objects, "Deployment", "switchyard")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _app_env(objects: Any) -> dict[str, str]:
    """The app's environment from the ConfigMap (the Secret's values are not in git)."""
    _, container = _app(objects)
    (ref,) = [s["configMapRef"]["name"] for s in container["envFrom"] if "configMapRef" in s]
    env = dict(next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == ref)["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def _port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def _secret_example() -> dict[str, str]:
    lines = (K8S / "base/secret.env.example").read_text(encoding="utf-8").splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {key: value for key, value in pairs}


# ---------------------------------------------------------------------------------------
# Schema validation


@functools.cache
def _schema_registry() -> Registry:
    resources = [
        Resource.from_contents(json.loads(path.read_text(encoding="utf-8"))) for path in sorted(SCHEMAS.glob("*.json"))
    ]
    return Registry().with_resources((r.id(), r) for r in resources if r.id())  # type: ignore[misc]


def _schema_file(obj: dict[str, Any]) -> Path:
    # kubernetes-validate's naming: "apps/v1" -> "apps-v1", "v1" -> "v1",
    # "policy/v1" -> "policy-v1" (a domain suffix of the group is dropped).
    version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", obj["apiVersion"])
    return SCHEMAS / f"{obj['kind'].lower()}-{version}.json"


def _validate(obj: dict[str, Any], where: str) -> None:
    if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
        return
    path = _schema_file(obj)
    assert path.is_file(), (
        f"{where}: no vendored schema for {obj['apiVersion']} {obj['kind']} ({path.name}): add the kind to "
        "deploy/schemas/kubernetes/vendor.py and re-vendor"
    )
    schema = json.loads(path.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema, registry=_schema_registry())
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, f"{where}: {obj['kind']} {obj['metadata'].get('name')}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:300]}" for e in errors
    )


def test_schemas_are_vendored_with_their_source() -> None:
    source = (ROOT / "deploy/schemas/SOURCE.md").read_text(encoding="utf-8")
    line = next((line for line in source.splitlines() if "kubernetes/" in line), None)
    assert line is not None, "deploy/schemas/SOURCE.md names no source for deploy/schemas/kubernetes"
    for fact in ("kubernetes-validate", "1.32", "Apache"):
        assert fact in line, f"SOURCE.md's kubernetes line should name {fact!r}: {line}"
    assert (SCHEMAS / "LICENSE").is_file()
    assert _schema_registry().get_or_retrieve("https://kubernetes.io/api/_definitions.json")


def test_the_validator_refuses_a_broken_manifest() -> None:
    """The strict schemas catch what a cluster would refuse (so a pass means something)."""
    deployment = _documents(K8S / "base/deployment.yaml")[0]
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(AssertionError, match="paht"):
        _validate(broken, "broken")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(AssertionError, match="replicas"):
        _validate(broken, "broken")


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_file_is_valid(path: Path) -> None:
    for doc in _documents(path):
        if _is_object(doc):
            _validate(doc, str(path.relative_to(ROOT)))


def test_every_manifest_file_is_checked() -> None:
    """The walk above finds the manifests (a renamed directory would check nothing)."""
    names = {str(p.relative_to(K8S)) for p in _manifest_files()}
    assert {
        "base/deployment.yaml",
        "base/service.yaml",
        "base/hpa.yaml",
        "base/pdb.yaml",
        "overlays/gpu/vllm-qwen25-7b.yaml",
        "overlays/cpu/llama.yaml",
        "components/servicemonitor/servicemonitor.yaml",
    } <= names


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_is_valid(overlay: str) -> None:
    objects = _rendered(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    for obj in objects:
        _validate(obj, f"overlays/{overlay} (rendered)")
        assert obj["metadata"].get("namespace") == "switchyard", f"{obj['kind']} {obj['metadata']['name']}"


def test_base_is_namespace_agnostic() -> None:
    for path in (K8S / "base").glob("*.yaml"):
        for doc in _documents(path):
            assert "namespace" not in doc.get("metadata", {}), f"{path.name} sets a namespace"
    assert "namespace" not in yaml.safe_load((K8S / "base/kustomization.yaml").read_text())


# ---------------------------------------------------------------------------------------
# The app: probes, drain, security, volumes


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_app_probes_are_on_the_right_paths_and_port(overlay: str) -> None:
    objects = _rendered(overlay)
    deployment, container = _app(objects)
    port = int(_app_env(objects)["SWITCHYARD_SERVER__PORT"])
    assert _app_env(objects)["SWITCHYARD_SERVER__HOST"] == "0.0.0.0"
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, f"{probe} on {get['path']}"
        assert _port(container, get["port"]) == port, f"{probe} on port {get['port']}, the app listens on {port}"
    # The startup probe gives the app time to load; liveness only counts after it.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    service = _one(objects, "Service", "switchyard")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (service_port,) = service["spec"]["ports"]
    assert _port(container, service_port["targetPort"]) == port


def _uvicorn_margin_s() -> int:
    """The seconds uvicorn waits beyond shutdown_grace_s (serving/cli.py)."""
    source = (ROOT / "serving/cli.py").read_text(encoding="utf-8")
    match = re.search(r"timeout_graceful_shutdown=int\(settings\.server\.shutdown_grace_s\) \+ (\d+)", source)
    assert match, "serving/cli.py no longer sets timeout_graceful_shutdown from shutdown_grace_s: update this test"
    return int(match.group(1))


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_outlasts_prestop_and_drain(overlay: str) -> None:
    objects = _rendered(overlay)
    deployment, container = _app(objects)
    env = _app_env(objects)
    assert "SWITCHYARD_SERVER__SHUTDOWN_GRACE_S" in env, "set the drain explicitly: the grace period depends on it"
    grace = float(env["SWITCHYARD_SERVER__SHUTDOWN_GRACE_S"])
    assert grace == load_settings(None, server={"shutdown_grace_s": grace}).server.shutdown_grace_s
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 1, "a preStop pause lets endpoints stop routing here before SIGTERM"
    termination = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    needed = pre_stop + int(grace) + _uvicorn_margin_s()
    assert termination > needed, (
        f"terminationGracePeriodSeconds {termination} must exceed preStop {pre_stop} + shutdown_grace_s "
        f"{grace:g} + uvicorn's {_uvicorn_margin_s()} s = {needed}, or pods are killed mid-drain"
    )


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_app_runs_as_non_root_on_a_read_only_root(overlay: str) -> None:
    objects = _rendered(overlay)
    deployment, container = _app(objects)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    env = _app_env(objects)
    # Everything the app writes is on a volume: /tmp and the data directory.
    for path in ("/tmp", env["SWITCHYARD_DATA_DIR"]):
        assert path in mounts, f"nothing mounted at {path} on a read-only root"
        assert "emptyDir" in volumes[mounts[path]] or "persistentVolumeClaim" in volumes[mounts[path]]
    # The rolling update keeps every ready pod until its replacement is ready.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # The HPA owns the replica count.
    assert "replicas" not in deployment["spec"]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_files_the_settings_name_are_mounted_or_in_the_image(overlay: str) -> None:
    objects = _rendered(overlay)
    deployment, container = _app(objects)
    env = _app_env(objects)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for name in ("SWITCHYARD_CONFIG", "SWITCHYARD_GATEWAY__MODELS_FILE"):
        path = env[name]
        if path.startswith(IMAGE_CONFIG):
            assert (ROOT / "config" / path.removeprefix(IMAGE_CONFIG)).is_file(), f"{name}={path}: not in config/"
            continue
        mount = next((m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")), None)
        assert mount is not None, f"{name}={path} is on no mounted volume"
        config_map = volumes[mount["name"]]["configMap"]["name"]
        data = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == config_map)["data"]
        assert path.removeprefix(mount["mountPath"] + "/") in data, f"{name}={path}: no such key in {config_map}"


# ---------------------------------------------------------------------------------------
# Settings: every SWITCHYARD_* name is a field, and the files load


def _field_names(model: type[BaseModel], prefix: str = "SWITCHYARD_") -> Iterator[str]:
    """Every environment name pydantic-settings reads for ``model`` (nested by ``__``)."""
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        yield env
        # A section (or an optional one) has fields of its own; a mapping's keys are
        # user-chosen (graph ids, tenants), so only the section's name is checked.
        if get_origin(field.annotation) is dict:
            continue
        for sub in (field.annotation, *get_args(field.annotation)):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                yield from _field_names(sub, env + "__")


def _all_env_names(overlay: str) -> dict[str, str]:
    """SWITCHYARD_* names the overlay's pods get, each with where it came from."""
    names = {}
    for obj in _rendered(overlay):
        if obj["kind"] == "ConfigMap":
            origin = f"ConfigMap {obj['metadata']['name']}"
            names.update({k: origin for k in obj.get("data", {}) if k.startswith("SWITCHYARD_")})
        for container in _containers(obj):
            names.update({e["name"]: f"{obj['metadata']['name']} env" for e in container.get("env", [])})
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    names[ref["key"]] = f"key of Secret {ref['name']}"
    names.update({k: "secret.env.example" for k in _secret_example()})
    return {k: v for k, v in names.items() if k.startswith("SWITCHYARD_")}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_switchyard_env_name_is_a_settings_field(overlay: str) -> None:
    fields = set(_field_names(Settings))
    assert "SWITCHYARD_SERVER__SHUTDOWN_GRACE_S" in fields and "SWITCHYARD_STATE__REDIS_URL" in fields
    names = _all_env_names(overlay)
    assert len(names) > 10
    for name, origin in names.items():
        if name in NON_FIELD_ENV:
            assert name in NON_FIELD_ENV[name].read_text(encoding="utf-8"), f"{name} is no longer read"
            continue
        assert name in fields, f"{name} ({origin}) is not a settings field: a typo the app would ignore"


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_settings_and_model_registry_load(overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's start-up reading of its settings, with the pod's environment."""
    objects = _rendered(overlay)
    for key in [k for k in os.environ if k.startswith("SWITCHYARD_") or k.startswith("VLLM_")]:
        monkeypatch.delenv(key)
    env = _app_env(objects)
    for key, value in {**_secret_example(), **env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SWITCHYARD_CONFIG")
    monkeypatch.setenv("SWITCHYARD_STATE__REPLICA_ID", "switchyard-0")
    config = tmp_path / "switchyard.yaml"
    config.write_text(_config_map(objects, "switchyard-config")["data"]["switchyard.yaml"], encoding="utf-8")
    models_path = env["SWITCHYARD_GATEWAY__MODELS_FILE"]
    if models_path.startswith(IMAGE_CONFIG):
        models = ROOT / "config" / models_path.removeprefix(IMAGE_CONFIG)
    else:
        models = tmp_path / "models.yaml"
        models.write_text(_config_map(objects, "switchyard-models")["data"]["models.yaml"], encoding="utf-8")
    settings = load_settings(config, gateway={"models_file": str(models)})
    assert settings.server.host == "0.0.0.0" and settings.server.port == 8000
    assert settings.shared_dsn, "replicas need the shared PostgreSQL database"
    assert settings.state.redis_url, "replicas share rate-limit buckets through Redis"
    assert settings.knowledge.qdrant_url and settings.knowledge.graph.neo4j_url
    assert set(settings.auth.tenants) >= {"default", "metrics"}
    registry = load_registry(settings.gateway.models_file)
    graph_aliases = {spec.model for spec in settings.graphs.values()}
    assert graph_aliases <= set(registry.aliases), f"the graphs call {graph_aliases}, the registry has {registry.aliases}"


# ---------------------------------------------------------------------------------------
# Scaling: HPA, Prometheus adapter, PDB


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_the_app_on_a_metric_it_exports(overlay: str) -> None:
    objects = _rendered(overlay)
    hpa = _one(objects, "HorizontalPodAutoscaler")
    deployment, _ = _app(objects)
    target = hpa["spec"]["scaleTargetRef"]
    app = ("apps/v1", "Deployment", deployment["metadata"]["name"])
    assert (target["apiVersion"], target["kind"], target["name"]) == app
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    exported = {sample.name for family in ServingMetrics().registry.collect() for sample in family.samples}
    assert name in exported, f"the HPA reads {name}; the app exports {sorted(exported)}"
    assert name == "switchyard_runs_in_flight"
    average = float(metric["pods"]["target"]["averageValue"])
    capacity = float(_app_env(objects)["SWITCHYARD_SERVER__MAX_CONCURRENT_RUNS"])
    assert 0 < average < capacity, "the target must be reached before a pod refuses runs (429)"
    assert hpa["spec"]["minReplicas"] >= 2, "one replica cannot drain without an outage"


def test_prometheus_adapter_serves_the_hpa_metric() -> None:
    import promql_parser

    hpa = _documents(K8S / "base/hpa.yaml")[0]
    wanted = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    values = yaml.safe_load((K8S / "charts/prometheus-adapter-values.yaml").read_text(encoding="utf-8"))
    rules = [r for r in values["rules"]["custom"] if r["name"]["as"] == wanted]
    assert len(rules) == 1, f"no adapter rule exposes {wanted}"
    rule = rules[0]
    assert re.fullmatch(rule["name"]["matches"], wanted)
    assert promql_parser.parse(rule["seriesQuery"])
    assert wanted in rule["seriesQuery"]
    # Pods metrics need the series mapped to pods and namespaces.
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    # The adapter's template, filled as it fills it for one pod.
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", wanted)
        .replace("<<.LabelMatchers>>", 'namespace="switchyard",pod=~"switchyard-.*"')
        .replace("<<.GroupBy>>", "pod")
    )
    assert "<<" not in query
    assert promql_parser.parse(query)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pdb_selects_the_app_pods(overlay: str) -> None:
    objects = _rendered(overlay)
    pdb = _one(objects, "PodDisruptionBudget")
    deployment, _ = _app(objects)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # Never selects another workload's pods (a PDB over two Deployments blocks both).
    for other in objects:
        if other["kind"] == "Deployment" and other is not deployment:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not pdb["spec"]["selector"]["matchLabels"].items() <= other_labels.items()
    assert pdb["spec"].get("maxUnavailable", 0) < _one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"]


@needs_kubectl
def test_servicemonitors_scrape_the_services() -> None:
    """The optional component (a CRD kind: no Kubernetes schema) points at real Services."""
    with tempfile.TemporaryDirectory() as tmp:
        relative = os.path.relpath(K8S, tmp)
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [f"{relative}/overlays/gpu"],
                    "components": [f"{relative}/components/servicemonitor"],
                }
            )
        )
        objects = _kustomize(Path(tmp))
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"switchyard", "vllm"}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = [
            o for o in objects if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()
        ]
        assert services, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["path"] == "/metrics"
            for service in services:
                assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The app's /metrics needs a key: the app's monitor sends one from a Secret.
    app = next(m for m in monitors if m["metadata"]["name"] == "switchyard")
    assert app["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "switchyard-metrics-key"


# ---------------------------------------------------------------------------------------
# Model servers: vLLM (gpu), llama-server (cpu)


def _vllm_args_printed(env: dict[str, str]) -> list[str]:
    """What ``switchyard backend vllm-args vllm`` prints, as argv."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHYARD_", "VLLM_"))}
    run_env.update({k: v for k, v in env.items() if k.startswith("VLLM_")})
    run_env["SWITCHYARD_GATEWAY__MODELS_FILE"] = str(ROOT / "config/models.vllm.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "serving.cli", "backend", "vllm-args", "vllm"],
        cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, f"switchyard backend vllm-args vllm failed:\n{done.stdout}\n{done.stderr}"
    # As a shell reads it: a backslash-newline continues the line.
    return shlex.split(done.stdout.replace("\\\n", " "))


@needs_kubectl
def test_vllm_runs_exactly_the_generated_command() -> None:
    objects = _rendered("gpu")
    env = _app_env(objects)
    assert env["SWITCHYARD_GATEWAY__MODELS_FILE"] == IMAGE_CONFIG + "models.vllm.yaml"
    vllm = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"
    ]
    assert len(vllm) == 1, "one vLLM Deployment per model backend (config/models.vllm.yaml has one)"
    (container,) = vllm[0]["spec"]["template"]["spec"]["containers"]
    printed = _vllm_args_printed(env)
    assert printed[:2] == ["vllm", "serve"]
    assert [*container["command"], *container["args"]] == printed
    assert container["image"].startswith("vllm/vllm-openai:")


@needs_kubectl
def test_vllm_service_is_what_the_registry_calls() -> None:
    objects = _rendered("gpu")
    env = _app_env(objects)
    backend = load_registry(ROOT / "config/models.vllm.yaml").backends["vllm"]
    url = urlsplit(env["VLLM_BASE_URL"])
    assert url.path == "/v1" and url.scheme == "http"
    service = _one(objects, "Service", url.hostname)
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment"
        and service["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == url.port
    listen = int(container["args"][container["args"].index("--port") + 1])
    assert _port(container, port["targetPort"]) == listen
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], _port(container, get["port"])) == ("/health", listen), probe
    # The registry's default (compose's `vllm` host) is replaced, not used by accident.
    assert backend.api_key_env == "VLLM_API_KEY"
    keys = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert keys["VLLM_API_KEY"] == {"name": "switchyard-secrets", "key": "VLLM_API_KEY"}
    # Rolling update: a new pod is ready before an old one goes.
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert (rolling["maxUnavailable"], rolling["maxSurge"]) == (0, 1)
    # Weights on a claim, not on a node's disk.
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert not any("hostPath" in v for v in volumes)
    claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v]
    assert claims and all(_one(objects, "PersistentVolumeClaim", c) for c in claims)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_limits_only_in_the_gpu_overlay(overlay: str) -> None:
    gpus = {
        f"{o['metadata']['name']}/{c['name']}": c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        for o in _rendered(overlay)
        for c in _containers(o)
    }
    with_gpu = {name for name, count in gpus.items() if count is not None}
    if overlay == "gpu":
        assert with_gpu == {"vllm-qwen25-7b/vllm"}
        assert int(gpus["vllm-qwen25-7b/vllm"]) >= 1
    else:
        assert not with_gpu, f"the cpu overlay asks for GPUs: {with_gpu}"
        assert not any(o["metadata"]["name"].startswith("vllm") for o in _rendered(overlay))


@needs_kubectl
def test_cpu_overlay_serves_the_llama_image() -> None:
    objects = _rendered("cpu")
    registry_text = _config_map(objects, "switchyard-models")["data"]["models.yaml"]
    backend = next(iter(yaml.safe_load(registry_text)["backends"].values()))
    url = urlsplit(backend["base_url"])
    service = _one(objects, "Service", url.hostname)
    deployment = _one(objects, "Deployment", "llama")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("switchyard-llama:")
    (port,) = service["spec"]["ports"]
    assert port["port"] == url.port
    listen = _port(container, port["targetPort"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert _port(container, container["readinessProbe"]["httpGet"]["port"]) == listen
    dockerfile = ROOT / "Dockerfile"
    if not dockerfile.is_file():
        pytest.skip("no Dockerfile: the llama target's port and model alias cannot be compared")
    text = dockerfile.read_text(encoding="utf-8")
    llama_stage = text.split("AS llama\n", 1)[1].split("\nFROM ", 1)[0]
    assert f'"--port", "{listen}"' in llama_stage, "the llama image listens elsewhere"
    assert f'"--alias", "{backend["model"]}"' in llama_stage, "the llama image serves another model name"


# ---------------------------------------------------------------------------------------
# Images and secrets


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay: str) -> None:
    for obj in _rendered(overlay):
        for container in _containers(obj):
            image = container["image"]
            name, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
            assert name and tag and "/" not in tag, f"{obj['metadata']['name']}: {image} has no tag"
            assert tag != "latest", f"{obj['metadata']['name']}: {image}"


def test_charts_are_pinned() -> None:
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    for values in ("qdrant-values.yaml", "neo4j-values.yaml", "prometheus-adapter-values.yaml"):
        text = (K8S / "charts" / values).read_text(encoding="utf-8")
        for source in (text, readme):
            installs = [line for line in source.splitlines() if "helm install" in line and values in line]
            assert installs, f"no `helm install ... -f {values}` line"
            for line in installs:
                assert re.search(r"--version \d+\.\d+\.\d+", line), f"unpinned chart: {line.strip()}"
    qdrant = yaml.safe_load((K8S / "charts/qdrant-values.yaml").read_text(encoding="utf-8"))
    assert re.fullmatch(r"v\d+\.\d+\.\d+", qdrant["image"]["tag"])


def test_no_secret_values_are_committed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "deploy/k8s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [p for p in tracked if Path(p).name == "secret.env"], "a secret.env (real values) is in git"
    for path in (p for p in K8S.rglob("*") if p.is_file()):
        if path.suffix in (".yaml", ".yml"):
            for doc in _documents(path):
                if isinstance(doc, dict):
                    assert doc.get("kind") != "Secret", f"{path}: a Secret's values are in git"
                    assert "secretGenerator" not in doc, f"{path}: generate the Secret outside git"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(K8S / "base/secret.env")], cwd=ROOT, check=False)
    assert ignored.returncode == 0, "deploy/k8s/base/secret.env is not git-ignored"
    example = _secret_example()
    for key, value in example.items():
        assert "CHANGE-ME" in value, f"secret.env.example: {key} holds a value, not a placeholder"
    # Every key a pod takes from the Secret is documented in the example.
    referenced = set()
    for path in _manifest_files():
        for doc in _documents(path):
            if not _is_object(doc):
                continue
            for container in _containers(doc):
                for e in container.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref and ref["name"] == "switchyard-secrets" and not ref.get("optional"):
                        referenced.add(ref["key"])
    assert referenced and referenced <= set(example), f"undocumented Secret keys: {referenced - set(example)}"
    # The charts read their credentials from Secrets, never from the values.
    qdrant = yaml.safe_load((K8S / "charts/qdrant-values.yaml").read_text(encoding="utf-8"))
    assert qdrant["apiKey"]["valueFrom"]["secretKeyRef"]["key"] in example
    neo4j = yaml.safe_load((K8S / "charts/neo4j-values.yaml").read_text(encoding="utf-8"))
    assert neo4j["neo4j"]["passwordFromSecret"] and not neo4j["neo4j"].get("password")


def test_our_images_carry_the_release_version() -> None:
    """`switchyard` and `switchyard-llama` are built from this repository: their tags
    follow pyproject's version (the Dockerfile's `docker build -t switchyard:<version>`)."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    tags = {}
    for kustomization in K8S.glob("**/kustomization.yaml"):
        for image in yaml.safe_load(kustomization.read_text(encoding="utf-8")).get("images", []):
            tags[image["name"]] = image["newTag"]
    assert tags["switchyard"] == version
    assert tags["switchyard-llama"] == version
    assert all(tag and tag != "latest" for tag in tags.values()), tags


def test_cpu_registry_describes_the_local_server() -> None:
    """The llama image runs the flags `switchyard backend start` uses for config/models.yaml's
    `local` backend: the cpu overlay's registry must promise what that server can do."""
    ours_file = yaml.safe_load((K8S / "overlays/cpu/models.yaml").read_text(encoding="utf-8"))
    ours = next(iter(ours_file["backends"].values()))
    local = yaml.safe_load((ROOT / "config/models.yaml").read_text(encoding="utf-8"))["backends"]["local"]
    assert ours["kind"] == local["kind"] == "llamacpp"
    assert "launch" not in ours, "the server runs in its own pod: Switchyard must not try to start it"
    assert (ours["model"], ours["capabilities"]) == (local["model"], local["capabilities"])
    assert load_registry(K8S / "overlays/cpu/models.yaml").aliases
