"""The serving layer's `eval.runner.CaseRunner`: eval cases run as the server runs graphs.

``eval`` defines what it needs (`eval.runner`); this module provides it, so the layers
stay one-way. Each case is a stateless graph run inside ``host.open(RunPlan(...))``,
the run host both protocols use: run slot, run context (tenant lists, output policy,
tool audit, budget), routing, metrics and the ``run`` audit record are the server's
own. The graph is built by the same `GraphRegistry` and builder the server uses, from
the configured graph's entry with its ``model`` replaced by the model under
evaluation, and sampled at temperature 0 with a fixed seed.

The model is an alias, or a backend id (``backend:<id>`` when an alias has the same
name). A backend id gets a private alias with that backend alone and no fallbacks, on
a gateway of its own (closed afterwards): the eval then measures that backend and
nothing else, whatever the configured aliases say.

Knowledge: an eval's scratch collections never go into the user's data. With the
embedded (Qdrant Edge) store, the eval keeps its own store under
``<eval_runs_dir>/vectors``; this also lets ``switchyard eval run`` work while
``switchyard serve`` holds the data directory's store. With a Qdrant server, the
suite's scratch collection is created there under its own name. A dataset written for
the user's own collection (no corpus) reads the user's knowledge base instead
(``user_collections``), and never writes it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from eval.datasets import Suite
from eval.metrics import LatencySla
from eval.run import CaseJudge
from eval.runner import CaseOutput, CaseRequest
from gateway import Backend, ModelGateway, UnknownModelError
from graphs import GraphRegistry, OutputBlockedError, UnknownGraphError
from knowledge import DocumentParseError, KnowledgeBase, KnowledgeError, KnowledgeGraph, entities_collection, open_graph_store
from knowledge.knowledge_graph import GraphReport
from knowledge.ontology import load_ontology

from knowledge.ingestion.loaders import discover, load_file
from knowledge.knowledge_base import build_embedder
from knowledge.models import Document, IngestReport
from knowledge.vectorstore.edge import EdgeStore
from knowledge.vectorstore.qdrant import QdrantStore
from serving.audit import AuditLog
from serving.auth import Principal, TenantSettings
from serving.guardrails import Guardrails, OutputGuard
from serving.limits import RunSlots
from serving.observability import ServingMetrics
from serving.platform import Platform
from serving.runs.checks import SamplingParams
from serving.runs.host import RunHost, RunPlan
from serving.settings import Settings
from tools import ToolRegistry

__all__ = [
    "BACKEND_PREFIX",
    "EVAL_KEY_ID",
    "EVAL_TENANT",
    "ServingCaseRunner",
    "cli_host",
    "corpus_documents",
    "eval_principal",
    "backends_of",
    "build_judge",
    "open_runner",
    "resolve_model",
    "sla_for",
]

log = logging.getLogger(__name__)

EVAL_TENANT = "switchyard-eval"
"""The tenant eval runs are recorded under (audit log, metrics, spans)."""
EVAL_KEY_ID = "eval-runner"
"""The key id of eval runs (they take run slots under it)."""
_PRIVATE_ALIAS = "eval-backend-{backend}"
# A knowledge_search result: "[doc id] passage" blocks separated by blank lines.
_PASSAGE = re.compile(r"^\[([^\]\n]+)\] (.*)$", re.S)


def eval_principal(graph: str, *, collections: Sequence[str] = (), tools: Sequence[str] = ()) -> Principal:
    """The principal of eval runs: an internal tenant allowed the suite's graph, its
    collections and the graph's tools, nothing else."""
    return Principal(
        tenant=EVAL_TENANT,
        key_id=EVAL_KEY_ID,
        settings=TenantSettings(graphs=(graph,), models=(), tools=tuple(tools), collections=tuple(collections)),
    )


BACKEND_PREFIX = "backend:"
"""``backend:<id>`` names a backend even where an alias has the same name."""


def resolve_model(gateway: ModelGateway, model: str) -> tuple[str, Backend | None]:
    """``model`` as an alias of ``gateway``'s registry: itself when it is an alias, or
    the private alias of a backend id with the backend. A name that is both is the
    alias; ``backend:<id>`` is always the backend.

    Raises:
        UnknownModelError: neither an alias nor a backend id.
    """
    registry = gateway.registry
    forced = model.startswith(BACKEND_PREFIX)
    name = model.removeprefix(BACKEND_PREFIX)
    if not forced and name in registry.aliases:
        return name, None
    backend = registry.backends.get(name)
    if backend is None:
        known = registry.backends if forced else {**registry.aliases, **registry.backends}
        raise UnknownModelError(model, known)
    return _PRIVATE_ALIAS.format(backend=name), backend


def sla_for(platform: Platform, model: str, *, graph: str | None = None) -> LatencySla | None:
    """The latency promise ``model`` is checked against: an alias's ``sla``. A backend id
    is a candidate for the alias ``graph`` calls (its ``model`` in the settings), so it is
    held to that alias's promise. None when there is no such promise."""
    aliases = platform.gateway.registry.aliases
    alias = None if model.startswith(BACKEND_PREFIX) else aliases.get(model)
    if alias is None and graph is not None and (spec := platform.settings.graphs.get(graph)) is not None:
        alias = aliases.get(spec.model)
    if alias is None or alias.sla is None:
        return None
    return LatencySla(ttft_s=alias.sla.ttft_s, total_s=alias.sla.total_s)


def corpus_documents(suite: Suite) -> list[Document | DocumentParseError]:
    """The suite's corpus (every folder or file it lists) as ingestion reads it (ids as
    ``switchyard ingest`` gives them: a directory's files by their path inside it, a
    file by its name)."""
    if suite.corpus is None:
        return []
    items: list[Document | DocumentParseError] = []
    for found in discover(list(suite.corpora or (suite.corpus,))):
        if isinstance(found, DocumentParseError):
            items.append(found)
            continue
        file, doc_id, named = found
        try:
            loaded = load_file(file, doc_id, follow_links=named)
        except DocumentParseError as exc:
            items.append(exc)
            continue
        items += loaded.documents
        items += loaded.errors
    return items


async def _backend_version(backend: Backend, timeout_s: float = 2.0) -> str:
    """``id (model)``, with the server's version when it reports one (llama.cpp's
    ``/props`` build, vLLM's ``/version``); never fails."""
    described = f"{backend.id} ({backend.model}"
    path = {"llamacpp": "/props", "vllm": "/version"}.get(backend.kind)
    if path is not None:
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                body = (await client.get(backend.root_url + path)).json()
            version = (body.get("build_info") or body.get("version")) if isinstance(body, dict) else None
            if version:
                described += f", {backend.kind} {version}"
        except (httpx.HTTPError, ValueError):
            pass
    return described + ")"


class _EvalKnowledge:
    """The knowledge base eval runs read and write (see the module docstring), opened
    on first use."""

    def __init__(self, platform: Platform, *, user_collections: bool = False) -> None:
        self._platform = platform
        self._user = user_collections
        self._kb: KnowledgeBase | None = None
        self._graph: KnowledgeGraph | None = None
        self._own_graph = False
        self._own_store = False
        self._own_embedder = False
        self.shared = False
        """The store is a Qdrant server others write to too (not the eval's own directory)."""

    def get(self) -> KnowledgeBase:
        if self._kb is not None:
            return self._kb
        settings = self._platform.settings
        shared = self._platform.knowledge
        if self._user:
            if shared is None:
                raise KnowledgeError(
                    "this eval asks the user's collections, but this process has no knowledge base open "
                    "(a server holds the data directory's store?)"
                )
            self._kb = shared
            return self._kb
        if settings.knowledge.qdrant_url is not None and shared is not None:
            self._kb = shared  # a Qdrant server: scratch collections under their own names there
            self.shared = True
            return self._kb
        # The store first: when it is locked (another eval on this directory), no
        # embedder was built to be left open.
        store: QdrantStore | EdgeStore
        if settings.knowledge.qdrant_url is not None:
            store = QdrantStore(url=settings.knowledge.qdrant_url, api_key=settings.knowledge.qdrant_api_key)
            self.shared = True
        else:
            # Optimised only on request: the eval's corpora are small, and its runs end.
            store = EdgeStore(settings.eval_runs_dir / "vectors", optimize_delay_s=None)
        if shared is not None:
            embedder = shared.embedder
        else:
            try:
                embedder = build_embedder(settings.knowledge, self._platform.gateway)
            except BaseException:
                if isinstance(store, EdgeStore):
                    store.close_now()
                raise
            self._own_embedder = True
        self._own_store = True
        self._kb = KnowledgeBase(store, embedder, settings.knowledge)
        return self._kb

    def graph(self) -> KnowledgeGraph:
        """The knowledge graph over `get`'s knowledge base: the platform's when the eval
        uses the platform's knowledge base (the user's collections, a Qdrant server),
        else one of the eval's own (see the module docstring), opened on first use.

        Raises:
            KnowledgeError: the eval uses the platform's knowledge base and this
                process has no knowledge graph open.
        """
        if self._graph is not None:
            return self._graph
        kb = self.get()
        if kb is self._platform.knowledge:
            shared = self._platform.graph
            if shared is None:
                raise KnowledgeError("this eval needs a knowledge graph, and this process has none open (knowledge.graph)")
            self._graph = shared
            return shared
        settings = self._platform.settings
        graph_settings = settings.knowledge.graph
        # The eval's own directory, whatever knowledge.graph.path says (the user's graph
        # is never written by an eval); a Neo4j server holds scratch graphs by name.
        store = open_graph_store(graph_settings.model_copy(update={"path": settings.eval_runs_dir / "graph"}), settings.eval_runs_dir)
        self._graph = KnowledgeGraph(store, kb, graph_settings, self._platform.gateway)
        self._own_graph = True
        return self._graph

    @property
    def user_collections(self) -> bool:
        return self._user

    @property
    def location(self) -> str | None:
        return None if self._kb is None else str(getattr(self._kb.store, "location", ""))

    async def aclose(self) -> None:
        if self._graph is not None and self._own_graph:
            await self._graph.aclose()
        if self._kb is None:
            return
        if self._own_store:
            await self._kb.store.aclose()
        if self._own_embedder:
            await self._kb.embedder.aclose()


class ServingCaseRunner:
    """Runs eval cases through the run host; made by `open_runner`."""

    def __init__(
        self,
        platform: Platform,
        host: RunHost,
        model: str,
        *,
        alias: str,
        gateway: ModelGateway,
        pinned: Backend | None,
        seed: int,
        user_collections: bool = False,
    ) -> None:
        self._platform = platform
        self._host = host
        self._model = model
        self.alias = alias
        """The alias the graphs call (the private one for a backend id)."""
        self.gateway = gateway
        self.pinned = pinned
        """The backend a backend id pinned the run to, if it was one."""
        self.seed = seed
        self.knowledge = _EvalKnowledge(platform, user_collections=user_collections)
        self._graphs: dict[str, GraphRegistry] = {}
        self._served: dict[str, None] = {}
        self._versions: dict[str, str] = {}
        self.ingests: list[IngestReport] = []
        """The ingestions `ensure_corpus` made (none when the collection already held
        the corpus)."""
        self.graph_imports: list[GraphReport] = []
        """The knowledge graph imports `ensure_corpus` made (``graphrag`` suites)."""

    @property
    def model(self) -> str:
        return self._model

    @property
    def backend_version(self) -> str:
        """The backends that served the run's cases (else those the alias may use), each
        with its model and, once it has served a case, its version."""
        ids = list(self._served) or [b.id for b in self.gateway.registry.candidates(self.alias)]
        backends = self.gateway.registry.backends
        return ", ".join(self._versions.get(i) or f"{i} ({backends[i].model})" for i in ids)

    def graph(self, graph_id: str) -> GraphRegistry:
        """The graph ``graph_id`` built for the model under evaluation (once).

        Raises:
            UnknownGraphError: no graph ``graph_id`` is configured.
            GraphLoadError: it cannot be built.
        """
        built = self._graphs.get(graph_id)
        if built is not None:
            return built
        specs = self._platform.settings.graphs
        if graph_id not in specs:
            raise UnknownGraphError(graph_id, list(specs))
        spec = specs[graph_id].model_copy(update={"model": self.alias})
        # The chat graph needs no knowledge base: do not load the embedder for it; only
        # graphrag (and an agent given graph_neighbors) need the knowledge graph.
        knowledge = self.knowledge.get() if graph_id != "chat" else None
        needs_graph = graph_id == "graphrag" or "graph_neighbors" in spec.tools
        graph = self.knowledge.graph() if knowledge is not None and needs_graph else None
        tools = ToolRegistry.builtin(self._platform.settings.tools, knowledge, graph=graph)
        built = self._graphs[graph_id] = GraphRegistry.load(
            {graph_id: spec}, self.gateway, knowledge=knowledge, tools=tools, graph=graph
        )
        return built

    async def ensure_corpus(self, suite: Suite, collection: str) -> None:
        """Ingest ``suite``'s corpus into ``collection`` unless it already holds exactly
        those documents (same ids, contents and sources; nothing else).

        Raises:
            KnowledgeError: a corpus file cannot be read, or ingestion failed, or the
                runner reads the user's collections (it never writes them).
        """
        if self.knowledge.user_collections:
            raise KnowledgeError(f"suite {suite.name!r} has a corpus: evaluate it without user_collections")
        items = await asyncio.to_thread(corpus_documents, suite)
        broken = [i for i in items if isinstance(i, DocumentParseError)]
        if broken:
            raise KnowledgeError(
                f"suite {suite.name!r}: corpus {suite.corpus}: " + "; ".join(f"{e.source}: {e.reason}" for e in broken)
            )
        documents = [i for i in items if isinstance(i, Document)]
        kb = self.knowledge.get()
        stored = await kb.store.documents(collection) if await kb.store.has_collection(collection) else {}
        # On a shared Qdrant server the eval writes as its own tenant, so that
        # ``delete_missing`` can only remove what an eval stored, and it never touches a
        # collection someone else wrote to (the embedded eval store is the eval's alone).
        shared = self.knowledge.shared
        owner = EVAL_TENANT if shared else None
        foreign = sorted({d.owner or "the operator" for d in stored.values() if d.owner != owner})
        if shared and foreign:
            raise KnowledgeError(
                f"collection {collection!r} holds documents of {', '.join(foreign)}: the eval ingests suite "
                f"{suite.name!r} only into a collection of its own (pass another --collection)"
            )
        wanted = {d.id: d for d in documents}
        if stored.keys() == wanted.keys() and all(
            stored[i].version == d.hash and stored[i].source == d.source for i, d in wanted.items()
        ):
            log.info("collection %r already holds the %d documents of suite %s", collection, len(wanted), suite.name)
            await self._ensure_graph(suite, collection)
            return
        report = await kb.ingest(collection, documents, delete_missing=True, tenant=owner)
        if report.failed:
            raise KnowledgeError(
                f"suite {suite.name!r}: ingesting its corpus into {collection!r} failed for "
                + "; ".join(f"{e['source']}: {e['reason']}" for e in report.errors)
            )
        self.ingests.append(report)
        log.info(
            "collection %r: %d added, %d updated, %d deleted for suite %s (%s)",
            collection, report.added, report.updated, report.deleted, suite.name, self.knowledge.location,
        )
        await self._ensure_graph(suite, collection)

    async def _ensure_graph(self, suite: Suite, collection: str) -> None:
        """Rebuild ``collection``'s knowledge graph from ``suite``'s ontology and curated
        facts (nothing for a suite without ``knowledge_graph``).

        The graph is dropped and imported again on every run: a few dozen facts cost
        well under a second, and an edited facts file can never leave stale facts
        behind. Entity points the new graph no longer has are removed from the
        collection's entity companion.

        Raises:
            KnowledgeError: the ontology does not load, or a fact line is invalid (the
                suite's facts must all import: a dropped line would measure a
                different graph than the suite says).
        """
        if suite.ontology is None:
            return
        graph = self.knowledge.graph()
        ontology = await asyncio.to_thread(load_ontology, suite.ontology)
        await graph.store.drop(collection)
        if suite.facts is None:
            await graph.bind(collection, ontology)
            return
        lines = (await asyncio.to_thread(suite.facts.read_text, encoding="utf-8")).splitlines()
        report = await graph.import_facts(collection, lines, ontology=ontology, source=str(suite.facts))
        if report.invalid:
            detail = "; ".join(f"{p['where']}: {p['reason']} ({p['detail']})" for p in report.problems[:5])
            raise KnowledgeError(f"suite {suite.name!r}: {suite.facts}: invalid facts {report.invalid}: {detail}")
        companion = entities_collection(collection)
        store = self.knowledge.get().store
        if await store.has_collection(companion):
            points = list(await store.documents(companion))
            alive = {e.id for e in await graph.store.entities(collection, points)}
            for stale in (p for p in points if p not in alive):
                await store.delete_document(companion, stale)
        self.graph_imports.append(report)
        log.info(
            "collection %r: knowledge graph of suite %s: %d entities, %d relations",
            collection, suite.name, sum(report.entities.values()), sum(report.relations.values()),
        )

    async def run_case(self, request: CaseRequest) -> CaseOutput:
        """Run one case as a stateless graph run through the run host. Any failure (the
        backend down, a refused run, a graph error) is the output's ``error``."""
        started = time.perf_counter()
        try:
            registered = self.graph(request.graph).get(request.graph)
            params = SamplingParams(temperature=0, seed=request.seed, max_tokens=request.max_tokens).as_params()
            self.gateway.check_alias(self.alias, params)
        except Exception as exc:  # boundary: a case that cannot start is its error
            return CaseOutput(error=_describe(exc), total_s=time.perf_counter() - started)
        collection = request.collection or (
            self.knowledge.get().settings.default_collection if request.graph != "chat" else None
        )
        principal = eval_principal(
            request.graph, collections=(collection,) if collection else (), tools=registered.spec.tools
        )
        plan = RunPlan(
            protocol="openai",
            kind="graph",
            target=request.graph,
            principal=principal,
            request_id=f"eval-{uuid.uuid4().hex[:16]}",
            run_id=f"eval-{uuid.uuid4().hex}",
            deadline_s=self._platform.settings.server.run_deadline_s,
            model_params=params,
            collection=collection,
            attributes={"switchyard.eval.case": request.case.id, "switchyard.eval.model": self._model},
        )
        capture = _Capture()
        run = None
        try:
            async with self._host.open(plan) as run:
                graph = registered.graph
                stream = graph.astream(
                    {"messages": [HumanMessage(request.case.input)]},
                    run.config({"callbacks": run.span.callbacks} if run.span.callbacks else None),
                    context=run.context(),
                    stream_mode=["messages", "updates"],
                    version="v2",
                )
                async with aclosing(run.events(stream)) as parts:
                    async for part in parts:
                        if capture.feed(part, run.guard) and not run.first_at:
                            run.token()
                capture.finish(run.guard)
                run.tokens = capture.completion_tokens
        except OutputBlockedError:
            capture.error = "the output check blocked the answer"
        except Exception as exc:  # boundary: a failed run is the case's error, not the eval's
            capture.error = _describe(exc)
        ended = time.perf_counter()
        backend = run.routing.backend if run is not None else None
        if backend is not None and backend not in self._served:
            self._served[backend] = None
            if (served := self.gateway.registry.backends.get(backend)) is not None:
                self._versions[backend] = await _backend_version(served)
        first = run.first_at if run is not None and run.first_at else None
        origin = run.started if run is not None else started
        return CaseOutput(
            answer=capture.answer,
            retrieved_ids=capture.retrieved_ids,
            contexts=capture.contexts,
            tool_calls=capture.tool_calls,
            ttft_s=(first - origin) if first is not None else None,
            total_s=ended - origin,
            backend=backend,
            error=capture.error,
            extra={"finish_reason": capture.finish_reason, "completion_tokens": capture.completion_tokens},
        )


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class _Capture:
    """What a graph run's v2 stream (``messages`` and ``updates``) says about the case."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.retrieved_ids: list[str] = []
        self.contexts: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.error: str | None = None
        self._candidates_seen = False

    @property
    def answer(self) -> str:
        return "".join(self.parts)

    def feed(self, part: dict[str, Any], guard: OutputGuard) -> bool:
        """Take one stream part; True when it carried answer text."""
        if part["type"] == "updates":
            for update in (part["data"] or {}).values():
                if isinstance(update, dict):
                    self._update(update)
            return False
        if part["type"] != "messages":
            return False
        message, _ = part["data"]
        if isinstance(message, ToolMessage):
            if message.name == "knowledge_search" and isinstance(message.content, str):
                self._passages(message.content)
            return False
        if not isinstance(message, AIMessage):
            return False
        text = message.content if isinstance(message.content, str) else str(message.text)
        finish = message.response_metadata.get("finish_reason")
        if finish:
            self.finish_reason = finish
        if message.usage_metadata:
            self.completion_tokens += message.usage_metadata.get("output_tokens", 0)
        if not text:
            return False
        safe = guard.feed(0, text)
        if safe:
            self.parts.append(safe)
        return True

    def finish(self, guard: OutputGuard) -> None:
        if rest := guard.flush(0):
            self.parts.append(rest)

    def _update(self, update: dict[str, Any]) -> None:
        candidates = update.get("candidates")
        if isinstance(candidates, list) and not self._candidates_seen:
            # The rag graph's retrieval, ranked best first: what recall@k and MRR read.
            self._candidates_seen = True
            self.retrieved_ids = [str(c.get("doc_id")) for c in candidates if isinstance(c, dict)]
        sources = update.get("sources")
        if isinstance(sources, list):
            # What the answer's [n] cite: sources numbered from 1.
            ordered = sorted((s for s in sources if isinstance(s, dict)), key=lambda s: int(s.get("index", 0)))
            self.contexts = [str(s.get("text", "")) for s in ordered]
            if "facts" in update:
                # The graphrag graph merges two retrievers (graph facts' chunks and searched
                # chunks) into its sources: those, in order, are its retrieval.
                self.retrieved_ids = [str(s.get("doc_id")) for s in ordered]
        messages = update.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, AIMessage):
                    self.tool_calls += [{"name": call["name"], "args": call["args"]} for call in message.tool_calls]

    def _passages(self, content: str) -> None:
        for block in content.split("\n\n"):
            match = _PASSAGE.match(block.strip())
            if match:
                self.retrieved_ids.append(match.group(1))
                self.contexts.append(match.group(2))


@asynccontextmanager
async def open_runner(
    platform: Platform, host: RunHost, model: str, *, seed: int = 7, user_collections: bool = False
) -> AsyncIterator[ServingCaseRunner]:
    """A `CaseRunner` evaluating ``model`` (an alias or a backend id) on ``platform``'s
    graphs, running each case through ``host``.

    Args:
        platform: the graphs' settings, the gateway, and (for ``user_collections``) the
            knowledge base.
        host: the run host (the server's, or `cli_host`'s).
        model: an alias, a backend id, or ``backend:<id>``.
        seed: the sampling seed of every case (temperature is 0).
        user_collections: the cases ask collections of ``platform.knowledge`` (a dataset
            written for the user's own collection, with no corpus to ingest), read and
            never written. Default: the eval's own store, where suites' corpora go.

    Raises:
        UnknownModelError: ``model`` is neither an alias nor a backend id.
    """
    alias, pinned = resolve_model(platform.gateway, model)
    own: ModelGateway | None = None
    gateway = platform.gateway
    if pinned is not None:
        registry = platform.gateway.registry.with_aliases({alias: pinned.id})
        gateway = own = ModelGateway(registry, probe_timeout_s=platform.settings.gateway.probe_timeout_s)
    runner = ServingCaseRunner(
        platform, host, model, alias=alias, gateway=gateway, pinned=pinned, seed=seed, user_collections=user_collections
    )
    try:
        yield runner
    finally:
        await runner.knowledge.aclose()
        if own is not None:
            await own.aclose()


@contextmanager
def _closing_audit(path: Path) -> Iterator[AuditLog]:
    audit = AuditLog(path)
    try:
        yield audit
    finally:
        audit.close()


@asynccontextmanager
async def cli_host(settings: Settings) -> AsyncIterator[RunHost]:
    """A run host for a CLI process (``switchyard eval run``): no threads, the server's
    run-slot limit and guardrails, its own metrics, and an audit log of its own under
    ``<eval_runs_dir>/audit.jsonl`` (the server's log has one writer: the server)."""
    settings.eval_runs_dir.mkdir(parents=True, exist_ok=True)
    with _closing_audit(settings.eval_runs_dir / "audit.jsonl") as audit:
        host = RunHost(
            threads=None,
            slots=RunSlots(server_max=settings.server.max_concurrent_runs),
            metrics=ServingMetrics(),
            audit=audit,
            guardrails=Guardrails(settings.guardrails),
        )
        try:
            yield host
        finally:
            await host.aclose()


def backends_of(gateway: ModelGateway, model: str) -> list[Backend]:
    """The backends an alias may use, or the backend a backend id names.

    Raises:
        UnknownModelError: neither.
    """
    alias, pinned = resolve_model(gateway, model)
    return [pinned] if pinned is not None else gateway.registry.candidates(alias)


def build_judge(settings: Settings, gateway: ModelGateway, model: str) -> CaseJudge:
    """The DeepEval judge on ``model`` (an alias, or a backend id), DeepEval kept offline
    with its files under ``<eval_runs_dir>/deepeval``; JSON-schema-constrained verdicts when
    every backend the judge may use can do them.

    Raises:
        UnknownModelError: ``model`` is neither an alias nor a backend id.
    """
    # DeepEval is imported only for a judged run, after it is told to stay offline.
    from eval.judge import Judge, configure_deepeval  # noqa: PLC0415

    configure_deepeval(settings.eval_runs_dir / "deepeval")
    alias, pinned = resolve_model(gateway, model)
    chat_model = gateway.backend_chat_model(pinned) if pinned is not None else gateway.chat_model(alias)
    backends = backends_of(gateway, model)
    json_schema = all(b.capabilities.json_schema for b in backends)
    # The name says which models judge, not only the alias: a run file's judge must change
    # when the alias is promoted to another model (stored baselines are matched on it).
    name = f"{model} -> " + ", ".join(f"{b.id} ({b.model})" for b in backends)
    return Judge.for_model(chat_model, name, json_schema=json_schema)
