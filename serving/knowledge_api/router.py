"""Routes of the collections API. A tenant sees and uses only the collections its
``collections`` allow-list names (403 otherwise). Documents uploaded here record the
uploading tenant, and only that tenant may replace or delete them (403 otherwise,
before anything is changed). A server with no tenants (``--dev``) writes as the
operator, who may replace or delete any document."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import AfterValidator
from starlette.convertors import PathConvertor, register_url_convertor

from knowledge import Document, DocumentOwnershipError, KnowledgeBase, SearchFilter
from knowledge.cli import graph_results
from knowledge.graph_cli import graph_stats_json, neighbors_json
from knowledge.knowledge_graph import GraphReport, KnowledgeGraph
from knowledge.ontology import Ontology, parse_ontology
from serving.auth import Principal
from serving.deps import PrincipalDep, require_key
from serving.errors import ServingError
from serving.openai.protocol import ErrorResponse
from serving.knowledge_api.protocol import (
    CollectionList,
    CollectionOut,
    DocumentList,
    DocumentOut,
    ExtractRequest,
    GraphImportRequest,
    GraphStatsOut,
    NeighborsOut,
    OntologyIn,
    OntologyOut,
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


async def _graph(request: Request) -> KnowledgeGraph:
    graph: KnowledgeGraph | None = request.app.state.platform.graph
    assert graph is not None  # a server always opens it (Platform.build)
    return graph


GraphDep = Annotated[KnowledgeGraph, Depends(_graph)]


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
        404: "Unknown collection (the message lists the existing ones), document, or a collection without a knowledge graph",
        409: "The collection's knowledge graph is bound to another ontology (both are named)",
        413: "Request body too large",
        422: "Invalid request (names the field): an empty query, a malformed document",
        429: "Rate or concurrency limit (see Retry-After)",
        503: "The embedder, the vector store or the graph store is unavailable",
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
async def search(
    name: str, body: SearchRequest, request: Request, knowledge: KnowledgeDep, principal: PrincipalDep
) -> SearchResponse:
    """The best chunks for a query (hybrid by default: dense and BM25-style sparse,
    fused by reciprocal rank); with ``graph``, the knowledge graph's facts about the
    entities the query names first."""
    _allowed(principal, name)
    where = None
    if body.filter is not None:
        where = SearchFilter(doc_ids=body.filter.doc_ids, tags=body.filter.tags, metadata=dict(body.filter.metadata))
    if not body.graph:
        hits = await knowledge.search(name, body.query, k=body.k, mode=body.mode, where=where)
        return SearchResponse(results=[SearchResult(**hit.json()) for hit in hits])
    graph: KnowledgeGraph | None = request.app.state.platform.graph
    assert graph is not None
    found, hits = await asyncio.gather(
        graph.retrieve(name, body.query, max_facts=body.k), knowledge.search(name, body.query, k=body.k, mode=body.mode, where=where)
    )
    return SearchResponse.model_validate(graph_results(found, hits))


def _ontology(text: str | None, field: str) -> Ontology | None:
    return None if text is None else parse_ontology(text, source=f"request field {field!r}")


def _ontology_out(collection: str, ontology: Ontology) -> OntologyOut:
    return OntologyOut(
        collection=collection,
        name=ontology.name,
        fingerprint=ontology.fingerprint,
        entity_types=sorted(ontology.entity_types),
        relation_types=sorted(ontology.relation_types),
    )


async def _check_writable(knowledge: KnowledgeBase, name: str, doc_ids: list[str] | None, writer: str | None) -> None:
    """A tenant may build graph facts only from documents it wrote (as it may only
    replace those); the operator, from any."""
    if writer is None:
        return
    stored = await knowledge.store.documents(name)
    wanted = stored.keys() if doc_ids is None else [d for d in doc_ids if d in stored]
    theirs = sorted(d for d in wanted if stored[d].owner != writer)
    if theirs:
        raise DocumentOwnershipError(name, writer, theirs)


@router.get("/{name}/graph", response_model=GraphStatsOut)
async def graph_stats(name: str, graph: GraphDep, principal: PrincipalDep) -> GraphStatsOut:
    """What the collection's knowledge graph holds: its ontology, entities and relations per type."""
    _allowed(principal, name)
    return GraphStatsOut(**graph_stats_json(name, await graph.stats(name)))


@router.get("/{name}/graph/ontology", response_model=OntologyOut)
async def get_ontology(name: str, graph: GraphDep, principal: PrincipalDep) -> OntologyOut:
    """The ontology the collection's graph is bound to (404 if it has no graph)."""
    _allowed(principal, name)
    return _ontology_out(name, await graph.bind(name, None))


@router.put("/{name}/graph/ontology", response_model=OntologyOut)
async def put_ontology(
    name: str, body: OntologyIn, knowledge: KnowledgeDep, graph: GraphDep, principal: PrincipalDep
) -> OntologyOut:
    """Bind the collection's graph to an ontology (created the first time; the same
    ontology again changes nothing; another one is a 409 naming both). The collection
    must exist: upload its documents first."""
    _allowed(principal, name)
    ontology = _ontology(body.ontology, "ontology")
    if not await knowledge.store.has_collection(name):
        # No graph for a collection that does not exist: each one is a database.
        raise ServingError(404, f"unknown collection {name!r}: upload its documents first")
    return _ontology_out(name, await graph.bind(name, ontology))


@router.post("/{name}/graph/extract", response_model=GraphReport)
async def extract(
    name: str, body: ExtractRequest, knowledge: KnowledgeDep, graph: GraphDep, principal: PrincipalDep, writer: WriterDep
) -> GraphReport:
    """Extract entities and relations from the collection's documents with the model
    (``knowledge.graph.extraction``), under its ontology; invalid items are dropped
    and counted by reason. Takes a model call per chunk."""
    _allowed(principal, name)
    ontology = _ontology(body.ontology, "ontology")
    await _check_writable(knowledge, name, body.doc_ids, writer)
    return await graph.extract(name, body.doc_ids, ontology=ontology, force=body.force)


@router.post("/{name}/graph/import", response_model=GraphReport)
async def import_facts(
    name: str, body: GraphImportRequest, knowledge: KnowledgeDep, graph: GraphDep, principal: PrincipalDep, writer: WriterDep
) -> GraphReport:
    """Import curated facts (one JSON object per line), under the collection's
    ontology; invalid lines are dropped and reported with their line numbers."""
    _allowed(principal, name)
    ontology = _ontology(body.ontology, "ontology")
    await _check_writable(knowledge, name, _sources(body.lines), writer)
    return await graph.import_facts(name, body.lines, ontology=ontology, source=body.source)


def _sources(lines: list[str]) -> list[str]:
    """The documents curated lines name (lines that do not parse are the importer's to report)."""
    found: dict[str, None] = {}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("source"), str):
            found[item["source"]] = None
    return list(found)


@router.get("/{name}/graph/neighbors", response_model=NeighborsOut)
async def graph_neighbors(
    name: str,
    graph: GraphDep,
    principal: PrincipalDep,
    entity: Annotated[str, Query(alias="name", min_length=1, max_length=500, pattern=r"\S")],
    hops: Annotated[int, Query(ge=1, le=4)] = 2,
    fanout: Annotated[int | None, Query(ge=1, le=500)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> NeighborsOut:
    """The facts within ``hops`` of the entity named ``name`` (a name or an alias)."""
    _allowed(principal, name)
    result = await graph.neighbors(name, entity, hops=hops, fanout=fanout, limit=limit)
    return NeighborsOut(**neighbors_json(result))
