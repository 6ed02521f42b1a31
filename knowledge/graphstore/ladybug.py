"""`GraphStore` on LadybugDB (``ladybug``, the maintained fork of Kùzu): an embedded
graph database in this process, the default when no Neo4j server is configured.

Layout of the store's directory (``<data_dir>/graph``)::

    .lock                 held (flock) by the process that has the store open
    <collection>/graph.lbug   one LadybugDB database per collection (and its .wal)

LadybugDB is schema first, so binding a collection to an ontology creates its tables:

- a node table per entity type: ``id`` (primary key), ``name``, ``aliases STRING[]``,
  ``keys STRING[]`` (normalised name and aliases), ``description`` and one typed column
  per property the ontology declares (string, INT64, DOUBLE, BOOLEAN);
- ``Chunk(id, doc_id)``, ``Document_(doc_id, hash)`` (what was written, for skipping
  unchanged documents) and ``Ontology_(name, fingerprint, text)`` (the bound ontology,
  so the binding lives and dies with the graph);
- a relationship table per relation type with every (FROM, TO) pair the ontology
  allows, carrying ``chunk_ids STRING[]``; ``MENTIONS`` from ``Chunk`` to every entity
  type.

A collection's database is built in a hidden directory and renamed into place, so a
crash leaves a whole graph or none.

**Threads.** The engine releases the GIL while it runs a query; its calls run on
worker threads (`asyncio.to_thread`). Each database has one connection and a lock,
so calls on one collection run one at a time (a write transaction and the reads
that would see it never interleave on the connection); collections are independent.
A call that is cancelled (a client gone, a timeout) finishes on its thread before
the cancellation passes on: a `write_document` either commits or rolls back as a
whole, never half. Every query is also bounded by the engine's query timeout
(``timeout_s``), so a runaway query ends as `GraphStoreError`.

**Dialect.** LadybugDB has no ``SET n += map``, no ``startNode(r)`` and refuses query
parameters inside list lambdas, so property maps are spelled out column by column
and the provenance arithmetic (which chunk ids a relation keeps) is done in Python
(`knowledge.graphstore._common`), the same code the Neo4j store uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import ladybug

from knowledge.errors import (
    GraphNotFoundError,
    GraphStoreError,
    KnowledgeError,
    OntologyError,
    OntologyMismatchError,
    OntologyViolationError,
    StoreLockedError,
)
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
    with_entities,
)
from knowledge.graphstore.base import DocumentGraph, Entity, Fact, GraphStats, PropertyValue
from knowledge.ontology import Ontology, normalise_name
from knowledge.vectorstore.base import valid_collection_name

__all__ = ["GraphStoreLockedError", "LadybugStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DB_FILE = "graph.lbug"
_CHECKPOINT_BYTES = 4 * 1024 * 1024
_COLUMN_TYPES = {"string": "STRING", "integer": "INT64", "number": "DOUBLE", "boolean": "BOOLEAN"}
_OWN_TABLES = frozenset({"chunk", "mentions", "document_", "ontology_"})
"""The tables the store itself creates; LadybugDB table names ignore case, so an
ontology type that folds to one of these cannot be a table."""


class GraphStoreLockedError(StoreLockedError):
    """The embedded graph store's directory is in use by another process (one
    process per directory: LadybugDB opens a database file in one process only).

    Attributes:
        path: the directory.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        KnowledgeError.__init__(
            self, f"the graph store at {path} is in use by another process (the embedded graph store allows one process per directory)"
        )


def _q(name: str) -> str:
    """A table or column name quoted for LadybugDB (names come from a validated
    ontology: letters, digits and ``_``; quoting keeps Cypher keywords usable)."""
    return f"`{name}`"


@dataclass(eq=False)
class _Graph:
    """An open collection database."""

    name: str
    dir: Path
    db: ladybug.Database
    conn: ladybug.Connection
    ontology: Ontology
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by the engine call running on the connection (and by closing it)."""
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Waited for before a call goes to a worker thread, so waiting callers do not
    hold the default executor's threads (the embedder's and vector store's too)."""
    closed: bool = False

    @property
    def entity_types(self) -> list[str]:
        return sorted(self.ontology.entity_types)

    @property
    def relation_types(self) -> list[str]:
        return sorted(self.ontology.relation_types)

    @property
    def any_entity(self) -> str:
        """A node pattern label matching every entity table (LadybugDB's label union)."""
        return ":".join(_q(t) for t in self.entity_types)


class LadybugStore:
    """Knowledge graphs in LadybugDB databases under ``path``, one per collection.

    Args:
        path: the store's directory (created if missing).
        timeout_s: limit for each call (the engine's query timeout, and the wait
            for the collection's lock).
        buffer_pool_mb: the page cache of each open collection database.

    Raises:
        GraphStoreLockedError: another `LadybugStore` (in any process) has ``path``
            open (a `StoreLockedError`).
    """

    def __init__(self, path: Path, *, timeout_s: float = 30.0, buffer_pool_mb: int = 256) -> None:
        self.location = str(path)
        self._root = path
        self._timeout = timeout_s
        self._buffer_pool = buffer_pool_mb * 1024 * 1024
        path.mkdir(parents=True, exist_ok=True)
        self._lock_file: Any = open(path / ".lock", "a+")  # noqa: SIM115 - held until aclose
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise GraphStoreLockedError(str(path)) from None
        self._graphs: dict[str, _Graph] = {}
        self._opening: dict[str, asyncio.Future[_Graph]] = {}
        self._open_lock = asyncio.Lock()
        self._closed = False
        for entry in path.iterdir():
            if entry.name.startswith(".creating-"):
                # A graph an earlier process was creating when it stopped.
                shutil.rmtree(entry, ignore_errors=True)

    # ---- opening -----------------------------------------------------------------------

    def _db_path(self, name: str) -> Path:
        return self._root / name / _DB_FILE

    def _names(self) -> list[str]:
        names = []
        for db_file in self._root.glob(f"*/{_DB_FILE}"):
            with contextlib.suppress(KnowledgeError):
                names.append(valid_collection_name(db_file.parent.name))
        return sorted(names)

    def _check_open(self) -> None:
        if self._closed:
            raise GraphStoreError(f"the graph store at {self.location} is closed")

    async def _graph(self, name: str) -> _Graph:
        """The collection's open database.

        Raises:
            GraphNotFoundError: the collection has no graph.
        """
        valid_collection_name(name)
        self._check_open()
        found = self._graphs.get(name)
        if found is not None:
            return found
        # One opening task per collection, which every caller awaits (shielded): a
        # caller cancelled mid-open leaves the task (and the lock it holds) running,
        # so the next caller waits for it instead of opening the same database a
        # second time (LadybugDB allows one Database per path in a process).
        opening = self._opening.get(name)
        if opening is None:
            opening = asyncio.ensure_future(self._open(name))
            self._opening[name] = opening
            opening.add_done_callback(lambda done: self._opened(name, done))
        return await asyncio.shield(opening)

    def _opened(self, name: str, done: asyncio.Future[_Graph]) -> None:
        if self._opening.get(name) is done:
            del self._opening[name]
        if not done.cancelled():
            done.exception()  # retrieved: every caller may have been cancelled

    async def _open(self, name: str) -> _Graph:
        async with self._open_lock:
            self._check_open()
            found = self._graphs.get(name)
            if found is not None:
                return found
            if not self._db_path(name).is_file():
                raise GraphNotFoundError(name, self._names())
            return await self._load(name)

    async def _load(self, name: str) -> _Graph:
        def load() -> _Graph:
            db = ladybug.Database(self._db_path(name), buffer_pool_size=self._buffer_pool)
            try:
                conn = ladybug.Connection(db)
                conn.set_query_timeout(int(self._timeout * 1000))
                rows = _rows(conn.execute("MATCH (o:Ontology_) RETURN o.text"))
                if len(rows) != 1:
                    raise GraphStoreError(f"collection {name!r}: the graph has no bound ontology ({self._db_path(name)})")
                return _Graph(name=name, dir=self._root / name, db=db, conn=conn, ontology=ontology_from_text(rows[0][0]))
            except BaseException:
                db.close()
                raise

        graph = await _engine(name, load)
        if self._closed:  # closed by `close_now` while the engine opened it
            await _engine(name, lambda: _close(graph))
            self._check_open()
        self._graphs[name] = graph
        return graph

    # ---- engine calls ----------------------------------------------------------------------

    async def _call(self, graph: _Graph, fn: Callable[[ladybug.Connection], T]) -> T:
        """Run ``fn`` with the collection's connection on a worker thread, alone."""

        def run() -> T:
            if not graph.lock.acquire(timeout=self._timeout):
                raise GraphStoreError(f"collection {graph.name!r}: the graph is busy (waited {self._timeout:g} s)")
            try:
                if graph.closed:
                    raise GraphNotFoundError(graph.name, self._names())
                return fn(graph.conn)
            finally:
                graph.lock.release()

        try:
            async with asyncio.timeout(self._timeout):
                await graph.turn.acquire()
        except TimeoutError:
            raise GraphStoreError(f"collection {graph.name!r}: the graph is busy (waited {self._timeout:g} s)") from None
        try:
            return await _engine(graph.name, run)
        finally:
            graph.turn.release()

    # ---- collections ---------------------------------------------------------------------------

    async def bind(self, collection: str, ontology: Ontology) -> None:
        """Bind ``collection``'s graph to ``ontology``, creating its tables the first time.

        Raises:
            OntologyMismatchError: the graph is bound to another ontology.
            OntologyError: an ontology type whose name LadybugDB cannot hold beside
                the store's own tables (names ignore case here).
        """
        valid_collection_name(collection)
        self._check_open()
        async with self._open_lock:
            if not self._db_path(collection).is_file():
                _check_table_names(ontology)
                await _engine(collection, lambda: self._create(collection, ontology))
        graph = await self._graph(collection)
        if graph.ontology.fingerprint != ontology.fingerprint:
            raise OntologyMismatchError(collection, graph.ontology.describe(), ontology.describe())

    def _create(self, name: str, ontology: Ontology) -> None:
        """Build the graph in a hidden directory and rename it into place."""
        building = self._root / f".creating-{name}-{uuid.uuid4().hex[:8]}"
        building.mkdir()
        try:
            db = ladybug.Database(building / _DB_FILE, buffer_pool_size=self._buffer_pool)
            try:
                conn = ladybug.Connection(db)
                for statement in _schema(ontology):
                    conn.execute(statement)
                conn.execute(
                    "CREATE (o:Ontology_ {name: $name, fingerprint: $fingerprint, text: $text})",
                    {"name": ontology.name, "fingerprint": ontology.fingerprint, "text": ontology_text(ontology)},
                )
                conn.close()
            finally:
                db.close()
            building.rename(self._root / name)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise

    async def ontology(self, collection: str) -> Ontology | None:
        try:
            graph = await self._graph(collection)
        except GraphNotFoundError:
            return None
        return graph.ontology

    async def graphs(self) -> list[str]:
        self._check_open()
        return self._names()

    async def drop(self, collection: str) -> bool:
        valid_collection_name(collection)
        self._check_open()
        async with self._open_lock:
            graph = self._graphs.pop(collection, None)
            if graph is not None:
                await _engine(collection, lambda: _close(graph))
            directory = self._root / collection
            if not (directory / _DB_FILE).is_file():
                return False
            # Renamed first, so a crash mid-removal never leaves a half graph in place.
            doomed = self._root / f".creating-dropped-{collection}-{uuid.uuid4().hex[:8]}"
            await asyncio.to_thread(directory.rename, doomed)
            await asyncio.to_thread(shutil.rmtree, doomed, True)
            return True

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._open_lock:
            graphs, self._graphs = list(self._graphs.values()), {}
            for graph in graphs:
                await _engine(graph.name, lambda g=graph: _close(g))  # type: ignore[misc]
        self._lock_file.close()

    def close_now(self) -> None:
        """Close the open databases and release the directory from synchronous code
        (after a failed start-up, with no event loop to await `aclose` on). Waits for
        an engine call still running on a collection (its lock) before closing it."""
        if self._closed:
            return
        self._closed = True
        graphs, self._graphs = list(self._graphs.values()), {}
        for graph in graphs:
            try:
                _close(graph)
            except Exception:  # closing the rest and the lock matters more
                log.exception("closing the graph of collection %r", graph.name)
        self._lock_file.close()

    # ---- documents -------------------------------------------------------------------------

    async def documents(self, collection: str) -> dict[str, str]:
        graph = await self._graph(collection)
        rows = await self._call(graph, lambda c: _rows(c.execute("MATCH (d:Document_) RETURN d.doc_id, d.hash")))
        return {str(doc_id): str(hash_) for doc_id, hash_ in rows}

    async def write_document(self, collection: str, graph: DocumentGraph) -> None:
        """Replace what ``graph.doc_id`` contributes, in one transaction.

        Raises:
            GraphNotFoundError: the collection has no graph.
            OntologyViolationError: something the bound ontology does not allow;
                nothing was written.
            ValueError: ``graph`` contradicts itself (see `check_document`).
        """
        handle = await self._graph(collection)
        reasons, properties = check_document(handle.ontology, graph)
        if reasons:
            raise OntologyViolationError(collection, reasons)
        await self._call(handle, lambda c: _checkpointed(c, handle, _transaction(c, lambda: _write(c, handle, graph, properties))))

    async def delete_document(self, collection: str, doc_id: str) -> bool:
        handle = await self._graph(collection)

        def delete(conn: ladybug.Connection) -> bool:
            existed = bool(_rows(conn.execute("MATCH (d:Document_ {doc_id: $d}) RETURN d.doc_id", {"d": doc_id})))
            removed, mentioned = _remove_document(conn, handle, doc_id)
            _collect_entities(conn, handle, mentioned)
            conn.execute("MATCH (d:Document_ {doc_id: $d}) DELETE d", {"d": doc_id})
            return existed or removed

        return await self._call(handle, lambda c: _checkpointed(c, handle, _transaction(c, lambda: delete(c))))

    async def document_graph(self, collection: str, doc_id: str) -> DocumentGraph | None:
        """What ``doc_id`` contributes now (see `GraphStore.document_graph`)."""
        handle = await self._graph(collection)

        def read(conn: ladybug.Connection) -> DocumentGraph | None:
            params = {"d": doc_id}
            hashes = _rows(conn.execute("MATCH (d:Document_ {doc_id: $d}) RETURN d.hash", params))
            chunks = [str(c) for (c,) in _rows(conn.execute("MATCH (c:Chunk) WHERE c.doc_id = $d RETURN c.id", params))]
            mentions = [
                (str(c), str(e))
                for c, e in _rows(conn.execute("MATCH (c:Chunk)-[:MENTIONS]->(e) WHERE c.doc_id = $d RETURN c.id, e.id", params))
            ]
            relations: list[tuple[str, str, str, list[str]]] = []
            if handle.relation_types:
                rels = "|".join(_q(t) for t in handle.relation_types)
                # Every relation the document stated starts at an entity it mentions.
                for source, rel, target in _rows(
                    conn.execute(f"MATCH (c:Chunk)-[:MENTIONS]->(a)-[r:{rels}]->(b) WHERE c.doc_id = $d RETURN a.id, r, b.id", params)
                ):
                    relations.append((str(rel["_LABEL"]), str(source), str(target), [str(x) for x in rel.get("chunk_ids") or ()]))
            entities = _load_entities(conn, handle, {e for _, e in mentions})
            content_hash = str(hashes[0][0]) if hashes and hashes[0][0] is not None else None
            return assemble_document(doc_id, content_hash, chunks, mentions, relations, entities)

        return await self._call(handle, read)

    # ---- reading ------------------------------------------------------------------------------

    async def entities(self, collection: str, ids: Sequence[str]) -> list[Entity]:
        graph = await self._graph(collection)
        wanted = unique(ids)
        found = await self._call(graph, lambda c: _load_entities(c, graph, wanted))
        return [found[i] for i in wanted if i in found]

    async def find_entities(self, collection: str, names: Sequence[str], *, limit: int = 50) -> list[Entity]:
        """Entities whose ``keys`` hold a normalised form of one of ``names``, ordered
        by type, name and id, at most ``limit``."""
        graph = await self._graph(collection)
        keys = unique([k for k in (normalise_name(n) for n in names) if k])
        if not keys or limit < 1:
            return []

        def find(conn: ladybug.Connection) -> list[Entity]:
            rows = _rows(
                conn.execute(
                    f"UNWIND $keys AS k MATCH (n:{graph.any_entity}) WHERE list_contains(n.keys, k) RETURN DISTINCT n",
                    {"keys": keys},
                )
            )
            return [_entity(graph, node) for (node,) in rows]

        found = await self._call(graph, find)
        found.sort(key=lambda e: (e.type, e.name, e.id))
        return found[:limit]

    async def neighbors(
        self, collection: str, seeds: Sequence[str], *, hops: int = 2, fanout: int = 20, limit: int = 100
    ) -> list[Fact]:
        check_expansion(hops, fanout, limit)
        graph = await self._graph(collection)
        if not graph.relation_types or not seeds:
            return []

        def expand(conn: ladybug.Connection) -> list[Fact]:
            frontier = unique(seeds)
            visited = set(frontier)
            seen: set[tuple[str, str, str]] = set()
            facts: list[Fact] = []
            for hop in range(1, hops + 1):
                # Every relation of the frontier is read: cutting them per entity in
                # the query (ORDER BY, collect, list_slice, both directions) tripled the
                # 2-hop p95 at 10k/30k (13.6 -> 42.8 ms, measured); `expand_hop` keeps fanout.
                edges = _edges(conn, graph, frontier)
                found, frontier = expand_hop(frontier, edges, hop=hop, fanout=fanout, seen=seen, visited=visited)
                facts.extend(found)
                # Facts are ordered nearer first: once ``limit`` are found, farther
                # hops cannot displace any of them.
                if not frontier or len(facts) >= limit:
                    break
            facts.sort(key=fact_order)
            facts = facts[:limit]
            return with_entities(facts, _load_entities(conn, graph, {e for f in facts for e in (f.source.id, f.target.id)}))

        return await self._call(graph, expand)

    async def mentions(self, collection: str, entity_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        graph = await self._graph(collection)
        ids = unique(entity_ids)
        if not ids:
            return {}
        rows = await self._call(
            graph,
            lambda c: _rows(c.execute("MATCH (c:Chunk)-[:MENTIONS]->(e) WHERE e.id IN $ids RETURN e.id, c.id", {"ids": ids})),
        )
        found: dict[str, list[str]] = {}
        for entity, chunk in rows:
            found.setdefault(str(entity), []).append(str(chunk))
        return {i: tuple(sorted(found[i])) for i in ids if i in found}

    async def stats(self, collection: str) -> GraphStats:
        graph = await self._graph(collection)

        def count(conn: ladybug.Connection) -> GraphStats:
            def one(query: str) -> int:
                return int(_rows(conn.execute(query))[0][0])

            return GraphStats(
                ontology=graph.ontology.describe(),
                documents=one("MATCH (d:Document_) RETURN count(d)"),
                chunks=one("MATCH (c:Chunk) RETURN count(c)"),
                entities={t: one(f"MATCH (n:{_q(t)}) RETURN count(n)") for t in graph.entity_types},
                relations={t: one(f"MATCH ()-[r:{_q(t)}]->() RETURN count(r)") for t in graph.relation_types},
            )

        return await self._call(graph, count)


# ---- schema ----------------------------------------------------------------------------------


def _check_table_names(ontology: Ontology) -> None:
    clash = sorted(t for t in (*ontology.entity_types, *ontology.relation_types) if t.casefold() in _OWN_TABLES)
    if clash:
        raise OntologyError(
            f"ontology {ontology.name!r}: type names {', '.join(clash)} clash with the embedded graph store's own tables "
            f"(Chunk, MENTIONS, Document_, Ontology_; LadybugDB ignores case in table names)",
            source=f"<ontology {ontology.name}>",
        )


def _schema(ontology: Ontology) -> list[str]:
    """The DDL of a collection's graph."""
    statements = []
    for name, entity_type in sorted(ontology.entity_types.items()):
        columns = ["id STRING PRIMARY KEY", "name STRING", "aliases STRING[]", "keys STRING[]", "description STRING"]
        columns += [f"{_q(prop)} {_COLUMN_TYPES[kind]}" for prop, kind in sorted(entity_type.properties.items())]
        statements.append(f"CREATE NODE TABLE {_q(name)}({', '.join(columns)})")
    statements.append("CREATE NODE TABLE Chunk(id STRING PRIMARY KEY, doc_id STRING)")
    statements.append("CREATE NODE TABLE Document_(doc_id STRING PRIMARY KEY, hash STRING)")
    statements.append("CREATE NODE TABLE Ontology_(name STRING PRIMARY KEY, fingerprint STRING, text STRING)")
    for name, relation in sorted(ontology.relation_types.items()):
        pairs = [f"FROM {_q(s)} TO {_q(t)}" for s in relation.source_types for t in relation.target_types]
        statements.append(f"CREATE REL TABLE {_q(name)}({', '.join(pairs)}, chunk_ids STRING[])")
    pairs = [f"FROM Chunk TO {_q(t)}" for t in sorted(ontology.entity_types)]
    statements.append(f"CREATE REL TABLE MENTIONS({', '.join(pairs)})")
    return statements


# ---- engine helpers (run on the worker thread, under the collection's lock) -----------------


def _rows(result: Any) -> list[list[Any]]:
    results = result if isinstance(result, list) else [result]
    out: list[list[Any]] = []
    for one in results:
        while one.has_next():
            out.append(one.get_next())
    return out


def _transaction(conn: ladybug.Connection, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a write transaction: committed if it returns, rolled back if it raises."""
    conn.execute("BEGIN TRANSACTION")
    try:
        value = fn()
    except BaseException:
        # A failed statement has already rolled the transaction back in the engine.
        with contextlib.suppress(RuntimeError):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return value


def _checkpointed(conn: ladybug.Connection, graph: _Graph, value: T) -> T:
    """``value``, after a checkpoint if the write-ahead log has grown past
    `_CHECKPOINT_BYTES`. LadybugDB 0.22's own automatic checkpoint (at a larger log)
    failed in the bench with "the buffer pool is full" at ~20k relations written in
    600 transactions with a 256 MB pool; checkpointing this often kept it under."""
    wal = graph.dir / f"{_DB_FILE}.wal"
    try:
        size = wal.stat().st_size
    except FileNotFoundError:
        return value
    if size > _CHECKPOINT_BYTES:
        conn.execute("CHECKPOINT")
    return value


def _entity(graph: _Graph, node: Mapping[str, Any]) -> Entity:
    return entity_from_record(node, str(node["_LABEL"]), graph.ontology)


def _by_type(graph: _Graph, ids: Iterable[str]) -> dict[str, list[str]]:
    """Entity ids grouped by their type (the prefix `entity_id` gives them)."""
    grouped: dict[str, list[str]] = {}
    for entity_id in ids:
        entity_type = entity_id.split(":", 1)[0]
        if entity_type in graph.ontology.entity_types:
            grouped.setdefault(entity_type, []).append(entity_id)
    return grouped


def _load_entities(conn: ladybug.Connection, graph: _Graph, ids: Iterable[str]) -> dict[str, Entity]:
    found: dict[str, Entity] = {}
    # Per type with ``id IN`` on the primary key: faster than a label union for the
    # ~100 ends of a 2-hop expansion, and than an UNWIND of ids (measured).
    for entity_type, group in _by_type(graph, ids).items():
        for (node,) in _rows(conn.execute(f"MATCH (n:{_q(entity_type)}) WHERE n.id IN $ids RETURN n", {"ids": group})):
            entity = _entity(graph, node)
            found[entity.id] = entity
    return found


def _edges(conn: ladybug.Connection, graph: _Graph, ids: list[str]) -> list[Edge]:
    """The relations touching the entities ``ids``, either direction, their ends
    named but not loaded (`with_entities` loads the ones kept)."""
    if not ids:
        return []
    rels = "|".join(_q(t) for t in graph.relation_types)
    # One undirected match (``a.id IN`` uses the primary key; an UNWIND of ids does
    # not, measured 20x slower); the direction is the relation's internal source id.
    rows = _rows(
        conn.execute(
            f"MATCH (a:{graph.any_entity})-[r:{rels}]-(b:{graph.any_entity}) WHERE a.id IN $ids "
            "RETURN a.id, a.name, label(a), id(a), r, b.id, b.name, label(b)",
            {"ids": ids},
        )
    )
    edges = []
    for a_id, a_name, a_type, a_internal, rel, b_id, b_name, b_type in rows:
        a = Entity(id=a_id, type=a_type, name=a_name or "")
        b = Entity(id=b_id, type=b_type, name=b_name or "")
        source, target = (a, b) if rel["_SRC"] == a_internal else (b, a)
        edges.append(Edge(source, str(rel["_LABEL"]), target, tuple(rel.get("chunk_ids") or ())))
    return edges


def _remove_document(conn: ladybug.Connection, graph: _Graph, doc_id: str) -> tuple[bool, set[str]]:
    """Take the document's chunks out of the graph: its chunk ids leave every relation
    (a relation left with none is deleted), its chunks and their mentions go.
    Returns whether it had chunks, and the entities its chunks mentioned (which may
    now be mentioned by none)."""
    old = {str(c) for (c,) in _rows(conn.execute("MATCH (c:Chunk) WHERE c.doc_id = $d RETURN c.id", {"d": doc_id}))}
    if not old:
        return False, set()
    mentioned = {
        str(e) for (e,) in _rows(conn.execute("MATCH (c:Chunk)-[:MENTIONS]->(e) WHERE c.doc_id = $d RETURN DISTINCT e.id", {"d": doc_id}))
    }
    for rel_type in graph.relation_types:
        # Every relation the document stated starts at an entity it mentions.
        rows = _rows(
            conn.execute(
                f"MATCH (c:Chunk)-[:MENTIONS]->(a)-[r:{_q(rel_type)}]->(b) WHERE c.doc_id = $d "
                "RETURN DISTINCT a.id, label(a), b.id, label(b), r.chunk_ids",
                {"d": doc_id},
            )
        )
        keep: dict[tuple[str, str], list[dict[str, Any]]] = {}
        drop: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for source, source_type, target, target_type, chunk_ids in rows:
            kept = [c for c in chunk_ids or () if c not in old]
            if len(kept) == len(chunk_ids or ()):
                continue
            row = {"s": source, "t": target, "c": kept}
            (keep if kept else drop).setdefault((source_type, target_type), []).append(row)
        for (source_type, target_type), group in keep.items():
            conn.execute(
                f"UNWIND $rows AS row MATCH (a:{_q(source_type)} {{id: row.s}})-[r:{_q(rel_type)}]->(b:{_q(target_type)} {{id: row.t}}) "
                "SET r.chunk_ids = CAST(row.c AS STRING[])",
                {"rows": group},
            )
        for (source_type, target_type), group in drop.items():
            conn.execute(
                f"UNWIND $rows AS row MATCH (a:{_q(source_type)} {{id: row.s}})-[r:{_q(rel_type)}]->(b:{_q(target_type)} {{id: row.t}}) "
                "DELETE r",
                {"rows": group},
            )
    conn.execute("MATCH (c:Chunk) WHERE c.doc_id = $d DETACH DELETE c", {"d": doc_id})
    return True, mentioned


def _collect_entities(conn: ladybug.Connection, graph: _Graph, candidates: Iterable[str]) -> None:
    """Delete the entities among ``candidates`` that no chunk mentions any more (with
    their relations)."""
    for entity_type, group in _by_type(graph, candidates).items():
        conn.execute(
            f"MATCH (n:{_q(entity_type)}) WHERE n.id IN $ids "
            "AND NOT EXISTS { MATCH (:Chunk)-[:MENTIONS]->(n) } DETACH DELETE n",
            {"ids": group},
        )


def _write(conn: ladybug.Connection, graph: _Graph, doc: DocumentGraph, properties: Mapping[str, Mapping[str, PropertyValue]]) -> None:
    _, mentioned = _remove_document(conn, graph, doc.doc_id)
    stored = _load_entities(conn, graph, [e.id for e in doc.entities])
    merged: dict[str, Entity] = {}
    for given in doc.entities:
        merged[given.id] = merge_entity(merged.get(given.id) or stored.get(given.id), given, properties.get(given.id, {}))
    by_type: dict[str, list[Entity]] = {}
    for entity in merged.values():
        by_type.setdefault(entity.type, []).append(entity)
    for entity_type, group in by_type.items():
        # One statement per set of known properties: LadybugDB types an UNWIND list's
        # struct from its rows, and a field that is null in every row has no type.
        shapes: dict[tuple[str, ...], list[Entity]] = {}
        for entity in group:
            shapes.setdefault(tuple(sorted(entity.properties)), []).append(entity)
        for known, shaped in shapes.items():
            sets = [
                "n.name = row.name",
                "n.aliases = CAST(row.aliases AS STRING[])",
                "n.keys = CAST(row.keys AS STRING[])",
                "n.description = row.description",
                *(f"n.{_q(p)} = row.p_{p}" for p in known),
            ]
            rows = [
                {
                    "id": e.id,
                    "name": e.name,
                    "aliases": list(e.aliases),
                    "keys": list(e.keys),
                    "description": e.description,
                    **{f"p_{p}": e.properties[p] for p in known},
                }
                for e in shaped
            ]
            conn.execute(f"UNWIND $rows AS row MERGE (n:{_q(entity_type)} {{id: row.id}}) SET {', '.join(sets)}", {"rows": rows})
    if doc.chunk_ids:
        conn.execute(
            "UNWIND $rows AS row MERGE (c:Chunk {id: row.id}) SET c.doc_id = row.doc",
            {"rows": [{"id": c, "doc": doc.doc_id} for c in unique(doc.chunk_ids)]},
        )
    mentions: dict[str, list[dict[str, str]]] = {}
    for mention in dict.fromkeys(doc.mentions):
        mentions.setdefault(merged[mention.entity_id].type, []).append({"c": mention.chunk_id, "e": mention.entity_id})
    for entity_type, group in mentions.items():
        conn.execute(
            f"UNWIND $rows AS row MATCH (c:Chunk {{id: row.c}}), (e:{_q(entity_type)} {{id: row.e}}) MERGE (c)-[:MENTIONS]->(e)",
            {"rows": group},
        )
    relations: dict[tuple[str, str, str], dict[tuple[str, str], list[str]]] = {}
    for relation in doc.relations:
        key = (relation.type, merged[relation.source].type, merged[relation.target].type)
        chunk_ids = relations.setdefault(key, {}).setdefault((relation.source, relation.target), [])
        chunk_ids.extend(c for c in relation.chunk_ids if c not in chunk_ids)
    for (rel_type, source_type, target_type), pairs in relations.items():
        conn.execute(
            f"UNWIND $rows AS row MATCH (a:{_q(source_type)} {{id: row.s}}), (b:{_q(target_type)} {{id: row.t}}) "
            f"MERGE (a)-[r:{_q(rel_type)}]->(b) "
            "SET r.chunk_ids = list_distinct(list_concat(coalesce(r.chunk_ids, CAST([] AS STRING[])), CAST(row.c AS STRING[])))",
            {"rows": [{"s": s, "t": t, "c": c} for (s, t), c in pairs.items()]},
        )
    _collect_entities(conn, graph, mentioned - set(merged))
    conn.execute("MERGE (d:Document_ {doc_id: $d}) SET d.hash = $h", {"d": doc.doc_id, "h": doc.content_hash})


def _close(graph: _Graph) -> None:
    with graph.lock:
        graph.closed = True
        graph.conn.close()
        graph.db.close()


async def _engine(name: str, fn: Callable[[], T]) -> T:
    """Run an engine call on a worker thread; its errors become `GraphStoreError`.

    A thread cannot be stopped: when the caller is cancelled, this waits for the call
    to finish before passing the cancellation on, so a write transaction has
    committed or rolled back by the time the caller's ``finally`` blocks run."""
    running = asyncio.ensure_future(asyncio.to_thread(fn))
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
    except (KnowledgeError, ValueError):
        raise
    except Exception as exc:  # the engine raises RuntimeError with its message
        raise GraphStoreError(f"graph of collection {name!r}: {exc}") from exc
