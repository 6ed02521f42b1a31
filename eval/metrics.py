"""Deterministic metrics: no judge, no model, no I/O.

Each metric scores one case and returns a number in ``[0, 1]`` (or a bool for the
predicates), or ``None`` when it does not apply to the case (no expected sources, no
expected facts, ...). A run is a set of :class:`CaseScore` records, one per case;
:func:`aggregate` averages each metric over the cases it applies to, and
``eval.gate`` compares two runs case by case.

Every metric is "higher is better": the gate relies on it.

Text is compared after :func:`normalise` (Unicode NFKC, casefold, thousands separators
dropped, whitespace collapsed), so ``"１，２３４ 元"`` contains the fact ``"1234元"``'s
digits and ``"Paris"`` matches ``"PARIS"``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from graphs.rag.prompts import NO_ANSWER_TEXT

__all__ = [
    "CITATIONS_VALID",
    "FACTS_CONTAINED",
    "LATENCY_WITHIN",
    "METRICS",
    "MRR",
    "NO_ANSWER_DETECTED",
    "NO_ANSWER_MARKERS",
    "RECALL_AT_K",
    "TOOLS_MATCH",
    "CaseScore",
    "LatencySla",
    "aggregate",
    "cited_indices",
    "citations_valid",
    "error_counts",
    "facts_contained",
    "latency_within",
    "mrr",
    "no_answer_detected",
    "normalise",
    "recall_at_k",
    "tools_match",
]

RECALL_AT_K = "recall_at_k"
"""Share of the expected sources found among the first k retrieved."""
MRR = "mrr"
"""Reciprocal rank of the first expected source retrieved."""
FACTS_CONTAINED = "facts_contained"
"""Share of the expected facts contained in the answer (normalised text)."""
CITATIONS_VALID = "citations_valid"
"""Share of the answer's citations that point at a retrieved chunk."""
NO_ANSWER_DETECTED = "no_answer_detected"
"""On an unanswerable case: the answer says it has no relevant information (1) or not (0)."""
TOOLS_MATCH = "tools_match"
"""Share of the expected tool calls the run made (name, and arguments when given), scored by
DeepEval's ``ToolCorrectnessMetric``."""
LATENCY_WITHIN = "latency_within"
"""The case's time to first token and total time were within the alias's SLA (1) or not (0)."""

METRICS = (RECALL_AT_K, MRR, FACTS_CONTAINED, CITATIONS_VALID, NO_ANSWER_DETECTED, TOOLS_MATCH, LATENCY_WITHIN)
"""The deterministic metrics, in report order."""

# --- text -------------------------------------------------------------------------------

# A number written with thousands separators: a group of 1-3 digits, then groups of exactly
# three after a comma or a space ("1,234,567", "1 234"; full-width "１，２３４" is "1,234" once
# NFKC has run; NBSP and thin spaces become " "). Not after a digit or a decimal point, not
# followed by more digits or by ",<digit>" (then the grouping is not a thousands grouping).
_GROUPED_NUMBER = re.compile(r"(?<![\d.])\d{1,3}(?:[, ]\d{3})+(?!\d)(?!,\d)")
_SEPARATOR = re.compile(r"[, ]")
# NFKC leaves typographic quotes alone; "don’t" must match "don't".
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def normalise(text: str) -> str:
    """Text as the metrics compare it.

    Unicode NFKC (full-width letters, digits and punctuation become half-width, the
    ideographic space a space), typographic quotes made straight, casefold, thousands
    separators removed inside numbers (``"1,234,567"``, ``"1 234"`` and ``"１，２３４"`` all
    become ``"1234"``; a decimal part is kept: ``"1,234.5"`` -> ``"1234.5"``), whitespace
    collapsed to single spaces and stripped.
    """
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).casefold()
    text = " ".join(text.split())  # first, so "1\u00a0234" and "1  234" group like "1 234"
    text = _GROUPED_NUMBER.sub(lambda m: _SEPARATOR.sub("", m.group(0)), text)
    return text


# --- retrieval ----------------------------------------------------------------------------


def recall_at_k(retrieved_ids: Sequence[str], expected_ids: Iterable[str], k: int) -> float | None:
    """Share of the distinct expected ids found among the first ``k`` retrieved ids.

    Args:
        retrieved_ids: ids in rank order, best first (document ids for ``expected_sources``).
            Duplicates take their positions, as retrieved.
        expected_ids: the ids a correct retrieval finds.
        k: how many of the retrieved ids count.

    Returns:
        A fraction in ``[0, 1]``; ``None`` when nothing is expected (the metric does not apply).

    Raises:
        ValueError: ``k`` is not positive.
    """
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    expected = set(expected_ids)
    if not expected:
        return None
    return len(expected & set(retrieved_ids[:k])) / len(expected)


def mrr(retrieved_ids: Sequence[str], expected_ids: Iterable[str]) -> float | None:
    """Reciprocal rank (1-based) of the first retrieved id that is expected; 0 when none is.

    Returns ``None`` when nothing is expected.
    """
    expected = set(expected_ids)
    if not expected:
        return None
    for rank, retrieved in enumerate(retrieved_ids, start=1):
        if retrieved in expected:
            return 1.0 / rank
    return 0.0


# --- answers ------------------------------------------------------------------------------


def facts_contained(answer: str, facts: Iterable[str]) -> float | None:
    """Share of the expected facts contained in the answer, both normalised.

    A fact that normalises to nothing is ignored. Returns ``None`` when no fact is left
    (the metric does not apply); an empty answer scores 0.
    """
    wanted = [f for f in (normalise(fact) for fact in facts) if f]
    if not wanted:
        return None
    text = normalise(answer)
    return sum(fact in text for fact in wanted) / len(wanted)


# "[1]", "[1][2]", "[1, 2]", full-width "［1］" (NFKC makes it "[1]") and "【1】".
_CITATION = re.compile(r"[\[【]\s*(\d{1,3}(?:\s*[,、]\s*\d{1,3})*)\s*[\]】]")


def cited_indices(answer: str) -> list[int]:
    """The source numbers an answer cites, in order of first appearance, without repeats.

    Reads ``[n]`` as the ``rag`` graph asks the model to write it, plus the variants models
    produce: ``[1, 2]``, ``【1】``, full-width ``［1］``.
    """
    seen: dict[int, None] = {}
    for group in _CITATION.findall(unicodedata.normalize("NFKC", answer)):
        for number in re.split(r"\s*[,、]\s*", group):
            seen.setdefault(int(number), None)
    return list(seen)


def citations_valid(cited: Sequence[int | str], retrieved: Sequence[Mapping[str, Any] | str]) -> float | None:
    """Share of the distinct citations that point at a retrieved chunk.

    Args:
        cited: source numbers (``[n]`` in the answer, see :func:`cited_indices`) or ids
            (doc or chunk ids); both kinds may be mixed.
        retrieved: what the answer could cite: the ``rag`` graph's ``sources`` (mappings with
            ``index``, ``doc_id``, ``chunk_id``) or plain ids in order (number ``n`` is the
            ``n``-th, from 1).

    Returns:
        A fraction in ``[0, 1]``. An answer that cites nothing scores 0 when there were
        sources to cite (the ``rag`` graph never gives an uncited answer) and ``None`` when
        there were none (nothing to cite: the metric does not apply).
    """
    distinct = list(dict.fromkeys(cited))
    if not distinct:
        return 0.0 if retrieved else None
    numbers: set[int] = set()
    ids: set[str] = set()
    for position, item in enumerate(retrieved, start=1):
        if isinstance(item, str):
            numbers.add(position)
            ids.add(item)
        else:
            numbers.add(int(item.get("index", position)))
            ids.update(str(item[key]) for key in ("doc_id", "chunk_id") if item.get(key) is not None)
    # bool is an int: True is not a citation.
    valid = sum(
        (c in numbers) if isinstance(c, int) and not isinstance(c, bool) else (str(c) in ids) for c in distinct
    )
    return valid / len(distinct)


NO_ANSWER_MARKERS: tuple[str, ...] = (
    # What the rag graph itself says when nothing passes grading (graphs/rag/prompts.py),
    # up to the collection's name.
    NO_ANSWER_TEXT.split("(", 1)[0].strip(),
    "no relevant information",
    # ANSWER_PROMPT tells the model: "If the sources do not contain the answer, say that you
    # do not know." These are the ways models say so, in English and in Chinese.
    "do not know",
    "don't know",
    "cannot answer",
    "can't answer",
    "unable to answer",
    "not able to answer",
    "no information about",
    "不知道",
    "无法回答",
    "不能回答",
    "没有相关信息",
    "没有找到相关",
    "未找到相关",
    "没有足够的信息",
    "信息不足",
    "资料中没有",
    "来源中没有",
)
"""Phrases (compared normalised) that mark a "no relevant information" answer: the ``rag``
graph's own ``NO_ANSWER_TEXT`` and the "I do not know" its answer prompt asks for."""


def no_answer_detected(answer: str, markers: Iterable[str] = NO_ANSWER_MARKERS) -> bool:
    """Whether the answer says it has no relevant information (any marker, normalised).

    An empty answer is not a "no answer": it says nothing.
    """
    text = normalise(answer)
    return bool(text) and any(m and m in text for m in (normalise(marker) for marker in markers))


# --- tools --------------------------------------------------------------------------------


def tools_match(expected: Sequence[Mapping[str, Any]], called: Sequence[Mapping[str, Any]]) -> float:
    """How well the run's tool calls meet the expected ones: DeepEval's ``ToolCorrectnessMetric``.

    Delegates to `eval.judge.tool_correctness` (deterministic, no model is called; DeepEval
    is imported on first use, after `eval.judge.configure_deepeval`, which runs with a
    per-user cache directory if nobody called it). Order is ignored and extra calls are
    not penalised. Each expected call ``{"name", "args"}`` is met by a distinct call of the
    same name; when the expectation gives ``args``, only those keys are compared (strings
    normalised, numbers numerically, ``True`` is not ``1``), and a call that gets some of
    them right earns that share (DeepEval's partial credit: one of two keys right is 0.5).
    An expectation without ``args`` is met by the name alone, unless another expectation
    of the same tool gives args: then the call must not give those.

    Args:
        expected: the case's ``expected_tools``.
        called: the calls the run made, ``{"name", "args"}`` each.

    Returns:
        A fraction in ``[0, 1]``: the mean over expected calls. With nothing expected: 1
        when nothing was called, else 0 (a case that lists no tools expects none).
    """
    from eval.judge import tool_correctness  # noqa: PLC0415 - DeepEval is imported only when needed

    return tool_correctness(expected, called)


# --- latency ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySla:
    """An alias's latency promise; a bound left ``None`` is not checked."""

    ttft_s: float | None = None
    """Longest acceptable time to the first token, in seconds."""
    total_s: float | None = None
    """Longest acceptable time to the last token, in seconds."""


def latency_within(ttft_s: float | None, total_s: float | None, sla: LatencySla) -> bool:
    """Whether a case met the SLA: each bound the SLA sets is met by its measurement.

    A measurement that is missing (``None``: no token came) fails the bound it is checked
    against.
    """
    if sla.ttft_s is not None and (ttft_s is None or ttft_s > sla.ttft_s):
        return False
    return not (sla.total_s is not None and (total_s is None or total_s > sla.total_s))


# --- records ------------------------------------------------------------------------------


class CaseScore(BaseModel):
    """One case's scores in one run, as written to and read from a run's JSON file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case_id: str = Field(min_length=1)
    """The dataset case's ``id``."""
    values: dict[str, float | None] = Field(default_factory=dict)
    """Metric name -> score (higher is better); ``None`` when the metric does not apply to the
    case or could not be scored (then ``errors`` says why)."""
    errors: dict[str, str] = Field(default_factory=dict)
    """Metric name -> why it could not be scored (a judge's unparseable JSON, a failed run).
    Counted and reported apart, never averaged in."""

    @field_validator("values")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        for metric, value in values.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{metric}: {value} is not a finite number")
        return values

    def value(self, metric: str) -> float | None:
        """The case's score on ``metric``; ``None`` when absent or not applicable."""
        return self.values.get(metric)


def aggregate(scores: Iterable[CaseScore]) -> dict[str, float | None]:
    """Each metric's mean over the cases it applies to.

    Every metric named by any case is a key; its value is ``None`` when no case has a score
    for it. Errors are not averaged in (see :func:`error_counts`).
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for score in scores:
        for metric, value in score.values.items():
            sums.setdefault(metric, 0.0)
            counts.setdefault(metric, 0)
            if value is not None:
                sums[metric] += value
                counts[metric] += 1
    return {metric: (sums[metric] / counts[metric] if counts[metric] else None) for metric in sums}


def error_counts(scores: Iterable[CaseScore]) -> dict[str, int]:
    """How many cases could not be scored, per metric."""
    counts: dict[str, int] = {}
    for score in scores:
        for metric in score.errors:
            counts[metric] = counts.get(metric, 0) + 1
    return counts
