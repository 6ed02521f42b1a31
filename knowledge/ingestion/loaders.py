"""Source files to `Document` values: Markdown, plain text, HTML, PDF and JSON Lines.

A document's id is stable: its path relative to the root it was found under (a file
named on its own has its file name), or, in a ``.jsonl`` file, the ``id`` of its
record. Its ``source`` is that relative path too (``file:line`` for a record), never
the operator's absolute path. A file that cannot be read becomes a
`DocumentParseError` naming it and why; the other files go on.

Symbolic links inside a folder are not followed, wherever they point: a link leaving
the folder (or dangling) is reported as a failure naming it, so nothing outside the
folder is read; a link to something inside the folder is skipped, since its target is
ingested under its own path. A path named on its own is read even if it is a link
(the operator chose it).

HTML keeps the text a reader sees: ``script``, ``style``, ``nav``, ``header``,
``footer`` and ``template`` elements are dropped, and ``h1``..``h6`` become Markdown
headings so that chunking follows them.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from knowledge.errors import DocumentParseError, InvalidDocumentIdError
from knowledge.models import Document, check_document_id

__all__ = ["LOADERS", "Loaded", "discover", "load_file", "parse_jsonl"]

LOADERS = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html", ".htm": "html", ".pdf": "pdf", ".jsonl": "jsonl"}
"""Supported file suffixes and their formats."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """What one file gave: its documents, and the records that failed (``.jsonl``)."""

    documents: list[Document]
    errors: list[DocumentParseError]


def discover(paths: list[Path]) -> Iterator[tuple[Path, str, bool] | DocumentParseError]:
    """``(file, id prefix, named)`` for every supported file under ``paths``: a file
    named directly has its file name as id; files found in a directory, their path
    relative to it. ``named`` is True for files named directly (an unsupported one
    is then reported, not silently skipped). Hidden files and directories are skipped.

    In a directory, symbolic links are not followed: one that leaves the directory
    (or dangles) and would have been ingested (a directory, or a supported file) is
    yielded as a `DocumentParseError` naming it; one that stays inside is skipped (its
    target is found under its own path)."""
    for path in paths:
        if path.is_dir():
            yield from _walk(path, path, path.resolve())
        else:
            yield path, path.name, True


def _walk(root: Path, folder: Path, real_root: Path) -> Iterator[tuple[Path, str, bool] | DocumentParseError]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        yield DocumentParseError(folder.relative_to(root).as_posix() or ".", f"cannot list: {exc.strerror or exc}")
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        relative = path.relative_to(root).as_posix()
        if entry.is_symlink():
            target = path.resolve()
            if target.exists() and (target == real_root or real_root in target.parents):
                continue  # inside the folder: its target is ingested under its own path
            if target.is_dir() or path.suffix.lower() in LOADERS:
                yield DocumentParseError(relative, "a symbolic link leaving the folder (or dangling): not followed")
        elif entry.is_dir(follow_symlinks=False):
            yield from _walk(root, path, real_root)
        elif entry.is_file(follow_symlinks=False) and path.suffix.lower() in LOADERS:
            yield path, relative, False


def load_file(path: Path, doc_id: str, *, follow_links: bool = True) -> Loaded:
    """The documents of one file; their ``source`` is ``doc_id`` (the path relative to
    the folder it was found in, or its file name), not ``path``.

    Args:
        path: the file.
        doc_id: its id (a ``.jsonl`` file's records have their own).
        follow_links: False for a file found in a folder: a symbolic link put in its
            place since is refused, not read.

    Raises:
        DocumentParseError: the file is missing, of an unsupported type, unreadable,
            or empty, or its id is one no store can hold.
    """
    source = doc_id
    kind = LOADERS.get(path.suffix.lower())
    if kind is None:
        supported = ", ".join(sorted(LOADERS))
        raise DocumentParseError(source, f"unsupported file type {path.suffix or '(none)'!r} (supported: {supported})")
    if kind != "jsonl":
        try:
            check_document_id(doc_id)
        except InvalidDocumentIdError as exc:
            raise DocumentParseError(repr(source), f"cannot be a document id: {exc.reason}") from None
    try:
        descriptor = os.open(path, os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW))
        with os.fdopen(descriptor, "rb") as file:
            raw = file.read()
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise DocumentParseError(source, "a symbolic link: not followed") from None
        raise DocumentParseError(source, f"cannot read: {exc.strerror or exc}") from None
    if kind == "pdf":
        text, title = _pdf_text(raw, source), None
        kind = "text"
    else:
        try:
            decoded = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise DocumentParseError(source, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        if kind == "jsonl":
            return parse_jsonl(decoded, source)
        if kind == "html":
            title, text = _html_text(decoded)
            kind = "markdown"
        else:
            text, title = decoded, None
            if kind == "markdown":
                match = re.search(r"^#\s+(.+?)\s*#*\s*$", text, re.M)
                title = match.group(1) if match else None
    if not text.strip():
        raise DocumentParseError(source, "no text in it")
    return Loaded([Document(id=doc_id, text=text, title=title, source=source, format=kind)], [])


def parse_jsonl(text: str, source: str) -> Loaded:
    """One document per line: ``{"id", "text", "title"?, "metadata"?}``. A bad line is
    an error naming ``source:line``; the others load."""
    documents: list[Document] = []
    errors: list[DocumentParseError] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            errors.append(DocumentParseError(where, f"not JSON ({exc})"))
            continue
        if not isinstance(record, dict):
            errors.append(DocumentParseError(where, "not a JSON object"))
            continue
        doc_id, body = record.get("id"), record.get("text")
        if not isinstance(doc_id, str) or not doc_id.strip():
            errors.append(DocumentParseError(where, 'no "id" string'))
            continue
        if not isinstance(body, str) or not body.strip():
            errors.append(DocumentParseError(where, f'record {doc_id!r} has no "text" string'))
            continue
        try:
            check_document_id(doc_id)
        except InvalidDocumentIdError as exc:
            errors.append(DocumentParseError(where, str(exc)))
            continue
        if doc_id in seen:
            errors.append(DocumentParseError(where, f"id {doc_id!r} appears twice"))
            continue
        seen.add(doc_id)
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            errors.append(DocumentParseError(where, '"metadata" must be an object'))
            continue
        title = record.get("title") if isinstance(record.get("title"), str) else None
        documents.append(Document(id=doc_id, text=body, title=title, source=where, metadata=metadata, format="text"))
    if not documents and not errors:
        errors.append(DocumentParseError(source, "no records in it"))
    return Loaded(documents, errors)


def _pdf_text(raw: bytes, source: str) -> str:
    from io import BytesIO

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(BytesIO(raw))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DocumentParseError(source, f"not a readable PDF ({exc.__class__.__name__}: {exc})") from None
    return "\n\n".join(p.strip() for p in pages if p.strip())


_DROPPED = frozenset({"script", "style", "nav", "header", "footer", "template", "noscript", "svg"})
_BLOCKS = frozenset({"p", "div", "section", "article", "li", "br", "tr", "blockquote", "pre", "ul", "ol", "table", "main"})


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: str | None = None
        self._skip = 0
        self._in_title = False
        self._heading: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROPPED:
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag):
            self._heading = int(tag[1])
            self.parts.append("\n\n" + "#" * self._heading + " ")
        elif tag in _BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROPPED:
            self._skip = max(0, self._skip - 1)
        elif tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag):
            self._heading = None
            self.parts.append("\n\n")
        elif tag in _BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title = (self.title or "") + data.strip()
        elif not self._skip:
            self.parts.append(re.sub(r"\s+", " ", data) if self._heading is None else data.strip())


def _html_text(html: str) -> tuple[str | None, str]:
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    text = "\n\n".join(line.strip() for line in re.split(r"\n\s*\n", text) if line.strip())
    return parser.title, text
