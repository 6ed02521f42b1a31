"""Extraction: one model call per chunk, asking for entities and relations as JSON
under the schema the ontology generates (`Ontology.extraction_schema`).

The call goes through the gateway (`ModelGateway.stream_chat`, see `Extractor._streamed`) with
``response_format: {"type": "json_schema", ...}``: the gateway refuses an alias
whose backends do not declare ``json_schema`` output, and each backend adapts it
(vLLM's guided decoding, llama.cpp's grammar). The answer is then checked item by
item (`knowledge.extraction.validate`): a model under a grammar still invents names
that are not among its own entities, or pairs types the relation does not connect.

A chunk whose call fails (timeout, backend error, an answer that is not JSON) is
reported and the others go on; it never fails the extraction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Final

from gateway import GatewayError, ModelGateway
from knowledge.extraction.validate import EntityItem, Problem, RelationItem, check_entity, check_relation, resolve_ends
from knowledge.ontology import Ontology
from knowledge.settings import ExtractionSettings

__all__ = ["MAX_ALIASES", "MAX_NAME_CHARS", "ChunkExtraction", "Extractor", "extraction_messages", "extraction_schema", "parse_answer"]


@dataclass(slots=True, kw_only=True)
class ChunkExtraction:
    """What one chunk gave: checked entities, relations with resolved ends, problems."""

    chunk_id: str
    entities: list[EntityItem] = field(default_factory=list)
    relations: list[tuple[RelationItem, EntityItem, EntityItem]] = field(default_factory=list)
    """Each relation with its source and target among ``entities``."""
    problems: list[Problem] = field(default_factory=list)
    failed: bool = False
    """The model call failed or its answer was not JSON: nothing was extracted."""
    answer: str = ""
    """The model's answer as it came (empty when the call failed)."""


_SYSTEM = """You extract a knowledge graph from a text, following an ontology.

Entity types:
{entity_types}

Relation types (from -> to):
{relation_types}

Rules:
- Only entities and relations the text states. Use the names as the text writes them.
- Every entity has one of the entity types above.
- A relation's "from" and "to" are names of entities you listed.
- Answer with JSON only: {{"entities": [{{"name": ..., "type": ...}}], "relations": [{{"type": ..., "from": ..., "to": ...}}]}}"""


def extraction_messages(ontology: Ontology, text: str) -> list[dict[str, str]]:
    """The chat messages asking for one chunk's entities and relations."""
    entity_types = "\n".join(f"- {name}: {t.description}".rstrip(": ") for name, t in sorted(ontology.entity_types.items()))
    relation_types = "\n".join(
        f"- {name} ({'/'.join(r.source_types)} -> {'/'.join(r.target_types)}): {r.description}".rstrip(": ")
        for name, r in sorted(ontology.relation_types.items())
    ) or "- none"
    system = _SYSTEM.format(entity_types=entity_types, relation_types=relation_types)
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Text:\n{text}"}]


def parse_answer(answer: str, ontology: Ontology, *, chunk_id: str) -> ChunkExtraction:
    """Check a model's answer for one chunk.

    Returns:
        A `ChunkExtraction`: ``failed`` with a ``bad_json`` problem when the answer is
        not a JSON object with an ``entities`` list; else the items that passed and a
        problem for each one that did not.
    """
    where = f"chunk {chunk_id}"
    result = ChunkExtraction(chunk_id=chunk_id, answer=answer)
    try:
        data: Any = json.loads(answer)
    except ValueError as exc:
        shown = " ".join(answer.split())[:80]
        result.failed = True
        result.problems.append(Problem(where=where, reason="bad_json", detail=f"not JSON ({exc}): {shown!r}"))
        return result
    if not isinstance(data, dict):
        result.failed = True
        result.problems.append(Problem(where=where, reason="bad_json", detail=f"a JSON {type(data).__name__}, not an object"))
        return result
    if not isinstance(data.get("entities"), list):
        result.failed = True
        result.problems.append(Problem(where=where, reason="missing_field", detail="no 'entities' list"))
        return result
    for raw in data["entities"]:
        item = check_entity(raw, ontology, where=where) if isinstance(raw, Mapping) else _not_object(where, raw)
        (result.problems if isinstance(item, Problem) else result.entities).append(item)  # type: ignore[arg-type]
    relations = data.get("relations") or []
    if not isinstance(relations, list):
        result.problems.append(Problem(where=where, reason="bad_json", detail="'relations' is not a list"))
        relations = []
    for raw in relations:
        relation = check_relation(raw, ontology, where=where) if isinstance(raw, Mapping) else _not_object(where, raw)
        if isinstance(relation, Problem):
            result.problems.append(relation)
            continue
        ends = resolve_ends(relation, result.entities, ontology)
        if isinstance(ends, Problem):
            result.problems.append(ends)
            continue
        result.relations.append((relation, *ends))
    return result


def _not_object(where: str, raw: object) -> Problem:
    return Problem(where=where, reason="bad_json", detail=f"an item is a JSON object, not {type(raw).__name__}")


MAX_NAME_CHARS: Final = 48
"""Longest name or alias the schema lets the model write (the ontology's default is
80): every character the grammar allows is a token a small model may spend."""

MAX_ALIASES: Final = 1
"""Aliases per entity the schema allows (the ontology's default is 3)."""


def extraction_schema(ontology: Ontology, settings: ExtractionSettings) -> dict[str, Any]:
    """The ontology's extraction schema with the settings' list bounds and tighter
    string bounds, so that a complete answer fits in ``max_tokens``.

    A grammar makes the model close the JSON only when the bounds leave it room:
    SmolLM2-135M, asked under the ontology's own bounds (names of 80 characters,
    3 aliases), repeated aliases until it was cut at 512 tokens on 2 of 6 sample
    chunks; with these (and 6 entities, 4 relations) all 6 answers were complete
    JSON, 329 to 445 tokens. With 12 entities and 12 relations 4 of 6 were still cut:
    keep ``max_entities`` and ``max_relations`` small for a small model.
    """
    schema = ontology.extraction_schema(
        max_entities=settings.max_entities, max_relations=settings.max_relations, max_name_chars=MAX_NAME_CHARS
    )
    entity = schema["properties"]["entities"]["items"]["properties"]
    entity["aliases"] = {**entity["aliases"], "maxItems": MAX_ALIASES}
    return schema


class Extractor:
    """Asks the extraction alias for each chunk's entities and relations."""

    def __init__(self, gateway: ModelGateway, ontology: Ontology, settings: ExtractionSettings) -> None:
        """Args:
            gateway: the model gateway.
            ontology: the collection's ontology (decides the schema and the checks).
            settings: the alias, bounds, per-chunk timeout.
        """
        self.gateway = gateway
        self.ontology = ontology
        self.settings = settings
        self.response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": "graph_extraction", "schema": extraction_schema(ontology, settings), "strict": True},
        }

    def check(self) -> None:
        """Refuse now, before any chunk, an alias no backend of which can answer under
        a JSON schema.

        Raises:
            UnknownModelError: the alias is not registered.
            CapabilityError: no backend of the alias declares ``json_schema``.
        """
        self.gateway.check_alias(self.settings.alias, {"response_format": self.response_format})

    async def extract(self, chunk_id: str, text: str) -> ChunkExtraction:
        """One chunk's extraction; never raises for the model's failures (they are the
        result's ``failed`` and ``problems``)."""
        body = {
            "messages": extraction_messages(self.ontology, text),
            "response_format": self.response_format,
            "max_tokens": self.settings.max_tokens,
            "temperature": 0,
        }
        where = f"chunk {chunk_id}"
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                content, finish_reason = await self._streamed(body)
        except TimeoutError:
            return ChunkExtraction(
                chunk_id=chunk_id, failed=True,
                problems=[Problem(where=where, reason="timeout", detail=f"no answer within {self.settings.timeout_s:g} s")],
            )
        except GatewayError as exc:
            return ChunkExtraction(
                chunk_id=chunk_id, failed=True,
                problems=[Problem(where=where, reason="model_error", detail=f"{exc.__class__.__name__}: {exc}"[:300])],
            )
        if finish_reason == "length":
            # Cut mid-JSON: say why rather than quote a parse error.
            return ChunkExtraction(
                chunk_id=chunk_id, failed=True, answer=content,
                problems=[Problem(
                    where=where, reason="bad_json",
                    detail=f"the answer was cut at max_tokens ({self.settings.max_tokens}): lower "
                    "max_entities/max_relations or raise max_tokens",
                )],
            )
        return parse_answer(content, self.ontology, chunk_id=chunk_id)

    async def _streamed(self, body: Mapping[str, Any]) -> tuple[str, str | None]:
        """The answer's text and finish reason, asked for as a stream.

        Streamed, because the backend's read timeout then applies between tokens rather
        than to a whole answer of up to ``max_tokens``, and because a chunk given up on
        (its timeout, a cancelled ingestion) closes the stream, which stops the backend
        generating: llama-server finishes a non-streamed request whose client has gone,
        and the next chunks' requests waited behind it, timed out in turn and opened the
        backend's circuit breaker (seen with the local model on a busy machine).
        """
        parts: list[str] = []
        finish_reason: str | None = None
        async with aclosing(self.gateway.stream_chat(self.settings.alias, body)) as chunks:
            async for chunk in chunks:
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if isinstance(delta.get("content"), str):
                        parts.append(delta["content"])
                    finish_reason = choice.get("finish_reason") or finish_reason
        return "".join(parts), finish_reason
