"""Graph store speed: upsert throughput and k-hop expansion latency at 10k entities /
30k relations, on the embedded store and over Bolt.

A synthetic graph under the sample ontology (config/ontologies/city-services.yaml):
``--entities`` entities spread evenly over its four types, ``--relations`` distinct
relations of its four types between allowed end types (every entity in at least one,
the rest drawn at random with a fixed seed, so every run and store gets the same
graph), cut into ``--docs`` documents of consecutive relations, three chunks each,
every end mentioned by the chunk stating the relation. Entity names are shared across
documents, so later documents merge into stored entities as real ingestion does.

Phases, one store at a time (``--store ladybug``: `LadybugStore` in a temp directory;
``--store neo4j``: `Neo4jStore` through the official driver over Bolt, to FalkorDB
started from falkordblite like the contract tests do, or ``--neo4j-url`` for a server
of your own):

1. ``write``: every document through `write_document`, one after the other
   (documents, entities and relations per second, and per-document p50/p95).
2. ``rewrite``: ``--rewrites`` documents written again with one relation fewer (the
   provenance-removal path).
3. ``expand``: `neighbors` from one seed entity (``--queries`` seeds drawn at random),
   hops 1 and 2 with the default fan-out 20 and limit 100: p50/p95/p99/max, and the
   facts returned. Then `find_entities` of one name.

Latencies include the asyncio → worker thread (embedded) or Bolt round trips, as the
retrieval code sees them. The host's other load is recorded per phase (2 shared cores).
Target (issue 16): 2-hop p95 ≤ 20 ms embedded.

    .venv/bin/python bench/graph_store.py --store ladybug
    .venv/bin/python bench/graph_store.py --store neo4j [--neo4j-url bolt://host:7687 --user neo4j --password ...]

Writes bench/results/graph-store-<store>-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

# knowledge_speed (beside this file) first: it puts the repository on sys.path.
from knowledge_speed import REPO, HostLoad, loadavg, percentiles, result_path

from knowledge.graphstore import DocumentGraph, Entity, GraphStore, LadybugStore, Mention, Neo4jStore, Relation, entity_id
from knowledge.ontology import Ontology, load_ontology
from tests.falkordb import settle, start_falkordb, stop_falkordb

ONTOLOGY_FILE = REPO / "config" / "ontologies" / "city-services.yaml"
COLLECTION = "bench"
CHUNKS_PER_DOC = 3


def synthetic_graph(ontology: Ontology, *, entities: int, relations: int, docs: int, seed: int = 16) -> list[DocumentGraph]:
    """The documents of the synthetic graph (see the module docstring)."""
    rng = random.Random(seed)
    types = sorted(ontology.entity_types)
    by_type: dict[str, list[Entity]] = {t: [] for t in types}
    for i in range(entities):
        t = types[i % len(types)]
        name = f"{t} {i:05d}"
        by_type[t].append(Entity(id=entity_id(t, name), type=t, name=name, aliases=(f"{t[:3]}-{i}",)))
    allowed = [(r, s, t) for r, rel in sorted(ontology.relation_types.items()) for s in rel.source_types for t in rel.target_types]
    edges: dict[tuple[str, str, str], tuple[Entity, str, Entity]] = {}

    def add(source: Entity, rel: str, target: Entity) -> None:
        edges.setdefault((source.id, rel, target.id), (source, rel, target))

    # Every entity in at least one relation, then random ones up to the count.
    everyone = [e for t in types for e in by_type[t]]
    rng.shuffle(everyone)
    for entity in everyone:
        rel, s, t = rng.choice([a for a in allowed if entity.type in (a[1], a[2])])
        if entity.type == s:
            add(entity, rel, rng.choice(by_type[t]))
        else:
            add(rng.choice(by_type[s]), rel, entity)
    while len(edges) < relations:
        rel, s, t = rng.choice(allowed)
        add(rng.choice(by_type[s]), rel, rng.choice(by_type[t]))
    ordered = list(edges.values())
    rng.shuffle(ordered)
    per_doc = -(-len(ordered) // docs)
    graphs = []
    for d in range(docs):
        part = ordered[d * per_doc : (d + 1) * per_doc]
        if not part:
            break
        graphs.append(document(f"doc-{d:05d}.md", part))
    return graphs


def document(doc_id: str, facts: list[tuple[Entity, str, Entity]], content_hash: str = "v1") -> DocumentGraph:
    chunk_ids = tuple(f"{doc_id}#{i}" for i in range(CHUNKS_PER_DOC))
    found: dict[str, Entity] = {}
    mentions: dict[Mention, None] = {}
    rels = []
    for i, (source, rel, target) in enumerate(facts):
        chunk = chunk_ids[i % CHUNKS_PER_DOC]
        for e in (source, target):
            found.setdefault(e.id, e)
            mentions[Mention(chunk_id=chunk, entity_id=e.id)] = None
        rels.append(Relation(type=rel, source=source.id, target=target.id, chunk_ids=(chunk,)))
    return DocumentGraph(
        doc_id=doc_id, content_hash=content_hash, chunk_ids=chunk_ids, entities=tuple(found.values()), relations=tuple(rels), mentions=tuple(mentions)
    )


def without_last_relation(graph: DocumentGraph) -> DocumentGraph:
    relations = graph.relations[:-1]
    ends = {r.source for r in relations} | {r.target for r in relations}
    return DocumentGraph(
        doc_id=graph.doc_id,
        content_hash="v2",
        chunk_ids=graph.chunk_ids,
        entities=tuple(e for e in graph.entities if e.id in ends),
        relations=relations,
        mentions=tuple(m for m in graph.mentions if m.entity_id in ends),
    )


async def measure(store: GraphStore, args: argparse.Namespace) -> dict[str, Any]:
    ontology = load_ontology(ONTOLOGY_FILE)
    graphs = synthetic_graph(ontology, entities=args.entities, relations=args.relations, docs=args.docs)
    await store.bind(COLLECTION, ontology)
    phases: dict[str, Any] = {}

    load = HostLoad()
    samples = []
    started = time.perf_counter()
    for graph in graphs:
        t0 = time.perf_counter()
        await store.write_document(COLLECTION, graph)
        samples.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - started
    stats = await store.stats(COLLECTION)
    phases["write"] = {
        "documents": len(graphs),
        "seconds": round(seconds, 2),
        "documents_per_s": round(len(graphs) / seconds, 1),
        "relations_per_s": round(sum(len(g.relations) for g in graphs) / seconds, 1),
        "entity_writes_per_s": round(sum(len(g.entities) for g in graphs) / seconds, 1),
        "per_document": percentiles(samples),
        "stored": {"entities": sum(stats.entities.values()), "relations": sum(stats.relations.values()), "chunks": stats.chunks},
        "host_other_cores": load.other_cores(),
    }
    print(json.dumps({"write": phases["write"]}, indent=2))

    rng = random.Random(7)
    load = HostLoad()
    samples = []
    for graph in rng.sample(graphs, min(args.rewrites, len(graphs))):
        t0 = time.perf_counter()
        await store.write_document(COLLECTION, without_last_relation(graph))
        samples.append(time.perf_counter() - t0)
    stats = await store.stats(COLLECTION)
    phases["rewrite"] = {
        "per_document": percentiles(samples),
        "stored": {"entities": sum(stats.entities.values()), "relations": sum(stats.relations.values())},
        "host_other_cores": load.other_cores(),
    }
    print(json.dumps({"rewrite": phases["rewrite"]}, indent=2))

    entities = [e for g in graphs for e in g.entities]
    seeds = [e.id for e in rng.sample(entities, min(args.queries, len(entities)))]
    for hops in (1, 2):
        load = HostLoad()
        samples, sizes = [], []
        await store.neighbors(COLLECTION, seeds[:10], hops=hops)  # warm-up
        for seed in seeds:
            t0 = time.perf_counter()
            facts = await store.neighbors(COLLECTION, [seed], hops=hops, fanout=20, limit=100)
            samples.append(time.perf_counter() - t0)
            sizes.append(len(facts))
        phases[f"expand_{hops}hop"] = {
            "latency": percentiles(samples),
            "facts_mean": round(sum(sizes) / len(sizes), 1),
            "facts_max": max(sizes),
            "host_other_cores": load.other_cores(),
        }
        print(json.dumps({f"expand_{hops}hop": phases[f"expand_{hops}hop"]}, indent=2))

    load = HostLoad()
    samples = []
    for name in [e.name for e in rng.sample(entities, min(args.queries, len(entities)))]:
        t0 = time.perf_counter()
        await store.find_entities(COLLECTION, [name])
        samples.append(time.perf_counter() - t0)
    phases["find_entities"] = {"latency": percentiles(samples), "host_other_cores": load.other_cores()}
    print(json.dumps({"find_entities": phases["find_entities"]}, indent=2))
    return phases


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "store": args.store,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "settings": {k: v for k, v in vars(args).items() if k != "password"},
        "loadavg_before": loadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="graph-bench-") as tmp:
        store: GraphStore
        server = None
        if args.store == "ladybug":
            store = LadybugStore(Path(tmp) / "graph")
            result["server"] = "LadybugDB (embedded)"
        elif args.neo4j_url:
            store = Neo4jStore(args.neo4j_url, user=args.user, password=args.password)
            result["server"] = args.neo4j_url
        else:
            server = start_falkordb(Path(tmp) / "falkordb")
            settle(server)
            store = Neo4jStore(server.url, user="", password="")
            result["server"] = "FalkorDB 4.18 (falkordblite 0.10.0) over Bolt"
        try:
            if args.store == "neo4j":
                await store.drop(COLLECTION)
            result["phases"] = await measure(store, args)
            if args.store == "neo4j":
                await store.drop(COLLECTION)
        finally:
            await store.aclose()
            if server is not None:
                stop_falkordb(server)
    result["loadavg_after"] = loadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["ladybug", "neo4j"], default="ladybug")
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--relations", type=int, default=30_000)
    parser.add_argument("--docs", type=int, default=1_000)
    parser.add_argument("--rewrites", type=int, default=100)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--neo4j-url", default=None, help="a Neo4j server of your own instead of FalkorDB")
    parser.add_argument("--user", default="neo4j")
    parser.add_argument("--password", default="")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if not args.no_save:
        out = result_path(f"graph-store-{args.store}")
        out.write_text(json.dumps(result, indent=2))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
