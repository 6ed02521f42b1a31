"""Every Cypher statement `Neo4jStore` runs, parameterised.

One Neo4j database holds many collections: every node carries a ``collection``
property and every statement matches on it (``$collection``). Values always travel as
parameters; the only text formatted into a statement is a label or relationship type
from a validated ontology (`label` checks it again and quotes it), because Cypher
cannot take those as parameters.

The statements keep to the Cypher that FalkorDB (the Bolt server the contract tests
run against) also speaks: no ``CALL {} IN TRANSACTIONS``, no ``EXISTS {}`` subqueries
(pattern predicates instead), no ``IF NOT EXISTS``. The schema statements that only
Neo4j has (constraints, ``IF NOT EXISTS``, ``dbms.components``) are in the
``NEO4J_`` constants, run only when the server passed that capability check.
"""

from __future__ import annotations

import re

__all__ = [
    "BIND_ONTOLOGY",
    "CHUNKS_OF_DOCUMENT",
    "COLLECT_ENTITIES",
    "COUNT_CHUNKS",
    "COUNT_DOCUMENTS",
    "COUNT_ENTITIES",
    "COUNT_RELATIONS",
    "DELETE_CHUNKS",
    "DELETE_DOCUMENT_RECORD",
    "DOCUMENTS",
    "DOCUMENT_EXISTS",
    "DOCUMENT_HASH",
    "DOCUMENT_MENTIONS",
    "DOCUMENT_RELATIONS",
    "DROP_BATCH",
    "DROP_ONTOLOGY",
    "EDGES",
    "FALKORDB_INDEXES",
    "FALKORDB_INDEX",
    "FIND_ENTITIES",
    "GET_ONTOLOGY",
    "GRAPHS",
    "LOAD_ENTITIES",
    "MENTIONED_BY_DOCUMENT",
    "MENTIONS",
    "MERGE_CHUNKS",
    "MERGE_MENTIONS",
    "NEO4J_COMPONENTS",
    "NEO4J_CONSTRAINTS",
    "NEO4J_TYPE_CONSTRAINT",
    "UNSUPPORT_DOCUMENT",
    "UPSERT_DOCUMENT",
    "label",
    "merge_entities",
    "merge_relations",
]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def label(name: str) -> str:
    """``name`` quoted as a label or relationship type; names come from a validated
    ontology, and this refuses anything else.

    Raises:
        ValueError: not a name an ontology could declare.
    """
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a valid label or relationship type")
    return f"`{name}`"


# ---- schema ----------------------------------------------------------------------------

NEO4J_COMPONENTS = "CALL dbms.components() YIELD name, versions, edition RETURN name, versions[0] AS version, edition"
"""Answers on Neo4j only: how a Neo4j server is told from a Bolt server that says it
is one (FalkorDB's agent string is ``Neo4j/5.13.0``)."""

NEO4J_CONSTRAINTS = (
    "CREATE CONSTRAINT switchyard_entity_key IF NOT EXISTS FOR (n:Entity) REQUIRE (n.collection, n.id) IS UNIQUE",
    "CREATE CONSTRAINT switchyard_chunk_key IF NOT EXISTS FOR (n:Chunk) REQUIRE (n.collection, n.id) IS UNIQUE",
    "CREATE CONSTRAINT switchyard_document_key IF NOT EXISTS FOR (n:Document_) REQUIRE (n.collection, n.doc_id) IS UNIQUE",
    "CREATE CONSTRAINT switchyard_ontology_key IF NOT EXISTS FOR (n:Ontology_) REQUIRE n.collection IS UNIQUE",
    "CREATE INDEX switchyard_chunk_doc IF NOT EXISTS FOR (n:Chunk) ON (n.collection, n.doc_id)",
)
"""Uniqueness of the store's own keys (each backed by an index)."""

NEO4J_TYPE_CONSTRAINT = "CREATE CONSTRAINT {name} IF NOT EXISTS FOR (n:{label}) REQUIRE (n.collection, n.id) IS UNIQUE"
"""Per entity type of an ontology: its ids unique per collection (format with `label`)."""

FALKORDB_INDEXES = "CALL db.indexes() YIELD label, properties RETURN label, properties"
"""FalkorDB's index list (it fails on an index that exists and has no ``IF NOT EXISTS``)."""

FALKORDB_INDEX = "CREATE INDEX FOR (n:{label}) ON (n.{properties})"
"""A FalkorDB range index (format ``label`` and ``properties`` joined by ``, n.``)."""

# ---- collections ---------------------------------------------------------------------------

GET_ONTOLOGY = "MATCH (o:Ontology_ {collection: $collection}) RETURN o.text AS text"

BIND_ONTOLOGY = (
    "MERGE (o:Ontology_ {collection: $collection}) "
    "ON CREATE SET o.name = $name, o.fingerprint = $fingerprint, o.text = $text "
    "RETURN o.text AS text"
)
"""Binds the collection unless it is bound already; returns the bound ontology."""

GRAPHS = "MATCH (o:Ontology_) RETURN o.collection AS collection ORDER BY collection"

DROP_BATCH = "MATCH (n:{label} {{collection: $collection}}) WITH n LIMIT $batch DETACH DELETE n RETURN count(*) AS deleted"
"""One batch of a drop (format with `label`): big graphs go in several transactions."""

DROP_ONTOLOGY = "MATCH (o:Ontology_ {collection: $collection}) DELETE o RETURN count(*) AS deleted"

# ---- documents -----------------------------------------------------------------------------

DOCUMENTS = "MATCH (d:Document_ {collection: $collection}) RETURN d.doc_id AS doc_id, d.hash AS hash"

DOCUMENT_EXISTS = "MATCH (d:Document_ {collection: $collection, doc_id: $doc_id}) RETURN count(d) AS n"

DOCUMENT_HASH = "MATCH (d:Document_ {collection: $collection, doc_id: $doc_id}) RETURN d.hash AS hash"

DOCUMENT_MENTIONS = (
    "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id})-[:MENTIONS]->(e:Entity) RETURN c.id AS chunk, e.id AS entity"
)

DOCUMENT_RELATIONS = (
    "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id})-[:MENTIONS]->(a:Entity)-[r]->(b:Entity) "
    "WITH DISTINCT a, r, b RETURN type(r) AS type, a.id AS source, b.id AS target, r.chunk_ids AS chunk_ids"
)
"""The relations starting at an entity the document mentions (every relation it
stated does), with all their chunk ids (the caller keeps the document's)."""

CHUNKS_OF_DOCUMENT = "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id}) RETURN c.id AS id"

MENTIONED_BY_DOCUMENT = (
    "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id})-[:MENTIONS]->(e:Entity) RETURN DISTINCT e.id AS id"
)

UNSUPPORT_DOCUMENT = (
    "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id})-[:MENTIONS]->(:Entity)-[r]->(:Entity) "
    "WITH DISTINCT r WHERE any(x IN r.chunk_ids WHERE x IN $chunk_ids) "
    "SET r.chunk_ids = [x IN r.chunk_ids WHERE NOT x IN $chunk_ids] "
    "WITH r WHERE size(r.chunk_ids) = 0 DELETE r"
)
"""Takes the document's chunk ids off the relations it stated (each starts at an
entity one of its chunks mentions) and deletes the relations left with none."""

DELETE_CHUNKS = "MATCH (c:Chunk {collection: $collection, doc_id: $doc_id}) DETACH DELETE c"

COLLECT_ENTITIES = (
    "UNWIND $ids AS i MATCH (n:Entity {collection: $collection, id: i}) "
    "WHERE NOT (n)<-[:MENTIONS]-() DETACH DELETE n"
)
"""Deletes the entities among ``$ids`` no chunk mentions any more."""

LOAD_ENTITIES = "UNWIND $ids AS i MATCH (n:Entity {collection: $collection, id: i}) RETURN n AS node, labels(n) AS labels"

_MERGE_ENTITIES = (
    "UNWIND $rows AS row MERGE (n:Entity:{label} {{collection: $collection, id: row.id}}) "
    "SET n.name = row.name, n.aliases = row.aliases, n.keys = row.keys, n.description = row.description, "
    "n += row.properties"
)


def merge_entities(entity_type: str) -> str:
    """Upserts entities of one type; ``row.properties`` holds every declared property
    (null removes one)."""
    return _MERGE_ENTITIES.format(label=label(entity_type))


MERGE_CHUNKS = "UNWIND $rows AS row MERGE (c:Chunk {collection: $collection, id: row.id}) SET c.doc_id = row.doc_id"

MERGE_MENTIONS = (
    "UNWIND $rows AS row "
    "MATCH (c:Chunk {collection: $collection, id: row.chunk}) MATCH (e:Entity {collection: $collection, id: row.entity}) "
    "MERGE (c)-[:MENTIONS]->(e)"
)

_MERGE_RELATIONS = (
    "UNWIND $rows AS row "
    "MATCH (a:Entity {{collection: $collection, id: row.source}}) MATCH (b:Entity {{collection: $collection, id: row.target}}) "
    "MERGE (a)-[r:{type}]->(b) "
    "SET r.chunk_ids = coalesce(r.chunk_ids, []) + [x IN row.chunk_ids WHERE NOT x IN coalesce(r.chunk_ids, [])]"
)


def merge_relations(relation_type: str) -> str:
    """Upserts relations of one type, adding ``row.chunk_ids`` to their provenance."""
    return _MERGE_RELATIONS.format(type=label(relation_type))


UPSERT_DOCUMENT = "MERGE (d:Document_ {collection: $collection, doc_id: $doc_id}) SET d.hash = $hash"

DELETE_DOCUMENT_RECORD = "MATCH (d:Document_ {collection: $collection, doc_id: $doc_id}) DELETE d"

# ---- reading ---------------------------------------------------------------------------------

FIND_ENTITIES = (
    "MATCH (n:Entity {collection: $collection}) WHERE any(k IN n.keys WHERE k IN $keys) "
    "RETURN n AS node, labels(n) AS labels"
)

EDGES = (
    "MATCH (a:Entity)-[r]-(b:Entity) WHERE a.collection = $collection AND a.id IN $ids "
    "WITH a, r, b ORDER BY a.id, type(r), startNode(r).name, endNode(r).name, startNode(r).id, endNode(r).id "
    "WITH a, collect({r: r, b: b}) AS found "
    "UNWIND found[0..$cap] AS e WITH a, e.r AS r, e.b AS b "
    "RETURN a AS a, labels(a) AS a_labels, startNode(r) = a AS outgoing, type(r) AS type, "
    "b AS b, labels(b) AS b_labels, r.chunk_ids AS chunk_ids"
)
"""The relations touching the entities ``$ids``, either direction (MENTIONS starts at a
chunk, so it is not among them), with both ends: at most ``$cap`` per entity, first in
`GraphStore.neighbors`' order (type, then the ends' names and ids), so the rows an
expansion reads are bounded by its fanout, not by how connected an entity is. ``id IN $ids`` rather than an UNWIND:
FalkorDB ran the UNWIND form 10x slower for a 2-hop frontier (measured); loading the
ends afterwards in a second query cost FalkorDB more than returning them here."""

MENTIONS = (
    "UNWIND $ids AS i MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {collection: $collection, id: i}) "
    "RETURN e.id AS entity, c.id AS chunk"
)

COUNT_DOCUMENTS = "MATCH (d:Document_ {collection: $collection}) RETURN count(d) AS n"

COUNT_CHUNKS = "MATCH (c:Chunk {collection: $collection}) RETURN count(c) AS n"

COUNT_ENTITIES = "MATCH (n:Entity {collection: $collection}) RETURN labels(n) AS labels, count(n) AS n"

COUNT_RELATIONS = "MATCH (a:Entity {collection: $collection})-[r]->(:Entity) RETURN type(r) AS type, count(r) AS n"
