"""The eval runner on a ``graphrag`` suite: the suite's corpus goes into the eval's own
vector store and its curated facts into a graph store of the eval's own, rebuilt from
the suite's files on every run (an edited facts file leaves nothing stale behind, in
the graph or its entity companion); the graph's numbered sources are what retrieval
metrics read. Real stores, the failure-injection fake as the model (the answer's words
do not matter here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eval.datasets import DATASETS_DIR, load_suite
from eval.metrics import RECALL_AT_K
from eval.run import run_suite
from knowledge import entities_collection
from knowledge.graphstore import entity_id
from serving.eval_runner import cli_host, open_runner
from serving.platform import Platform
from serving.settings import Settings, load_settings
from tests.conftest import REPO, write_models_file

pytestmark = pytest.mark.integration

CITY = DATASETS_DIR / "graphrag-corpus"
CASE = "childcare-extract-price"


@pytest.fixture
def settings(tmp_path: Path, fake_backend_url: str) -> Iterator[Settings]:
    models = write_models_file(tmp_path / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    graphs = yaml.safe_load((REPO / "config/switchyard.yaml").read_text())["graphs"]
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "gateway": {"models_file": str(models)}, "graphs": graphs}))
    yield load_settings(config)


def _suite(tmp: Path) -> Path:
    """The graphrag suite on the city-services documents alone, one case, with a copy of
    the facts that the test can edit."""
    directory = tmp / "suite"
    directory.mkdir()
    (tmp / "facts.jsonl").write_text((CITY / "facts.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    config = {
        "name": "graphrag-tiny", "graph": "graphrag", "collection": "eval-city",
        "corpus": [str(CITY / "documents")],
        "knowledge_graph": {"ontology": str(CITY / "ontology.yaml"), "facts": str(tmp / "facts.jsonl")},
    }
    (directory / "suite.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    case = next(line for line in (DATASETS_DIR / "graphrag" / "cases.jsonl").read_text().splitlines() if f'"{CASE}"' in line)
    (directory / "cases.jsonl").write_text(case + "\n", encoding="utf-8")
    return directory


async def test_the_suite_graph_is_imported_and_rebuilt_from_its_files(settings: Settings, tmp_path: Path) -> None:
    directory = _suite(tmp_path)
    platform = Platform.build(settings)
    try:
        async with cli_host(settings) as host:
            async with open_runner(platform, host, "chat-default") as runner:
                run = await run_suite(load_suite(directory), runner)
                assert [sum(r.relations.values()) for r in runner.graph_imports] == [33]
                assert run.outputs is not None
                retrieved = run.outputs[CASE]["retrieved_ids"]
                # The graph's numbered sources: the allowance and the extract only the graph finds.
                assert retrieved[:2] == ["38-childcare-allowance.md", "39-birth-register-extract.md"]
                assert run.by_case()[CASE].values[RECALL_AT_K] == 1.0
                assert run.outputs[CASE]["error"] is None

            # The Civil Registry Hall leaves the facts file: the next run's graph and entity
            # companion no longer have it, although the corpus is not ingested again.
            facts = tmp_path / "facts.jsonl"
            kept = [line for line in facts.read_text().splitlines() if "Civil Registry Hall" not in line]
            facts.write_text("\n".join(kept) + "\n")
            async with open_runner(platform, host, "chat-default") as runner:
                await run_suite(load_suite(directory), runner)
                assert runner.ingests == [] and [sum(r.relations.values()) for r in runner.graph_imports] == [32]
                graph = runner.knowledge.graph()
                assert await graph.store.find_entities("eval-city", ["Civil Registry Hall"]) == []
                companion = await runner.knowledge.get().store.documents(entities_collection("eval-city"))
                # Every point of the companion is an entity of the graph: the hall's is gone.
                assert entity_id("Office", "Civil Registry Hall") not in companion
                stored = {e.id for e in await graph.store.entities("eval-city", list(companion))}
                assert companion and set(companion) == stored
        # The eval's graph never reaches the user's data directory.
        assert (settings.eval_runs_dir / "graph").is_dir()
        assert platform.graph is None or "eval-city" not in await platform.graph.graphs()
    finally:
        await platform.aclose()
