"""Graph retrieval: link a question's entities, expand k hops, rank the facts found,
and attach each fact's source chunks.

1. **Linking.** Every run of 1 to `MAX_NGRAM` words of the question, normalised
   (`normalise_name`), is looked up by name and alias (`GraphStore.find_entities`):
   an entity whose canonical name matches is linked ``exact`` (score 1.0), by an
   alias ``alias`` (0.9). The question is also searched by meaning in the
   collection's entity companion (``<collection>__entities``, one point per entity:
   its name, aliases, type and description); an entity found there with a cosine
   similarity of at least ``min_link_relevance`` is linked ``vector`` with that
   similarity as its score.
2. **Expansion.** The relations within ``hops`` of the linked entities, either
   direction, at most ``fanout`` per entity per hop (`GraphStore.neighbors`).
3. **Ranking** (`rank_facts`): how strongly a path from the linked entities reaches
   the fact (a hub entity passes little on to each of its many relations), its
   distance, whether the question names its relation type, the question's words
   and meaning in the chunks that state it; a fact that runs alongside the path
   ("another procedure that also requires this card") counts less than one that
   continues it ("the card is issued by that office"). Ties keep the store's order
   (nearer first, then relation type, then names), so a ranking is the same on
   every store and run.
4. **Sources.** The text, title and source of each chunk a fact cites, read from
   the vector store with its vector (`VectorStore.export_document`, one read per
   document); a chunk the vector store no longer has is left out.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from knowledge.graphstore.base import Entity, Fact, GraphStore
from knowledge.knowledge_base import KnowledgeBase
from knowledge.ontology import normalise_name
from knowledge.settings import GraphRetrievalSettings

__all__ = [
    "ENTITIES_SUFFIX",
    "MAX_NGRAM",
    "FactSource",
    "GraphRetrieval",
    "GraphRetriever",
    "LinkedEntity",
    "RankedFact",
    "entities_collection",
    "question_ngrams",
    "rank_facts",
]

ENTITIES_SUFFIX: Final = "__entities"
"""A collection's entity companion is ``<collection>__entities``."""

_MAX_COLLECTION_NAME: Final = 64

MAX_NGRAM: Final = 6
"""Longest run of question words looked up as an entity name."""

MAX_QUESTION_WORDS: Final = 200
"""Words of a question used for linking (the n-grams of a longer one are not all looked up)."""

MAX_NAME_LINKS: Final = 100
"""Most entities a question links by name or alias (the longest names first); the
store is asked in batches of this many, and a batch that fills is split (a name
many entities share cannot crowd out another the question names)."""

_MAX_LINK_QUERIES: Final = 64
"""Store calls after which a linking splits no more full batches (each is then taken
as it is), so a question of many shared names costs at most about twice this many."""

EXACT_SCORE: Final = 1.0
ALIAS_SCORE: Final = 0.9

_WEIGHTS: Final = {"path": 0.45, "hops": 0.20, "relation": 0.10, "terms": 0.10, "relevance": 0.15}

SIBLING_FACTOR: Final = 0.6
"""What a fact that runs alongside the path keeps of its score (see `rank_facts`)."""

# Words that carry no content in a question; they would make every chunk "match".
_STOP_WORDS: Final = frozenset(
    "a an and are as at be by can do does for from get got have how i if in is it its my me of on or our "
    "should so that the their them then there these they this to was we what when where which who whom why "
    "will with would you your not no yes any all one".split()
)


def entities_collection(collection: str) -> str:
    """The vector collection holding one point per entity of ``collection``'s graph:
    ``<collection>__entities``, or for a name too long for that (collection names
    have at most 64 characters) its first 41 characters, ``-`` and 12 hex digits of
    its hash before the suffix."""
    name = collection + ENTITIES_SUFFIX
    if len(name) <= _MAX_COLLECTION_NAME:
        return name
    digest = hashlib.sha256(collection.encode()).hexdigest()[:12]
    return f"{collection[: _MAX_COLLECTION_NAME - len(ENTITIES_SUFFIX) - 13]}-{digest}{ENTITIES_SUFFIX}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedEntity:
    """An entity of the graph the question names (or means)."""

    entity: Entity
    how: Literal["exact", "alias", "vector"]
    """By its canonical name, by an alias, or found by meaning in the entity companion."""
    score: float
    """1.0 exact, 0.9 alias, the cosine similarity for ``vector``."""
    mention: str
    """The question text that matched (the whole question for ``vector``)."""

    def json(self) -> dict[str, Any]:
        return {
            "id": self.entity.id,
            "name": self.entity.name,
            "type": self.entity.type,
            "how": self.how,
            "score": round(self.score, 6),
            "mention": self.mention,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FactSource:
    """A chunk that states a fact."""

    chunk_id: str
    doc_id: str
    text: str
    title: str | None = None
    source: str = ""

    def json(self) -> dict[str, Any]:
        return {"chunk_id": self.chunk_id, "doc_id": self.doc_id, "text": self.text, "title": self.title, "source": self.source}


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedFact:
    """A fact found by expansion, its ranking score, and the chunks that state it."""

    fact: Fact
    score: float
    sources: tuple[FactSource, ...]
    """One per chunk id of the fact that the vector store still has, in chunk id order."""

    def json(self) -> dict[str, Any]:
        """The fact as clients and prompts see it; ``doc_id`` is the first document
        that states it (as a chunk hit's ``doc_id``)."""
        fact = self.fact
        doc_ids = list(fact.doc_ids)
        return {
            "text": fact.text(),
            "subject": fact.source.name,
            "relation": fact.relation,
            "object": fact.target.name,
            "subject_type": fact.source.type,
            "object_type": fact.target.type,
            "hops": fact.hops,
            "score": round(self.score, 6),
            "doc_id": doc_ids[0] if doc_ids else None,
            "doc_ids": doc_ids,
            "chunk_ids": list(fact.chunk_ids),
            "sources": [s.json() for s in self.sources],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphRetrieval:
    """What graph retrieval found for one question."""

    collection: str
    linked: tuple[LinkedEntity, ...]
    """The entities the expansion started from, best first."""
    facts: tuple[RankedFact, ...]
    """Best first, at most ``max_facts``."""

    def json(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "linked": [e.json() for e in self.linked],
            "facts": [f.json() for f in self.facts],
        }


_WORD = re.compile(r"\w+", re.UNICODE)


def question_ngrams(question: str, *, max_words: int = MAX_NGRAM) -> dict[str, str]:
    """Normalised runs of 1 to ``max_words`` whitespace-separated words of
    ``question`` → the text as written (the first occurrence), longest runs first."""
    words = question.split()[:MAX_QUESTION_WORDS]
    found: dict[str, str] = {}
    for size in range(min(max_words, len(words)), 0, -1):
        for start in range(len(words) - size + 1):
            text = " ".join(words[start : start + size])
            key = normalise_name(text)
            if key and key not in found:
                found[key] = text.strip(" .,;:!?\"'`()[]{}«»“”‘’")
    return found


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.casefold()) if len(w) > 2 and w not in _STOP_WORDS}


def _stems(words: set[str]) -> set[str]:
    return {w[:5] for w in words}


def _relation_mentioned(relation: str, question_stems: set[str]) -> bool:
    parts = [p for p in relation.casefold().split("_") if len(p) > 2 and p not in _STOP_WORDS]
    return any(p[:5] in question_stems for p in parts)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _distances(facts: Sequence[Fact], seeds: Iterable[str]) -> dict[str, int]:
    """Entity id → hops from the nearest seed, over ``facts`` (breadth first)."""
    adjacent: dict[str, set[str]] = {}
    for fact in facts:
        adjacent.setdefault(fact.source.id, set()).add(fact.target.id)
        adjacent.setdefault(fact.target.id, set()).add(fact.source.id)
    distance = dict.fromkeys(seeds, 0)
    frontier = list(distance)
    while frontier:
        following = []
        for entity in frontier:
            for other in sorted(adjacent.get(entity, ())):
                if other not in distance:
                    distance[other] = distance[entity] + 1
                    following.append(other)
        frontier = following
    return distance


def rank_facts(
    facts: Sequence[Fact],
    linked: Sequence[LinkedEntity],
    question: str,
    chunk_texts: Mapping[str, str],
    chunk_relevance: Mapping[str, float] | None = None,
) -> list[tuple[Fact, float]]:
    """``facts`` with their scores, best first (ties keep the order of ``facts``).

    A fact's score is ``(0.45 * path + 0.20 / hops + 0.10 * relation + 0.10 * terms
    + 0.15 * relevance) * sibling``:

    - ``path``: how strongly the question reaches the fact. For a fact touching a
      linked entity, that entity's link score; further out, the path score of the
      facts that lead to its nearer end (the bridge), divided by the square root of
      the bridge's degree among the facts found: a hub (a card every procedure
      requires) passes little on to each of its many relations, a document only
      two procedures mention passes on more.
    - ``hops``: 1 for a fact touching a linked entity, 1/2 one further, ...
    - ``relation``: 1 when a word of the relation type (``ISSUED_BY`` → "issued")
      appears in the question (by its first five letters).
    - ``terms``: the share of the question's content words found in the fact's
      chunks or its ends' names.
    - ``relevance``: the best cosine similarity of the question to one of the fact's
      chunks (0 when not given).
    - ``sibling``: 0.6 for a fact that only runs alongside the path that reached it
      (it enters or leaves the bridge with the same relation type, in the same
      direction, as a nearer fact does: "another procedure that also requires this
      card"), else 1. A fact that continues the path (the card is issued by an
      office) keeps its score.

    Args:
        facts: the expansion's facts, in the store's order.
        linked: the linked entities (the seeds, with their link scores).
        question: the question.
        chunk_texts: chunk id → text, for the facts' chunks (missing ones count as empty).
        chunk_relevance: chunk id → cosine similarity to the question.
    """
    relevance_of = chunk_relevance or {}
    link_scores: dict[str, float] = {}
    for item in linked:
        link_scores[item.entity.id] = max(link_scores.get(item.entity.id, 0.0), item.score)
    distance = _distances(facts, link_scores)
    degree: Counter[str] = Counter()
    for fact in facts:
        degree[fact.source.id] += 1
        degree[fact.target.id] += 1

    def near_end(fact: Fact) -> tuple[str, str]:
        """(the nearer end, which side of the fact it is)."""
        s, t = distance.get(fact.source.id, 1 << 30), distance.get(fact.target.id, 1 << 30)
        return (fact.source.id, "out") if s <= t else (fact.target.id, "in")

    # Path scores, nearest facts first: an entity's reach is the best path into it.
    reach = dict(link_scores)
    path: dict[int, float] = {}
    arrivals: dict[str, set[tuple[str, str]]] = {}
    order = sorted(range(len(facts)), key=lambda i: min(distance.get(facts[i].source.id, 1 << 30), distance.get(facts[i].target.id, 1 << 30)))
    for index in order:
        fact = facts[index]
        near, side = near_end(fact)
        near_distance = distance.get(near, 1 << 30)
        if near_distance == 0:
            # Touches a seed (or two: the better link counts).
            score = max(reach.get(e, 0.0) for e in (fact.source.id, fact.target.id) if distance.get(e) == 0)
        else:
            score = reach.get(near, 0.0) / math.sqrt(max(degree[near], 1))
        path[index] = score
        far = fact.target.id if side == "out" else fact.source.id
        if distance.get(far, 1 << 30) > near_distance:
            reach[far] = max(reach.get(far, 0.0), score)
            # How the path arrived at ``far``: this relation type, from this side.
            arrivals.setdefault(far, set()).add((fact.relation, "in" if side == "out" else "out"))

    question_words = _content_words(question)
    question_stems = _stems(question_words)
    scored: list[tuple[float, int, Fact]] = []
    for position, fact in enumerate(facts):
        near, side = near_end(fact)
        sibling = distance.get(near, 1 << 30) > 0 and (fact.relation, side) in arrivals.get(near, set())
        relation = 1.0 if _relation_mentioned(fact.relation, question_stems) else 0.0
        if question_words:
            seen = " ".join(
                [*(chunk_texts.get(c, "") for c in fact.chunk_ids), fact.source.name, *fact.source.aliases,
                 fact.target.name, *fact.target.aliases]
            )
            seen_stems = _stems(_content_words(seen))
            terms = sum(1 for w in question_words if w[:5] in seen_stems) / len(question_words)
        else:
            terms = 0.0
        relevance = max((relevance_of.get(c, 0.0) for c in fact.chunk_ids), default=0.0)
        score = (
            _WEIGHTS["path"] * path.get(position, 0.0)
            + _WEIGHTS["hops"] / max(fact.hops, 1)
            + _WEIGHTS["relation"] * relation
            + _WEIGHTS["terms"] * terms
            + _WEIGHTS["relevance"] * max(relevance, 0.0)
        ) * (SIBLING_FACTOR if sibling else 1.0)
        scored.append((score, position, fact))
    scored.sort(key=lambda row: (-row[0], row[1]))
    return [(fact, score) for score, _, fact in scored]


class GraphRetriever:
    """Linking, expansion, ranking and sources over one graph store and the knowledge
    base that holds the chunks (and the entity companions)."""

    def __init__(self, store: GraphStore, knowledge: KnowledgeBase, settings: GraphRetrievalSettings) -> None:
        self.store = store
        self.knowledge = knowledge
        self.settings = settings

    async def link(self, collection: str, question: str, *, query: Sequence[float] | None = None) -> list[LinkedEntity]:
        """The entities ``question`` names (exact, alias) or means (vector), best first,
        one entry per entity. ``query``: the question's vector, if already embedded."""
        ngrams = question_ngrams(question)
        found: dict[str, LinkedEntity] = {}
        if ngrams:
            for entity in await self._named(collection, list(ngrams)):
                canonical = normalise_name(entity.name)
                # The longest run of words that names it (ngrams are longest first).
                key = next((k for k in ngrams if k in entity.keys), None)
                if key is None:
                    continue
                how: Literal["exact", "alias"] = "exact" if key == canonical else "alias"
                linked = LinkedEntity(entity=entity, how=how, score=EXACT_SCORE if how == "exact" else ALIAS_SCORE,
                                      mention=ngrams[key])
                if entity.id not in found or found[entity.id].score < linked.score:
                    found[entity.id] = linked
        if len(found) > MAX_NAME_LINKS:
            # The longest mentions first (a run of words naming an entity says more
            # than one of its words), then the better link.
            best = sorted(
                found.values(), key=lambda e: (-len(e.mention.split()), -e.score, e.entity.type, e.entity.name, e.entity.id)
            )
            found = {e.entity.id: e for e in best[:MAX_NAME_LINKS]}
        for entity, relevance in await self.by_meaning(collection, question, query=query):
            if entity.id not in found:
                found[entity.id] = LinkedEntity(entity=entity, how="vector", score=relevance, mention=question)
        return sorted(found.values(), key=lambda e: (-e.score, e.entity.type, e.entity.name, e.entity.id))

    async def _named(self, collection: str, names: Sequence[str]) -> list[Entity]:
        """Every entity whose name or alias is one of ``names``. `GraphStore.find_entities`
        sorts its matches and keeps the first ``limit``: a batch that comes back full
        may have lost some, so it is asked again in halves (a single name that fills
        a batch keeps its first `MAX_NAME_LINKS`)."""
        found: dict[str, Entity] = {}
        pending = [list(names)]
        calls = 0
        while pending:
            batch = pending.pop()
            entities = await self.store.find_entities(collection, batch, limit=MAX_NAME_LINKS)
            calls += 1
            if len(entities) >= MAX_NAME_LINKS and len(batch) > 1 and calls < _MAX_LINK_QUERIES:
                half = len(batch) // 2
                pending += [batch[half:], batch[:half]]  # the first half (longer names) next
                continue
            found.update((e.id, e) for e in entities)
        return list(found.values())

    async def by_meaning(
        self, collection: str, text: str, *, query: Sequence[float] | None = None
    ) -> list[tuple[Entity, float]]:
        """Entities of the companion closest in meaning to ``text`` (at most ``link_k``)
        with a cosine similarity of at least ``min_link_relevance``, best first; none
        when the collection has no companion yet."""
        companion = entities_collection(collection)
        store = self.knowledge.store
        if not await store.has_collection(companion):
            return []
        vector = query if query is not None else await self.knowledge.embedder.embed_query(text)
        k = self.settings.link_k
        hits = await store.search(companion, dense=vector, sparse=None, mode="dense", k=k, candidates=k)
        relevance = {h.doc_id: h.relevance for h in hits if h.relevance is not None and h.relevance >= self.settings.min_link_relevance}
        if not relevance:
            return []
        entities = await self.store.entities(collection, list(relevance))
        return sorted(((e, float(relevance[e.id])) for e in entities), key=lambda pair: (-pair[1], pair[0].id))

    async def sources(self, collection: str, chunk_ids: Sequence[str]) -> dict[str, FactSource]:
        """Chunk id → its `FactSource`, for the chunks the vector store has."""
        found, _ = await self._read_chunks(collection, chunk_ids)
        return found

    async def _read_chunks(
        self, collection: str, chunk_ids: Sequence[str]
    ) -> tuple[dict[str, FactSource], dict[str, Sequence[float]]]:
        """The chunks' sources and dense vectors, one export per document."""
        by_doc: dict[str, set[str]] = {}
        for chunk_id in chunk_ids:
            by_doc.setdefault(chunk_id.rsplit("#", 1)[0], set()).add(chunk_id)
        found: dict[str, FactSource] = {}
        vectors: dict[str, Sequence[float]] = {}
        for doc_id in sorted(by_doc):
            export = await self.knowledge.store.export_document(collection, doc_id)
            if export is None:
                continue
            for chunk in export.chunks:
                payload = chunk.payload
                chunk_id = str(payload.get("chunk_id", ""))
                if chunk_id in by_doc[doc_id]:
                    found[chunk_id] = FactSource(
                        chunk_id=chunk_id,
                        doc_id=doc_id,
                        text=str(payload.get("text", "")),
                        title=export.entry.title,
                        source=export.entry.source,
                    )
                    vectors[chunk_id] = chunk.dense
        return found, vectors

    async def retrieve(self, collection: str, question: str, *, max_facts: int, hops: int, fanout: int) -> GraphRetrieval:
        """Link, expand, rank; the best ``max_facts`` facts with their sources.

        An expansion reads up to four times ``max_facts`` facts (at least 50), nearest
        first, before ranking.
        """
        query = await self.knowledge.embedder.embed_query(question)
        linked = await self.link(collection, question, query=query)
        if not linked:
            return GraphRetrieval(collection=collection, linked=(), facts=())
        facts = await self.store.neighbors(
            collection, [e.entity.id for e in linked], hops=hops, fanout=fanout, limit=max(50, 4 * max_facts)
        )
        chunk_ids = sorted({c for f in facts for c in f.chunk_ids})
        sources, vectors = await self._read_chunks(collection, chunk_ids)
        relevance = {c: _cosine(query, v) for c, v in vectors.items()}
        ranked = rank_facts(facts, linked, question, {c: s.text for c, s in sources.items()}, relevance)[:max_facts]
        return GraphRetrieval(
            collection=collection,
            linked=tuple(linked),
            facts=tuple(
                RankedFact(fact=fact, score=score, sources=tuple(sources[c] for c in fact.chunk_ids if c in sources))
                for fact, score in ranked
            ),
        )
