"""``switchyard ingest``, ``switchyard search`` and ``switchyard knowledge migrate|optimize``.

Mounted by ``serving/cli.py``, which puts an object satisfying `KnowledgeCliEnv` in
the Typer context and turns `KnowledgeError` into a one-line message and exit status 1.

The embedded store allows one process per data directory. When a Switchyard server
holds it, these commands send their work through that server's HTTP API (found in
``<data_dir>/run/server.json``, which the server writes when it starts; an API key is
read from ``SWITCHYARD_API_KEY``); if no server is registered, they say which
directory is locked.

Through a server, collection names and document ids are percent-encoded as one path
segment each (``/``, ``#``, ``?``, ``.`` included), so a request names exactly the
document meant. ``ingest`` checks everything it can before it changes anything: the
collection name, that the server lets it replace every document it sends, and that
every document ``--delete-missing`` would remove has an id the server can take.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import httpx
import typer

from knowledge._client import check, documents_path, headers, segment
from knowledge.graph_cli import OntologyOption, print_graph_report, read_ontology, through
from knowledge.errors import (
    DocumentParseError,
    InvalidDocumentIdError,
    KnowledgeError,
    OntologyMismatchError,
    StoreLockedError,
)
from knowledge.ingestion.loaders import discover, load_file
from knowledge.ingestion.pipeline import same_source
from knowledge.knowledge_base import KnowledgeBase
from knowledge.knowledge_graph import OntologyRequiredError
from knowledge.migrate import migrate_collection
from knowledge.models import Document, IngestReport, SearchHit, check_document_id
from knowledge.vectorstore.base import valid_collection_name
from knowledge.ontology import Ontology
from knowledge.vectorstore.qdrant import QdrantStore

if TYPE_CHECKING:
    from knowledge.knowledge_graph import GraphRetrieval, KnowledgeGraph

__all__ = ["KnowledgeCliEnv", "graph_results", "ingest", "knowledge_app", "search"]

_UPLOAD_BYTES = 512 * 1024
"""Documents per upload request, by JSON size: under the server's default body limit."""


class KnowledgeCliEnv(Protocol):
    """What these commands need from the composition root."""

    def open_knowledge(self) -> AbstractAsyncContextManager[KnowledgeBase]:
        """Open the knowledge base (raises `StoreLockedError` when a server holds it)."""
        ...

    def server_url(self) -> str | None:
        """The URL of the Switchyard server running on this data directory, if any."""
        ...

    def legacy_store_path(self) -> Path:
        """Where earlier versions kept the embedded store (qdrant-client's local mode)."""
        ...

    def open_knowledge_graph(self, *, extraction: bool = True) -> AbstractAsyncContextManager[KnowledgeGraph | str]:
        """Open the knowledge base and its graph (with the model gateway, and the local
        model backend started if ``extraction`` needs it); or, when a server holds the
        stores, yield that server's URL.

        Raises:
            KnowledgeError: a store is locked and no server is registered.
        """
        ...


def _items(paths: list[Path]) -> Iterator[Document | DocumentParseError]:
    for found in discover(paths):
        if isinstance(found, DocumentParseError):
            yield found
            continue
        file, doc_id, named = found
        try:
            loaded = load_file(file, doc_id, follow_links=named)
        except DocumentParseError as exc:
            yield exc
            continue
        yield from loaded.documents
        yield from loaded.errors


CollectionOption = Annotated[str, typer.Option("--collection", "-c", help="The collection (created on first ingest).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def ingest(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(help="Files or directories (.md .txt .html .pdf .jsonl).")],
    collection: CollectionOption,
    as_json: JsonOption = False,
    delete_missing: Annotated[
        bool, typer.Option("--delete-missing", help="Remove documents of the collection that are not in PATHS.")
    ] = False,
    graph: Annotated[
        bool,
        typer.Option(
            "--graph",
            help="Also extract entities and relations into the collection's knowledge graph (a model call per chunk).",
        ),
    ] = False,
    ontology_file: OntologyOption = None,
) -> None:
    """Ingest documents: new ones are added, changed ones replaced, unchanged ones skipped.
    With ``--graph``, the documents' entities and relations are then extracted under the
    collection's ontology (documents whose facts are already extracted are skipped)."""
    env: KnowledgeCliEnv = ctx.obj
    valid_collection_name(collection)
    if ontology_file is not None and not graph:
        raise KnowledgeError("--ontology is for the knowledge graph: add --graph")
    for path in paths:
        if not path.exists():
            raise KnowledgeError(f"{path}: no such file or directory")
    ontology, ontology_text = read_ontology(ontology_file)
    items = list(_items(paths))
    documents = sum(isinstance(i, Document) for i in items)
    doc_ids = [i.id for i in items if isinstance(i, Document)]
    show_bar = sys.stderr.isatty()

    async def write(target: KnowledgeBase) -> IngestReport:
        with typer.progressbar(length=documents, label="ingesting", file=sys.stderr) if show_bar else _NoBar() as bar:
            done = await target.ingest(
                collection, items, delete_missing=delete_missing, progress=lambda doc_id, outcome: bar.update(1)
            )
        if done.added or done.updated or done.deleted:
            # Indexes are built once, at the end (only if enough was written: below
            # that, brute force is as fast); searches need not wait for a server.
            if show_bar:
                typer.echo("optimising the collection's indexes...", err=True)
            try:
                await target.optimize(collection)
            except KnowledgeError as exc:
                # Every document is stored; only the indexes wait for the next try.
                typer.echo(f"warning: {exc}; run `switchyard knowledge optimize --collection {collection}`", err=True)
        return done

    async def run() -> tuple[IngestReport, dict[str, Any] | None]:
        if not graph:
            async with _local_or_server(env) as target:
                if isinstance(target, str):
                    typer.echo(f"the vector store is held by the server at {target}; sending the documents through it", err=True)
                    return await _ingest_through(target, collection, items, delete_missing), None
                return await write(target), None
        async with env.open_knowledge_graph() as kg:
            if isinstance(kg, str):
                typer.echo(f"the stores are held by the server at {kg}; sending the documents through it", err=True)
                # The ontology is checked before any document is written, and bound after.
                path = f"/v1/collections/{segment(collection)}/graph/ontology"
                async with httpx.AsyncClient(base_url=kg, headers=headers(), timeout=60) as client:
                    answer = await client.get(path)
                    if answer.status_code == 404 and answer.json().get("error", {}).get("code") in ("graph_not_found", "collection_not_found"):
                        bound = None
                    else:
                        bound = check(answer, kg)
                _check_ontology(collection, bound and (bound["name"], bound["fingerprint"]), ontology)
                report = await _ingest_through(kg, collection, items, delete_missing)
                if ontology_text is not None:
                    await through(kg, "PUT", path, json={"ontology": ontology_text})
                typer.echo("extracting entities and relations on the server (a model call per chunk)...", err=True)
                extracted = await through(
                    kg, "POST", f"/v1/collections/{segment(collection)}/graph/extract", json={"doc_ids": doc_ids}, timeout=None
                )
                return report, dict(extracted)
            bound = await kg.store.ontology(collection)
            _check_ontology(collection, bound and (bound.name, bound.fingerprint), ontology)
            report = await write(kg.knowledge)
            await kg.bind(collection, ontology)
            with typer.progressbar(length=1, label="extracting", file=sys.stderr) if show_bar else _NoBar() as bar:

                def progress(done: int, total: int) -> None:
                    bar.length = total
                    bar.update(done - bar.pos)

                extracted = await kg.extract(collection, doc_ids, progress=progress)
            return report, dict(extracted.model_dump(mode="json"))

    report, extracted = asyncio.run(run())
    if as_json:
        result = report.model_dump(mode="json")
        if extracted is not None:
            result["graph"] = extracted
        typer.echo(json.dumps(result))
    else:
        typer.echo(
            f"{collection}: {report.added} added, {report.updated} updated, {report.skipped} unchanged, "
            f"{report.deleted} deleted, {report.failed} failed; {report.chunks} chunks in {report.seconds:.1f}s"
        )
        for error in report.errors:
            typer.echo(f"  failed: {error['source']}: {error['reason']}", err=True)
        if extracted is not None:
            print_graph_report(extracted)
    if report.failed or (extracted is not None and extracted.get("failed_chunks")):
        raise SystemExit(2)


def _check_ontology(collection: str, bound: tuple[str, str] | None, given: Ontology | None) -> None:
    """Before ``ingest --graph`` writes anything: the collection's graph is bound to
    ``given`` (or will be), or has an ontology when none is given.

    Raises:
        OntologyMismatchError: the graph is bound to another ontology.
        OntologyRequiredError: no graph yet, and no ontology given.
    """
    if bound is None:
        if given is None:
            raise OntologyRequiredError(collection)
        return
    name, fingerprint = bound
    if given is not None and given.fingerprint != fingerprint:
        raise OntologyMismatchError(collection, f"{name!r} ({fingerprint})", given.describe())


@asynccontextmanager
async def _local_or_server(env: KnowledgeCliEnv) -> AsyncIterator[KnowledgeBase | str]:
    """The knowledge base, opened here; or, when a server holds its store, that
    server's URL."""
    opened = env.open_knowledge()
    locked: StoreLockedError | None = None
    try:
        knowledge = await opened.__aenter__()
    except StoreLockedError as exc:
        locked = exc
    if locked is not None:
        url = env.server_url()
        if url is None:
            raise KnowledgeError(
                f"{locked}; no Switchyard server is registered for this data directory to go through: stop the "
                "process that holds it, or start `switchyard serve`"
            )
        yield url
        return
    try:
        yield knowledge
    finally:
        await opened.__aexit__(None, None, None)


class _NoBar:
    length = 0
    pos = 0

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        pass


async def _ingest_through(
    url: str, collection: str, items: list[Document | DocumentParseError], delete_missing: bool
) -> IngestReport:
    started = time.perf_counter()
    report = IngestReport(collection=collection)
    documents = [i for i in items if isinstance(i, Document)]
    failed_sources = [i.source for i in items if isinstance(i, DocumentParseError)]
    for error in items:
        if isinstance(error, DocumentParseError):
            report.failed += 1
            report.errors.append({"source": error.source, "reason": error.reason})
    async with httpx.AsyncClient(base_url=url, headers=headers(), timeout=600) as client:
        # Everything that can refuse the ingestion is checked before anything changes.
        listed = await _stored_documents(client, url, collection)
        theirs = sorted(d.id for d in documents if d.id in listed and not listed[d.id].get("writable", False))
        if theirs:
            shown = ", ".join(repr(d) for d in theirs[:10]) + (f" and {len(theirs) - 10} more" if len(theirs) > 10 else "")
            raise KnowledgeError(
                f"collection {collection!r} on the server at {url} holds documents that another tenant (or the "
                f"operator) wrote, which this key may not replace: {shown}; nothing was changed"
            )
        doomed: list[str] = []
        if delete_missing:
            keep = {d.id for d in documents}
            for doc_id, stored in listed.items():
                source = stored.get("source") or ""
                if not stored.get("owned", False) or doc_id in keep or any(same_source(source, s) for s in failed_sources):
                    continue
                doomed.append(doc_id)
            bad = []
            for doc_id in doomed:
                try:
                    check_document_id(doc_id)
                except InvalidDocumentIdError as exc:
                    bad.append(str(exc))
            if bad:
                raise KnowledgeError(
                    f"--delete-missing would remove documents the server cannot be asked to delete by id: "
                    f"{'; '.join(bad)}; nothing was changed"
                )
        batch: list[dict[str, Any]] = []
        size = 0

        async def send() -> None:
            nonlocal batch, size
            if not batch:
                return
            got = check(await client.post(documents_path(collection), json={"documents": batch}), url)
            for key in ("added", "updated", "skipped", "failed", "chunks"):
                setattr(report, key, getattr(report, key) + got[key])
            report.errors.extend(got["errors"])
            batch, size = [], 0

        for document in documents:
            record = document.model_dump()
            length = len(json.dumps(record, ensure_ascii=False).encode())
            if batch and size + length > _UPLOAD_BYTES:
                await send()
            batch.append(record)
            size += length
        await send()
        for doc_id in doomed:
            response = await client.delete(documents_path(collection, doc_id))
            if response.status_code == 404:
                continue  # deleted by someone else since it was listed
            check(response, url)
            report.deleted += 1
    report.seconds = round(time.perf_counter() - started, 3)
    return report


async def _stored_documents(client: httpx.AsyncClient, url: str, collection: str) -> dict[str, dict[str, Any]]:
    """The collection's documents on the server by id (none if it does not exist yet)."""
    response = await client.get(documents_path(collection))
    if response.status_code == 404:
        return {}
    return {d["doc_id"]: d for d in check(response, url)["documents"]}


def search(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="What to look for.")],
    collection: CollectionOption,
    k: Annotated[int, typer.Option("-k", min=1, max=100, help="How many results (chunks; with --graph, also facts).")] = 5,
    mode: Annotated[str, typer.Option("--mode", help="hybrid, dense or sparse.")] = "hybrid",
    graph: Annotated[
        bool,
        typer.Option("--graph", help="Also retrieve facts from the collection's knowledge graph (as the graphrag graph does)."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Search a collection; prints the best chunks (``--json``: ``{"results": [...]}``,
    each with its ``doc_id``). With ``--graph``, the graph's facts about the entities the
    query names come first (``kind: fact``), then the chunks (``kind: chunk``), and
    ``linked`` lists the entities found in the query."""
    env: KnowledgeCliEnv = ctx.obj
    valid_collection_name(collection)
    if mode not in ("hybrid", "dense", "sparse"):
        raise KnowledgeError(f"--mode must be hybrid, dense or sparse, not {mode!r}")
    if not query.strip():
        raise KnowledgeError("the query is empty")
    body: dict[str, Any] = {"query": query, "k": k, "mode": mode}

    async def run() -> dict[str, Any]:
        if not graph:
            async with _local_or_server(env) as target:
                if isinstance(target, str):
                    answer = await through(target, "POST", f"/v1/collections/{segment(collection)}/search", json=body, timeout=60)
                    return {"results": [{"kind": "chunk", **hit} for hit in answer["results"]]}
                hits = await target.search(collection, query, k=k, mode=mode)  # type: ignore[arg-type]
                return {"results": [{"kind": "chunk", **hit.json()} for hit in hits]}
        async with env.open_knowledge_graph(extraction=False) as kg:
            if isinstance(kg, str):
                answer = await through(
                    kg, "POST", f"/v1/collections/{segment(collection)}/search", json={**body, "graph": True}, timeout=60
                )
                return {"results": answer["results"], "linked": answer.get("linked", [])}
            found, hits = await asyncio.gather(
                kg.retrieve(collection, query, max_facts=k),
                kg.knowledge.search(collection, query, k=k, mode=mode),  # type: ignore[arg-type]
            )
            return graph_results(found, hits)

    found = asyncio.run(run())
    results = found["results"]
    if as_json:
        typer.echo(json.dumps(found, ensure_ascii=False))
        return
    if graph:
        linked = found.get("linked", [])
        typer.echo("entities in the query: " + (", ".join(f"{e['name']} ({e['type']}, {e['how']})" for e in linked) or "none"))
    if not results:
        typer.echo("no results")
    for rank, hit in enumerate(results, start=1):
        if hit.get("kind") == "fact":
            typer.echo(f"{rank}. fact [{hit['hops']} hop] {hit['text']}  <- {', '.join(hit['doc_ids'])}")
            continue
        text = " ".join(hit["text"].split())
        typer.echo(f"{rank}. {hit['doc_id']} ({hit['chunk_id']}) score={hit['score']:.4f}\n   {text[:200]}")


def graph_results(found: GraphRetrieval, hits: list[SearchHit]) -> dict[str, Any]:
    """A graph search's answer (CLI and HTTP API): facts first, then chunks, each with
    its ``kind`` and ``doc_id``; ``linked``: the entities found in the query."""
    return {
        "results": [{"kind": "fact", **fact.json()} for fact in found.facts] + [{"kind": "chunk", **hit.json()} for hit in hits],
        "linked": [
            {
                "id": link.entity.id,
                "name": link.entity.name,
                "type": link.entity.type,
                "how": link.how,
                "score": round(link.score, 4),
                "mention": link.mention,
            }
            for link in found.linked
        ],
    }


knowledge_app = typer.Typer(help="Maintain the vector store: migrate collections, optimise indexes.", no_args_is_help=True)


@knowledge_app.command("migrate")
def migrate(
    ctx: typer.Context,
    collection: CollectionOption,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="The earlier store's directory (default: knowledge.qdrant_path, <data_dir>/qdrant)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Copy a collection that an earlier version stored (qdrant-client's local mode) into
    the current store, vectors and all; documents already copied are skipped, so it
    can be run again."""
    env: KnowledgeCliEnv = ctx.obj
    valid_collection_name(collection)
    path = source or env.legacy_store_path()
    if not path.is_dir():
        raise KnowledgeError(f"{path}: no earlier vector store there (give its directory with --from)")

    async def run() -> dict[str, Any]:
        legacy = QdrantStore(path=path)  # StoreLockedError if an older server still holds it
        try:
            async with env.open_knowledge() as knowledge:
                report = await migrate_collection(
                    legacy, knowledge.store, collection, embedder=knowledge.embedder.name, dimensions=knowledge.embedder.dimensions
                )
                optimized = await knowledge.optimize(collection)
        except StoreLockedError as exc:
            raise KnowledgeError(f"{exc}: stop the server to migrate (a migration writes the store directly)") from None
        finally:
            await legacy.aclose()
        return {**dataclasses.asdict(report), "optimized": optimized, "from": str(path)}

    result = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(
        f"{collection}: {result['copied']} documents copied ({result['chunks']} chunks), {result['skipped']} already there; "
        f"{result['documents']} documents now in the store ({result['seconds']:.1f}s)"
    )


@knowledge_app.command("optimize")
def optimize(
    ctx: typer.Context,
    collection: CollectionOption,
    force: Annotated[bool, typer.Option("--force", help="Optimise even if little was written since the last time.")] = False,
) -> None:
    """Build a collection's indexes now (a server does it by itself after writes)."""
    env: KnowledgeCliEnv = ctx.obj
    valid_collection_name(collection)

    async def run() -> bool:
        async with _local_or_server(env) as target:
            if isinstance(target, str):
                raise KnowledgeError(f"the server at {target} holds the store; it optimises collections by itself after writes")
            return await target.optimize(collection, force=force)

    changed = asyncio.run(run())
    typer.echo(f"{collection}: {'optimised' if changed else 'nothing to optimise'}")
