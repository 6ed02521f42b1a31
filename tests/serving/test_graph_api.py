"""The knowledge graph through a real server: the collections API's graph routes
(ontology binding, curated import, neighbours, graph search, stats), the CLI going
through the server that holds the stores, facts removed with their document, tenants
kept to their collections and documents, and bad input answered with a 4xx naming
what was wrong (never a 500)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD, ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

ONTOLOGY = (REPO / "config/ontologies/city-services.yaml").read_text()
OTHER_ONTOLOGY = "name: other\nentity_types:\n  Thing: {description: Anything.}\n"

DOCUMENTS = [
    {
        "id": "unemployment-benefit.md",
        "title": "Unemployment benefit",
        "text": "# Unemployment benefit\n\nTo apply for the unemployment benefit you need a Separation Certificate "
        "from your last employer. The benefit is paid by the Employment Office on Dock Street.",
    },
    {
        "id": "separation-certificate.md",
        "title": "Separation certificate",
        "text": "# When the employer refuses\n\nIf an employer refuses to write the paper, the Labour Arbitration "
        "Office at 4 Quarry Lane writes it instead after a short hearing.",
    },
]

FACTS = [
    {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "unemployment-benefit.md"},
    {
        "kind": "entity",
        "type": "Document",
        "name": "Separation Certificate",
        "aliases": ["separation paper"],
        "source": "unemployment-benefit.md",
    },
    {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "unemployment-benefit.md"},
    {
        "kind": "entity",
        "type": "Office",
        "name": "Labour Arbitration Office",
        "properties": {"address": "4 Quarry Lane"},
        "source": "separation-certificate.md",
    },
    {"kind": "entity", "type": "Document", "name": "Separation Certificate", "source": "separation-certificate.md"},
    {
        "kind": "relation",
        "type": "ISSUED_INSTEAD_BY",
        "from": "Separation Certificate",
        "to": "Labour Arbitration Office",
        "source": "separation-certificate.md",
    },
]
LINES = [json.dumps(f) for f in FACTS]


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    """Counts per type without the types that have none (stores may list those as 0)."""
    return {kind: n for kind, n in counts.items() if n}


def _run(config: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ.copy()
    env.pop("SWITCHYARD_API_KEY", None)
    if key:
        env["SWITCHYARD_API_KEY"] = key
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False,
    )


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("graph-api")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
    }
    handle = start_server(tmp, settings)
    try:
        yield handle
    finally:
        stop_server(handle)


def _collection(server: ServerHandle, name: str) -> str:
    return f"{server.url}/v1/collections/{name}"


def _seed(server: ServerHandle, name: str) -> None:
    url = _collection(server, name)
    assert httpx.post(url + "/documents", json={"documents": DOCUMENTS}, timeout=120).status_code == 200
    bound = httpx.put(url + "/graph/ontology", json={"ontology": ONTOLOGY}, timeout=60)
    assert bound.status_code == 200, bound.text
    report = httpx.post(url + "/graph/import", json={"lines": LINES, "source": "facts.jsonl"}, timeout=120)
    assert report.status_code == 200, report.text
    assert sum(report.json()["invalid"].values()) == 0, report.json()


def test_ontology_binding_import_neighbors_and_graph_search(dev_server: ServerHandle) -> None:
    url = _collection(dev_server, "city")
    _seed(dev_server, "city")

    bound = httpx.get(url + "/graph/ontology", timeout=30).json()
    assert (bound["name"], bound["collection"]) == ("city-services", "city")
    assert "ISSUED_INSTEAD_BY" in bound["relation_types"]
    again = httpx.put(url + "/graph/ontology", json={"ontology": ONTOLOGY}, timeout=30)
    assert again.status_code == 200 and again.json()["fingerprint"] == bound["fingerprint"]

    other = httpx.put(url + "/graph/ontology", json={"ontology": OTHER_ONTOLOGY}, timeout=30)
    assert other.status_code == 409, other.text
    message = other.json()["error"]["message"]
    assert "city-services" in message and "'other'" in message

    stats = httpx.get(url + "/graph", timeout=30).json()
    assert _nonzero(stats["entities"]) == {"Document": 1, "Office": 1, "Procedure": 1}
    assert _nonzero(stats["relations"]) == {"ISSUED_INSTEAD_BY": 1, "REQUIRES": 1}

    # Two hops from the benefit reach the office, through the certificate (by its alias here).
    near = httpx.get(url + "/graph/neighbors", params={"name": "separation paper", "hops": 1}, timeout=30).json()
    assert [e["name"] for e in near["matched"]] == ["Separation Certificate"]
    assert {f["relation"] for f in near["facts"]} == {"REQUIRES", "ISSUED_INSTEAD_BY"}
    far = httpx.get(url + "/graph/neighbors", params={"name": "unemployment benefit", "hops": 2}, timeout=30).json()
    by_relation = {f["relation"]: f for f in far["facts"]}
    assert by_relation["REQUIRES"]["hops"] == 1 and by_relation["ISSUED_INSTEAD_BY"]["hops"] == 2
    assert by_relation["ISSUED_INSTEAD_BY"]["doc_ids"] == ["separation-certificate.md"]
    one = httpx.get(url + "/graph/neighbors", params={"name": "unemployment benefit", "hops": 1}, timeout=30).json()
    assert {f["relation"] for f in one["facts"]} == {"REQUIRES"}

    found = httpx.post(
        url + "/search", json={"query": "What does the unemployment benefit require?", "k": 3, "graph": True}, timeout=60
    )
    assert found.status_code == 200, found.text
    body = found.json()
    kinds = [r["kind"] for r in body["results"]]
    assert "fact" in kinds and "chunk" in kinds and kinds.index("chunk") > kinds.index("fact")
    assert all(r["doc_id"] for r in body["results"])
    assert any(link["name"] == "Unemployment Benefit" for link in body["linked"])
    facts = [r for r in body["results"] if r["kind"] == "fact"]
    assert any(f["relation"] == "REQUIRES" and f["doc_id"] == "unemployment-benefit.md" for f in facts)
    assert all(f["sources"] and f["sources"][0]["text"] for f in facts)

    plain = httpx.post(url + "/search", json={"query": "unemployment benefit", "k": 2}, timeout=60).json()
    assert {r["kind"] for r in plain["results"]} == {"chunk"} and plain.get("linked") is None


def test_invalid_lines_are_dropped_and_counted_with_their_line_numbers(dev_server: ServerHandle) -> None:
    url = _collection(dev_server, "city-bad")
    _seed(dev_server, "city-bad")
    lines = [
        "not json",
        json.dumps({"kind": "entity", "type": "Planet", "name": "Mars", "source": "unemployment-benefit.md"}),
        json.dumps({"kind": "relation", "type": "REQUIRES", "from": "Labour Arbitration Office", "to": "Separation Certificate", "source": "separation-certificate.md"}),
        json.dumps({"kind": "entity", "type": "Office", "name": "Ghost Office", "source": "no-such-document.md"}),
        json.dumps({"kind": "relation", "type": "OWNS", "from": "Separation Certificate", "to": "Labour Arbitration Office", "source": "separation-certificate.md"}),
    ]
    report = httpx.post(url + "/graph/import", json={"lines": lines, "source": "bad.jsonl"}, timeout=60)
    assert report.status_code == 200, report.text
    got = report.json()
    assert sum(got["invalid"].values()) == 5, got
    assert {"bad_json", "unknown_entity_type", "relation_not_allowed", "unknown_document", "unknown_relation_type"} <= set(got["invalid"])
    wheres = " ".join(p["where"] for p in got["problems"])
    for number in range(1, 6):
        assert f"line {number}" in wheres
    # Nothing invalid was written.
    stats = httpx.get(url + "/graph", timeout=30).json()
    assert _nonzero(stats["entities"]) == {"Document": 1, "Office": 1, "Procedure": 1}
    assert _nonzero(stats["relations"]) == {"ISSUED_INSTEAD_BY": 1, "REQUIRES": 1}


def test_a_deleted_document_takes_the_facts_only_it_supported(dev_server: ServerHandle) -> None:
    url = _collection(dev_server, "city-del")
    _seed(dev_server, "city-del")
    assert httpx.delete(url + "/documents/separation-certificate.md", timeout=60).status_code == 204
    stats = httpx.get(url + "/graph", timeout=30).json()
    # The office and its relation came only from the deleted document; the certificate
    # is also mentioned by the benefit's document and stays.
    assert _nonzero(stats["relations"]) == {"REQUIRES": 1}
    assert _nonzero(stats["entities"]) == {"Document": 1, "Procedure": 1}
    gone = httpx.get(url + "/graph/neighbors", params={"name": "Labour Arbitration Office"}, timeout=30).json()
    assert gone["matched"] == [] and gone["facts"] == []


def test_bad_requests_are_4xx_naming_the_problem(dev_server: ServerHandle) -> None:
    url = _collection(dev_server, "no-graph")
    assert httpx.post(url + "/documents", json={"documents": DOCUMENTS[:1]}, timeout=60).status_code == 200
    missing = httpx.get(url + "/graph", timeout=30)
    assert missing.status_code == 404 and "has no knowledge graph" in missing.json()["error"]["message"]
    assert httpx.get(url + "/graph/neighbors", params={"name": "x"}, timeout=30).status_code == 404
    searched = httpx.post(url + "/search", json={"query": "benefit", "graph": True}, timeout=30)
    assert searched.status_code == 404, searched.text

    broken = httpx.put(url + "/graph/ontology", json={"ontology": "name: x\nentity_types: {}\n"}, timeout=30)
    assert broken.status_code == 400 and "entity_types" in broken.json()["error"]["message"]
    not_yaml = httpx.put(url + "/graph/ontology", json={"ontology": "name: [x"}, timeout=30)
    assert not_yaml.status_code == 400 and "YAML" in not_yaml.json()["error"]["message"]
    dangling = httpx.put(
        url + "/graph/ontology",
        json={"ontology": "name: x\nentity_types: {A: {}}\nrelation_types: {R: {from: [A], to: [B]}}\n"},
        timeout=30,
    )
    assert dangling.status_code == 400 and "relation_types.R.to" in dangling.json()["error"]["message"]

    reserved = httpx.put(url + "/graph/ontology", json={"ontology": "name: x\nentity_types: {A: {properties: {keys: string}}}\n"}, timeout=30)
    assert reserved.status_code == 400 and "'keys' is reserved" in reserved.json()["error"]["message"]
    twice = httpx.put(
        url + "/graph/ontology",
        json={"ontology": "name: x\nentity_types: {A: {}, B: {}}\nrelation_types: {R: {from: [A, A], to: [B]}}\n"},
        timeout=30,
    )
    assert twice.status_code == 400 and "listed twice: A" in twice.json()["error"]["message"]
    nowhere = httpx.put(_collection(dev_server, "never-uploaded") + "/graph/ontology", json={"ontology": ONTOLOGY}, timeout=30)
    assert nowhere.status_code == 404 and "upload its documents first" in nowhere.json()["error"]["message"]
    # A 404 names no other collection's graph (another tenant's, perhaps).
    _seed(dev_server, "secret-plans")
    assert "secret-plans" not in httpx.get(url + "/graph", timeout=30).text

    # Import into a collection whose graph has no ontology yet, without one: refused.
    unbound = httpx.post(url + "/graph/import", json={"lines": LINES}, timeout=30)
    assert unbound.status_code == 400, unbound.text
    for bad in ({"name": ""}, {"name": "x", "hops": 9}, {"name": "x", "limit": 0}):
        response = httpx.get(url + "/graph/neighbors", params=bad, timeout=30)
        assert response.status_code == 422, (bad, response.text)
    for body in ({"lines": "x"}, {"lines": [], "ontology": ""}, {"lines": [], "extra": 1}):
        assert httpx.post(url + "/graph/import", json=body, timeout=30).status_code == 422
    assert httpx.post(url + "/graph/extract", json={"doc_ids": ["a\x00b"]}, timeout=30).status_code == 422


def test_the_cli_goes_through_the_server_that_holds_the_stores(dev_server: ServerHandle, tmp_path: Path) -> None:
    _seed(dev_server, "city-cli")
    config = dev_server.config
    neighbors = _run(config, "graph", "neighbors", "Separation Certificate", "--collection", "city-cli", "-k", "1", "--json")
    assert neighbors.returncode == 0, neighbors.stderr
    assert {f["relation"] for f in json.loads(neighbors.stdout)["facts"]} == {"REQUIRES", "ISSUED_INSTEAD_BY"}

    found = _run(config, "search", "Who issues the separation certificate?", "--collection", "city-cli", "--graph", "-k", "3", "--json")
    assert found.returncode == 0, found.stderr
    results = json.loads(found.stdout)["results"]
    assert any(r["kind"] == "fact" for r in results) and all(r["doc_id"] for r in results)

    stats = _run(config, "graph", "stats", "--collection", "city-cli", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["relations"]["REQUIRES"] == 1

    other = tmp_path / "other.yaml"
    other.write_text(OTHER_ONTOLOGY)
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(LINES) + "\n")
    refused = _run(config, "graph", "import", str(facts), "--collection", "city-cli", "--ontology", str(other))
    assert refused.returncode == 1 and "city-services" in refused.stderr and "'other'" in refused.stderr
    again = _run(config, "graph", "import", str(facts), "--collection", "city-cli", "--json")
    assert again.returncode == 0, again.stderr
    assert sum(json.loads(again.stdout)["invalid"].values()) == 0
    # Idempotent: the same facts again leave one copy of each.
    assert _nonzero(json.loads(_run(config, "graph", "stats", "--collection", "city-cli", "--json").stdout)["relations"]) == {
        "ISSUED_INSTEAD_BY": 1,
        "REQUIRES": 1,
    }


TENANTS = {"acme": {"collections": ["shared"]}, "globex": {"collections": ["shared"]}, "initech": {"collections": ["other"]}}


@pytest.fixture(scope="module")
def tenants_server(
    tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("graph-tenants")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "auth": {"tenants": TENANTS},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


def test_tenants_build_graphs_only_from_their_own_documents(tenants_server: tuple[ServerHandle, dict[str, str]]) -> None:
    server, keys = tenants_server
    url = _collection(server, "shared")

    def auth(tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[tenant]}"}

    assert httpx.post(url + "/documents", json={"documents": DOCUMENTS}, headers=auth("acme"), timeout=120).status_code == 200
    assert httpx.put(url + "/graph/ontology", json={"ontology": ONTOLOGY}, headers=auth("acme"), timeout=30).status_code == 200
    theirs = httpx.post(url + "/graph/import", json={"lines": LINES}, headers=auth("globex"), timeout=60)
    assert theirs.status_code == 403 and "document_not_owned" in theirs.text
    extract = httpx.post(url + "/graph/extract", json={}, headers=auth("globex"), timeout=60)
    assert extract.status_code == 403
    assert httpx.get(url + "/graph", headers=auth("globex"), timeout=30).json()["documents"] == 0

    mine = httpx.post(url + "/graph/import", json={"lines": LINES}, headers=auth("acme"), timeout=60)
    assert mine.status_code == 200, mine.text
    # Readers allowed the collection see the graph; others do not.
    assert httpx.get(url + "/graph/neighbors", params={"name": "Separation Certificate"}, headers=auth("globex"), timeout=30).status_code == 200
    for path in ("/graph", "/graph/ontology"):
        assert httpx.get(url + path, headers=auth("initech"), timeout=30).status_code == 403
    assert httpx.post(url + "/search", json={"query": "benefit", "graph": True}, headers=auth("initech"), timeout=30).status_code == 403
    assert httpx.get(url + "/graph", timeout=30).status_code == 401
