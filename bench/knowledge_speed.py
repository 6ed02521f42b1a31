"""Knowledge speed on this machine, per vector store: ingestion throughput against the
embedder alone, optimisation time, search latency and memory, at a given number of
chunks.

- ``--store edge``: `EdgeStore` (Qdrant Edge in-process, the embedded default);
  ``--store local``: `QdrantStore(path=...)` (qdrant-client's local mode, the store
  before issue 15).
- Ingestion: chunks/s of the whole pipeline (`KnowledgeBase.ingest`: chunk, embed,
  sparse-encode, write, switch versions) against the embedder alone on chunk texts of
  the same corpus (the floor: no pipeline beats its own embedder), interleaved: the
  ingestion runs in ``--slices`` parts with a floor sample before each and after the
  last, so load from other work on the shared cores hits both alike. Then
  ``store.optimize(collection, force=True)``, timed on its own.
- Search: p50/p95/max of ``store.search`` per mode (dense, sparse, hybrid; k=5,
  candidates=30) with the query vectors computed beforehand, so the query's
  embedding is excluded; and of `KnowledgeBase.search`, which includes it.
  Queries: the corpus questions and the ``rag`` suite's inputs, ``--rounds`` times.
- Memory: this process's RSS (it also holds the embedder and the corpus), the largest
  child's (the optimiser), the store's size on disk, and a fresh process that only
  opens the store and runs hybrid searches (what serving the collection costs).

The corpus is the sample corpus (eval/datasets/corpus) repeated with a varying line
per copy, so every copy is a distinct document. Writes
bench/results/knowledge-<store>-<chunks>-<UTC time>.json.

    .venv/bin/python bench/knowledge_speed.py --store edge|local [--chunks 10000] [--rounds 3] [--no-save]

The other knowledge benches (retrieval_quality.py, edge_readers.py, rag_latency.py)
import the helpers here: `open_kb`, `scaled_documents`, `prepared_corpus`,
`write_prepared`, `query_set`, `percentiles`, `HostLoad`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from knowledge import Chunk, Document, KnowledgeBase, KnowledgeSettings, VectorStore, build_embedder  # noqa: E402
from knowledge.cli import _items  # noqa: E402
from knowledge.embeddings.sparse import SparseVector  # noqa: E402
from knowledge.vectorstore.edge import EdgeStore  # noqa: E402
from knowledge.vectorstore.qdrant import QdrantStore  # noqa: E402

CORPUS = REPO / "eval" / "datasets" / "corpus"
QUESTIONS = REPO / "eval" / "datasets" / "corpus-questions.jsonl"
RAG_CASES = REPO / "eval" / "datasets" / "rag" / "cases.jsonl"
RESULTS = REPO / "bench" / "results"
CACHE = Path(tempfile.gettempdir()) / "switchyard-bench-vectors"
"""Embeddings of scaled corpora, by chunk texts (re-embedding 10k chunks takes a minute)."""
STORES = ("edge", "local")
MODES = ("dense", "sparse", "hybrid")


# ---- helpers shared by the knowledge benches ---------------------------------------------


def open_store(kind: str, path: Path) -> VectorStore:
    """``edge``: `EdgeStore` on ``path``; ``local``: qdrant-client's local mode on ``path``."""
    if kind == "local":
        return QdrantStore(path=path)
    if kind == "edge":
        return EdgeStore(path)
    raise SystemExit(f"unknown store {kind!r} (one of {', '.join(STORES)})")


def open_kb(kind: str, path: Path, settings: KnowledgeSettings | None = None) -> KnowledgeBase:
    """A knowledge base with the default (packaged) embedder over the chosen store."""
    settings = settings or KnowledgeSettings()
    return KnowledgeBase(open_store(kind, path), build_embedder(settings, None), settings)


def base_documents() -> list[Document]:
    return [d for d in _items([CORPUS]) if isinstance(d, Document)]


def scaled_documents(kb: KnowledgeBase, target_chunks: int) -> list[Document]:
    """The sample corpus repeated until it has about ``target_chunks`` chunks, each copy
    with its own id and a line of its own (so no two documents are the same)."""
    base = base_documents()
    per_copy = sum(len(kb.chunker.split(d)) for d in base)
    copies = max(1, round(target_chunks / per_copy))
    return [
        d.model_copy(update={"id": f"{n:04d}/{d.id}", "text": f"{d.text}\n\nCopy {n} of the archive, shelf {n % 97}."})
        for n in range(copies)
        for d in base
    ]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A document with its chunks and their vectors, ready for ``write_document``."""

    document: Document
    chunks: list[Chunk]
    dense: list[list[float]]
    sparse: list[SparseVector]


async def prepared_corpus(kb: KnowledgeBase, target_chunks: int) -> list[Prepared]:
    """The scaled corpus, chunked and embedded (dense vectors cached on disk by the
    chunk texts: benches that measure reads need the collection, not its embedding)."""
    import numpy as np

    documents = scaled_documents(kb, target_chunks)
    split = [kb.chunker.split(d) for d in documents]
    texts = [c.text for chunks in split for c in chunks]
    digest = hashlib.sha256("\x00".join([kb.embedder.name, *texts]).encode()).hexdigest()[:16]
    cache = CACHE / f"{kb.embedder.name}-{len(texts)}-{digest}.npy"
    if cache.exists():
        matrix = np.load(cache)
    else:
        started = time.perf_counter()
        matrix = np.asarray(await kb.embedder.embed_documents(texts), dtype=np.float32)
        CACHE.mkdir(parents=True, exist_ok=True)
        np.save(cache, matrix)
        print(f"embedded {len(texts)} chunks in {time.perf_counter() - started:.0f}s (cached in {cache})", flush=True)
    out: list[Prepared] = []
    row = 0
    for document, chunks in zip(documents, split, strict=True):
        dense = matrix[row : row + len(chunks)].tolist()
        row += len(chunks)
        out.append(Prepared(document, chunks, dense, [kb.sparse.document(c.text) for c in chunks]))
    return out


async def reused_corpus(kb: KnowledgeBase, target_chunks: int, prepared: Sequence[Prepared]) -> AsyncIterator[Prepared]:
    """The scaled corpus at ``target_chunks``, its dense vectors taken from
    ``prepared`` (`prepared_corpus` of a smaller size) instead of embedded: copy
    ``n`` of a document gets copy ``n mod copies`` 's vectors, plus Gaussian noise
    (cosine ~0.98 to the original, renormalised) for copies beyond the source's, so
    no two points have the same vector (exact duplicates would make a degenerate
    HNSW graph). A document whose chunks differ from its source copy's is embedded.
    Sparse vectors are computed from the real texts. For measuring reads at a size
    whose embedding would take too long; yields one document at a time (100k
    chunks of Python float lists would take gigabytes)."""
    import numpy as np

    source = {p.document.id: p for p in prepared}
    copies = len({i.split("/", 1)[0] for i in source})
    rng = np.random.default_rng(15)
    for document in scaled_documents(kb, target_chunks):
        copy, base_id = document.id.split("/", 1)
        origin = source[f"{int(copy) % copies:04d}/{base_id}"]
        chunks = kb.chunker.split(document)
        if len(chunks) != len(origin.chunks):
            dense = await kb.embedder.embed_documents([c.text for c in chunks])
        elif int(copy) < copies:
            dense = origin.dense
        else:
            matrix = np.asarray(origin.dense, dtype=np.float32)
            matrix += rng.normal(0.0, 0.2 / np.sqrt(matrix.shape[1]), matrix.shape).astype(np.float32)
            dense = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).tolist()
        yield Prepared(document, chunks, dense, [kb.sparse.document(c.text) for c in chunks])


async def write_prepared(kb: KnowledgeBase, collection: str, prepared: Iterable[Prepared] | AsyncIterator[Prepared]) -> float:
    """Write ``prepared`` into ``collection`` document by document; seconds taken."""
    started = time.perf_counter()
    await kb.store.ensure_collection(collection, dimensions=kb.embedder.dimensions, embedder=kb.embedder.name)
    if isinstance(prepared, AsyncIterator):
        async for p in prepared:
            await kb.store.write_document(collection, p.document, p.chunks, p.dense, p.sparse)
    else:
        for p in prepared:
            await kb.store.write_document(collection, p.document, p.chunks, p.dense, p.sparse)
    return time.perf_counter() - started


def query_texts() -> list[str]:
    """The corpus questions (English and Chinese) and the ``rag`` suite's inputs."""
    corpus = [json.loads(line)["q"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    rag = [json.loads(line)["input"] for line in RAG_CASES.read_text().splitlines() if line.strip()]
    return list(dict.fromkeys(corpus + rag))


async def query_set(kb: KnowledgeBase) -> list[tuple[str, list[float], SparseVector]]:
    """Each query text with its dense and sparse query vectors."""
    return [(q, await kb.embedder.embed_query(q), kb.sparse.query(q)) for q in query_texts()]


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max/mean in milliseconds of ``samples`` (seconds)."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)

    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def rss_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mb": fields.get("VmRSS", 0.0), "peak_rss_mb": fields.get("VmHWM", 0.0)}


def children_peak_rss_mb() -> float:
    """The largest peak RSS of this process's finished children (the optimiser's)."""
    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)


def disk_mb(path: Path) -> dict[str, float]:
    """The files under ``path``: their sizes, and the blocks they occupy (a write-ahead
    log's segments are preallocated, sparse until written)."""
    files = [f.stat() for f in path.rglob("*") if f.is_file()]
    return {
        "apparent_mb": round(sum(s.st_size for s in files) / 2**20, 1),
        "allocated_mb": round(sum(s.st_blocks * 512 for s in files) / 2**20, 1),
    }


class HostLoad:
    """Busy CPU of the whole host that is not this process (or its finished children),
    in cores, over a span: the lead's and other work on the 2 shared cores skews every
    latency here, so each phase records it."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system

    def other_cores(self) -> float:
        wall0, busy0, own0 = self._start
        wall1, busy1, own1 = self._sample()
        return round(max(0.0, (busy1 - busy0) - (own1 - own0)) / max(wall1 - wall0, 1e-9), 2)


def wait_quiet(max_s: float, *, below: float = 0.3, window_s: float = 5.0) -> float:
    """Wait (up to ``max_s``) until the rest of the host uses less than ``below`` cores
    over ``window_s``; the last window's figure. Other people's test runs share
    these cores: a measurement started in a quiet moment is worth the wait."""
    deadline = time.monotonic() + max_s
    while True:
        host = HostLoad()
        time.sleep(window_s)
        other = host.other_cores()
        if other < below or time.monotonic() >= deadline:
            print(f"host: {other} other cores busy", flush=True)
            return other


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def result_path(prefix: str) -> Path:
    return RESULTS / f"{prefix}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"


# ---- the measurement -------------------------------------------------------------------------


async def timed_searches(
    store: VectorStore, collection: str, queries: Sequence[tuple[str, list[float], SparseVector]], mode: str, rounds: int
) -> list[float]:
    samples = []
    for _ in range(rounds):
        for _text, dense, sparse in queries:
            started = time.perf_counter()
            await store.search(collection, dense=dense, sparse=sparse, mode=mode, k=5, candidates=30)  # type: ignore[arg-type]
            samples.append(time.perf_counter() - started)
    return samples


async def floor(kb: KnowledgeBase, texts: list[str]) -> dict[str, float]:
    """The embedder alone on ``texts``: chunks/s, its CPU per chunk (all threads), and
    the other load meanwhile. Taken before and after the ingestion, since other work
    on the shared cores comes and goes."""
    host = HostLoad()
    cpu = time.process_time()
    started = time.perf_counter()
    await kb.embedder.embed_documents(texts)
    seconds = time.perf_counter() - started
    return {
        "chunks": len(texts),
        "chunks_per_s": round(len(texts) / seconds, 1),
        "cpu_ms_per_chunk": round((time.process_time() - cpu) / len(texts) * 1000, 2),
        "other_cores": host.other_cores(),
    }


async def measure_ingestion(
    kb: KnowledgeBase, documents: list[Document], floor_chunks: int, slices: int, quiet_s: float
) -> tuple[dict[str, Any], int, dict[str, float]]:
    """The whole pipeline against its floor, interleaved (see the module docstring)."""
    await kb.embedder.embed_documents([c.text for c in kb.chunker.split(documents[0])])  # warm-up
    quiet = {"before_ingest": wait_quiet(quiet_s)}
    # The ingestion runs in `slices` consecutive parts, each after a floor sample
    # (the embedder alone on the first `floor_chunks` chunk texts of that part),
    # and one more sample after the last: other work on the shared cores comes
    # and goes, and interleaving exposes the pipeline and its floor to the same.
    size = -(-len(documents) // slices)
    parts = [documents[i : i + size] for i in range(0, len(documents), size)]
    floors: list[dict[str, float]] = []
    rows: list[dict[str, Any]] = []
    ingest_seconds = ingest_cpu = 0.0
    chunks = failed = 0
    host_all = HostLoad()
    for n, part in enumerate(parts):
        sample = [c.text for d in part for c in kb.chunker.split(d)][:floor_chunks]
        floors.append(await floor(kb, sample))
        host = HostLoad()
        cpu = time.process_time()
        started = time.perf_counter()
        report = await kb.ingest("bench", part)
        seconds = time.perf_counter() - started
        ingest_seconds += seconds
        ingest_cpu += time.process_time() - cpu
        chunks += report.chunks
        failed += report.failed
        rows.append({"chunks": report.chunks, "chunks_per_s": round(report.chunks / seconds, 1), "other_cores": host.other_cores()})
        print(f"part {n + 1}/{len(parts)}: {report.chunks} chunks at {rows[-1]['chunks_per_s']}/s; "
              f"floor before it {floors[-1]['chunks_per_s']}/s; other cores {rows[-1]['other_cores']}", flush=True)
        if report.failed:
            raise SystemExit(f"ingestion failed for {report.failed} documents: {report.errors[:3]}")
    floors.append(await floor(kb, sample))
    ingest_other = host_all.other_cores()
    floor_seconds = sum(f["chunks"] / f["chunks_per_s"] for f in floors)
    embed_rate = sum(f["chunks"] for f in floors) / floor_seconds
    embed_cpu_per_chunk = sum(f["cpu_ms_per_chunk"] * f["chunks"] for f in floors) / sum(f["chunks"] for f in floors)
    print(f"ingested {chunks} chunks in {ingest_seconds:.1f}s ({chunks / ingest_seconds:.1f}/s); "
          f"the embedder alone {embed_rate:.1f}/s", flush=True)
    ingest = {
        "measured": "the whole pipeline (KnowledgeBase.ingest)",
        "seconds": round(ingest_seconds, 1),
        "chunks_per_s": round(chunks / ingest_seconds, 1),
        "cpu_ms_per_chunk": round(ingest_cpu / chunks * 1000, 2),
        "floor_embedder_chunks_per_s": round(embed_rate, 1),
        "floor_cpu_ms_per_chunk": round(embed_cpu_per_chunk, 2),
        "ratio_to_floor": round(chunks / ingest_seconds / embed_rate, 3),
        "cpu_ratio_to_floor": round(embed_cpu_per_chunk / (ingest_cpu / chunks * 1000), 3),
        "other_cores": ingest_other,
        "parts": rows,
        "floors": floors,
    }
    return ingest, chunks, quiet


async def write_reused(kb: KnowledgeBase, target_chunks: int, source_chunks: int) -> tuple[dict[str, Any], int]:
    """No embedding: the store's writes alone, of vectors reused from a smaller corpus."""
    prepared = await prepared_corpus(kb, source_chunks)  # embedded (or loaded) before the clock starts
    counted: list[int] = []

    async def counting() -> AsyncIterator[Prepared]:
        async for p in reused_corpus(kb, target_chunks, prepared):
            counted.append(len(p.chunks))
            yield p

    host = HostLoad()
    seconds = await write_prepared(kb, "bench", counting())
    chunks = sum(counted)
    print(f"wrote {chunks} chunks with reused vectors in {seconds:.1f}s", flush=True)
    ingest = {
        "measured": (
            f"NOT the pipeline: dense vectors reused from the {source_chunks}-chunk corpus's embeddings "
            "(noised per copy), sparse vectors computed; write_document per document, timed with the "
            "sparse encoding and the chunking (no embedder in the loop)"
        ),
        "seconds": round(seconds, 1),
        "chunks_per_s": round(chunks / seconds, 1),
        "other_cores": host.other_cores(),
    }
    return ingest, chunks


async def measure(
    kind: str, target_chunks: int, rounds: int, floor_chunks: int, slices: int, quiet_s: float, reuse_from: int | None
) -> dict[str, Any]:
    memory: dict[str, Any] = {"before_open": rss_mb()}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as tmp:
        path = Path(tmp) / "store"
        kb = open_kb(kind, path)
        try:
            memory["embedder_loaded"] = rss_mb()
            documents = scaled_documents(kb, target_chunks)
            if reuse_from:
                ingest, chunks = await write_reused(kb, target_chunks, reuse_from)
                quiet: dict[str, float] = {}
            else:
                ingest, chunks, quiet = await measure_ingestion(kb, documents, floor_chunks, slices, quiet_s)
            memory["after_ingest"] = rss_mb()
            disk_before_optimize = disk_mb(path)

            host = HostLoad()
            started = time.perf_counter()
            changed = await kb.store.optimize("bench", force=True)
            optimize_seconds = time.perf_counter() - started
            optimize_other = host.other_cores()
            print(f"optimize(force=True): {optimize_seconds:.1f}s, changed={changed}", flush=True)
            memory["after_optimize"] = rss_mb()
            memory["optimizer_child_peak_rss_mb"] = children_peak_rss_mb()

            queries = await query_set(kb)
            quiet["before_search"] = wait_quiet(min(quiet_s, 60))
            search: dict[str, dict[str, Any]] = {}
            host = HostLoad()
            for mode in MODES:
                await timed_searches(kb.store, "bench", queries[:3], mode, 1)  # warm-up
                search[f"{mode}, query vectors given"] = percentiles(await timed_searches(kb.store, "bench", queries, mode, rounds))
                full = []
                for text, _dense, _sparse in queries:
                    started = time.perf_counter()
                    await kb.search("bench", text, k=5, mode=mode)  # type: ignore[arg-type]
                    full.append(time.perf_counter() - started)
                search[f"{mode}, with the query's embedding"] = percentiles(full)
                print(f"{mode}: {search[f'{mode}, query vectors given']}", flush=True)
            search_other = host.other_cores()
            memory["after_search"] = rss_mb()
            disk_after = disk_mb(path)
        finally:
            await kb.aclose()
        probe = serve_probe(kind, path, queries, rounds)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": kind,
        "store_class": "EdgeStore" if kind == "edge" else "QdrantStore(path=...) (qdrant-client local mode)",
        "documents": len(documents),
        "chunks": chunks,
        "ingest": ingest,
        "optimize": {"seconds": round(optimize_seconds, 2), "changed": changed, "other_cores": optimize_other},
        "search": search,
        "search_settings": {"k": 5, "candidates": 30, "queries": len(queries), "rounds": rounds, "other_cores": search_other},
        "memory": memory,
        "disk_mb": {"after_ingest": disk_before_optimize, "after_optimize_and_searches": disk_after},
        "serve_probe": probe,
        "other_cores_when_started": quiet,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def serve_probe(kind: str, path: Path, queries: Sequence[tuple[str, list[float], SparseVector]], rounds: int) -> dict[str, Any]:
    """Open the closed store in a fresh process (no embedder, no corpus in memory), run
    the hybrid searches, and report its memory: what serving the collection costs."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([[t, d, list(s[0]), list(s[1])] for t, d, s in queries], f)
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--probe", str(path), "--store", kind, "--rounds", str(rounds), "--queries", f.name],
            capture_output=True, text=True, check=False, timeout=1800,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


async def probe(kind: str, path: Path, queries_file: Path, rounds: int) -> dict[str, Any]:
    raw = json.loads(queries_file.read_text())
    queries = [(t, d, (i, v)) for t, d, i, v in raw]
    before = rss_mb()
    started = time.perf_counter()
    store = open_store(kind, path)
    opened = time.perf_counter() - started
    try:
        started = time.perf_counter()
        await store.search("bench", dense=queries[0][1], sparse=queries[0][2], mode="hybrid", k=5, candidates=30)
        first = time.perf_counter() - started
        hybrid = percentiles(await timed_searches(store, "bench", queries, "hybrid", rounds))
        after = rss_mb()
    finally:
        await store.aclose()
    return {
        "open_s": round(opened, 3),
        "first_hybrid_ms": round(first * 1000, 2),
        "hybrid": hybrid,
        "rss_before_open_mb": before["rss_mb"],
        "rss_after_searches_mb": after["rss_mb"],
        "peak_rss_mb": after["peak_rss_mb"],
        "store_rss_mb": round(after["peak_rss_mb"] - before["rss_mb"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=STORES, required=True)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="times each query is searched per mode")
    parser.add_argument("--floor-chunks", type=int, default=300, help="chunks per floor sample (the embedder alone)")
    parser.add_argument("--slices", type=int, default=10, help="parts the ingestion runs in, a floor sample before each")
    parser.add_argument("--reuse-vectors-from", type=int, metavar="CHUNKS",
                        help="skip the ingestion: write the corpus with dense vectors reused from the corpus at CHUNKS (see reused_corpus)")
    parser.add_argument("--quiet-wait-s", type=float, default=180.0, help="wait up to this long for the host to be quiet")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--queries", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(asyncio.run(probe(args.store, args.probe, args.queries, args.rounds))))
        return
    result = asyncio.run(measure(args.store, args.chunks, args.rounds, args.floor_chunks, args.slices, args.quiet_wait_s, args.reuse_vectors_from))
    ingest, optimize = result["ingest"], result["optimize"]
    print(f"\n{result['store']}: {result['documents']} documents, {result['chunks']} chunks")
    print("\n| ingestion | value |\n|---|---|")
    if "ratio_to_floor" not in ingest:
        print(f"| {ingest['measured']} | {ingest['chunks_per_s']} chunks/s ({ingest['seconds']} s) |")
    else:
        print(f"| whole pipeline | {ingest['chunks_per_s']} chunks/s ({ingest['seconds']} s) |")
        print(f"| embedder alone (floor: {len(ingest['floors'])} samples of {ingest['floors'][0]['chunks']} chunks, between the parts) | "
              f"{ingest['floor_embedder_chunks_per_s']} chunks/s |")
        print(f"| ratio to floor (throughput) | {ingest['ratio_to_floor']} |")
        print(f"| CPU per chunk, pipeline / floor (all threads) | {ingest['cpu_ms_per_chunk']} / {ingest['floor_cpu_ms_per_chunk']} ms |")
    print(f"| optimize(force=True) | {optimize['seconds']} s (changed: {optimize['changed']}) |")
    print(f"| other load (cores) during ingest / optimize | {ingest['other_cores']} / {optimize['other_cores']} |")
    print("\n| search | n | p50 ms | p95 ms | p99 ms | max ms |\n|---|---|---|---|---|---|")
    for name, row in result["search"].items():
        print(f"| {name} | {row['n']} | {row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['max_ms']} |")
    memory, probe_result = result["memory"], result["serve_probe"]
    print("\n| memory | MB |\n|---|---|")
    print(f"| this process, embedder loaded (RSS) | {memory['embedder_loaded']['rss_mb']} |")
    print(f"| this process, peak (embedder + corpus + store) | {memory['after_search']['peak_rss_mb']} |")
    print(f"| optimiser child, peak | {memory['optimizer_child_peak_rss_mb']} |")
    for when, size in result["disk_mb"].items():
        print(f"| store on disk, {when.replace('_', ' ')}: allocated (apparent) | {size['allocated_mb']} ({size['apparent_mb']}) |")
    if "error" in probe_result:
        print(f"| serve probe | failed: {probe_result['error'][-300:]} |")
    else:
        print(f"| serve probe: peak RSS of a process that opens the store and searches | {probe_result['peak_rss_mb']} (store: +{probe_result['store_rss_mb']}) |")
        print(f"| serve probe: open {probe_result['open_s']} s, first hybrid {probe_result['first_hybrid_ms']} ms, hybrid p50/p95 "
              f"{probe_result['hybrid']['p50_ms']}/{probe_result['hybrid']['p95_ms']} ms | |")
    if not args.no_save:
        out = result_path(f"knowledge-{args.store}-{result['chunks']}")
        out.write_text(json.dumps(result, indent=2))
        print(f"\nresults written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
