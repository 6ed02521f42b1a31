"""The ``openai`` embedder: vectors from a gateway alias's ``/v1/embeddings``, here the
real llama-server started with ``--embeddings`` (SmolLM2's vectors are OpenAI-shaped
but poor for retrieval: these tests check the plumbing, not the ranking)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from gateway import ModelGateway, load_registry
from gateway.local import start_backend, stop_backend
from knowledge import Document, EmbeddingError, KnowledgeBase, KnowledgeError, KnowledgeSettings
from knowledge.embeddings.local import LocalEmbedder
from knowledge.embeddings.openai import GatewayEmbedder
from knowledge.vectorstore.edge import EdgeStore
from tests.fakes.openai_backend import free_port

pytestmark = [pytest.mark.integration, pytest.mark.llm]


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("embed-backend")
    port, dead = free_port(), free_port()
    launch = {"context_size": 2048, "parallel": 2, "threads": 2, "cache_ram_mb": 0, "chat_template": None,
              "extra_args": ["--embeddings", "--pooling", "mean"]}
    caps = {"context_window": 512, "embeddings": True, "embedding_dimensions": 576}
    config = {
        "backends": {
            "emb": {"kind": "llamacpp", "base_url": f"http://127.0.0.1:{port}/v1", "model": "smollm2", "capabilities": caps, "launch": launch},
            "gone": {"kind": "openai", "base_url": f"http://127.0.0.1:{dead}/v1", "model": "x", "capabilities": caps,
                     "timeouts": {"connect_s": 1, "read_s": 2}},
            "chat-only": {"kind": "openai", "base_url": f"http://127.0.0.1:{dead}/v1", "model": "x",
                          "capabilities": {"context_window": 512}},
        },
        "aliases": {"embed-default": "emb", "gone": "gone", "chat-only": "chat-only"},
    }
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(config))
    backend = load_registry(path).backends["emb"]
    start_backend(backend, tmp)
    try:
        yield path
    finally:
        stop_backend(backend, tmp)


@pytest.fixture
async def gateway(registry_file: Path) -> AsyncIterator[ModelGateway]:
    gateway = ModelGateway(load_registry(registry_file))
    yield gateway
    await gateway.aclose()


async def test_vectors_come_from_the_backend(gateway: ModelGateway, tmp_path: Path) -> None:
    embedder = GatewayEmbedder(gateway, "embed-default", batch_size=2)
    vectors = await embedder.embed_documents(["one", "two", "three"])  # two requests
    assert [len(v) for v in vectors] == [576, 576, 576] and vectors[0] != vectors[1]
    store = EdgeStore(tmp_path / "vectors")
    try:
        knowledge = KnowledgeBase(store, embedder, KnowledgeSettings())
        report = await knowledge.ingest("remote", [Document(id="a", text="Ferries leave at dawn."), Document(id="b", text="Bread.")])
        assert (report.added, report.failed) == (2, 0)
        assert len(await knowledge.search("remote", "ferries", k=2)) == 2
        [info] = await knowledge.collections()
        assert (info.embedder, info.dimensions) == ("openai:smollm2", 576)
        # A collection keeps the embedder that built it.
        local = KnowledgeBase(store, LocalEmbedder.packaged("use-multilingual-v3"), KnowledgeSettings())
        with pytest.raises(KnowledgeError, match="holds vectors of 'openai:smollm2' .576 dimensions.; the configured embedder is 'use-multilingual-v3' .512."):
            await local.ingest("remote", [Document(id="c", text="x")])
    finally:
        await store.aclose()


async def test_backend_failures_are_named(gateway: ModelGateway, tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="does not declare the embeddings capability"):
        GatewayEmbedder(gateway, "chat-only")
    store = EdgeStore(tmp_path / "vectors")
    try:
        knowledge = KnowledgeBase(store, GatewayEmbedder(gateway, "gone"), KnowledgeSettings())
        report = await knowledge.ingest("c", [Document(id="a", text="text")])
        assert report.failed == 1 and "embedding backend failed" in report.errors[0]["reason"]
        assert "gone" in report.errors[0]["reason"]
    finally:
        await store.aclose()
