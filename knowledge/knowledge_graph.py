"""`KnowledgeGraph`: the knowledge graph's facade (bind an ontology, extract, import
curated facts, delete, neighbours, retrieval, stats), over a `GraphStore` and the
`KnowledgeBase` whose documents the facts come from; `open_graph_store` and
`open_knowledge_graph` build them from settings.

What a collection's graph holds and where it comes from:

- **Extraction** (`KnowledgeGraph.extract`): per chunk of each document, the
  extraction alias is asked for entities and relations under the ontology's JSON
  schema (`knowledge.extraction.extractor`); each item is checked
  (`knowledge.extraction.validate`), resolved (same type and normalised name or
  alias: one entity; an entity the graph already holds keeps its id) and the
  document's graph is written as a unit, replacing what the document supported
  before. A document whose graph was written from its current version (same content
  hash as the vector store) is skipped unless ``force``. A document with a chunk
  whose extraction failed is written with what the other chunks gave, under a
  ``partial:`` hash, so the next extraction tries it again; one whose chunks all
  failed is not written (the graph keeps what it had).
- **Curated facts** (`KnowledgeGraph.import_facts`): JSON Lines under the same checks
  (`knowledge.extraction.curated`). Each fact is stated by its ``source`` document;
  it is linked to that document's chunks that contain one of the names (case-folded;
  for a relation, chunks with both ends' names, else either, else the first chunk).
  An import **adds** to what the document already has in the graph: the document's
  graph becomes the union of its stored facts (extracted or imported before) and the
  imported ones, recorded as of the document's current version: an extraction skips
  the document from then on; a forced one, or a new version of the document,
  replaces its graph, curated facts included (import them again after it).
- **Documents change**: a document replaced or deleted in the knowledge base loses
  its facts (`KnowledgeGraph.delete_document`, called by the knowledge base's hook);
  facts other documents also state stay.
- **Entity companion**: ``<collection>__entities``, a vector collection of the
  knowledge base with one document per entity (id: the entity id; text: its name,
  aliases, type and description; metadata ``entity_type``), kept in step with the
  graph after each write, for linking questions to entities by meaning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, Field

from knowledge.errors import GraphNotFoundError, KnowledgeError, UnknownCollectionError
from knowledge.extraction.curated import parse_curated
from knowledge.extraction.extractor import ChunkExtraction, Extractor
from knowledge.extraction.validate import INVALID_REASONS, DocumentGraphBuilder, EntityItem, Problem, resolve_ends
from knowledge.graphstore.ladybug import LadybugStore
from knowledge.graphstore.base import DocumentGraph, Entity, Fact, GraphStats, GraphStore, Relation
from knowledge.knowledge_base import KnowledgeBase, SearchObserver, report_search
from knowledge.models import Document
from knowledge.ontology import Ontology
from knowledge.retrieval.graph import (
    ENTITIES_SUFFIX,
    FactSource,
    GraphRetrieval,
    GraphRetriever,
    LinkedEntity,
    RankedFact,
    entities_collection,
)
from knowledge.settings import GraphSettings, KnowledgeSettings
from knowledge.vectorstore.base import StoredDocument, valid_collection_name

if TYPE_CHECKING:
    from gateway import ModelGateway

__all__ = [
    "ENTITIES_SUFFIX",
    "FactSource",
    "GraphReport",
    "GraphRetrieval",
    "KnowledgeGraph",
    "LinkedEntity",
    "NeighborsResult",
    "OntologyRequiredError",
    "RankedFact",
    "entities_collection",
    "open_graph_store",
    "open_knowledge_graph",
]

log = logging.getLogger(__name__)

PARTIAL_PREFIX: Final = "partial:"
"""Content hash prefix of a document graph written while some chunks failed."""

MAX_PROBLEMS: Final = 100
"""Problems a report lists (all are counted)."""

MAX_HOPS: Final = 4
MAX_FANOUT: Final = 500
MAX_LIMIT: Final = 1000
MAX_FACTS: Final = 200


class OntologyRequiredError(KnowledgeError):
    """A collection with no knowledge graph yet was given no ontology to bind.

    Attributes:
        collection: the collection.
    """

    def __init__(self, collection: str) -> None:
        self.collection = collection
        super().__init__(
            f"collection {collection!r} has no knowledge graph yet: give an ontology (--ontology FILE) to create one"
        )


class GraphReport(BaseModel):
    """What an extraction or an import did (``--json``)."""

    collection: str
    ontology: str
    """The ontology the graph is bound to (``name (fingerprint)``)."""
    documents: int = 0
    """Documents whose graph was written."""
    skipped: int = 0
    """Documents whose graph was already written from their current version (extraction)."""
    removed: int = 0
    """Documents the graph held that the knowledge base no longer has, whose facts were
    removed (an extraction of every document: ``doc_ids`` None)."""
    chunks: int = 0
    """Chunks extracted (extraction), or curated lines read (import)."""
    failed_chunks: int = 0
    """Chunks whose model call failed or whose answer was not JSON (extraction)."""
    entities: dict[str, int] = Field(default_factory=dict)
    """Entities written, per type (each entity once)."""
    relations: dict[str, int] = Field(default_factory=dict)
    """Relations written, per type (each once)."""
    invalid: dict[str, int] = Field(default_factory=dict)
    """Items dropped, per reason (`knowledge.extraction.validate.INVALID_REASONS`)."""
    problems: list[dict[str, str]] = Field(default_factory=list)
    """The first `MAX_PROBLEMS` problems: ``{"where": "line 3" | "chunk doc#2", "reason", "detail"}``;
    besides the invalid reasons, ``timeout`` and ``model_error`` for failed chunks."""
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NeighborsResult:
    """The entities a name matched and the facts around them."""

    collection: str
    matched: tuple[Entity, ...]
    """Entities whose name or alias is the name asked for (or, when none is, the
    entities the entity companion finds closest in meaning above the linking threshold)."""
    facts: tuple[Fact, ...]
    """Nearer first (see `GraphStore.neighbors`)."""

    def json(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "matched": [{"id": e.id, "name": e.name, "type": e.type, "aliases": list(e.aliases)} for e in self.matched],
            "facts": [
                {
                    "text": f.text(),
                    "subject": f.source.name,
                    "relation": f.relation,
                    "object": f.target.name,
                    "subject_type": f.source.type,
                    "object_type": f.target.type,
                    "hops": f.hops,
                    "doc_id": f.doc_ids[0] if f.doc_ids else None,
                    "doc_ids": list(f.doc_ids),
                    "chunk_ids": list(f.chunk_ids),
                }
                for f in self.facts
            ],
        }


class _Tally:
    """Counts for a `GraphReport`."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.invalid: Counter[str] = Counter()
        self.entities: dict[str, str] = {}
        self.relations: set[tuple[str, str, str]] = set()
        self.documents = 0
        self.skipped = 0
        self.removed = 0
        self.chunks = 0
        self.failed_chunks = 0

    def problem(self, problem: Problem) -> None:
        if problem.reason in INVALID_REASONS:
            self.invalid[problem.reason] += 1
        self.problems.append(problem)

    def written(self, graph: DocumentGraph) -> None:
        self.documents += 1
        self.entities.update((e.id, e.type) for e in graph.entities)
        self.relations.update((r.type, r.source, r.target) for r in graph.relations)

    def report(self, collection: str, ontology: Ontology, started: float) -> GraphReport:
        return GraphReport(
            collection=collection,
            ontology=ontology.describe(),
            documents=self.documents,
            skipped=self.skipped,
            removed=self.removed,
            chunks=self.chunks,
            failed_chunks=self.failed_chunks,
            entities=dict(sorted(Counter(self.entities.values()).items())),
            relations=dict(sorted(Counter(t for t, _, _ in self.relations).items())),
            invalid=dict(sorted(self.invalid.items())),
            problems=[p.json() for p in self.problems[:MAX_PROBLEMS]],
            seconds=round(time.perf_counter() - started, 3),
        )


@dataclass(frozen=True, slots=True)
class _Chunk:
    chunk_id: str
    text: str
    folded: str


def _entity_item(entity: Entity) -> EntityItem:
    return EntityItem(
        type=entity.type, name=entity.name, aliases=entity.aliases, description=entity.description,
        properties=dict(entity.properties),
    )


def _entity_document(entity: Entity) -> Document:
    """The entity companion's document for ``entity``."""
    lines = [entity.name]
    if entity.aliases:
        lines.append("Also known as: " + ", ".join(entity.aliases))
    lines.append(f"Type: {entity.type}")
    if entity.description:
        lines.append(entity.description)
    return Document(
        id=entity.id, text="\n".join(lines), title=entity.name, source="knowledge graph",
        metadata={"entity_type": entity.type},
    )


def _naming(chunks: Sequence[_Chunk], names: Iterable[str]) -> list[str]:
    folded = [n.casefold() for n in names if n.strip()]
    return [c.chunk_id for c in chunks if any(n in c.folded for n in folded)]


def _bounded(value: int, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise KnowledgeError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


class KnowledgeGraph:
    """A knowledge graph per collection, constrained by an ontology, every fact
    traceable to the chunks that state it (see the module docstring).

    Writes to one collection's graph (a document's graph read back, merged and
    written; the entity companion updated) run one at a time in this process; model
    calls run outside that lock.
    """

    def __init__(
        self, store: GraphStore, knowledge: KnowledgeBase, settings: GraphSettings, gateway: ModelGateway | None = None
    ) -> None:
        """Args:
            store: the graph store (owned: `aclose` closes it).
            knowledge: the knowledge base holding the documents and the entity
                companions (not owned: the caller closes it).
            settings: extraction and retrieval settings.
            gateway: the model gateway; needed by `extract` only.
        """
        self.store = store
        self.knowledge = knowledge
        self.settings = settings
        self.gateway = gateway
        self.retriever = GraphRetriever(store, knowledge, settings.retrieval)
        self.on_search: SearchObserver | None = None
        """Told of every completed `retrieve`, with its number of facts (source
        ``graph``): the server counts facts per retrieval and retrievals that found
        none (no entity linked, or nothing around it)."""
        self._writing: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._calls: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _model_calls(self) -> asyncio.Semaphore:
        """The bound on extraction's model calls in flight, shared by every extraction
        of this graph (``extraction.concurrency`` is what the model server can take,
        not what one request may ask): one per event loop, as a semaphore is."""
        loop = asyncio.get_running_loop()
        if self._calls is None or self._calls[0] is not loop:
            self._calls = (loop, asyncio.Semaphore(self.settings.extraction.concurrency))
        return self._calls[1]

    @contextlib.asynccontextmanager
    async def _lock(self, collection: str) -> AsyncIterator[None]:
        # Dropped once nobody holds or waits for it: names come from clients.
        lock, users = self._writing.setdefault(collection, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._writing[collection]

    # ---- binding ---------------------------------------------------------------------------

    async def bind(self, collection: str, ontology: Ontology | None) -> Ontology:
        """The ontology of ``collection``'s graph: ``ontology`` bound to it (creating
        the graph the first time), or with None the one it is bound to.

        Raises:
            InvalidCollectionNameError: not a collection name.
            KnowledgeError: the name of an entity companion (``<collection>__entities``).
            OntologyRequiredError: None given and the collection has no graph.
            OntologyMismatchError: the graph is bound to another ontology.
        """
        self._check_name(collection)
        if ontology is None:
            bound = await self.store.ontology(collection)
            if bound is None:
                raise OntologyRequiredError(collection)
            return bound
        await self.store.bind(collection, ontology)
        return ontology

    @staticmethod
    def _check_name(collection: str) -> None:
        valid_collection_name(collection)
        if collection.endswith(ENTITIES_SUFFIX):
            raise KnowledgeError(
                f"collection {collection!r} is the entity companion of a knowledge graph, not a collection of documents"
            )

    async def _require_collection(self, collection: str) -> None:
        if not await self.knowledge.store.has_collection(collection):
            raise UnknownCollectionError(collection, [c.name for c in await self.knowledge.collections()])

    async def _require_graph(self, collection: str) -> Ontology:
        valid_collection_name(collection)
        ontology = await self.store.ontology(collection)
        if ontology is None:
            raise GraphNotFoundError(collection, await self.store.graphs())
        return ontology

    # ---- extraction ------------------------------------------------------------------------

    async def extract(
        self,
        collection: str,
        doc_ids: Sequence[str] | None = None,
        *,
        ontology: Ontology | None = None,
        progress: Callable[[int, int], None] | None = None,
        force: bool = False,
    ) -> GraphReport:
        """Extract the graph of the collection's documents with the model.

        Args:
            collection: a collection of the knowledge base.
            doc_ids: the documents to extract; None: all of them. An id the
                collection does not have is reported (``unknown_document``).
            ontology: bound to the collection first (see `bind`); None: the bound one.
            progress: called with (chunks done, chunks to do) after each chunk.
            force: extract documents whose graph is already up to date too.

        With ``doc_ids`` None the graph is also reconciled with the knowledge base:
        documents it holds that the knowledge base no longer has lose their facts
        (``removed``), which repairs a removal the knowledge base's hook could not do.

        Returns:
            The counts; chunks that failed and items that were dropped are in it, not raised.

        Raises:
            KnowledgeError: no model gateway.
            UnknownCollectionError: no such collection.
            OntologyRequiredError, OntologyMismatchError: see `bind`.
            UnknownModelError, CapabilityError: the extraction alias cannot answer
                under a JSON schema (before any chunk).
        """
        started = time.perf_counter()
        self._check_name(collection)
        if self.gateway is None:
            raise KnowledgeError("extraction needs the model gateway")
        await self._require_collection(collection)
        ontology = await self.bind(collection, ontology)
        extractor = Extractor(self.gateway, ontology, self.settings.extraction)
        extractor.check()
        tally = _Tally()
        stored_docs = await self.knowledge.store.documents(collection)
        graph_docs = await self.store.documents(collection)
        wanted = sorted(stored_docs) if doc_ids is None else list(dict.fromkeys(doc_ids))
        todo = []
        for doc_id in wanted:
            entry = stored_docs.get(doc_id)
            if entry is None:
                tally.problem(
                    Problem(where=f"document {doc_id}", reason="unknown_document", detail=f"no document {doc_id!r} in {collection!r}")
                )
            elif not force and graph_docs.get(doc_id) == entry.version:
                tally.skipped += 1
            else:
                todo.append(entry)
        if doc_ids is None:
            await self._remove_gone(collection, sorted(set(graph_docs) - set(stored_docs)), tally)
        total = sum(e.chunks for e in todo)
        done = 0
        semaphore = self._model_calls()

        async def one(chunk: _Chunk) -> ChunkExtraction:
            nonlocal done
            async with semaphore:
                result = await extractor.extract(chunk.chunk_id, chunk.text)
            done += 1
            if progress is not None:
                progress(done, total)
            return result

        async def document(entry: StoredDocument) -> None:
            read = await self._chunks(collection, entry.doc_id)
            if read is None:
                return  # deleted meanwhile
            live, chunks = read
            # A task group, not gather: when one chunk's work fails unexpectedly the
            # others' model calls are cancelled, not left running after we return.
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(c)) for c in chunks]
            except BaseExceptionGroup as failed:
                raise failed.exceptions[0]  # noqa: B904  (as itself: see below)
            results = [t.result() for t in tasks]
            tally.chunks += len(results)
            failed = sum(1 for r in results if r.failed)
            tally.failed_chunks += failed
            for result in results:
                for problem in result.problems:
                    tally.problem(problem)
            if failed == len(results):
                # Nothing came back (a model that is down): keep what the graph has.
                return
            version = live if not failed else PARTIAL_PREFIX + live
            async with self._lock(collection):
                current = await self.knowledge.store.document(collection, entry.doc_id)
                if current is None or current.version != live:
                    # Replaced or deleted while the model read it (the knowledge base
                    # already removed its facts): these would be stale.
                    log.info("graph extraction %s: %s changed while it was extracted; not written", collection, entry.doc_id)
                    return
                names = [n for r in results for e in r.entities for n in (e.name, *e.aliases)]
                stored = await self._stored_entities(collection, names)
                builder = DocumentGraphBuilder(
                    doc_id=entry.doc_id, content_hash=version, chunk_ids=[c.chunk_id for c in chunks], stored=stored
                )
                for result in results:
                    handles = {id(e): builder.add_entity(e, [result.chunk_id]) for e in result.entities}
                    for relation, source, target in result.relations:
                        builder.add_relation(relation.type, handles[id(source)], handles[id(target)], [result.chunk_id])
                graph = builder.build()
                await self.store.write_document(collection, graph)
                tally.written(graph)
                await self._update_companion(collection, [e.id for e in graph.entities])

        # Up to ``concurrency`` documents at once (and as many chunks in all), so that
        # one-chunk documents keep a server with several slots busy too; each document
        # is written as soon as its chunks are done.
        documents = asyncio.Semaphore(self.settings.extraction.concurrency)

        async def bounded(entry: StoredDocument) -> None:
            async with documents:
                await document(entry)

        try:
            async with asyncio.TaskGroup() as group:
                for entry in todo:
                    group.create_task(bounded(entry))
        except BaseExceptionGroup as failed:
            # The first failure as itself (a GraphStoreError stays a 503), as a run of
            # one document at a time would raise it; the other documents were cancelled.
            raise failed.exceptions[0]  # noqa: B904
        if tally.documents or tally.removed:
            async with self._lock(collection):
                await self._prune_companion(collection)
        report = tally.report(collection, ontology, started)
        log.info(
            "graph extraction %s: %d documents, %d skipped, %d chunks (%d failed), %d entities, %d relations, invalid %s",
            collection, report.documents, report.skipped, report.chunks, report.failed_chunks,
            sum(report.entities.values()), sum(report.relations.values()), report.invalid or "none",
        )
        return report

    async def _remove_gone(self, collection: str, doc_ids: Sequence[str], tally: _Tally) -> None:
        """Remove the facts of graph documents the knowledge base does not have (the
        companion is pruned by the caller)."""
        if not doc_ids:
            return
        async with self._lock(collection):
            for doc_id in doc_ids:
                # Checked again under the lock: one ingested (and extracted by another
                # request) since the listing is not gone.
                if await self.knowledge.store.document(collection, doc_id) is not None:
                    continue
                if await self.store.delete_document(collection, doc_id):
                    tally.removed += 1
                    log.info("graph %s: removed the facts of %s, which the knowledge base no longer has", collection, doc_id)

    async def _chunks(self, collection: str, doc_id: str) -> tuple[str, list[_Chunk]] | None:
        """The document's live version and its chunks in order, or None if it is gone."""
        export = await self.knowledge.store.export_document(collection, doc_id)
        if export is None:
            return None
        rows = sorted(export.chunks, key=lambda c: int(c.payload.get("index", 0)))
        return export.entry.version, [
            _Chunk(chunk_id=str(c.payload["chunk_id"]), text=str(c.payload.get("text", "")),
                   folded=str(c.payload.get("text", "")).casefold())
            for c in rows
        ]

    async def _stored_entities(self, collection: str, names: Sequence[str]) -> list[Entity]:
        unique = list(dict.fromkeys(names))
        if not unique:
            return []
        return await self.store.find_entities(collection, unique, limit=max(100, 4 * len(unique)))

    # ---- the entity companion ---------------------------------------------------------------

    async def _update_companion(self, collection: str, entity_ids: Sequence[str]) -> None:
        """Write the companion's point of each of these entities as the graph holds it
        now (unchanged ones are skipped by content hash)."""
        if not entity_ids:
            return
        entities = await self.store.entities(collection, list(entity_ids))
        if not entities:
            return
        companion = entities_collection(collection)
        report = await self.knowledge.ingest(companion, [_entity_document(e) for e in entities])
        if report.failed:
            # The graph is written; without these points the entities cannot be linked
            # by meaning (an import still reads the graph itself). Running again repairs it.
            reasons = "; ".join(sorted({e["reason"] for e in report.errors}))[:500]
            raise KnowledgeError(
                f"the knowledge graph of {collection!r} was written, but {report.failed} entities could not be added "
                f"to its entity companion {companion!r} ({reasons}); run the extraction or import again"
            )

    async def _companion_ids(self, collection: str) -> list[str]:
        companion = entities_collection(collection)
        if not await self.knowledge.store.has_collection(companion):
            return []
        return sorted(await self.knowledge.store.documents(companion))

    async def _prune_companion(self, collection: str) -> None:
        """Remove the companion's points of entities the graph no longer holds."""
        ids = await self._companion_ids(collection)
        if not ids:
            return
        alive = {e.id for e in await self.store.entities(collection, ids)}
        for gone in (i for i in ids if i not in alive):
            await self.knowledge.delete(entities_collection(collection), gone)

    # ---- curated facts ---------------------------------------------------------------------

    async def _document_graph(
        self, collection: str, doc_id: str, chunk_ids: Sequence[str]
    ) -> tuple[list[Entity], dict[str, list[str]], list[Relation]]:
        """What the graph holds from ``doc_id`` (`GraphStore.document_graph`), cut to
        its current chunks ``chunk_ids``: its entities, which of those chunks mention
        each, and its relations with those chunk ids. Read from the graph itself, not
        the entity companion, so an entity whose companion point is missing is not
        lost from the union an import writes."""
        graph = await self.store.document_graph(collection, doc_id)
        if graph is None:
            return [], {}, []
        own = set(chunk_ids)
        mine: dict[str, list[str]] = {}
        for mention in graph.mentions:
            if mention.chunk_id in own:
                mine.setdefault(mention.entity_id, []).append(mention.chunk_id)
        relations = [
            Relation(type=r.type, source=r.source, target=r.target, chunk_ids=tuple(c for c in r.chunk_ids if c in own))
            for r in graph.relations
        ]
        return (
            [e for e in graph.entities if e.id in mine],
            mine,
            [r for r in relations if r.chunk_ids and r.source in mine and r.target in mine],
        )

    async def import_facts(
        self, collection: str, lines: Iterable[str], *, ontology: Ontology | None = None, source: str = "<input>"
    ) -> GraphReport:
        """Import curated facts (JSON Lines, see `knowledge.extraction.curated`).

        Every line is checked; a line that fails is dropped and reported with its
        number, the others are written. Relation ends are looked up among the
        import's entities first, then the graph's. Each document named by a
        ``source`` gets the union of what it had in the graph and the imported facts.

        Args:
            collection: a collection of the knowledge base.
            lines: the file's lines.
            ontology: bound to the collection first; None: the bound one.
            source: the file's name, for the log.

        Raises:
            UnknownCollectionError: no such collection.
            OntologyRequiredError, OntologyMismatchError: see `bind`.
        """
        started = time.perf_counter()
        self._check_name(collection)
        await self._require_collection(collection)
        ontology = await self.bind(collection, ontology)
        tally = _Tally()
        parsed = parse_curated(lines, ontology)
        tally.chunks = parsed.lines
        for problem in parsed.problems:
            tally.problem(problem)
        stored_docs = await self.knowledge.store.documents(collection)

        def known(doc: str, where: str) -> bool:
            if doc in stored_docs:
                return True
            tally.problem(Problem(where=where, reason="unknown_document", detail=f"source {doc!r} is not a document of {collection!r}"))
            return False

        entities = [e for e in parsed.entities if known(e.source, e.item.where)]
        relations = [r for r in parsed.relations if known(r.source, r.item.where)]
        names = [n for e in entities for n in (e.item.name, *e.item.aliases)]
        names += [n for r in relations for n in (r.item.source, r.item.target)]
        stored = await self._stored_entities(collection, names)
        # Relation ends: the import's entities first, then the graph's.
        from_store = [_entity_item(e) for e in stored]
        known_entity = {id(item): entity for item, entity in zip(from_store, stored, strict=True)}
        candidates = [*(e.item for e in entities), *from_store]
        resolved = []
        for relation in relations:
            ends = resolve_ends(relation.item, candidates, ontology)
            if isinstance(ends, Problem):
                tally.problem(ends)
            else:
                resolved.append((relation, *ends))
        # The whole write phase under the collection's lock (no model calls here): the
        # documents' graphs read back are not changed by another writer meanwhile. A
        # document replaced or deleted meanwhile has its facts removed after this, by
        # the knowledge base's hook.
        written: set[str] = set()
        async with self._lock(collection):
            for doc_id in sorted({e.source for e in entities} | {r.source for r, _, _ in resolved}):
                read = await self._chunks(collection, doc_id)
                if read is None or not read[1]:
                    gone = (*(e.item for e in entities if e.source == doc_id), *(r.item for r, _, _ in resolved if r.source == doc_id))
                    for item in gone:
                        tally.problem(Problem(where=item.where, reason="unknown_document", detail=f"document {doc_id!r} is gone"))
                    continue
                # The facts are of the document's current version: an extraction
                # skips it from now on unless forced (which would replace them).
                version, chunks = read
                chunk_ids = [c.chunk_id for c in chunks]
                first = [chunk_ids[0]]
                old_entities, old_mentions, old_relations = await self._document_graph(collection, doc_id, chunk_ids)
                # Looked up now, not once before the loop: an entity an earlier
                # document of this import wrote (an alias it declared) is the graph's.
                doc_names = [n for e in entities if e.source == doc_id for n in (e.item.name, *e.item.aliases)]
                doc_names += [
                    n for r, a, b in resolved if r.source == doc_id for n in (a.name, *a.aliases, b.name, *b.aliases)
                ]
                now_stored = await self._stored_entities(collection, doc_names)
                builder = DocumentGraphBuilder(
                    doc_id=doc_id, content_hash=version, chunk_ids=chunk_ids, stored=[*now_stored, *old_entities]
                )
                handles = {e.id: builder.add_entity(_entity_item(e), old_mentions[e.id], known=e) for e in old_entities}
                for relation in old_relations:
                    if relation.source in handles and relation.target in handles:
                        builder.add_relation(relation.type, handles[relation.source], handles[relation.target], relation.chunk_ids)
                for curated in (e for e in entities if e.source == doc_id):
                    item = curated.item
                    builder.add_entity(item, _naming(chunks, (item.name, *item.aliases)) or first)
                for curated, subject, obj in (r for r in resolved if r[0].source == doc_id):
                    subject_names, object_names = (subject.name, *subject.aliases), (obj.name, *obj.aliases)
                    both = [c for c in _naming(chunks, subject_names) if c in set(_naming(chunks, object_names))]
                    stating = both or _naming(chunks, (*subject_names, *object_names)) or first
                    source_handle = builder.add_entity(subject, stating, known=known_entity.get(id(subject)))
                    target_handle = builder.add_entity(obj, stating, known=known_entity.get(id(obj)))
                    builder.add_relation(curated.item.type, source_handle, target_handle, stating)
                graph = builder.build()
                await self.store.write_document(collection, graph)
                tally.written(graph)
                written.update(e.id for e in graph.entities)
            await self._update_companion(collection, sorted(written))
        # In file order, whichever step found them.
        tally.problems.sort(key=lambda p: int(p.where.removeprefix("line ")) if p.where.startswith("line ") else 0)
        report = tally.report(collection, ontology, started)
        log.info(
            "graph import %s from %s: %d lines, %d documents, %d entities, %d relations, invalid %s",
            collection, source, report.chunks, report.documents, sum(report.entities.values()),
            sum(report.relations.values()), report.invalid or "none",
        )
        return report

    # ---- documents leaving -----------------------------------------------------------------

    async def delete_document(self, collection: str, doc_id: str) -> None:
        """Remove what ``doc_id`` contributed to ``collection``'s graph (facts other
        documents state stay) and the companion points of entities that went with it.
        Nothing happens for a collection with no graph or an entity companion, so the
        knowledge base may call it for every document it replaces or deletes."""
        if collection.endswith(ENTITIES_SUFFIX) or await self.store.ontology(collection) is None:
            return
        async with self._lock(collection):
            if await self.store.delete_document(collection, doc_id):
                await self._prune_companion(collection)

    # ---- reading ---------------------------------------------------------------------------

    async def neighbors(
        self, collection: str, name: str, *, hops: int | None = None, fanout: int | None = None, limit: int = 50
    ) -> NeighborsResult:
        """The facts within ``hops`` of the entities named ``name`` (by name or alias;
        when none is, by meaning through the entity companion).

        Raises:
            KnowledgeError: an empty name, or hops/fanout/limit out of range.
            GraphNotFoundError: the collection has no graph.
        """
        if not name.strip():
            raise KnowledgeError("the entity name is empty")
        retrieval = self.settings.retrieval
        hops = _bounded(retrieval.hops if hops is None else hops, "hops", 1, MAX_HOPS)
        fanout = _bounded(retrieval.fanout if fanout is None else fanout, "fanout", 1, MAX_FANOUT)
        limit = _bounded(limit, "limit", 1, MAX_LIMIT)
        await self._require_graph(collection)
        matched = await self.store.find_entities(collection, [name], limit=20)
        if not matched:
            matched = [e for e, _ in await self.retriever.by_meaning(collection, name)]
        facts = await self.store.neighbors(collection, [e.id for e in matched], hops=hops, fanout=fanout, limit=limit) if matched else []
        return NeighborsResult(collection=collection, matched=tuple(matched), facts=tuple(facts))

    async def retrieve(
        self, collection: str, question: str, *, max_facts: int | None = None, hops: int | None = None
    ) -> GraphRetrieval:
        """The facts that answer ``question`` best, with their source chunks (see
        `knowledge.retrieval.graph`).

        Raises:
            KnowledgeError: an empty question, or max_facts/hops out of range.
            GraphNotFoundError: the collection has no graph.
        """
        if not question.strip():
            raise KnowledgeError("the question is empty")
        retrieval = self.settings.retrieval
        max_facts = _bounded(retrieval.max_facts if max_facts is None else max_facts, "max_facts", 1, MAX_FACTS)
        hops = _bounded(retrieval.hops if hops is None else hops, "hops", 1, MAX_HOPS)
        await self._require_graph(collection)
        found = await self.retriever.retrieve(collection, question, max_facts=max_facts, hops=hops, fanout=retrieval.fanout)
        report_search(self.on_search, collection, "graph", len(found.facts))
        return found

    async def stats(self, collection: str) -> GraphStats:
        """Counts per type.

        Raises:
            GraphNotFoundError: the collection has no graph.
        """
        valid_collection_name(collection)
        return await self.store.stats(collection)

    async def graphs(self) -> list[str]:
        """The collections that have a graph, sorted."""
        return await self.store.graphs()

    async def aclose(self) -> None:
        """Close the graph store (the knowledge base is the caller's)."""
        if self.knowledge.on_removed == self.delete_document:
            self.knowledge.on_removed = None
        await self.store.aclose()

    def close_now(self) -> None:
        """Release the store from synchronous code (a failed start-up)."""
        closer = getattr(self.store, "close_now", None)
        if closer is not None:
            closer()


def open_graph_store(settings: GraphSettings, data_dir: Path) -> GraphStore:
    """The configured graph store: Neo4j when ``neo4j_url`` is set, else LadybugDB in
    ``path`` (default ``<data_dir>/graph``).

    Raises:
        StoreLockedError: the embedded store's directory is in use by another process.
    """
    if settings.neo4j_url:
        from knowledge.graphstore.neo4j import Neo4jStore  # the driver is imported only when configured

        return Neo4jStore(
            settings.neo4j_url,
            user=settings.neo4j_user,
            password=settings.neo4j_password,
            database=settings.neo4j_database,
            timeout_s=settings.timeout_s,
        )
    return LadybugStore(settings.path or data_dir / "graph", timeout_s=settings.timeout_s)


def open_knowledge_graph(
    settings: KnowledgeSettings, data_dir: Path, knowledge: KnowledgeBase, gateway: ModelGateway | None = None
) -> KnowledgeGraph:
    """Open the graph store and build the `KnowledgeGraph` over ``knowledge``; the
    knowledge base then tells it when a document is replaced or deleted
    (`KnowledgeBase.on_removed`), so the facts only that document supported go.

    Raises:
        StoreLockedError: the embedded graph store is in use by another process.
    """
    graph = KnowledgeGraph(open_graph_store(settings.graph, data_dir), knowledge, settings.graph, gateway)
    knowledge.on_removed = graph.delete_document
    return graph
