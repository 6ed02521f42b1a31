"""Wire models of the collections API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from knowledge import IngestReport

__all__ = [
    "CollectionList",
    "CollectionOut",
    "DocumentIn",
    "DocumentList",
    "DocumentOut",
    "SearchFilterIn",
    "SearchRequest",
    "SearchResponse",
    "SearchResult",
    "UploadRequest",
    "UploadResponse",
]


class CollectionOut(BaseModel):
    name: str
    documents: int
    chunks: int
    embedder: str
    dimensions: int


class CollectionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CollectionOut]


class DocumentIn(BaseModel):
    """A document to store; re-sending an unchanged one is a no-op."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=512)
    """Stable across uploads: a changed document with the same id replaces the old one."""
    text: str = Field(min_length=1)
    title: str | None = None
    source: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form; ``tags`` (a list of strings) can filter searches."""
    format: Literal["text", "markdown"] = "text"
    """``markdown``: chunks follow its headings."""


class UploadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1, max_length=10_000)


class UploadResponse(IngestReport):
    """What the upload did: documents added, updated, skipped (unchanged), failed."""


class DocumentOut(BaseModel):
    doc_id: str
    version: str
    """The content hash of the stored version."""
    chunks: int
    source: str
    title: str | None


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    documents: list[DocumentOut]


class SearchFilterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc_ids: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, str | int | float | bool] = Field(default_factory=dict)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000, pattern=r"\S")
    """What to look for (not blank)."""
    k: int = Field(default=5, ge=1, le=100)
    mode: Literal["hybrid", "dense", "sparse"] = "hybrid"
    filter: SearchFilterIn | None = None


class SearchResult(BaseModel):
    doc_id: str
    chunk_id: str
    score: float
    """The mode's ranking score (reciprocal-rank fusion for hybrid)."""
    relevance: float | None
    """Cosine similarity of the chunk to the query."""
    text: str
    source: str
    title: str | None
    heading: str


class SearchResponse(BaseModel):
    results: list[SearchResult]
