"""``switchyard ingest`` and ``switchyard search`` as a user runs them (no server on
the data directory): the JSON summary, a broken file named with its reason, the
results shape, idempotency across runs, and errors as one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD
from tests.knowledge.conftest import CORPUS

pytestmark = pytest.mark.integration


def _run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(config), *args],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
    )


def test_ingest_and_search_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    source = tmp_path / "docs"
    shutil.copytree(CORPUS, source)
    (source / "broken.pdf").write_bytes(b"%PDF-1.4 not really")

    first = _run(config, "ingest", str(source), "--collection", "docs", "--json")
    assert first.returncode == 2  # some documents failed
    report = json.loads(first.stdout)
    assert (report["added"], report["failed"]) == (25, 1)
    assert report["errors"][0]["source"].endswith("broken.pdf") and "not a readable PDF" in report["errors"][0]["reason"]

    (source / "broken.pdf").unlink()
    second = _run(config, "ingest", str(source), "--collection", "docs", "--json")
    assert second.returncode == 0
    assert json.loads(second.stdout)["skipped"] == 25

    found = _run(config, "search", "Which telescope sits on the rim of the extinct volcano?", "--collection", "docs", "-k", "2", "--json")
    assert found.returncode == 0, found.stderr
    results = json.loads(found.stdout)["results"]
    assert len(results) == 2 and results[0]["doc_id"] == "06-caldera-observatory.md"
    assert set(results[0]) >= {"doc_id", "chunk_id", "score", "text", "source"}

    missing = _run(config, "search", "anything", "--collection", "nope")
    assert missing.returncode == 1 and missing.stderr.strip() == "error: unknown collection 'nope' (collections: docs)"
    empty = _run(config, "search", "  ", "--collection", "docs")
    assert empty.returncode == 1 and "the query is empty" in empty.stderr
