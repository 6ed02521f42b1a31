"""Wire models of the collections API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from knowledge import (
    IngestReport,
    InvalidDocumentIdError,
    InvalidFilterError,
    check_document_id,
    check_metadata_filter,
    check_text_filter,
)

__all__ = [
    "ExtractRequest",
    "FactResult",
    "GraphImportRequest",
    "GraphStatsOut",
    "LinkedEntityOut",
    "NeighborsOut",
    "OntologyIn",
    "OntologyOut",
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
    "document_id",
]


def document_id(value: str) -> str:
    """``value`` if it can be a document id (`check_document_id`); for pydantic
    validators, so that a bad one is a 422 naming the field."""
    try:
        return check_document_id(value)
    except InvalidDocumentIdError as exc:
        raise ValueError(str(exc)) from None


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
    """Stable across uploads: a changed document with the same id replaces the old one
    (only its writer may). Any text without control characters; ``/``, ``#``, ``?``
    and ``..`` are part of the id."""
    text: str = Field(min_length=1)
    title: str | None = None
    source: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form; ``tags`` (a list of strings) can filter searches."""
    format: Literal["text", "markdown"] = "text"
    """``markdown``: chunks follow its headings."""

    @field_validator("id")
    @classmethod
    def _storable_id(cls, value: str) -> str:
        return document_id(value)


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
    owned: bool
    """Written by the caller (a server with no tenants: by the operator); what
    ``switchyard ingest --delete-missing`` removes when its source lost it."""
    writable: bool
    """The caller may replace or delete it: a tenant, only the documents it wrote; the
    operator, any."""


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    documents: list[DocumentOut]


class SearchFilterIn(BaseModel):
    """Restricts a search; every given field must match."""

    model_config = ConfigDict(extra="forbid")

    doc_ids: list[str] = Field(default_factory=list)
    """Chunks of any of these documents."""
    tags: list[str] = Field(default_factory=list)
    """Chunks of documents with any of these tags."""
    metadata: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Document metadata fields that must equal these values. A key is one top-level
    field, taken literally, without ``"`` or ``\\``; a value is a string, a boolean, a
    64-bit integer or a finite number. Strings, booleans and integers match exactly;
    a number written with a decimal point or an exponent matches by value (``2.0``
    matches a stored ``2``). Anything else is a 422 naming the key."""

    # The knowledge layer's own rules (`SearchFilter` applies them too), checked here so
    # that a filter no store can apply is a 422 naming the field.

    @field_validator("doc_ids", "tags")
    @classmethod
    def _texts(cls, values: list[str], info: ValidationInfo) -> list[str]:
        try:
            check_text_filter(str(info.field_name), values)
        except InvalidFilterError as exc:
            raise ValueError(str(exc)) from None
        return values

    @field_validator("metadata", mode="before")
    @classmethod
    def _storable(cls, value: object) -> object:
        # Before pydantic's own union check, which would turn an integer too big for
        # 64 bits into a float and so match something else than was asked.
        if isinstance(value, dict):
            try:
                check_metadata_filter(value)
            except InvalidFilterError as exc:
                raise ValueError(str(exc)) from None
        return value


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000, pattern=r"\S")
    """What to look for (not blank)."""
    k: int = Field(default=5, ge=1, le=100)
    mode: Literal["hybrid", "dense", "sparse"] = "hybrid"
    filter: SearchFilterIn | None = None
    graph: bool = False
    """Also retrieve facts from the collection's knowledge graph (as the ``graphrag``
    graph does): the facts come first in ``results`` (``kind: fact``), at most ``k``."""


class SearchResult(BaseModel):
    kind: Literal["chunk"] = "chunk"
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


class FactResult(BaseModel):
    """A fact of the knowledge graph: ``subject relation object``, with the chunks that state it."""

    kind: Literal["fact"] = "fact"
    text: str
    subject: str
    subject_type: str
    relation: str
    object: str
    object_type: str
    hops: int
    """1: the relation touches an entity the query names; 2: one relation further; ..."""
    score: float
    doc_id: str | None
    """The first document stating it (``doc_ids``: all of them)."""
    doc_ids: list[str]
    chunk_ids: list[str]
    sources: list[dict[str, Any]] = Field(default_factory=list)
    """The chunks stating it: ``chunk_id``, ``doc_id``, ``text``, ``title``, ``source``."""


class LinkedEntityOut(BaseModel):
    """An entity the query names."""

    id: str
    name: str
    type: str
    how: Literal["exact", "alias", "vector"]
    score: float
    mention: str


class SearchResponse(BaseModel):
    results: list[Annotated[SearchResult | FactResult, Field(discriminator="kind")]]
    linked: list[LinkedEntityOut] | None = None
    """With ``graph``: the entities found in the query."""


class OntologyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ontology: str = Field(min_length=1, max_length=1_000_000)
    """The ontology file's text (YAML or JSON)."""


class OntologyOut(BaseModel):
    collection: str
    name: str
    fingerprint: str
    entity_types: list[str]
    relation_types: list[str]


class ExtractRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc_ids: list[Annotated[str, AfterValidator(document_id)]] | None = Field(default=None, max_length=100_000)
    """The documents to extract (default: every document of the collection); those
    whose facts are already extracted from the same content are skipped."""
    ontology: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    """An ontology's text: binds the collection's graph the first time."""
    force: bool = False
    """Extract again even documents whose facts are up to date."""


class GraphImportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lines: list[str] = Field(max_length=1_000_000)
    """Curated facts, one JSON object per line (``kind`` entity or relation)."""
    ontology: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    source: str = Field(default="upload", max_length=500)
    """What the lines came from, for the problems' locations."""


class GraphStatsOut(BaseModel):
    collection: str
    ontology: str
    documents: int
    chunks: int
    entities: dict[str, int]
    relations: dict[str, int]


class NeighborsOut(BaseModel):
    collection: str
    matched: list[dict[str, Any]]
    facts: list[dict[str, Any]]
