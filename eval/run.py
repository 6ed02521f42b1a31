"""One evaluation run: every case of a suite through a `CaseRunner`, scored.

`run_suite` asks the runner to ingest the suite's corpus (when it has one), runs the
cases one after another (so each case's latency is its own, not a share of a batch),
scores each with the deterministic metrics (`score_case`) and, when a judge is given,
the judged ones, and returns the `RunFile` that ``switchyard eval run`` writes and
``switchyard eval gate`` reads.

Which metric applies to which case (a metric that does not apply is absent from the
case's ``values``; one that applies but has nothing to score is ``None``):

- ``recall_at_k`` and ``mrr``: cases with ``expected_sources``, against the run's
  retrieved document ids in rank order (``CaseOutput.retrieved_ids``: the serving
  runner gives the ``rag`` graph's retrieved chunks before grading, a document once per
  chunk, at each chunk's rank; for the ``agent`` graph, the passages its
  ``knowledge_search`` calls returned). ``k`` is `RECALL_K` (4, the ``rag`` graph's
  default ``knowledge.rag.max_sources``: how many chunks the model is given at most),
  unless the caller passes another; the run file records it as ``timings.recall_k``.
- ``facts_contained``: cases with ``expected_facts``.
- ``citations_valid``: every case of a ``rag`` or ``graphrag`` suite (the graph numbers its sources
  and asks the model to cite them); ``None`` when nothing was retrieved.
- ``no_answer_detected``: cases with ``expect_no_answer``.
- ``tools_match``: every case of an ``agent`` suite (a case listing no tools expects
  none); DeepEval's ToolCorrectnessMetric through ``eval.metrics.tools_match``.
- ``latency_within``: every case, when the alias has an SLA.

A case whose run failed (``CaseOutput.error``) scores no metric: each one that applies
is an error naming the failure (`CaseScore.errors`), counted apart by the gate, never
a silent 0 and never a crash.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, Protocol

from eval.datasets import Case, Suite
from eval.metrics import (
    CITATIONS_VALID,
    FACTS_CONTAINED,
    LATENCY_WITHIN,
    MRR,
    NO_ANSWER_DETECTED,
    RECALL_AT_K,
    TOOLS_MATCH,
    CaseScore,
    LatencySla,
    cited_indices,
    citations_valid,
    facts_contained,
    latency_within,
    mrr,
    no_answer_detected,
    recall_at_k,
    tools_match,
)
from eval.runner import CaseOutput, CaseRequest, CaseRunner
from eval.runs import RunFile

__all__ = ["ANSWER_CHARS", "JUDGED_METRICS", "RECALL_K", "CaseJudge", "applicable_metrics", "run_suite", "score_case"]

log = logging.getLogger(__name__)

RECALL_K = 4
"""``k`` of ``recall_at_k``: the ``rag`` graph's default ``max_sources``."""
ANSWER_CHARS = 2000
"""An answer is kept in the run file up to this many characters."""
JUDGED_METRICS = ("faithfulness", "answer_relevancy", "correctness")
"""The metrics a judge scores (``eval.judge``)."""


class CaseJudge(Protocol):
    """What `run_suite` needs of a judge (``eval.judge.Judge`` is one)."""

    name: str
    """The judge model, as the run file records it."""

    async def score(self, case: Case, output: CaseOutput) -> tuple[dict[str, float | None], dict[str, str]]:
        """The judged metrics' values and the errors of those it could not score."""
        ...


def applicable_metrics(suite: Suite, case: Case, *, sla: LatencySla | None) -> list[str]:
    """The deterministic metrics that apply to ``case`` (see the module docstring)."""
    names = []
    if case.expected_sources:
        names += [RECALL_AT_K, MRR]
    if case.expected_facts:
        names.append(FACTS_CONTAINED)
    if suite.graph in ("rag", "graphrag"):
        names.append(CITATIONS_VALID)
    if case.expect_no_answer:
        names.append(NO_ANSWER_DETECTED)
    if suite.graph == "agent":
        names.append(TOOLS_MATCH)
    if sla is not None:
        names.append(LATENCY_WITHIN)
    return names


def score_case(
    suite: Suite, case: Case, output: CaseOutput, *, sla: LatencySla | None, k: int = RECALL_K
) -> CaseScore:
    """The deterministic metrics of one case's output.

    Args:
        suite: the case's suite (its graph decides which metrics apply).
        case: the golden case.
        output: what the run produced.
        sla: the alias's latency promise; ``None``: ``latency_within`` does not apply.
        k: how many retrieved ids ``recall_at_k`` looks at.

    Returns:
        The scores; when the run failed, every applicable metric is an error instead.
    """
    names = applicable_metrics(suite, case, sla=sla)
    if output.error is not None:
        reason = f"the run failed: {output.error}"
        return CaseScore(case_id=case.id, values={name: None for name in names}, errors=dict.fromkeys(names, reason))
    values: dict[str, float | None] = {}
    for name in names:
        if name == RECALL_AT_K:
            values[name] = recall_at_k(list(output.retrieved_ids), case.expected_sources, k)
        elif name == MRR:
            values[name] = mrr(list(output.retrieved_ids), case.expected_sources)
        elif name == FACTS_CONTAINED:
            values[name] = facts_contained(output.answer, case.expected_facts)
        elif name == CITATIONS_VALID:
            values[name] = citations_valid(cited_indices(output.answer), list(output.contexts))
        elif name == NO_ANSWER_DETECTED:
            values[name] = float(no_answer_detected(output.answer))
        elif name == TOOLS_MATCH:
            expected = [tool.model_dump() for tool in case.expected_tools]
            values[name] = tools_match(expected, list(output.tool_calls))
        elif name == LATENCY_WITHIN:
            assert sla is not None
            values[name] = float(latency_within(output.ttft_s, output.total_s, sla))
    return CaseScore(case_id=case.id, values=values)


async def _judged(judge: CaseJudge, suite: Suite, case: Case, output: CaseOutput) -> tuple[dict[str, float | None], dict[str, str]]:
    if output.error is not None:
        # Faithfulness is to retrieved context: a chat suite has none.
        names = [m for m in JUDGED_METRICS if m != "faithfulness" or suite.graph != "chat"]
        return {m: None for m in names}, dict.fromkeys(names, f"the run failed: {output.error}")
    try:
        return await judge.score(case, output)
    except Exception as exc:  # boundary: a judge that breaks is a scored error, not a crashed run
        log.warning("judge %s failed on case %s: %r", judge.name, case.id, exc)
        reason = f"the judge failed: {type(exc).__name__}: {exc}"
        return {m: None for m in JUDGED_METRICS}, dict.fromkeys(JUDGED_METRICS, reason)


def _percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None}
    return {
        "mean": round(sum(values) / len(values), 4),
        "p50": round(_percentile(values, 0.5) or 0.0, 4),
        "p95": round(_percentile(values, 0.95) or 0.0, 4),
    }


def _record(output: CaseOutput) -> dict[str, Any]:
    """What the run file keeps of a case's output."""
    record: dict[str, Any] = {
        "answer": output.answer[:ANSWER_CHARS],
        "ttft_s": None if output.ttft_s is None else round(output.ttft_s, 4),
        "total_s": None if output.total_s is None else round(output.total_s, 4),
        "backend": output.backend,
        "error": output.error,
        "retrieved_ids": list(output.retrieved_ids),
        "tool_calls": [dict(call) for call in output.tool_calls],
    }
    if len(output.answer) > ANSWER_CHARS:
        record["answer_chars"] = len(output.answer)
    if output.extra:
        record["extra"] = dict(output.extra)
    return record


def _switchyard_version() -> str:
    try:
        return metadata.version("switchyard")
    except metadata.PackageNotFoundError:
        return "unknown"


async def run_suite(
    suite: Suite,
    runner: CaseRunner,
    *,
    judge: CaseJudge | None = None,
    sla: LatencySla | None = None,
    seed: int = 7,
    progress: Callable[[int, int], None] | None = None,
    k: int = RECALL_K,
) -> RunFile:
    """Run every case of ``suite`` through ``runner`` and score it.

    Args:
        suite: the suite (or a dataset file wrapped as one).
        runner: runs cases against the model being evaluated.
        judge: scores faithfulness, answer relevancy and correctness; ``None``: only the
            deterministic metrics.
        sla: the alias's latency promise, for ``latency_within``.
        seed: the sampling seed sent with every case.
        progress: called after each case with (cases done, cases in all).
        k: ``recall_at_k``'s k.

    Returns:
        The run file: per-case scores and outputs, the backend and versions, timings.

    Raises:
        Whatever ``runner.ensure_corpus`` raises (the corpus cannot be ingested: no case
        can run). A case's failure is never raised: it is scored as errors.
    """
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    collections = sorted({c for c in (suite.collection_for(case) for case in suite.cases) if c is not None})
    if suite.corpus is not None:
        for collection in collections:
            await runner.ensure_corpus(suite, collection)
    scores: list[CaseScore] = []
    outputs: dict[str, dict[str, Any]] = {}
    backends: dict[str, int] = {}
    total = len(suite.cases)
    for done, case in enumerate(suite.cases, start=1):
        request = CaseRequest(
            case=case, graph=suite.graph, collection=suite.collection_for(case), seed=seed, max_tokens=suite.config.max_tokens
        )
        try:
            output = await runner.run_case(request)
        except Exception as exc:  # boundary: a runner that raises instead of reporting still scores as errors
            log.warning("case %s raised: %r", case.id, exc)
            output = CaseOutput(error=f"{type(exc).__name__}: {exc}")
        score = score_case(suite, case, output, sla=sla, k=k)
        if judge is not None:
            values, errors = await _judged(judge, suite, case, output)
            score = CaseScore(
                case_id=case.id, values={**score.values, **values}, errors={**score.errors, **errors}
            )
        scores.append(score)
        outputs[case.id] = _record(output)
        if output.backend:
            backends[output.backend] = backends.get(output.backend, 0) + 1
        if progress is not None:
            progress(done, total)
    ttfts = [o["ttft_s"] for o in outputs.values() if o["ttft_s"] is not None and o["error"] is None]
    totals = [o["total_s"] for o in outputs.values() if o["total_s"] is not None and o["error"] is None]
    timings: dict[str, Any] = {
        "total_s": round(time.perf_counter() - started, 3),
        "cases": total,
        "failed_cases": sum(o["error"] is not None for o in outputs.values()),
        "ttft_s": _summary(ttfts),
        "case_total_s": _summary(totals),
        "recall_k": k,
    }
    if backends:
        timings["cases_by_backend"] = backends
    backend = runner.backend_version
    return RunFile(
        suite=suite.name,
        dataset_hash=suite.hash,
        model=runner.model,
        backend=backend,
        started_at=started_at,
        judge=judge.name if judge is not None else None,
        cases=scores,
        timings=timings,
        outputs=outputs,
        versions={"switchyard": _switchyard_version(), "model": runner.model, "backend": backend},
    )
