"""Values of the knowledge layer: documents, their chunks, and search hits."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from knowledge.errors import InvalidDocumentIdError

__all__ = ["MAX_DOCUMENT_ID", "Chunk", "Document", "IngestReport", "SearchHit", "check_document_id", "content_hash"]

MAX_DOCUMENT_ID = 512
"""Characters in a document id at most."""


def check_document_id(doc_id: object) -> str:
    """``doc_id`` if every store and the HTTP API can hold it exactly.

    An id is 1 to `MAX_DOCUMENT_ID` characters of valid Unicode (no lone surrogates,
    which no wire encoding carries) without control characters (NUL, newlines, tabs,
    DEL...: ids travel in URLs, logs and terminal lines). Anything else, ``/``, ``#``,
    ``?``, ``%``, ``..`` and spaces included, is part of the id as written.

    Raises:
        InvalidDocumentIdError: naming the id and what is wrong with it.
    """
    if not isinstance(doc_id, str):
        raise InvalidDocumentIdError(str(doc_id), f"must be a string, not {type(doc_id).__name__}")
    if not doc_id:
        raise InvalidDocumentIdError(doc_id, "it is empty")
    if len(doc_id) > MAX_DOCUMENT_ID:
        raise InvalidDocumentIdError(doc_id[:40] + "...", f"longer than {MAX_DOCUMENT_ID} characters")
    try:
        doc_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidDocumentIdError(doc_id, "not valid Unicode text (a lone surrogate)") from None
    for position, char in enumerate(doc_id):
        if unicodedata.category(char) == "Cc":
            raise InvalidDocumentIdError(doc_id, f"control character {char!r} at position {position}")
    return doc_id


def content_hash(text: str, title: str | None, metadata: dict[str, Any]) -> str:
    """The hash that decides whether a document changed (text, title and metadata)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([text, title, metadata], sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()[:32]


class Document(BaseModel):
    """One document to ingest: its stable id and its text.

    The id is the document's path relative to the root it was ingested from, or the
    ``id`` of its JSON Lines record, or what an API client sends.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=MAX_DOCUMENT_ID)
    """Stable across re-ingestion; what updates and deletes refer to (see
    `check_document_id`)."""
    text: str
    """The document's plain text (Markdown keeps its headings)."""
    title: str | None = None
    source: str = ""
    """Where it came from (a path relative to the folder ingested, ``upload``...);
    shown with citations."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form fields; ``tags`` (a list of strings) is indexed for filters."""
    format: str = "text"
    """``markdown``, ``text``, ``html``, ``pdf`` or ``jsonl`` (chunking follows Markdown
    headings)."""

    @field_validator("id")
    @classmethod
    def _storable_id(cls, value: str) -> str:
        try:
            return check_document_id(value)
        except InvalidDocumentIdError as exc:
            raise ValueError(exc.reason) from None

    @property
    def hash(self) -> str:
        return content_hash(self.text, self.title, self.metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """A piece of a document, the unit that is embedded and retrieved."""

    doc_id: str
    index: int
    """Position in the document, from 0."""
    text: str
    """The text embedded and shown (with the heading path prepended for context)."""
    heading: str = ""
    """The Markdown heading path it sits under (``Title > Section``)."""
    tokens: int = 0

    @property
    def chunk_id(self) -> str:
        return f"{self.doc_id}#{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchHit:
    """One retrieved chunk."""

    doc_id: str
    chunk_id: str
    score: float
    """The ranking score of the search mode used (cosine for dense, BM25-style for
    sparse, reciprocal-rank fusion for hybrid)."""
    text: str
    source: str
    title: str | None = None
    heading: str = ""
    relevance: float | None = None
    """Cosine similarity of the chunk to the query (any mode), what graders threshold."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "chunk_id": self.chunk_id,
            "score": round(self.score, 6),
            "relevance": None if self.relevance is None else round(self.relevance, 6),
            "text": self.text,
            "source": self.source,
            "title": self.title,
            "heading": self.heading,
        }


class IngestReport(BaseModel):
    """What an ingestion did (``switchyard ingest --json``)."""

    collection: str
    added: int = 0
    updated: int = 0
    skipped: int = 0
    """Unchanged documents."""
    deleted: int = 0
    """Documents gone from the source (``--delete-missing``)."""
    failed: int = 0
    chunks: int = 0
    """Chunks written."""
    seconds: float = 0.0
    errors: list[dict[str, str]] = Field(default_factory=list)
    """``{"source", "reason"}`` for each document that failed."""
