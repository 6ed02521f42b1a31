"""`GraphStore` on a Neo4j server through the official async driver
(`neo4j.AsyncGraphDatabase`), over Bolt: the production graph store.

One Neo4j database holds the graphs of many collections. Every node has a
``collection`` property, and ids are unique per collection:

- ``(:Entity:<Type> {collection, id, name, aliases, keys, description, <properties>})``,
  the type label from the ontology;
- ``(:Chunk {collection, id, doc_id})-[:MENTIONS]->(:Entity)``;
- ``(:Entity)-[:<RELATION_TYPE> {chunk_ids}]->(:Entity)``;
- ``(:Document_ {collection, doc_id, hash})`` and ``(:Ontology_ {collection, name,
  fingerprint, text})``, the binding.

Every statement is a parameterised constant of `knowledge.graphstore.queries`;
upserts are batched (``UNWIND $rows AS row MERGE ...``); the only names formatted
into Cypher are labels and relationship types of a validated ontology.

**Servers.** The store checks what it talks to before its first call
(``CALL dbms.components()``, which only Neo4j answers: FalkorDB's Bolt endpoint says
``Neo4j/5.13.0`` in its agent string, so the agent string cannot tell them apart):

- Neo4j: uniqueness constraints on the store's keys and per entity type of each bound
  ontology (``IF NOT EXISTS``), managed transactions (retried on transient errors,
  rolled back on failure), concurrent sessions from the driver's pool.
- Any other Bolt server (FalkorDB, which the contract tests run against): no Cypher
  constraints (range indexes on the same keys instead, created when missing), no
  ``IF NOT EXISTS``, and no rollback: a transaction's statements apply as they run.
  So the store takes everything a write could fail on out of the transaction (the
  ontology check and the entity merging happen first, in Python), and makes every
  call, reads included, wait its turn on one session: a reader never sees a
  half-written document, and the driver keeps one connection open for the store's
  life (FalkorDB 4.18 leaves the first new connection after a client's disconnect
  unanswered, and once stopped answering after several busy connections). FalkorDB
  also routes auto-commit queries and transactions to different graphs when a
  database name is given, so ``database`` is ignored there (its default graph).
  And it splices parameters into the query text: strings are escaped for it
  (`_FalkorDBTx`), and a string with a NUL is refused (a ValueError) before anything
  is written.

**Cancellation.** Like every graph store, a call whose caller is cancelled finishes
its transaction first (`_finish`): a cancelled `write_document` has committed (or,
on Neo4j, rolled back on an error) before the cancellation passes on, and on a
server without rollback nothing is ever left half done by a cancellation.

**Concurrency.** Writes to one collection wait for each other in this process
(merging an entity's aliases reads the stored entity first). Two processes writing
the same entity at once can lose one's alias (the entity itself stays unique).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import neo4j
from neo4j.exceptions import ConfigurationError, DriverError, Neo4jError

from knowledge.errors import GraphNotFoundError, GraphStoreError, KnowledgeError, OntologyMismatchError, OntologyViolationError
from knowledge.graphstore import queries as q
from knowledge.graphstore._common import (
    Edge,
    assemble_document,
    check_document,
    check_expansion,
    entity_from_record,
    expand_hop,
    fact_order,
    merge_entity,
    ontology_from_text,
    ontology_text,
    unique,
)
from knowledge.graphstore.base import DocumentGraph, Entity, Fact, GraphStats, PropertyValue
from knowledge.ontology import Ontology, normalise_name
from knowledge.vectorstore.base import valid_collection_name

__all__ = ["Neo4jStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DROP_BATCH = 5000

_OWN_LABELS = ("Entity", "Chunk", "Document_")


class Neo4jStore:
    """Knowledge graphs in one Neo4j database, one per collection.

    Args:
        url: ``neo4j://host:7687`` or ``bolt://host:7687``.
        user: the user (empty for a server without authentication).
        password: its password.
        database: the Neo4j database; None: the server's default (ignored on
            servers other than Neo4j, see the module docstring).
        timeout_s: limit for each call: the transaction timeout the server
            enforces, the driver's connection timeouts, and the wait for a turn.

    Raises:
        GraphStoreError: a URL the driver cannot use, or one with credentials in it
            (they go in ``user`` and ``password``).
    """

    def __init__(
        self, url: str, *, user: str, password: str | None, database: str | None = None, timeout_s: float = 30.0
    ) -> None:
        parts = urlsplit(url)
        # Credentials in the URL stay out of messages.
        self.location = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
        self._timeout = timeout_s
        self._database = database
        if "@" in parts.netloc:
            raise GraphStoreError(
                f"the Neo4j URL {self.location} has credentials in it: give them as the user and password "
                "(knowledge.graph.neo4j_user, neo4j_password) instead"
            )
        try:
            self._driver = neo4j.AsyncGraphDatabase.driver(
                url,
                auth=(user, password or ""),
                connection_timeout=timeout_s,
                connection_acquisition_timeout=timeout_s,
                max_transaction_retry_time=timeout_s,
            )
        except (ConfigurationError, ValueError) as exc:
            raise GraphStoreError(f"the Neo4j URL {self.location} is not usable: {exc}") from exc
        self._probe_lock = asyncio.Lock()
        self._is_neo4j: bool | None = None
        self._one: asyncio.Lock | None = None
        """Held for every call on a server without transactions worth the name."""
        self._ontologies: dict[str, Ontology] = {}
        self._schema_done: set[str] = set()
        self._write_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._closed = False
        self._closing: asyncio.Task[None] | None = None

    # ---- the server --------------------------------------------------------------------

    async def _probe(self) -> bool:
        """Whether the server is Neo4j (constraints, rollback); checked once."""
        if self._is_neo4j is not None:
            return self._is_neo4j
        async with self._probe_lock:
            if self._is_neo4j is None:
                is_neo4j = await self._components()
                if is_neo4j:
                    await self._auto(q.NEO4J_CONSTRAINTS)
                else:
                    if self._database is not None:
                        log.warning("graph store at %s is not Neo4j: the database %r is ignored", self.location, self._database)
                    self._one = asyncio.Lock()
                    await self._falkordb_indexes({"Entity": ("collection", "id"), "Chunk": ("collection", "id", "doc_id")})
                self._is_neo4j = is_neo4j
        return bool(self._is_neo4j)

    async def _components(self) -> bool:
        try:
            async with self._driver.session(database=self._database) as session:
                rows = await (await session.run(q.NEO4J_COMPONENTS)).data()
            return bool(rows) and str(rows[0].get("name", "")).startswith("Neo4j")
        except Neo4jError:
            return False  # the server has no dbms.components(): not Neo4j
        except (DriverError, OSError) as exc:
            raise GraphStoreError(f"graph store at {self.location}: {exc}") from exc

    def _session(self) -> neo4j.AsyncSession:
        database = self._database if self._one is None else None
        return self._driver.session(database=database)

    async def _auto(self, statements: Sequence[str]) -> None:
        """Schema statements, each in its own auto-commit transaction."""
        async with self._turn():
            try:
                async with self._session() as session:
                    for statement in statements:
                        await (await session.run(statement)).consume()  # type: ignore[arg-type]
            except (Neo4jError, DriverError, OSError) as exc:
                raise GraphStoreError(f"graph store at {self.location}: {exc}") from exc

    async def _falkordb_indexes(self, wanted: Mapping[str, Sequence[str]]) -> None:
        """Range indexes FalkorDB lacks (it refuses to create one that exists)."""
        async with self._turn():
            try:
                async with self._session() as session:
                    have: dict[str, set[str]] = {}
                    for row in await (await session.run(q.FALKORDB_INDEXES)).data():
                        have.setdefault(str(row["label"]), set()).update(row["properties"] or ())
                    for name, properties in wanted.items():
                        missing = [p for p in properties if p not in have.get(name, set())]
                        if missing:
                            statement = q.FALKORDB_INDEX.format(label=q.label(name), properties=", n.".join(missing))
                            await (await session.run(statement)).consume()  # type: ignore[arg-type]
            except (Neo4jError, DriverError, OSError) as exc:
                raise GraphStoreError(f"graph store at {self.location}: creating indexes: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """On a server other than Neo4j: wait for the one session's turn."""
        if self._one is None:
            yield
            return
        async with asyncio.timeout(self._timeout):
            await self._one.acquire()
        try:
            yield
        finally:
            self._one.release()

    async def _ensure_schema(self, ontology: Ontology) -> None:
        """The indexes (Neo4j: uniqueness constraints) of the ontology's entity types."""
        if ontology.fingerprint in self._schema_done:
            return
        if await self._probe():
            await self._auto(
                [q.NEO4J_TYPE_CONSTRAINT.format(name=f"switchyard_{t}_key", label=q.label(t)) for t in sorted(ontology.entity_types)]
            )
        else:
            await self._falkordb_indexes({t: ("collection", "id") for t in sorted(ontology.entity_types)})
        self._schema_done.add(ontology.fingerprint)

    # ---- running transactions ------------------------------------------------------------

    async def _run(self, fn: Callable[[_Tx], Awaitable[T]], *, write: bool) -> T:
        """``fn`` in a managed transaction, finished even if the caller is cancelled."""
        if self._closed:
            raise GraphStoreError(f"the graph store at {self.location} is closed")
        await self._probe()

        @neo4j.unit_of_work(timeout=self._timeout)
        async def work(tx: neo4j.AsyncManagedTransaction) -> T:
            # FalkorDB splices parameters into the query text (see `_FalkorDBTx`).
            return await fn(tx if self._one is None else _FalkorDBTx(tx))

        async def run() -> T:
            async with self._turn(), self._session() as session:
                if write:
                    return await session.execute_write(work)
                return await session.execute_read(work)

        try:
            return await _finish(run())
        except TimeoutError as exc:
            raise GraphStoreError(f"graph store at {self.location}: busy for more than {self._timeout:g} s") from exc
        except (Neo4jError, DriverError, OSError) as exc:
            raise GraphStoreError(f"graph store at {self.location}: {exc}") from exc

    # ---- collections -------------------------------------------------------------------------

    async def _bound(self, collection: str) -> Ontology | None:
        valid_collection_name(collection)
        cached = self._ontologies.get(collection)
        if cached is not None:
            return cached

        async def read(tx: _Tx) -> str | None:
            record = await (await tx.run(q.GET_ONTOLOGY, collection=collection)).single()
            return None if record is None else str(record["text"])

        text = await self._run(read, write=False)
        if text is None:
            return None
        ontology = ontology_from_text(text)
        self._ontologies[collection] = ontology
        return ontology

    async def _require(self, collection: str) -> Ontology:
        ontology = await self._bound(collection)
        if ontology is None:
            raise GraphNotFoundError(collection, await self.graphs())
        return ontology

    async def bind(self, collection: str, ontology: Ontology) -> None:
        """Bind ``collection``'s graph to ``ontology`` (creating the indexes or
        constraints of its entity types).

        Raises:
            OntologyMismatchError: the graph is bound to another ontology.
        """
        valid_collection_name(collection)
        await self._ensure_schema(ontology)
        params = {"collection": collection, "name": ontology.name, "fingerprint": ontology.fingerprint, "text": ontology_text(ontology)}

        async def bind(tx: _Tx) -> str:
            record = await (await tx.run(q.BIND_ONTOLOGY, params)).single()
            assert record is not None
            return str(record["text"])

        bound = ontology_from_text(await self._run(bind, write=True))
        if bound.fingerprint != ontology.fingerprint:
            raise OntologyMismatchError(collection, bound.describe(), ontology.describe())
        self._ontologies[collection] = bound

    async def ontology(self, collection: str) -> Ontology | None:
        return await self._bound(collection)

    async def graphs(self) -> list[str]:
        async def read(tx: _Tx) -> list[str]:
            return [str(r["collection"]) for r in await (await tx.run(q.GRAPHS)).data()]

        return await self._run(read, write=False)

    async def drop(self, collection: str) -> bool:
        valid_collection_name(collection)
        async with self._write_lock(collection):
            self._ontologies.pop(collection, None)
            for own in _OWN_LABELS:
                statement = q.DROP_BATCH.format(label=q.label(own))

                async def batch(tx: _Tx, statement: str = statement) -> int:
                    record = await (await tx.run(statement, collection=collection, batch=_DROP_BATCH)).single()
                    return int(record["deleted"]) if record else 0

                # Batches in transactions of their own: a big graph does not need one huge
                # transaction. The binding goes last, so a drop cut short can be repeated.
                while await self._run(batch, write=True) == _DROP_BATCH:
                    pass

            async def unbind(tx: _Tx) -> int:
                record = await (await tx.run(q.DROP_ONTOLOGY, collection=collection)).single()
                return int(record["deleted"]) if record else 0

            return await self._run(unbind, write=True) > 0

    async def aclose(self) -> None:
        if self._closed:
            if self._closing is not None:
                await self._closing
            return
        self._closed = True
        await self._driver.close()

    def close_now(self) -> None:
        """Close the store from synchronous code (after a failed start-up). The driver
        connects lazily, so at start-up it usually holds no connection; its close is
        scheduled on the running event loop if there is one, else run to the end here."""
        if self._closed:
            return
        self._closed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                asyncio.run(self._driver.close())
            except Exception:  # a socket that will not close cleanly is closed anyway
                log.exception("closing the graph store at %s", self.location)
            return
        self._closing = loop.create_task(self._driver.close())

    @contextlib.asynccontextmanager
    async def _write_lock(self, collection: str) -> AsyncIterator[None]:
        """One writer per collection in this process; the lock is dropped once nobody
        holds or waits for it (collection names come from clients: no entry may
        outlive them)."""
        lock, users = self._write_locks.setdefault(collection, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._write_locks[collection]

    # ---- documents -------------------------------------------------------------------------------

    async def documents(self, collection: str) -> dict[str, str]:
        await self._require(collection)

        async def read(tx: _Tx) -> dict[str, str]:
            rows = await (await tx.run(q.DOCUMENTS, collection=collection)).data()
            return {str(r["doc_id"]): str(r["hash"]) for r in rows}

        return await self._run(read, write=False)

    async def write_document(self, collection: str, graph: DocumentGraph) -> None:
        """Replace what ``graph.doc_id`` contributes, in one transaction.

        Raises:
            GraphNotFoundError: the collection has no graph.
            OntologyViolationError: something the bound ontology does not allow;
                nothing was written.
            ValueError: ``graph`` contradicts itself (see `check_document`).
        """
        ontology = await self._require(collection)
        reasons, properties = check_document(ontology, graph)
        if reasons:
            raise OntologyViolationError(collection, reasons)
        if self._one is not None:
            # Refused before the first statement: FalkorDB has no rollback.
            _falkordb_value(dataclasses.asdict(graph))

        async def write(tx: _Tx) -> None:
            await _write(tx, collection, ontology, graph, properties)

        async with self._write_lock(collection):
            await self._run(write, write=True)

    async def delete_document(self, collection: str, doc_id: str) -> bool:
        await self._require(collection)

        async def delete(tx: _Tx) -> bool:
            record = await (await tx.run(q.DOCUMENT_EXISTS, collection=collection, doc_id=doc_id)).single()
            existed = bool(record and record["n"])
            removed, mentioned = await _remove_document(tx, collection, doc_id)
            if mentioned:
                await _consume(tx, q.COLLECT_ENTITIES, collection=collection, ids=sorted(mentioned))
            await _consume(tx, q.DELETE_DOCUMENT_RECORD, collection=collection, doc_id=doc_id)
            return existed or removed

        async with self._write_lock(collection):
            return await self._run(delete, write=True)

    async def document_graph(self, collection: str, doc_id: str) -> DocumentGraph | None:
        """What ``doc_id`` contributes now (see `GraphStore.document_graph`), read in
        one transaction."""
        ontology = await self._require(collection)

        async def read(tx: _Tx) -> DocumentGraph | None:
            record = await (await tx.run(q.DOCUMENT_HASH, collection=collection, doc_id=doc_id)).single()
            chunks = [str(r["id"]) for r in await (await tx.run(q.CHUNKS_OF_DOCUMENT, collection=collection, doc_id=doc_id)).data()]
            mentions = [
                (str(r["chunk"]), str(r["entity"]))
                for r in await (await tx.run(q.DOCUMENT_MENTIONS, collection=collection, doc_id=doc_id)).data()
            ]
            relations = [
                (str(r["type"]), str(r["source"]), str(r["target"]), [str(c) for c in r["chunk_ids"] or ()])
                for r in await (await tx.run(q.DOCUMENT_RELATIONS, collection=collection, doc_id=doc_id)).data()
            ]
            ids = sorted({e for _, e in mentions})
            entities = await _load_entities(tx, collection, ontology, ids) if ids else {}
            content_hash = None if record is None or record["hash"] is None else str(record["hash"])
            return assemble_document(doc_id, content_hash, chunks, mentions, relations, entities)

        return await self._run(read, write=False)

    # ---- reading ------------------------------------------------------------------------------------

    async def entities(self, collection: str, ids: Sequence[str]) -> list[Entity]:
        ontology = await self._require(collection)
        wanted = unique(ids)
        if not wanted:
            return []

        async def read(tx: _Tx) -> dict[str, Entity]:
            return await _load_entities(tx, collection, ontology, wanted)

        found = await self._run(read, write=False)
        return [found[i] for i in wanted if i in found]

    async def find_entities(self, collection: str, names: Sequence[str], *, limit: int = 50) -> list[Entity]:
        """Entities whose ``keys`` hold a normalised form of one of ``names``, ordered
        by type, name and id, at most ``limit``."""
        ontology = await self._require(collection)
        keys = unique([k for k in (normalise_name(n) for n in names) if k])
        if self._one is not None:
            # FalkorDB cannot hold a NUL (see `_FalkorDBTx`), so no name there has one.
            keys = [k for k in keys if "\x00" not in k]
        if not keys or limit < 1:
            return []

        async def read(tx: _Tx) -> list[Entity]:
            rows = await (await tx.run(q.FIND_ENTITIES, collection=collection, keys=keys)).data()
            return [_entity(r["node"], r["labels"], ontology) for r in rows]

        found = {e.id: e for e in await self._run(read, write=False)}
        return sorted(found.values(), key=lambda e: (e.type, e.name, e.id))[:limit]

    async def neighbors(
        self, collection: str, seeds: Sequence[str], *, hops: int = 2, fanout: int = 20, limit: int = 100
    ) -> list[Fact]:
        check_expansion(hops, fanout, limit)
        ontology = await self._require(collection)
        if not ontology.relation_types or not seeds:
            return []

        async def expand(tx: _Tx) -> list[Fact]:
            frontier = unique(seeds)
            visited = set(frontier)
            seen: set[tuple[str, str, str]] = set()
            facts: list[Fact] = []
            for hop in range(1, hops + 1):
                # Per entity, the fanout plus the relations already taken (which
                # `expand_hop` skips) is all a hop can use.
                edges = await _edges(tx, collection, ontology, frontier, fanout + len(seen))
                found, frontier = expand_hop(frontier, edges, hop=hop, fanout=fanout, seen=seen, visited=visited)
                facts.extend(found)
                if not frontier or len(facts) >= limit:
                    break
            return facts

        facts = await self._run(expand, write=False)
        facts.sort(key=fact_order)
        return facts[:limit]

    async def mentions(self, collection: str, entity_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        await self._require(collection)
        ids = unique(entity_ids)
        if not ids:
            return {}

        async def read(tx: _Tx) -> list[dict[str, Any]]:
            return await (await tx.run(q.MENTIONS, collection=collection, ids=ids)).data()

        found: dict[str, set[str]] = {}
        for row in await self._run(read, write=False):
            found.setdefault(str(row["entity"]), set()).add(str(row["chunk"]))
        return {i: tuple(sorted(found[i])) for i in ids if i in found}

    async def stats(self, collection: str) -> GraphStats:
        ontology = await self._require(collection)

        async def read(tx: _Tx) -> GraphStats:
            async def one(statement: str) -> int:
                record = await (await tx.run(statement, collection=collection)).single()
                return int(record["n"]) if record else 0

            entities = dict.fromkeys(sorted(ontology.entity_types), 0)
            for row in await (await tx.run(q.COUNT_ENTITIES, collection=collection)).data():
                entities[_type_of(row["labels"])] = int(row["n"])
            relations = dict.fromkeys(sorted(ontology.relation_types), 0)
            for row in await (await tx.run(q.COUNT_RELATIONS, collection=collection)).data():
                relations[str(row["type"])] = int(row["n"])
            return GraphStats(
                ontology=ontology.describe(),
                documents=await one(q.COUNT_DOCUMENTS),
                chunks=await one(q.COUNT_CHUNKS),
                entities=entities,
                relations=relations,
            )

        return await self._run(read, write=False)


# ---- transaction bodies --------------------------------------------------------------------------


class _Tx(Protocol):
    """What the transaction bodies use of a transaction."""

    async def run(self, query: Any, parameters: Mapping[str, Any] | None = None, **kwargs: Any) -> neo4j.AsyncResult: ...


class _FalkorDBTx:
    """A transaction on FalkorDB whose string parameters survive its Bolt endpoint.

    FalkorDB 4.18 does not keep Bolt parameters apart from the query: it writes them
    into a ``CYPHER name='value' ...`` prefix of the query text between single quotes
    without escaping them, and its parser then reads backslash escapes in them
    (measured through the ``neo4j`` driver: ``it's`` and ``end\\`` fail with
    ``Neo.DatabaseError.General.UnknownError``, ``\\'`` arrives as ``'``; double quotes,
    newlines and non-ASCII text arrive intact; a NUL cuts the string). Unescaped, a
    value could end its quote and add Cypher of its own. So every string (in lists
    and maps too) goes with its backslashes and single quotes escaped, which the
    parser undoes; a NUL is refused (`_falkordb_value`). Neo4j gets parameters as
    they are."""

    def __init__(self, tx: neo4j.AsyncManagedTransaction) -> None:
        self._tx = tx

    async def run(self, query: Any, parameters: Mapping[str, Any] | None = None, **kwargs: Any) -> neo4j.AsyncResult:
        params = {**(parameters or {}), **kwargs}
        return await self._tx.run(query, {k: _falkordb_value(v) for k, v in params.items()})


def _falkordb_value(value: Any) -> Any:
    """``value`` with every string escaped for FalkorDB's parameter splicing.

    Raises:
        ValueError: a string holds a NUL, which FalkorDB would cut it at.
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"a NUL character in {value[:80]!r}: FalkorDB cannot hold it (it cuts the string there)")
        return value.replace("\\", "\\\\").replace("'", "\\'")
    if isinstance(value, Mapping):
        return {k: _falkordb_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_falkordb_value(v) for v in value]
    return value



async def _consume(tx: _Tx, statement: str, **params: Any) -> None:
    await (await tx.run(statement, params)).consume()  # type: ignore[arg-type]


def _type_of(labels: Sequence[str]) -> str:
    return next((str(label) for label in labels if label != "Entity"), "Entity")


def _entity(node: Any, labels: Sequence[str], ontology: Ontology) -> Entity:
    return entity_from_record(dict(node), _type_of(labels), ontology)


async def _load_entities(tx: _Tx, collection: str, ontology: Ontology, ids: list[str]) -> dict[str, Entity]:
    rows = await (await tx.run(q.LOAD_ENTITIES, collection=collection, ids=ids)).data()
    return {e.id: e for e in (_entity(r["node"], r["labels"], ontology) for r in rows)}


async def _edges(tx: _Tx, collection: str, ontology: Ontology, ids: list[str], cap: int) -> list[Edge]:
    """The relations touching ``ids``, at most ``cap`` per entity (in `expand_hop`'s order)."""
    if not ids:
        return []
    edges = []
    for row in await (await tx.run(q.EDGES, collection=collection, ids=ids, cap=cap)).data():
        a = _entity(row["a"], row["a_labels"], ontology)
        b = _entity(row["b"], row["b_labels"], ontology)
        source, target = (a, b) if row["outgoing"] else (b, a)
        edges.append(Edge(source, str(row["type"]), target, tuple(row["chunk_ids"] or ())))
    return edges


async def _remove_document(tx: _Tx, collection: str, doc_id: str) -> tuple[bool, set[str]]:
    """Take the document's chunks out of the graph (see `LadybugStore`'s twin)."""
    rows = await (await tx.run(q.CHUNKS_OF_DOCUMENT, collection=collection, doc_id=doc_id)).data()
    old = sorted(str(r["id"]) for r in rows)
    if not old:
        return False, set()
    mentioned = {str(r["id"]) for r in await (await tx.run(q.MENTIONED_BY_DOCUMENT, collection=collection, doc_id=doc_id)).data()}
    await _consume(tx, q.UNSUPPORT_DOCUMENT, collection=collection, doc_id=doc_id, chunk_ids=old)
    await _consume(tx, q.DELETE_CHUNKS, collection=collection, doc_id=doc_id)
    return True, mentioned


async def _write(
    tx: _Tx,
    collection: str,
    ontology: Ontology,
    doc: DocumentGraph,
    properties: Mapping[str, Mapping[str, PropertyValue]],
) -> None:
    record = await (await tx.run(q.GET_ONTOLOGY, collection=collection)).single()
    if record is None or ontology_from_text(str(record["text"])).fingerprint != ontology.fingerprint:
        # Dropped (or dropped and bound again) by another process since we looked.
        raise GraphNotFoundError(collection, [])
    ids = unique([e.id for e in doc.entities])
    stored = await _load_entities(tx, collection, ontology, ids) if ids else {}
    merged: dict[str, Entity] = {}
    for given in doc.entities:
        merged[given.id] = merge_entity(merged.get(given.id) or stored.get(given.id), given, properties.get(given.id, {}))
    _, mentioned = await _remove_document(tx, collection, doc.doc_id)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for entity in merged.values():
        declared = ontology.entity_types[entity.type].properties
        by_type.setdefault(entity.type, []).append(
            {
                "id": entity.id,
                "name": entity.name,
                "aliases": list(entity.aliases),
                "keys": list(entity.keys),
                "description": entity.description,
                "properties": {p: entity.properties.get(p) for p in sorted(declared)},
            }
        )
    for entity_type, rows in sorted(by_type.items()):
        await _consume(tx, q.merge_entities(entity_type), collection=collection, rows=rows)
    if doc.chunk_ids:
        await _consume(tx, q.MERGE_CHUNKS, collection=collection, rows=[{"id": c, "doc_id": doc.doc_id} for c in unique(doc.chunk_ids)])
    if doc.mentions:
        rows = [{"chunk": m.chunk_id, "entity": m.entity_id} for m in dict.fromkeys(doc.mentions)]
        await _consume(tx, q.MERGE_MENTIONS, collection=collection, rows=rows)
    relations: dict[str, dict[tuple[str, str], list[str]]] = {}
    for relation in doc.relations:
        chunk_ids = relations.setdefault(relation.type, {}).setdefault((relation.source, relation.target), [])
        chunk_ids.extend(c for c in relation.chunk_ids if c not in chunk_ids)
    for relation_type, pairs in sorted(relations.items()):
        rows = [{"source": s, "target": t, "chunk_ids": c} for (s, t), c in pairs.items()]
        await _consume(tx, q.merge_relations(relation_type), collection=collection, rows=rows)
    gone = sorted(mentioned - set(merged))
    if gone:
        await _consume(tx, q.COLLECT_ENTITIES, collection=collection, ids=gone)
    await _consume(tx, q.UPSERT_DOCUMENT, collection=collection, doc_id=doc.doc_id, hash=doc.content_hash)


async def _finish(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even when the caller is cancelled (then the
    cancellation passes on): a transaction is never abandoned half way, which on a
    server without rollback would leave half a document."""
    running = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        while not running.done():
            try:
                await asyncio.shield(running)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        raise
    except KnowledgeError:
        raise
