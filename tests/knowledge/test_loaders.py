"""Loaders: each format to documents with stable ids; bad files named with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledge.errors import DocumentParseError
from knowledge.ingestion.loaders import discover, load_file

from tests.knowledge.conftest import CORPUS


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF with ``lines`` of Helvetica text (built by hand: offsets and all)."""
    text = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) '" for line in lines) + " ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(text) + text.encode() + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_ids_are_paths_relative_to_the_root_or_file_names(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.md").write_text("# X\n\nx")
    (tmp_path / "a" / ".hidden.md").write_text("h")
    (tmp_path / "a" / "notes.docx").write_text("?")
    found = [(f.name, doc_id, named) for f, doc_id, named in discover([tmp_path / "a", tmp_path / "a" / "b" / "x.md"])]
    assert found == [("x.md", "b/x.md", False), ("x.md", "x.md", True)]


def test_markdown_html_text_and_jsonl() -> None:
    md = load_file(CORPUS / "01-harbor-tides.md", "01-harbor-tides.md").documents[0]
    assert md.format == "markdown" and md.title and md.text.startswith("# ")
    html = load_file(CORPUS / "22-page.html", "22-page.html").documents[0]
    assert html.title and "SCRIPT-TOKEN-ZQX-7781" not in html.text
    assert html.text.startswith("# ") and "\n## " in html.text  # headings survive for the chunker
    txt = load_file(CORPUS / "21-notes.txt", "21-notes.txt").documents[0]
    assert txt.format == "text" and txt.title is None
    records = load_file(CORPUS / "docs.jsonl", "docs.jsonl")
    assert [d.id for d in records.documents] == ["faq-001", "faq-002", "faq-003"] and not records.errors


def test_pdf_text_is_extracted(tmp_path: Path) -> None:
    pdf = tmp_path / "memo.pdf"
    pdf.write_bytes(make_pdf(["Quarterly memo for the Verrin depot.", "The night tram runs until 2 a.m."]))
    document = load_file(pdf, "memo.pdf").documents[0]
    assert "Verrin depot" in document.text and "night tram" in document.text


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("broken.pdf", b"%PDF-1.4 this is not really a pdf", "not a readable PDF"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "not UTF-8 text"),
        ("empty.md", b"   \n", "no text in it"),
        ("slides.pptx", b"PK", "unsupported file type '.pptx'"),
    ],
)
def test_unreadable_files_are_named_with_the_reason(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DocumentParseError) as failed:
        load_file(path, name)
    assert failed.value.source == name and reason in failed.value.reason  # relative, not the local path


def test_bad_jsonl_lines_are_named_and_the_rest_load(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": "ok-1", "text": "fine"}\nnot json\n{"id": "", "text": "x"}\n{"id": "ok-1", "text": "again"}\n{"id": "ok-2", "text": "fine too", "metadata": {"tags": ["t"]}}\n')
    loaded = load_file(path, "mixed.jsonl")
    assert [d.id for d in loaded.documents] == ["ok-1", "ok-2"]
    assert [e.source for e in loaded.errors] == ["mixed.jsonl:2", "mixed.jsonl:3", "mixed.jsonl:4"]
    assert "appears twice" in loaded.errors[2].reason
