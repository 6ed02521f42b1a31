"""The ``knowledge`` section of ``config/switchyard.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChunkingSettings",
    "EdgeSettings",
    "EmbedderSettings",
    "ExtractionSettings",
    "GraphRetrievalSettings",
    "GraphSettings",
    "KnowledgeSettings",
    "RagSettings",
    "RetrievalSettings",
]


class EmbedderSettings(BaseModel):
    """Which model turns text into vectors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "openai"] = "local"
    """``local``: the model shipped in a PyPI package, on the CPU, offline.
    ``openai``: an OpenAI-compatible ``/v1/embeddings`` backend of the gateway (vLLM or
    TEI serving an embedding model), named by ``alias``."""
    model: str = "use-multilingual-v3"
    """``local``: the packaged model (`knowledge.embeddings.local.PACKAGED_MODELS`)."""
    alias: str | None = None
    """``openai``: the model alias or backend id in the model registry."""
    batch_size: int = Field(default=32, ge=1, le=1024)
    dimensions: int | None = None
    """``openai``: the vectors' size, if the backend does not say (checked on first use)."""


class ChunkingSettings(BaseModel):
    """How documents are cut into chunks, in the embedder's tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=200, ge=16, le=8192)
    """Chunk size, in the embedder's tokens (the SentencePiece pieces of the default model)."""
    overlap_tokens: int = Field(default=40, ge=0)
    """Tokens repeated from the end of one chunk at the start of the next."""


class RetrievalSettings(BaseModel):
    """Defaults for searches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["hybrid", "dense", "sparse"] = "hybrid"
    k: int = Field(default=5, ge=1, le=100)
    candidates: int = Field(default=30, ge=1, le=1000)
    """Per vector kind, before fusion."""


class RagSettings(BaseModel):
    """The ``rag`` graph's retrieval and grading."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidates: int = Field(default=8, ge=1, le=50)
    """Chunks retrieved before grading."""
    min_relevance: float = Field(default=0.28, ge=-1.0, le=1.0)
    """Cosine similarity a chunk needs to be used. Measured on the sample corpus with
    the default embedder (docs/knowledge.md): 39 of 40 answerable questions keep their
    source, all 3 unanswerable ones keep nothing."""
    max_sources: int = Field(default=4, ge=1, le=20)
    """Chunks given to the model (and cited), best first."""
    rewrite: bool = True
    """Rewrite a follow-up question into a standalone search query (multi-turn only)."""
    node_timeout_s: float = Field(default=30.0, gt=0)
    """Limit for each of rewrite and retrieve (generation has the run's deadline)."""


class EdgeSettings(BaseModel):
    """The embedded vector store (Qdrant Edge, in this process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = None
    """The store's directory; default ``<data_dir>/vectors``. One process at a time."""
    optimize_min_points: int = Field(default=5000, ge=1)
    """Chunks written or deleted since the last optimisation that start one by
    themselves. Below this a collection's new points are searched by brute force,
    which costs about a millisecond per 5,000 chunks of 512 dimensions."""
    optimize_delay_s: float | None = Field(default=5.0, ge=0)
    """Quiet time after the last write before that optimisation starts (so one
    ingestion is optimised once, at its end); null: only ``switchyard ingest`` and
    `VectorStore.optimize` optimise."""


class ExtractionSettings(BaseModel):
    """How entities and relations are extracted from chunks (``switchyard ingest --graph``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alias: str = "chat-default"
    """The model alias asked; its backend must declare ``json_schema`` output."""
    max_entities: int = Field(default=6, ge=1, le=100)
    """Most entities the schema lets the model return per chunk. Small by default: a
    small model under a grammar fills what the schema allows, and SmolLM2-135M's
    answers were cut at 512 tokens on 4 of 6 sample chunks with 12 entities and 12
    relations, none with 6 and 4 (`knowledge.extraction.extractor.extraction_schema`).
    Raise both for a larger model."""
    max_relations: int = Field(default=4, ge=0, le=100)
    """Most relations per chunk."""
    max_tokens: int = Field(default=512, ge=16, le=8192)
    """Longest answer per chunk."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Limit per chunk; a chunk that times out is counted failed, the rest go on."""
    concurrency: int = Field(default=1, ge=1, le=64)
    """Chunks extracted at once (a local CPU model serves one at a time)."""


class GraphRetrievalSettings(BaseModel):
    """Graph retrieval: entity linking, expansion and fact ranking."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hops: int = Field(default=2, ge=1, le=4)
    """How far from the question's entities facts are collected."""
    fanout: int = Field(default=20, ge=1, le=500)
    """Most relations followed from one entity per hop."""
    max_facts: int = Field(default=12, ge=1, le=200)
    """Facts given to the model, best first."""
    link_k: int = Field(default=5, ge=1, le=50)
    """Entities looked up by meaning in the ``<collection>__entities`` companion."""
    min_link_relevance: float = Field(default=0.5, ge=-1.0, le=1.0)
    """Cosine similarity an entity found by meaning needs to seed the expansion
    (exact and alias matches always do)."""


class GraphSettings(BaseModel):
    """The knowledge graph: Neo4j when ``neo4j_url`` is set, else LadybugDB in process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    neo4j_url: str | None = None
    """A Neo4j server (``neo4j://host:7687`` or ``bolt://host:7687``). Unset: the embedded store."""
    neo4j_user: str = "neo4j"
    neo4j_password: str | None = None
    neo4j_database: str | None = None
    """The Neo4j database; unset: the server's default."""
    path: Path | None = None
    """The embedded store's directory; default ``<data_dir>/graph``. One process at a time."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Limit for each graph store call."""
    extraction: ExtractionSettings = ExtractionSettings()
    retrieval: GraphRetrievalSettings = GraphRetrievalSettings()


class KnowledgeSettings(BaseModel):
    """Where vectors live and how documents become them.

    Override from the environment with ``SWITCHYARD_KNOWLEDGE__<FIELD>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    qdrant_url: str | None = None
    """A Qdrant server (``http://host:6333``). Unset: the embedded store (``edge``)."""
    qdrant_api_key: str | None = None
    edge: EdgeSettings = EdgeSettings()
    """The embedded store, used when ``qdrant_url`` is unset."""
    qdrant_path: Path | None = None
    """Where earlier versions kept the embedded store (qdrant-client's local mode);
    default ``<data_dir>/qdrant``. Only ``switchyard knowledge migrate`` reads it."""
    default_collection: str = "default"
    """What the ``rag`` graph searches when a request names no collection."""
    embedder: EmbedderSettings = EmbedderSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    rag: RagSettings = RagSettings()
    graph: GraphSettings = GraphSettings()
    """The knowledge graph (GraphRAG): store, extraction and retrieval."""
