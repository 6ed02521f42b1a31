"""The Grafana dashboard and the Prometheus alert rules (``deploy/grafana``,
``deploy/prometheus/alerts.yml``).

Every PromQL expression is parsed by ``promql_parser`` (a port of Prometheus's own
grammar), after Grafana's template variables are replaced by sample values. Every
metric an expression names must be one a real Switchyard exports (its ``/metrics``,
scraped after a few runs so histograms and labelled counters have samples) or one of
vLLM's own, listed in `VLLM_METRICS` with the vLLM version it comes from and checked
against the recorded vLLM bodies of ``tests/gateway/data``. Label matchers and
``by (...)`` groupings are checked against the labels the series really carry, where
a sample shows them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import start_server, stop_server, write_models_file
from tests.promql import sample

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/dashboards/switchyard.json"
DATASOURCES = REPO / "deploy/grafana/provisioning/datasources/prometheus.yaml"
PROVIDERS = REPO / "deploy/grafana/provisioning/dashboards/switchyard.yaml"
ALERTS = REPO / "deploy/prometheus/alerts.yml"
OPERATIONS = REPO / "docs/operations.md"
ONTOLOGY = REPO / "config/ontologies/city-services.yaml"
VLLM_DATA = REPO / "tests/gateway/data"

VLLM_V1 = "0.10 (V1 engine, vllm/v1/metrics/loggers.py)"
VLLM_V0 = "< 0.9 (V0 engine, vllm/engine/metrics.py)"
RECORDED_VLLM = {VLLM_V1: "vllm_metrics_v1.txt", VLLM_V0: "vllm_metrics_v0.txt"}
"""The recorded vLLM ``/metrics`` bodies (see tests/gateway/test_vllm_metrics.py) by
the vLLM version whose metric definitions produced them."""

VLLM_METRICS: dict[str, str] = {
    "vllm:num_requests_running": VLLM_V1,
    "vllm:num_requests_waiting": VLLM_V1,
    "vllm:kv_cache_usage_perc": VLLM_V1,
    "vllm:gpu_cache_usage_perc": VLLM_V0,  # renamed in 0.9, hidden from 0.10
    "vllm:request_queue_time_seconds_bucket": VLLM_V1,
    "vllm:time_to_first_token_seconds_bucket": VLLM_V1,
    "vllm:e2e_request_latency_seconds_bucket": VLLM_V1,
    "vllm:generation_tokens_total": VLLM_V1,
    "vllm:num_preemptions_total": VLLM_V1,
}
"""vLLM's own metrics (scraped by Prometheus from the vllm service) that the dashboard
and the rules may name, with the vLLM version they are taken from."""

TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""

REQUIRED_PANELS = (
    "Time to first token p50 / p95 / p99 by graph and backend",
    "Run latency p50 / p95 / p99 by route",
    "Request latency p95 by route and status",
    "Output tokens/s by graph",
    "Output tokens/s per run p50 / p10",
    "Runs/s by graph and outcome",
    "In-flight runs by replica",
    "Tool decisions by tool and decision",
    "Retrieval hits per search p50 / p95 by source",
    "Empty retrievals by source",
    "Circuit breaker state by backend",
    "Breaker transitions by backend and state",
    "Backend errors/s by backend and error",
    "Run error ratio by graph",
    "Rate-limit rejections by reason",
    "Rate-limit store errors by replica",
    "Runs reaped from dead replicas",
    "vLLM KV-cache usage",
    "vLLM queue time p50 / p95",
    "vLLM running and waiting requests",
    "vLLM time to first token and end-to-end latency p95",
    "vLLM generation tokens/s and preemptions/s",
)

REQUIRED_ALERTS = (
    "SwitchyardTimeToFirstTokenOverSla",
    "SwitchyardRunLatencyOverSla",
    "SwitchyardVllmQueueTimeHigh",
    "SwitchyardVllmKvCacheHigh",
    "SwitchyardRunErrorRateHigh",
    "SwitchyardBackendErrorRateHigh",
    "SwitchyardBreakerOpen",
    "SwitchyardRateLimitStoreErrors",
    "SwitchyardReplicaRunsReaped",
    "SwitchyardRetrievalEmptyHigh",
)

GRAFANA_BUILTINS = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "3h",
    "__range_s": "10800",
    "__range_ms": "10800000",
}
"""Grafana's own variables, with a sample value each."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.+),\s*)?(\w+)\)\s*$")

# Prometheus's rule format: the keys it accepts (anything else fails `promtool check rules`).
_GROUP_KEYS = frozenset({"name", "interval", "limit", "query_offset", "labels", "rules"})
_ALERT_KEYS = frozenset({"alert", "expr", "for", "keep_firing_for", "labels", "annotations"})
_SEVERITIES = frozenset({"critical", "warning", "info"})


# --------------------------------------------------------------------------- reading the files


def _load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def _load_rules() -> dict[str, Any]:
    return yaml.safe_load(ALERTS.read_text(encoding="utf-8"))


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in _load_rules()["groups"] for rule in group["rules"]]


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in dashboard["templating"]["list"]}


def substitute(expr: str, variables: set[str]) -> str:
    """``expr`` with Grafana's variables (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``)
    replaced: builtins by a sample value, the dashboard's own by ``.*`` (they are
    multi-value regex variables).

    Raises:
        AssertionError: a variable the dashboard does not define.
    """

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        assert name in variables, f"{expr!r} uses ${name}, which the dashboard does not define"
        return ".*"

    return _VARIABLE.sub(replace, expr)


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and where it was written."""

    where: str
    expr: str
    """As written (Grafana variables not yet replaced)."""
    label: str | None = None
    """For a variable's ``label_values(metric, label)``: the label it lists."""


def _queries() -> list[Query]:
    dashboard = _load_dashboard()
    variables = _variables(dashboard)
    queries = []
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            queries.append(Query(f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for name, variable in variables.items():
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text)
        assert match and match.group(1), f"variable {name}: {text!r} is not label_values(metric, label)"
        queries.append(Query(f"variable {name}", match.group(1), label=match.group(2)))
    for rule in _alert_rules():
        queries.append(Query(f"alert {rule['alert']}", rule["expr"]))
    return queries


def _parse(query: Query) -> promql_parser.Expr:
    names = set(_variables(_load_dashboard()))
    return promql_parser.parse(substitute(query.expr, names))


def _selectors(expr: promql_parser.Expr) -> list[tuple[str, list[promql_parser.Matcher]]]:
    """Every vector selector under ``expr``: its metric name (from the name or a
    ``__name__`` matcher) and its other label matchers."""
    found: list[tuple[str, list[promql_parser.Matcher]]] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = list(node.matchers.matchers) if node.matchers else []
            name = node.name
            for matcher in matchers:
                if matcher.name == "__name__":
                    assert matcher.op == promql_parser.MatchOp.Equal, f"a regex on __name__ in {node}"
                    name = matcher.value
            assert name, f"a selector without a metric name: {node}"
            found.append((name, [m for m in matchers if m.name != "__name__"]))

    promql_parser.walk(expr, visit)
    return found


# --------------------------------------------------------------------------- what is exported

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


@dataclass(frozen=True, slots=True)
class Exported:
    """The series names a ``/metrics`` body exports, and the labels seen on each."""

    names: frozenset[str]
    labels: dict[str, frozenset[str]]
    """By series name, for the series that had samples (a labelled metric no one has
    touched yet shows its type but no labels)."""


def exported_series(text: str) -> Exported:
    """The series names of a Prometheus text body: each family's name with the
    suffixes its type gives its samples (a counter ``x`` is ``x_total``; a histogram
    ``x`` is ``x_bucket``, ``x_sum``, ``x_count``), whether or not it has samples yet,
    plus every sample's own name."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        for point in family.samples:
            names.add(point.name)
            labels.setdefault(point.name, set()).update(point.labels)
    return Exported(frozenset(names), {name: frozenset(found) for name, found in labels.items()})


def _vllm_exported() -> dict[str, Exported]:
    return {
        version: exported_series((VLLM_DATA / file).read_text(encoding="utf-8"))
        for version, file in RECORDED_VLLM.items()
    }


@dataclass(frozen=True, slots=True)
class ScrapedApp:
    """A real Switchyard's metrics and the route templates its ``route`` label takes."""

    metrics: Exported
    routes: frozenset[str]
    """Every path of its OpenAPI description (``/threads/{thread_id}/runs/stream``)."""
    text: str
    """The ``/metrics`` body itself."""
    targets: frozenset[str]
    """The graph ids and model aliases it was configured with."""


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ScrapedApp]:
    """What a real Switchyard's ``/metrics`` exports after an answered stream, an
    answered graph run, a backend failure, a tool call, a refused oversized body, a
    breaker that opened (all through the FAKE scripted backend, so no model is
    needed), a rag run over an uploaded document, a search that finds nothing and a
    knowledge-graph search (the real packaged embedder and embedded stores), so that
    the labelled series have samples and show their labels. Its backends are ``kind:
    vllm``, so the vLLM load families are exported too (without samples: the fake has
    no ``/metrics``)."""
    tmp = tmp_path_factory.mktemp("dashboard-server")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    registry = yaml.safe_load(models.read_text(encoding="utf-8"))
    registry["backends"]["fake-tools"] = {**registry["backends"]["fake-ok"], "model": "fake-tools"}
    registry["aliases"]["fake-tools"] = "fake-tools"
    models.write_text(yaml.safe_dump(registry), encoding="utf-8")
    graphs = {
        "chat-fake": {"path": "graphs.chat:make_graph", "model": "fake-ok"},
        "agent-fake": {"path": "graphs.agent:make_graph", "model": "fake-tools", "tools": ["calculator"]},
        "rag-fake": {"path": "graphs.rag:make_graph", "model": "fake-ok"},
    }
    handle = start_server(
        tmp, {"gateway": {"models_file": str(models)}, "graphs": graphs, "knowledge": {"default_collection": "docs"}}
    )
    try:
        url = handle.url + "/v1/chat/completions"

        def ask(model: str, content: str = "hello", **extra: Any) -> int:
            body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
            return httpx.post(url, json=body, timeout=30).status_code

        stream = {"model": "fake-ok", "messages": [{"role": "user", "content": "hello"}], "stream": True}
        with httpx.stream("POST", url, json=stream, timeout=30) as response:
            assert response.status_code == 200 and list(response.iter_lines())
        assert ask("chat-fake") == 200
        assert ask("fake-500") == 502
        assert ask("agent-fake", "SCRIPT:calc") == 200  # the fake asks for the calculator once
        assert ask("fake-ok", "x" * 1_100_000) == 413  # over server.max_body_bytes (1 MiB)
        for _ in range(4):  # a closed port: its breaker opens after 3 failures (the default)
            assert ask("down") in (502, 503)
        _search_knowledge(handle.url + "/v1/collections/docs")
        # A streamed graph run (time to first token is measured on streams): one vector search.
        rag = {"model": "rag-fake", "messages": [{"role": "user", "content": "Who issues the Resident Card?"}], "stream": True}
        with httpx.stream("POST", url, json=rag, timeout=60) as response:
            assert response.status_code == 200 and list(response.iter_lines())
        assert ask("no-such-model") == 404
        response = httpx.get(handle.url + "/metrics", timeout=10)
        assert response.status_code == 200
        openapi = httpx.get(handle.url + "/openapi.json", timeout=10)  # served in --dev
        assert openapi.status_code == 200
        targets = frozenset(graphs) | frozenset(registry["aliases"])
        yield ScrapedApp(exported_series(response.text), frozenset(openapi.json()["paths"]), response.text, targets)
    finally:
        stop_server(handle)


DOCUMENTS = [
    {"id": "card.md", "text": "# Resident Card\n\nThe Citizen Desk issues the Resident Card.\n", "format": "markdown"},
    {"id": "housing.md", "text": "# Housing benefit\n\nThe housing benefit requires your Resident Card.\n", "format": "markdown"},
]
FACTS = [
    {"kind": "entity", "type": "Document", "name": "Resident Card", "source": "card.md"},
    {"kind": "entity", "type": "Office", "name": "Citizen Desk", "source": "card.md"},
    {"kind": "relation", "type": "ISSUED_BY", "from": "Resident Card", "to": "Citizen Desk", "source": "card.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Housing Benefit", "to": "Resident Card", "source": "housing.md"},
    {"kind": "entity", "type": "Procedure", "name": "Housing Benefit", "source": "housing.md"},
]


def _search_knowledge(collection_url: str) -> None:
    """Upload two documents and their graph facts through the collections API, then
    search: one vector search that finds nothing (a tag no chunk has) and one graph
    search (facts, and chunks beside them)."""
    upload = httpx.post(collection_url + "/documents", json={"documents": DOCUMENTS}, timeout=60)
    assert upload.status_code == 200 and upload.json()["added"] == 2, upload.text
    imported = httpx.post(
        collection_url + "/graph/import",
        json={"lines": [json.dumps(f) for f in FACTS], "ontology": ONTOLOGY.read_text(encoding="utf-8")},
        timeout=60,
    )
    assert imported.status_code == 200 and imported.json()["invalid"] == {}, imported.text
    empty = httpx.post(collection_url + "/search", json={"query": "Resident Card", "filter": {"tags": ["none"]}}, timeout=30)
    assert empty.status_code == 200 and empty.json()["results"] == [], empty.text
    both = httpx.post(collection_url + "/search", json={"query": "Who issues the Resident Card?", "graph": True}, timeout=30)
    assert both.status_code == 200, both.text
    assert {r["kind"] for r in both.json()["results"]} == {"fact", "chunk"}


# --------------------------------------------------------------------------- tests


def test_metric_name_derivation_follows_the_exposition_format() -> None:
    text = (
        "# TYPE a_total counter\n"
        'a_total{x="1"} 2.0\n'
        "# TYPE b histogram\n"
        'b_bucket{le="1.0",y="2"} 1.0\nb_bucket{le="+Inf",y="2"} 1.0\nb_sum{y="2"} 0.5\nb_count{y="2"} 1.0\n'
        "# TYPE c gauge\n"
        "# TYPE d counter\n"
    )
    found = exported_series(text)
    assert {"a_total", "b_bucket", "b_sum", "b_count", "c", "d_total"} <= found.names
    assert not {"a", "b", "d", "c_total"} & found.names
    assert found.labels["b_bucket"] == {"le", "y"} and found.labels["b_count"] == {"y"}
    assert "c" not in found.labels  # no samples: no labels known


def test_the_dashboard_has_the_panels_and_variables() -> None:
    dashboard = _load_dashboard()
    panels = _panels(dashboard)
    titles = [panel["title"] for panel in panels]
    assert not set(REQUIRED_PANELS) - set(titles), set(REQUIRED_PANELS) - set(titles)
    assert len(titles) == len(set(titles)), "panel titles repeat"
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']}: no query"
            assert panel.get("description"), f"{panel['title']}: no description"
            refs = [target["refId"] for target in panel["targets"]]
            assert len(refs) == len(set(refs)), f"{panel['title']}: refIds repeat"
    assert {"graph", "backend"} <= set(_variables(dashboard))
    assert dashboard["uid"] == "switchyard" and dashboard["title"]


def test_every_panel_queries_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))
    (source,) = provisioned["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    uid = source["uid"]
    dashboard = _load_dashboard()
    for panel in _panels(dashboard):
        if panel["type"] == "row":  # a row has no queries of its own
            assert not panel.get("targets"), panel["title"]
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": uid}, (panel["title"], target["refId"])
    for name, variable in _variables(dashboard).items():
        assert variable["datasource"] == {"type": "prometheus", "uid": uid}, name


def test_the_dashboard_provider_reads_the_mounted_directory() -> None:
    provisioned = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))
    (provider,) = provisioned["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.mark.parametrize("query", _queries(), ids=lambda q: q.where)
def test_every_expression_parses(query: Query) -> None:
    _parse(query)


def test_an_undefined_variable_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"\$tenant"):
        substitute('sum(rate(x{tenant=~"$tenant"}[$__rate_interval]))', {"graph"})
    assert substitute('x{a=~"${graph:regex}"}[$__rate_interval]', {"graph"}) == 'x{a=~".*"}[5m]'


def test_listed_vllm_metrics_are_vllm_s_own_and_used() -> None:
    recorded = _vllm_exported()
    for name, version in VLLM_METRICS.items():
        assert name in recorded[version].names, f"{name} is not in the recorded vLLM {version} body"
    used = {name for query in _queries() for name, _ in _selectors(_parse(query)) if name.startswith("vllm:")}
    assert used == set(VLLM_METRICS), f"listed but unused: {set(VLLM_METRICS) - used}; unlisted: {used - set(VLLM_METRICS)}"


def _known_labels(name: str, app: Exported, vllm: dict[str, Exported]) -> frozenset[str] | None:
    """The labels series ``name`` carries in Prometheus, or ``None`` if no sample showed them."""
    if name in VLLM_METRICS:
        labels = vllm[VLLM_METRICS[name]].labels.get(name)
    else:
        labels = app.labels.get(name)
    return None if labels is None else labels | TARGET_LABELS


@pytest.mark.e2e
def test_expressions_name_only_exported_metrics_and_labels(app: ScrapedApp) -> None:
    app_metrics = app.metrics
    vllm = _vllm_exported()
    problems: list[str] = []
    unchecked: set[str] = set()
    for query in _queries():
        expr = _parse(query)
        for name, matchers in _selectors(expr):
            if name.startswith("vllm:"):
                if name not in VLLM_METRICS:
                    problems.append(f"{query.where}: {name} is not a listed vLLM metric")
                    continue
            elif name not in app_metrics.names:
                problems.append(f"{query.where}: {name} is not exported by the app")
                continue
            labels = _known_labels(name, app_metrics, vllm)
            if labels is None:
                unchecked.add(name)
                continue
            for matcher in matchers:
                if matcher.name not in labels:
                    problems.append(f"{query.where}: {name} has no label {matcher.name!r} (it has {sorted(labels)})")
            if query.label is not None and query.label not in labels:
                problems.append(f"{query.where}: {name} has no label {query.label!r} to list")

        def grouping(node: promql_parser.Expr) -> None:
            modifier = getattr(node, "modifier", None)
            if not isinstance(node, promql_parser.AggregateExpr) or modifier is None:
                return
            if modifier.type != promql_parser.AggModifierType.By:
                return
            inner = [_known_labels(name, app_metrics, vllm) for name, _ in _selectors(node.expr)]
            if not inner or any(labels is None for labels in inner):
                return
            available = frozenset().union(*(labels for labels in inner if labels is not None))
            for label in modifier.labels:
                if label not in available:
                    problems.append(f"{query.where}: groups by {label!r}, which none of {node.expr} carries")

        promql_parser.walk(expr, grouping)
    assert not problems, "\n".join(problems)
    # Only the vLLM load gauges lack samples (the fake backend has no /metrics): every
    # other series' labels were checked.
    assert unchecked <= {"switchyard_backend_kv_cache_usage"}, unchecked


@pytest.mark.e2e
def test_the_new_replica_metrics_are_exported(app: ScrapedApp) -> None:
    # Unlabelled counters: exported from the start, before any Redis error or reaped run.
    assert {"switchyard_rate_limit_store_errors_total", "switchyard_replica_runs_reaped_total"} <= app.metrics.names
    assert "switchyard_time_to_first_token_seconds_bucket" in app.metrics.labels  # the runs above did reach it


@pytest.mark.e2e
def test_time_to_first_token_is_split_by_configured_targets_only(app: ScrapedApp) -> None:
    assert app.metrics.labels["switchyard_time_to_first_token_seconds_bucket"] == {"kind", "target", "backend", "le"}
    seen = _label_values(app.text, "switchyard_time_to_first_token_seconds_count", "target")
    # Streamed runs of a graph and of an alias, by the graph id or alias they served;
    # a refused model name (404) never becomes a label value.
    assert {"rag-fake", "fake-ok"} <= seen <= app.targets, seen


@pytest.mark.e2e
def test_retrieval_hits_are_counted_by_source(app: ScrapedApp) -> None:
    assert app.metrics.labels["switchyard_retrieval_hits_bucket"] == {"source", "le"}
    assert _label_values(app.text, "switchyard_retrieval_hits_count", "source") == {"vectors", "graph"}
    # Vectors: the empty search, the graph search's chunks, the rag run's search.
    assert sample(app.text, "switchyard_retrieval_hits_count", source="vectors") == 3
    assert sample(app.text, "switchyard_retrieval_hits_bucket", source="vectors", le="0.0") == 1
    # Graph: one retrieval, which found facts.
    assert sample(app.text, "switchyard_retrieval_hits_count", source="graph") == 1
    assert sample(app.text, "switchyard_retrieval_hits_bucket", source="graph", le="0.0") == 0
    assert sample(app.text, "switchyard_retrieval_hits_sum", source="graph") >= 1


def _label_values(text: str, name: str, label: str) -> set[str]:
    return {
        found.labels[label]
        for family in text_string_to_metric_families(text)
        for found in family.samples
        if found.name == name and label in found.labels
    }


@pytest.mark.e2e
def test_route_matchers_match_the_app_s_routes(app: ScrapedApp) -> None:
    """A ``route`` matcher that matches no route of the app selects nothing, silently."""
    assert "/v1/chat/completions" in app.routes and "/threads/{thread_id}/runs/stream" in app.routes
    problems = []
    for query in _queries():
        for name, matchers in _selectors(_parse(query)):
            for matcher in matchers:
                if matcher.name != "route":
                    continue
                if matcher.op in (promql_parser.MatchOp.Re, promql_parser.MatchOp.NotRe):
                    # PromQL anchors regexes; each alternative must name a real route.
                    for alternative in _alternatives(matcher.value):
                        if not any(re.fullmatch(alternative, route) for route in app.routes):
                            problems.append(f"{query.where}: {name} route {alternative!r} matches no route")
                elif matcher.value not in app.routes:
                    problems.append(f"{query.where}: {name} route {matcher.value!r} is no route")
    assert not problems, "\n".join(problems)


def _alternatives(regex: str) -> list[str]:
    """The top-level ``|`` alternatives of ``regex`` (outside parentheses and classes)."""
    parts, depth, start, in_class = [], 0, 0, False
    for index, char in enumerate(regex):
        if char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif not in_class and char == "(":
            depth += 1
        elif not in_class and char == ")":
            depth -= 1
        elif not in_class and depth == 0 and char == "|":
            parts.append(regex[start:index])
            start = index + 1
    return [*parts, regex[start:]]


def test_alert_rules_are_valid_prometheus_rules() -> None:
    document = _load_rules()
    assert set(document) == {"groups"}
    group_names = [group["name"] for group in document["groups"]]
    assert len(group_names) == len(set(group_names)), "group names repeat"
    alerts: list[str] = []
    for group in document["groups"]:
        assert set(group) <= _GROUP_KEYS, (group["name"], set(group) - _GROUP_KEYS)
        assert group["rules"], group["name"]
        for rule in group["rules"]:
            name = rule.get("alert")
            assert name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), rule
            assert set(rule) <= _ALERT_KEYS, (name, set(rule) - _ALERT_KEYS)
            assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
            promql_parser.parse_duration(rule["for"])  # raises on a malformed duration
            assert rule["labels"]["severity"] in _SEVERITIES, name
            for label in rule["labels"]:
                assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label), (name, label)
            annotations = rule["annotations"]
            assert annotations["summary"].strip() and annotations["description"].strip(), name
            assert annotations["runbook_url"] == f"docs/operations.md#{name.lower()}", name
            for text in annotations.values():
                assert text.count("{{") == text.count("}}"), (name, text)
            alerts.append(name)
    assert len(alerts) == len(set(alerts)), "alert names repeat"
    assert not set(REQUIRED_ALERTS) - set(alerts), set(REQUIRED_ALERTS) - set(alerts)


def _numbers(expr: str) -> set[float]:
    found: set[float] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.NumberLiteral):
            found.add(node.val)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_sla_thresholds_agree_with_their_labels_and_the_registries() -> None:
    slas = {"sla_ttft_s": set(), "sla_total_s": set()}
    for rule in _alert_rules():
        for key, values in slas.items():
            if key in rule["labels"]:
                threshold = float(rule["labels"][key])
                assert threshold in _numbers(rule["expr"]), f"{rule['alert']}: {key} {threshold} is not its threshold"
                values.add(threshold)
    assert all(len(values) == 1 for values in slas.values()), slas
    # An SLA written on the default alias of a shipped registry must be the one alerted on.
    for models in sorted(REPO.glob("config/models*.yaml")):
        alias = (yaml.safe_load(models.read_text(encoding="utf-8")).get("aliases") or {}).get("chat-default")
        sla = alias.get("sla") if isinstance(alias, dict) else None
        if sla and sla.get("ttft_s") is not None:
            assert slas["sla_ttft_s"] == {float(sla["ttft_s"])}, models.name
        if sla and sla.get("total_s") is not None:
            assert slas["sla_total_s"] == {float(sla["total_s"])}, models.name


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_runbook_anchor_is_a_heading_of_the_operations_guide() -> None:
    if not OPERATIONS.exists():
        pytest.skip("docs/operations.md is not written yet")
    headings = {
        _anchor(line.lstrip("#")) for line in OPERATIONS.read_text(encoding="utf-8").splitlines() if line.startswith("#")
    }
    missing = [rule["alert"] for rule in _alert_rules() if rule["annotations"]["runbook_url"].split("#")[1] not in headings]
    assert not missing, f"docs/operations.md has no heading for {missing}"


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus); the rule format is checked above")
    result = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
