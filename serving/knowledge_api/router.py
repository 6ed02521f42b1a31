"""Routes of the collections API. A tenant sees and uses only the collections its
``collections`` allow-list names (403 otherwise). Documents uploaded here record the
uploading tenant, and only that tenant may replace or delete them (403 otherwise,
before anything is changed). A server with no tenants (``--dev``) writes as the
operator, who may replace or delete any document."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import AfterValidator
from starlette.convertors import PathConvertor, register_url_convertor

from knowledge import Document, KnowledgeBase, SearchFilter
from serving.auth import Principal
from serving.deps import PrincipalDep, require_key
from serving.errors import ServingError
from serving.openai.protocol import ErrorResponse
from serving.knowledge_api.protocol import (
    CollectionList,
    CollectionOut,
    DocumentList,
    DocumentOut,
    SearchRequest,
    SearchResponse,
    SearchResult,
    UploadRequest,
    UploadResponse,
    document_id,
)

__all__ = ["router"]


async def _knowledge(request: Request) -> KnowledgeBase:
    knowledge: KnowledgeBase | None = request.app.state.platform.knowledge
    assert knowledge is not None  # a server always opens it (Platform.build)
    return knowledge


KnowledgeDep = Annotated[KnowledgeBase, Depends(_knowledge)]


async def _writer(request: Request, principal: PrincipalDep) -> str | None:
    """Who writes: the caller's tenant, or None (the operator) on a server whose auth
    is off (``--dev``: one local user, no tenants to tell apart)."""
    return principal.tenant if request.app.state.authenticator.enabled else None


WriterDep = Annotated[str | None, Depends(_writer)]


class _WholeRest(PathConvertor):
    """The rest of the path, whatever it holds: Starlette's ``path`` stops at a newline
    (its ``.`` does not match one), which made an id holding one a bare 404 instead of
    a 422 naming it."""

    regex = "(?s:.*)"


register_url_convertor("document_id", _WholeRest())

DocumentIdPath = Annotated[
    str,
    Path(description="The document id, percent-encoded as one path segment (`/` as %2F, `#` as %23, `?` as %3F)."),
    AfterValidator(document_id),
]
"""The rest of the path, taken whole: ``/``, ``#``, ``?`` and ``..`` are part of the id
(a client must percent-encode them); an id no store can hold is a 422."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": description}
    for code, description in {
        400: "Invalid collection name, or a request the knowledge base refuses",
        401: "Missing or invalid API key",
        403: "The tenant may not use this collection, or may not replace or delete a document another tenant wrote",
        404: "Unknown collection (the message lists the existing ones) or document",
        413: "Request body too large",
        422: "Invalid request (names the field): an empty query, a malformed document",
        429: "Rate or concurrency limit (see Retry-After)",
        503: "The embedder is unavailable",
    }.items()
}

router = APIRouter(prefix="/v1/collections", tags=["knowledge"], dependencies=[require_key], responses=_ERRORS)


def _allowed(principal: Principal, name: str) -> None:
    if not principal.settings.allows_collection(name):
        raise ServingError(403, f"tenant {principal.tenant!r} may not use collection {name!r}")


@router.get("", response_model=CollectionList)
async def list_collections(knowledge: KnowledgeDep, principal: PrincipalDep) -> CollectionList:
    """The collections the caller may use, with their sizes and embedder."""
    collections = await knowledge.collections()
    return CollectionList(
        data=[
            CollectionOut(name=c.name, documents=c.documents, chunks=c.chunks, embedder=c.embedder, dimensions=c.dimensions)
            for c in collections
            if principal.settings.allows_collection(c.name)
        ]
    )


@router.get("/{name}/documents", response_model=DocumentList)
async def list_documents(name: str, knowledge: KnowledgeDep, principal: PrincipalDep, writer: WriterDep) -> DocumentList:
    """The documents of a collection, their stored versions, and whether the caller
    wrote them (``owned``) and may replace or delete them (``writable``)."""
    _allowed(principal, name)
    stored = await knowledge.store.documents(name)
    return DocumentList(
        documents=[
            DocumentOut(
                doc_id=d.doc_id,
                version=d.version,
                chunks=d.chunks,
                source=d.source,
                title=d.title,
                owned=d.owner == writer,
                writable=writer is None or d.owner == writer,
            )
            for d in sorted(stored.values(), key=lambda d: d.doc_id)
        ]
    )


@router.post("/{name}/documents", response_model=UploadResponse)
async def upload_documents(
    name: str, body: UploadRequest, knowledge: KnowledgeDep, principal: PrincipalDep, writer: WriterDep
) -> UploadResponse:
    """Add or update documents (created on first upload). Idempotent: an unchanged
    document is skipped; a changed one replaces its old chunks as a whole. A request
    naming a document another tenant wrote is refused whole (403), nothing written."""
    _allowed(principal, name)
    documents = [
        Document(id=d.id, text=d.text, title=d.title, source=d.source or "upload", metadata=d.metadata, format=d.format)
        for d in body.documents
    ]
    report = await knowledge.ingest(name, documents, tenant=writer)  # not yours: 403 (serving/errors.py)
    return UploadResponse(**report.model_dump())


@router.delete("/{name}/documents/{doc_id:document_id}", status_code=204)
async def delete_document(
    name: str, doc_id: DocumentIdPath, knowledge: KnowledgeDep, principal: PrincipalDep, writer: WriterDep
) -> None:
    """Remove a document and its chunks (only the tenant that wrote it may)."""
    _allowed(principal, name)
    deleted = await knowledge.delete(name, doc_id, tenant=writer)  # not yours: 403 (serving/errors.py)
    if not deleted:
        raise ServingError(404, f"document {doc_id!r} not found in collection {name!r}")


@router.post("/{name}/search", response_model=SearchResponse)
async def search(name: str, body: SearchRequest, knowledge: KnowledgeDep, principal: PrincipalDep) -> SearchResponse:
    """The best chunks for a query (hybrid by default: dense and BM25-style sparse,
    fused by reciprocal rank)."""
    _allowed(principal, name)
    where = None
    if body.filter is not None:
        where = SearchFilter(doc_ids=body.filter.doc_ids, tags=body.filter.tags, metadata=dict(body.filter.metadata))
    hits = await knowledge.search(name, body.query, k=body.k, mode=body.mode, where=where)
    return SearchResponse(results=[SearchResult(**hit.json()) for hit in hits])
