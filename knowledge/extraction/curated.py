"""Curated facts: JSON Lines a team writes from structured data, one item a line::

    {"kind": "entity", "type": "Office", "name": "Labour Arbitration Office", "aliases": ["LAO"],
     "properties": {"address": "..."}, "description": "...", "source": "separation-certificate.md"}
    {"kind": "relation", "type": "ISSUED_BY", "from": "Separation Certificate",
     "to": "Labour Arbitration Office", "source": "separation-certificate.md"}

``source`` is the id of a document of the collection (the id ``switchyard ingest``
gave the file): the fact is stated by that document. `parse_curated` checks each line
on its own (JSON, fields, the ontology's types); relation ends and sources are
checked by the caller (`KnowledgeGraph.import_facts`), which knows the collection.
Every problem names its line (``line 3``); blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from knowledge.extraction.validate import EntityItem, Problem, RelationItem, check_entity, check_relation
from knowledge.models import MAX_DOCUMENT_ID
from knowledge.ontology import Ontology

__all__ = ["MAX_LINE_CHARS", "CuratedEntity", "CuratedFacts", "CuratedRelation", "parse_curated"]

MAX_LINE_CHARS = 100_000
"""Longest line read (a longer one is ``bad_json``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CuratedEntity:
    line: int
    source: str
    """The document that states it."""
    item: EntityItem


@dataclass(frozen=True, slots=True, kw_only=True)
class CuratedRelation:
    line: int
    source: str
    item: RelationItem


@dataclass(slots=True, kw_only=True)
class CuratedFacts:
    """What the lines hold: the items that passed, the problems of the others."""

    entities: list[CuratedEntity] = field(default_factory=list)
    relations: list[CuratedRelation] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    lines: int = 0
    """Non-blank lines read."""


def _source(value: object, where: str) -> str | Problem:
    if value is None:
        return Problem(where=where, reason="missing_field", detail="source is missing (the id of a document of the collection)")
    if not isinstance(value, str) or not value or len(value) > MAX_DOCUMENT_ID:
        return Problem(where=where, reason="unknown_document", detail=f"source {value!r} is not a document id")
    return value


def parse_curated(lines: Iterable[str], ontology: Ontology) -> CuratedFacts:
    """Check every line of a curated JSON Lines file against ``ontology``.

    Args:
        lines: the file's lines (with or without their newlines), numbered from 1.
        ontology: the collection's ontology.

    Returns:
        The entities and relations that passed (relation ends not yet resolved,
        sources not yet looked up) and one `Problem` per line that did not.
    """
    facts = CuratedFacts()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        facts.lines += 1
        where = f"line {number}"
        if len(text) > MAX_LINE_CHARS:
            facts.problems.append(Problem(where=where, reason="bad_json", detail=f"longer than {MAX_LINE_CHARS} characters"))
            continue
        try:
            raw = json.loads(text)
        except ValueError as exc:
            facts.problems.append(Problem(where=where, reason="bad_json", detail=f"not JSON: {exc}"))
            continue
        if not isinstance(raw, dict):
            facts.problems.append(Problem(where=where, reason="bad_json", detail=f"a line is a JSON object, not {type(raw).__name__}"))
            continue
        kind = raw.get("kind")
        if kind not in ("entity", "relation"):
            detail = "kind is missing" if kind is None else f"kind {kind!r} is neither 'entity' nor 'relation'"
            facts.problems.append(Problem(where=where, reason="missing_field", detail=detail))
            continue
        if kind == "entity":
            item = check_entity(raw, ontology, where=where)
        else:
            item = check_relation(raw, ontology, where=where)
        if isinstance(item, Problem):
            facts.problems.append(item)
            continue
        source = _source(raw.get("source"), where)
        if isinstance(source, Problem):
            facts.problems.append(source)
            continue
        if isinstance(item, EntityItem):
            facts.entities.append(CuratedEntity(line=number, source=source, item=item))
        else:
            facts.relations.append(CuratedRelation(line=number, source=source, item=item))
    return facts
