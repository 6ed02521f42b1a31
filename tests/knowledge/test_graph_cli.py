"""``switchyard ontology`` and ``switchyard graph`` as a user runs them on the data
directory (no server): validation naming the field, the extraction schema, curated
import, neighbours, graph search, stats, an ontology change refused naming both, and
``ingest --graph`` extracting with the real local model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway import Backend
from tests.conftest import REPO, SWITCHYARD

pytestmark = pytest.mark.integration

ONTOLOGY = REPO / "config/ontologies/city-services.yaml"

BENEFIT = """# Unemployment benefit

To apply for the unemployment benefit you need a Separation Certificate from your last
employer. The Employment Office on Dock Street handles the unemployment benefit.
"""
CERTIFICATE = """# When the employer refuses

If an employer refuses to write the Separation Certificate, the Labour Arbitration Office
at 4 Quarry Lane issues it instead after a short hearing.
"""
FACTS = [
    {"kind": "entity", "type": "Procedure", "name": "Unemployment Benefit", "source": "benefit.md"},
    {"kind": "entity", "type": "Document", "name": "Separation Certificate", "aliases": ["separation paper"], "source": "benefit.md"},
    {"kind": "relation", "type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate", "source": "benefit.md"},
    {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "properties": {"address": "4 Quarry Lane"}, "source": "certificate.md"},
    {"kind": "relation", "type": "ISSUED_INSTEAD_BY", "from": "Separation Certificate", "to": "Labour Arbitration Office", "source": "certificate.md"},
]


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    """Counts per type without the types that have none (stores may list those as 0)."""
    return {kind: n for kind, n in counts.items() if n}


def _run(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = os.environ.copy()
    env.pop("SWITCHYARD_API_KEY", None)
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout, check=False,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "benefit.md").write_text(BENEFIT)
    (docs / "certificate.md").write_text(CERTIFICATE)
    return config, docs


def test_ontology_validate_and_schema(tmp_path: Path, workspace: tuple[Path, Path]) -> None:
    config, _ = workspace
    ok = _run(config, "ontology", "validate", str(ONTOLOGY))
    assert ok.returncode == 0, ok.stderr
    assert "city-services" in ok.stdout and "4 entity types" in ok.stdout
    summary = json.loads(_run(config, "ontology", "validate", str(ONTOLOGY), "--json").stdout)
    assert summary["relation_types"] == ["HANDLED_BY", "ISSUED_BY", "ISSUED_INSTEAD_BY", "REQUIRES"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: broken\nentity_types:\n  Office: {}\nrelation_types:\n  RUNS: {from: [Office], to: [Person]}\n")
    refused = _run(config, "ontology", "validate", str(bad))
    assert refused.returncode == 1
    assert str(bad) in refused.stderr and "relation_types.RUNS.to" in refused.stderr and "'Person'" in refused.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: typo\nentity_type:\n  Office: {}\n")
    wrong = _run(config, "ontology", "validate", str(typo))
    assert wrong.returncode == 1 and "entity_type" in wrong.stderr
    missing = _run(config, "ontology", "validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr

    schema = json.loads(_run(config, "ontology", "schema", str(ONTOLOGY)).stdout)
    entity = schema["properties"]["entities"]["items"]
    assert entity["properties"]["type"]["enum"] == ["Document", "Office", "Organisation", "Procedure"]
    assert schema["properties"]["relations"]["items"]["properties"]["type"]["enum"] == [
        "HANDLED_BY",
        "ISSUED_BY",
        "ISSUED_INSTEAD_BY",
        "REQUIRES",
    ]
    assert schema["properties"]["entities"]["maxItems"] == 6 and entity["properties"]["name"]["maxLength"] == 48


def test_curated_graph_from_the_command_line(tmp_path: Path, workspace: tuple[Path, Path]) -> None:
    config, docs = workspace
    ingested = _run(config, "ingest", str(docs), "--collection", "city", "--json")
    assert ingested.returncode == 0, ingested.stderr
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(json.dumps(f) for f in FACTS) + "\n" + '{"kind": "entity", "type": "Planet", "name": "Mars", "source": "benefit.md"}\n')

    unbound = _run(config, "graph", "import", str(facts), "--collection", "city")
    assert unbound.returncode == 1 and "ontology" in unbound.stderr

    imported = _run(config, "graph", "import", str(facts), "--collection", "city", "--ontology", str(ONTOLOGY), "--json")
    assert imported.returncode == 0, imported.stderr
    report = json.loads(imported.stdout)
    assert report["invalid"] == {"unknown_entity_type": 1}
    assert any(p["where"] == "line 6" for p in report["problems"])
    assert _nonzero(report["relations"]) == {"ISSUED_INSTEAD_BY": 1, "REQUIRES": 1}

    other = tmp_path / "other.yaml"
    other.write_text("name: other\nentity_types:\n  Thing: {}\n")
    refused = _run(config, "graph", "import", str(facts), "--collection", "city", "--ontology", str(other))
    assert refused.returncode == 1 and "city-services" in refused.stderr and "'other'" in refused.stderr

    neighbors = _run(config, "graph", "neighbors", "Unemployment Benefit", "--collection", "city", "-k", "2", "--json")
    assert neighbors.returncode == 0, neighbors.stderr
    found = json.loads(neighbors.stdout)
    hops = {f["relation"]: (f["hops"], f["doc_id"]) for f in found["facts"]}
    assert hops == {"REQUIRES": (1, "benefit.md"), "ISSUED_INSTEAD_BY": (2, "certificate.md")}
    text = _run(config, "graph", "neighbors", "separation paper", "--collection", "city")
    assert text.returncode == 0 and "Labour Arbitration Office" in text.stdout
    nobody = _run(config, "graph", "neighbors", "Nobody", "--collection", "city")
    assert nobody.returncode == 0 and "no entity named 'Nobody'" in nobody.stdout

    searched = _run(config, "search", "What does the unemployment benefit require?", "--collection", "city", "--graph", "-k", "2", "--json")
    assert searched.returncode == 0, searched.stderr
    results = json.loads(searched.stdout)["results"]
    assert [r["kind"] for r in results][:1] == ["fact"] and all(r["doc_id"] for r in results)

    stats = json.loads(_run(config, "graph", "stats", "--collection", "city", "--json").stdout)
    assert _nonzero(stats["entities"]) == {"Document": 1, "Office": 1, "Procedure": 1}

    no_graph = _run(config, "graph", "stats", "--collection", "elsewhere")
    assert no_graph.returncode == 1 and "has no knowledge graph" in no_graph.stderr
    flag = _run(config, "ingest", str(docs), "--collection", "city", "--ontology", str(ONTOLOGY))
    assert flag.returncode == 1 and "--graph" in flag.stderr

    # Changing a document takes away the facts its old version supported.
    (docs / "certificate.md").write_text("# Moved\n\nThe hearings now take place elsewhere.\n")
    assert _run(config, "ingest", str(docs), "--collection", "city").returncode == 0
    after = json.loads(_run(config, "graph", "stats", "--collection", "city", "--json").stdout)
    assert _nonzero(after["relations"]) == {"REQUIRES": 1}


@pytest.mark.llm
def test_ingest_graph_extracts_with_the_local_model(workspace: tuple[Path, Path], local_backend: Backend) -> None:
    config, docs = workspace
    done = _run(config, "ingest", str(docs), "--collection", "city", "--graph", "--ontology", str(ONTOLOGY), "--json", timeout=900)
    assert done.returncode in (0, 2), done.stderr
    report = json.loads(done.stdout)
    graph = report["graph"]
    assert graph["documents"] == 2 and graph["chunks"] >= 2
    # Quality is not asserted: whatever was written is of the ontology's types.
    stats = json.loads(_run(config, "graph", "stats", "--collection", "city", "--json").stdout)
    assert set(stats["entities"]) <= {"Office", "Document", "Procedure", "Organisation"}
    assert set(stats["relations"]) <= {"ISSUED_BY", "REQUIRES", "HANDLED_BY", "ISSUED_INSTEAD_BY"}
    if graph["failed_chunks"] == 0:
        # Nothing changed: nothing is extracted again (a document with a failed chunk
        # would be tried again, and a busy machine can time a chunk out).
        again = _run(config, "ingest", str(docs), "--collection", "city", "--graph", "--json", timeout=900)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["graph"]["documents"] == 0
        whole = _run(config, "graph", "extract", "--collection", "city", "--json", timeout=900)
        assert whole.returncode == 0, whole.stderr
        assert (json.loads(whole.stdout)["documents"], json.loads(whole.stdout)["skipped"]) == (0, 2)
