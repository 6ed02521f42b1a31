"""Ingesting a folder with real symbolic links in it (issue 11, item 8): nothing outside
the folder is read, a link leaving it is reported by name, a link inside it is not
followed (its target is ingested under its own path), and the stored ``source`` is
the path relative to the folder, never the operator's absolute path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knowledge import KnowledgeBase
from knowledge.cli import _items
from knowledge.errors import DocumentParseError
from knowledge.ingestion.loaders import discover, load_file

pytestmark = pytest.mark.integration

SECRET = "The vault combination is 31-4-15-92."


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    """``docs/`` with real files and links; ``outside/`` with what must never be read."""
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    (outside / "secret.md").write_text(f"# Secret\n\n{SECRET}\n")
    (outside / "private" / "leak.md").write_text(f"# Leak\n\n{SECRET}\n")
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "guides" / "start.md").write_text("# Start\n\nThe ferry leaves the north pier at dawn.\n")
    (docs / "readme.txt").write_text("Tram timetables are posted at every stop.\n")
    (docs / "leak.md").symlink_to(outside / "secret.md")  # a file link leaving the folder
    (docs / "symdir").symlink_to(outside / "private", target_is_directory=True)  # a directory link leaving it
    (docs / "guides" / "up.md").symlink_to("../../outside/secret.md")  # relative, leaving it
    (docs / "dangling.md").symlink_to(tmp_path / "nothing-here.md")
    (docs / "alias.md").symlink_to(docs / "guides" / "start.md")  # inside: not followed
    (docs / "loop").symlink_to(docs, target_is_directory=True)  # inside (a cycle): not followed
    return docs, outside


def test_links_leaving_the_folder_are_reported_and_not_read(tmp_path: Path) -> None:
    docs, _ = _folder(tmp_path)
    found = list(discover([docs]))
    files = sorted(f[1] for f in found if isinstance(f, tuple))
    refused = sorted((e.source, e.reason) for e in found if isinstance(e, DocumentParseError))
    assert files == ["guides/start.md", "readme.txt"]
    assert [source for source, _ in refused] == ["dangling.md", "guides/up.md", "leak.md", "symdir"]
    assert all("symbolic link leaving the folder" in reason for _, reason in refused)


async def test_ingesting_the_folder_stores_nothing_from_outside_and_no_absolute_path(
    knowledge: KnowledgeBase, tmp_path: Path
) -> None:
    docs, _ = _folder(tmp_path)
    report = await knowledge.ingest("c", _items([docs]))
    assert (report.added, report.failed) == (2, 4)
    stored = await knowledge.store.documents("c")
    assert sorted(stored) == ["guides/start.md", "readme.txt"]
    assert {d.source for d in stored.values()} == {"guides/start.md", "readme.txt"}
    hits = await knowledge.search("c", "vault combination", k=10)
    assert all(SECRET not in h.text for h in hits)
    assert all(str(tmp_path) not in h.source and not h.source.startswith("/") for h in hits)
    assert not any(str(tmp_path) in e["source"] for e in report.errors)


async def test_sources_stored_before_as_absolute_paths_are_rewritten(knowledge: KnowledgeBase, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nThe museum opens at ten.\n")
    [document] = load_file(docs / "a.md", "a.md").documents
    await knowledge.ingest("c", [document.model_copy(update={"source": str(docs / "a.md")})])  # as stored before
    report = await knowledge.ingest("c", _items([docs]))
    assert report.updated == 1
    assert (await knowledge.store.documents("c"))["a.md"].source == "a.md"


def test_a_file_swapped_for_a_link_after_discovery_is_not_read(tmp_path: Path) -> None:
    docs, outside = _folder(tmp_path)
    [(path, doc_id, named)] = [f for f in discover([docs / "guides"]) if isinstance(f, tuple)]
    path.unlink()
    os.symlink(outside / "secret.md", path)
    with pytest.raises(DocumentParseError, match="a symbolic link: not followed"):
        load_file(path, doc_id, follow_links=named)


def test_a_path_named_on_its_own_is_read_even_as_a_link(tmp_path: Path) -> None:
    docs, _ = _folder(tmp_path)
    items = list(_items([docs / "alias.md"]))
    assert [(d.id, d.source) for d in items if not isinstance(d, DocumentParseError)] == [("alias.md", "alias.md")]
