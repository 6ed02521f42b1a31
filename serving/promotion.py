"""Eval-gated promotion of a model alias, and its one-step rollback.

``promote(alias, backend, weight)``:

1. picks the alias's suites (``eval.suites[alias]``, else every shipped suite whose graph
   is a configured graph calling the alias);
2. probes the candidate and the baseline (an unreachable candidate refuses the promotion
   with `EvaluationFailedError`, 503, before anything runs), then runs each suite on the
   candidate backend alone, and on the baseline alone, unless a stored run of the baseline
   on the same dataset (same hash, same judge, as the judge this promotion builds names
   itself) can be reused; a stored run with failed cases is never reused, and one the
   gate cannot compare with the candidate's (exit 2: e.g. it predates the alias's SLA) is
   replaced by a fresh run of the baseline. The baseline is the alias's primary target,
   or, when the candidate is already a canary target, the heaviest of the others
   (`gateway.promotions.promotion_targets`);
3. gates each suite (``eval.gate.compare`` with ``eval.thresholds``) and writes its
   reports (Markdown and HTML) under ``<eval_runs_dir>/promotions/<alias>/`` and the run
   files under ``<eval_runs_dir>/runs/<suite>/`` (where ``switchyard eval run`` keeps its
   own);
4. only when every suite passes, switches the alias's targets in one write of
   ``promotions.json`` and one registry swap (``weight`` W: the candidate at W and the
   other targets scaled to share 100-W; none: the candidate alone), recording who, when, the scores and
   the reports in the alias's history and an audit record (``model_promoted``). A
   refused promotion changes nothing and leaves a ``model_promotion_refused`` record
   with the failing metrics.

``rollback(alias)`` restores the targets in force before the alias's last promotion at
once (no evaluation), with a ``model_rolled_back`` record; ``history(alias)`` lists both.
A rollback never waits for a promotion of the alias that is evaluating: that promotion
then finds the alias changed when it commits, and is refused (`PromotionConflictError`,
409) with nothing written.

Files that cannot be read or written (a read-only or full data directory, an unreadable
suite) refuse with 503 and change nothing; an audit record that cannot be written after a
change was made is logged as an error (the change stands).

The evaluation is a callable (`Evaluate`), so the switching logic does not depend on how
the cases run; `serving_evaluate` is the real one (the server's graphs and run host).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from eval.datasets import DatasetError, Suite, list_suites, load_suite
from eval.gate import GateResult, Thresholds, ThresholdsError, compare, render_markdown
from eval.metrics import LatencySla
from eval.run import CaseJudge, run_suite
from eval.runs import RunFile, RunFileError, load_run, write_run
from gateway import AliasTarget, ModelGateway, ModelRegistry, RegistryError, load_registry
from gateway.promotions import (
    AliasPromotions,
    HistoryEntry,
    NothingToRollBackError,
    PromotionConflictError,
    PromotionError,
    PromotionStore,
    PromotionStoreError,
    promotion_targets,
    promotions_path,
)
from serving.audit import AuditLog
from serving.eval_runner import BACKEND_PREFIX, build_judge, open_runner
from serving.platform import Platform
from serving.runs.host import RunHost
from serving.settings import Settings

__all__ = [
    "Commit",
    "NothingToRollBackError",
    "Evaluate",
    "EvaluationFailedError",
    "GateRefusedError",
    "PromotionBusyError",
    "PromotionOutcome",
    "PromotionRequestError",
    "PromotionStoreError",
    "PromotionUnavailableError",
    "Promoter",
    "SuiteGate",
    "UnknownAliasError",
    "configured_judge",
    "file_commit",
    "served_registry",
    "serving_evaluate",
]

log = logging.getLogger(__name__)


class Evaluate(Protocol):
    """Runs one suite against a model (an alias or a backend id, which then answers alone)."""

    def __call__(self, suite: Suite, model: str, *, sla: LatencySla | None) -> Awaitable[RunFile]: ...


Check = Callable[[Mapping[str, AliasPromotions]], None]
Commit = Callable[[Callable[[Check], HistoryEntry]], Awaitable[HistoryEntry]]
"""Writes a change of ``promotions.json`` and puts it in force: given the store write
(which calls its ``check`` with the new aliases before writing), the server's reloader
builds the new registry in ``check``, and swaps it in after the write."""


class PromotionRequestError(PromotionError):
    """The request names something invalid (an unknown backend, a bad weight): HTTP 400."""


class UnknownAliasError(PromotionError):
    """No such alias in the served registry: HTTP 404."""


class PromotionUnavailableError(PromotionError):
    """Something the promotion needs cannot be used now (a suite's files cannot be read, a
    backend does not answer, the data directory cannot be written): nothing changed
    (HTTP 503)."""


class EvaluationFailedError(PromotionUnavailableError):
    """The evaluation could not run (a corpus that cannot be ingested, a candidate or
    baseline backend that does not answer its health probe): nothing changed (HTTP 503)."""


class PromotionBusyError(PromotionConflictError):
    """Another promotion of the alias is running (in this process): HTTP 409. A rollback
    never waits for one."""


def served_registry(models_file: Path, store: PromotionStore) -> ModelRegistry:
    """``models_file`` with the promotions in force: what a server serves.

    Raises:
        RegistryError: the file is invalid, or a promotion names what it no longer has.
    """
    return store.apply(load_registry(models_file))


def file_commit(models_file: Path, store: PromotionStore, gateway: ModelGateway | None = None) -> Commit:
    """A `Commit` with no server to tell (a CLI): the change is checked against
    ``models_file`` and, after the write, put in force in ``gateway`` (this process's);
    a server started later, or a running one's watcher, picks the file up."""

    async def commit(write: Callable[[Check], HistoryEntry]) -> HistoryEntry:
        base = load_registry(models_file)
        built: list[ModelRegistry] = []

        def check(aliases: Mapping[str, AliasPromotions]) -> None:
            built.append(store.apply(base, source=aliases))

        entry = await asyncio.to_thread(write, check)
        if gateway is not None and built:
            gateway.reload(built[-1])
        return entry

    return commit


def configured_judge(settings: Settings, gateway: ModelGateway) -> CaseJudge | None:
    """The DeepEval judge ``eval.judge`` names (an alias or a backend id), as ``switchyard
    eval run`` builds it, DeepEval kept offline with its files under
    ``<eval_runs_dir>/deepeval``; None when no judge is configured.

    Raises:
        UnknownModelError: the judge is neither an alias nor a backend id.
    """
    model = settings.eval.judge
    return None if model is None else build_judge(settings, gateway, model)


def serving_evaluate(platform: Platform, host: RunHost) -> Evaluate:
    """The real `Evaluate`: each suite through ``platform``'s graphs and ``host`` (the
    server's run host, or a CLI's), sampled with ``eval.seed``, each backend evaluated
    alone (`serving.eval_runner.open_runner`), judged by ``eval.judge`` when one is set
    (built at the first evaluation, so a bad judge refuses a promotion, nothing else, and
    built again after each registry swap: its name, which a run file records and a stored
    baseline is matched on, may name the backends the judge alias resolves to)."""
    seed = platform.settings.eval.seed
    judges: list[tuple[ModelRegistry, CaseJudge | None]] = []

    async def evaluate(suite: Suite, model: str, *, sla: LatencySla | None) -> RunFile:
        registry = platform.gateway.registry
        if not judges or judges[0][0] is not registry:
            judges[:] = [(registry, configured_judge(platform.settings, platform.gateway))]
        judge = judges[0][1]
        # Promotion evaluates backends: ``backend:<id>`` even if an alias has the same name.
        # A suite with no corpus asks the user's own collections (read only), as `eval run` does.
        pinned = BACKEND_PREFIX + model.removeprefix(BACKEND_PREFIX)
        user_collections = suite.corpus is None and platform.knowledge is not None
        async with open_runner(platform, host, pinned, seed=seed, user_collections=user_collections) as runner:
            return await run_suite(suite, runner, judge=judge, sla=sla, seed=seed)

    return evaluate


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteGate:
    """One suite's gate in a promotion."""

    suite: str
    dataset_hash: str
    result: GateResult
    baseline_run: str
    candidate_run: str
    baseline_reused: bool
    """The baseline run was a stored one (same dataset hash and judge), not run now."""
    baseline_rerun: str | None = None
    """A stored baseline run that was found but could not be gated against (exit 2), so
    the baseline ran again; None when none was set aside."""
    reports: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.result.passed

    def failing(self) -> list[dict[str, Any]]:
        """The metrics that did not pass: name, verdict, reason, baseline, candidate."""
        return [
            {"metric": m.metric, "verdict": m.verdict, "reason": m.reason, "baseline": m.baseline, "candidate": m.candidate}
            for m in self.result.metrics
            if m.verdict in ("regressed", "not_evaluable")
        ]

    def scores(self) -> dict[str, Any]:
        """Per metric: baseline, candidate, delta, verdict (what the history keeps)."""
        return {
            m.metric: {"baseline": m.baseline, "candidate": m.candidate, "delta": m.delta, "verdict": m.verdict}
            for m in self.result.metrics
            if m.verdict != "not_applicable"
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "dataset_hash": self.dataset_hash,
            "passed": self.passed,
            "exit_code": self.result.exit_code,
            "baseline_run": self.baseline_run,
            "candidate_run": self.candidate_run,
            "baseline_reused": self.baseline_reused,
            "baseline_rerun": self.baseline_rerun,
            "reports": list(self.reports),
            "metrics": self.result.to_json()["metrics"],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PromotionOutcome:
    """What a promotion did."""

    alias: str
    backend: str
    weight: int | None
    promoted: bool
    suites: tuple[SuiteGate, ...]
    entry: HistoryEntry | None = None
    """The history entry (when promoted)."""
    reports: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "backend": self.backend,
            "weight": self.weight,
            "promoted": self.promoted,
            "entry": None if self.entry is None else self.entry.model_dump(mode="json"),
            "suites": [s.to_json() for s in self.suites],
            "reports": list(self.reports),
        }


class GateRefusedError(PromotionError):
    """A suite did not pass the gate: nothing changed (HTTP 422, with the verdicts)."""

    def __init__(self, outcome: PromotionOutcome) -> None:
        self.outcome = outcome
        failing = [
            f"{s.suite}: " + (", ".join(f"{m['metric']} {m['verdict']} ({m['reason']})" for m in s.failing()) or "no case in common")
            for s in outcome.suites
            if not s.passed
        ]
        super().__init__(
            f"promotion of {outcome.backend!r} to alias {outcome.alias!r} refused by the eval gate; nothing changed. "
            + "; ".join(failing)
        )


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _safe(name: str) -> str:
    return _SAFE.sub("_", name).strip(".") or "_"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _targets_json(targets: Sequence[AliasTarget]) -> list[dict[str, Any]]:
    return [{"backend": t.backend, "weight": t.weight} for t in targets]


class Promoter:
    """Promotes, rolls back and lists one data directory's alias promotions."""

    def __init__(
        self,
        *,
        settings: Settings,
        gateway: ModelGateway,
        graph_models: Mapping[str, str],
        evaluate: Evaluate,
        commit: Commit,
        audit: AuditLog | None = None,
        store: PromotionStore | None = None,
        render_html: Callable[[GateResult, RunFile, RunFile], str] | None = None,
    ) -> None:
        """Args:
            settings: the settings (``eval`` section, data directory).
            gateway: the served gateway (the alias's current targets, the known backends).
            graph_models: graph id -> the alias it calls (which suites cover an alias).
            evaluate: runs a suite against a model.
            commit: writes and applies a change (the reloader's `commit` in a server,
                `file_commit` in a CLI with no server).
            audit: where the promotion records go (the server's log); None: none written.
            render_html: the HTML gate report (``eval.report.render_gate_html``), if any.
        """
        self._settings = settings
        self._gateway = gateway
        self._graph_models = dict(graph_models)
        self._evaluate = evaluate
        self._commit = commit
        self._audit = audit
        self.store = store or PromotionStore(promotions_path(settings.data_dir))
        self._render_html = render_html
        self._busy: set[str] = set()
        self._switch = asyncio.Lock()
        """Held while a promotion takes its snapshot of the alias, and while a promotion or
        a rollback commits: never during an evaluation, so a rollback is never kept waiting."""

    @property
    def runs_dir(self) -> Path:
        return self._settings.eval_runs_dir

    def suites_for(self, alias: str) -> list[Suite]:
        """The suites a promotion of ``alias`` runs.

        Raises:
            PromotionRequestError: none is configured or found, or one is invalid.
            PromotionUnavailableError: a suite's files cannot be read now.
        """
        names = self._settings.eval.suites.get(alias)
        try:
            if names:
                return [load_suite(name) for name in names]
            graphs = {graph for graph, model in self._graph_models.items() if model == alias}
            suites = [s for s in (load_suite(name) for name in list_suites()) if s.graph in graphs]
        except DatasetError as exc:
            raise PromotionRequestError(f"the eval suites of alias {alias!r} cannot be loaded: {exc}") from None
        except OSError as exc:
            raise PromotionUnavailableError(
                f"the eval suites of alias {alias!r} cannot be read ({exc.filename or ''}: {exc.strerror or exc}); nothing changed"
            ) from None
        if not suites:
            raise PromotionRequestError(
                f"no eval suite covers alias {alias!r}: no configured graph that calls it has a shipped suite; "
                f"list its suites in the settings (eval.suites.{alias})"
            )
        return suites

    def _claim(self, alias: str) -> None:
        if alias in self._busy:
            raise PromotionBusyError(f"a promotion of alias {alias!r} is already running; try again when it ends")
        self._busy.add(alias)

    def _alias(self, alias: str) -> Any:
        registry = self._gateway.registry
        if alias not in registry.aliases:
            raise UnknownAliasError(f"unknown model alias {alias!r}; aliases: {', '.join(sorted(registry.aliases)) or 'none'}")
        return registry.aliases[alias]

    def history(self, alias: str) -> tuple[HistoryEntry, ...]:
        """The alias's promotions and rollbacks, oldest first.

        Raises:
            UnknownAliasError: neither served nor ever promoted.
        """
        entries = self.store.history(alias)
        if not entries:
            self._alias(alias)
        return entries

    async def promote(self, alias: str, backend: str, *, weight: int | None = None, by: str) -> PromotionOutcome:
        """Evaluate ``backend`` for ``alias`` and switch on a pass; see the module docstring.

        Raises:
            UnknownAliasError, PromotionRequestError: bad alias, backend or weight, or
                ``backend`` already takes all the traffic (nothing ran).
            PromotionBusyError: another promotion of the alias is running.
            EvaluationFailedError: the candidate (or the baseline, when it has to run)
                does not answer its health probe, or a suite could not be evaluated
                (nothing changed).
            PromotionUnavailableError: a suite cannot be read, or ``promotions.json``
                cannot be written (nothing changed).
            GateRefusedError: a suite failed its gate (nothing changed).
            PromotionConflictError: someone else changed the alias meanwhile, e.g. a
                rollback while this promotion was evaluating (nothing changed).
        """
        served = self._alias(alias)
        registry = self._gateway.registry
        if backend not in registry.backends:
            raise PromotionRequestError(
                f"unknown backend {backend!r}; backends: {', '.join(sorted(registry.backends))}"
            )
        self._plan(served.targets, alias, backend, weight)  # a bad request is refused before anything
        try:
            thresholds = Thresholds.load(self._settings.eval.thresholds)
        except ThresholdsError as exc:
            raise PromotionRequestError(f"eval.thresholds: {exc}") from None
        suites = self.suites_for(alias)
        self._claim(alias)
        try:
            # One consistent view of the alias: what the store says and what is served.
            async with self._switch:
                promotions = await asyncio.to_thread(self.store.alias, alias)
                current = self._alias(alias)
            expected, seq = promotions.targets, len(promotions.history)
            before = tuple(current.targets)
            primary, after = self._plan(before, alias, backend, weight)
            sla = None if current.sla is None else LatencySla(ttft_s=current.sla.ttft_s, total_s=current.sla.total_s)

            def refuse(reason: str) -> EvaluationFailedError:
                self._record("model_promotion_refused", alias=alias, backend=backend, weight=weight, by=by,
                             baseline=primary, error=reason)
                return EvaluationFailedError(f"promotion of {backend!r} to alias {alias!r} refused; nothing changed: {reason}")

            health = {h.backend_id: h for h in await self._gateway.probe(list(dict.fromkeys([backend, primary])))}
            if not health[backend].ready:
                log.warning("promotion of %s to alias %s: the candidate is unreachable: %s", backend, alias, health[backend].reason)
                raise refuse(f"the candidate backend {backend!r} is unreachable: {health[backend].reason}")
            # A baseline that does not answer matters only if a suite has no stored run of it.
            primary_down = None if health[primary].ready else health[primary].reason
            stamp = _stamp()
            report_dir = self.runs_dir / "promotions" / _safe(alias) / f"{stamp}-{_safe(backend)}"
            gates = []
            for suite in suites:
                try:
                    gates.append(await self._gate_suite(suite, primary, backend, sla, thresholds, report_dir, primary_down))
                except Exception as exc:  # boundary: an evaluation that cannot run refuses the promotion
                    log.exception("promotion of %s to alias %s: suite %s could not be evaluated", backend, alias, suite.name)
                    why = str(exc) if isinstance(exc, PromotionError) else f"{type(exc).__name__}: {exc}"
                    raise refuse(f"suite {suite.name!r} could not be evaluated: {why}") from None
            reports = tuple(path for gate in gates for path in gate.reports)
            outcome = PromotionOutcome(alias=alias, backend=backend, weight=weight, promoted=False, suites=tuple(gates), reports=reports)
            if not all(gate.passed for gate in gates):
                self._record("model_promotion_refused", alias=alias, backend=backend, weight=weight, by=by,
                             baseline=primary,
                             failing={g.suite: g.failing() for g in gates if not g.passed}, reports=list(reports))
                log.warning("promotion of %s to alias %s refused by the eval gate", backend, alias)
                raise GateRefusedError(outcome)
            scores = {g.suite: g.scores() for g in gates}
            runs = {g.suite: {"baseline": g.baseline_run, "candidate": g.candidate_run} for g in gates}

            def write(check: Check) -> HistoryEntry:
                return self.store.record_promotion(
                    alias, expected_override=expected, expected_seq=seq, from_targets=before, to_targets=after, by=by,
                    backend=backend, weight=weight, scores=scores, reports=list(reports), runs=runs, check=check,
                )

            try:
                async with self._switch:
                    entry = await self._commit(write)
            except (PromotionError, RegistryError) as exc:
                # A rollback or another writer got there first, the data directory cannot
                # be written, or the models file no longer has what the change needs.
                log.warning("promotion of %s to alias %s passed the gate but was not committed: %s", backend, alias, exc)
                self._record("model_promotion_refused", alias=alias, backend=backend, weight=weight, by=by,
                             baseline=primary, error=str(exc), reports=list(reports))
                raise
            self._record("model_promoted", alias=alias, backend=backend, weight=weight, by=by, seq=entry.seq,
                         baseline=primary, from_targets=_targets_json(before), to_targets=_targets_json(after),
                         scores=scores, reports=list(reports), runs=runs)
            log.info("alias %s promoted to %s by %s: %s", alias, backend, by, _targets_json(after))
            return PromotionOutcome(
                alias=alias, backend=backend, weight=weight, promoted=True, suites=tuple(gates), entry=entry, reports=reports
            )
        finally:
            self._busy.discard(alias)

    @staticmethod
    def _plan(
        targets: Sequence[AliasTarget], alias: str, backend: str, weight: int | None
    ) -> tuple[str, tuple[AliasTarget, ...]]:
        """(baseline, targets after) of the promotion (`promotion_targets`).

        Raises:
            PromotionRequestError: a bad weight, or nothing would change.
        """
        if weight is not None and not 1 <= weight <= 100:
            raise PromotionRequestError(f"weight must be from 1 to 100 (the candidate's share in %), got {weight}")
        try:
            return promotion_targets(targets, backend, weight)
        except ValueError as exc:
            raise PromotionRequestError(f"alias {alias!r}: {exc}") from None

    async def rollback(self, alias: str, *, by: str) -> HistoryEntry:
        """Restore the targets before ``alias``'s last promotion, at once.

        A promotion of the alias that is evaluating does not hold the rollback up: it is
        refused when it tries to commit (the store's stale-writer check).

        Raises:
            UnknownAliasError: not a served alias.
            NothingToRollBackError: no promotion of it is left to roll back.
            PromotionStoreError: ``promotions.json`` cannot be written (nothing changed).
        """
        self._alias(alias)
        async with self._switch:
            before = tuple(self._alias(alias).targets)

            def write(check: Check) -> HistoryEntry:
                return self.store.record_rollback(alias, current_targets=before, by=by, check=check)

            entry = await self._commit(write)
            after = self._gateway.registry.aliases[alias].targets if alias in self._gateway.registry.aliases else entry.to_targets
        self._record("model_rolled_back", alias=alias, by=by, seq=entry.seq, rolls_back=entry.rolls_back,
                     from_targets=_targets_json(before), to_targets=_targets_json(after))
        log.info("alias %s rolled back by %s: %s", alias, by, _targets_json(after))
        return entry

    def _record(self, kind: str, **fields: Any) -> None:
        """Append an audit record. A log that cannot be written does not undo or hide what
        was done (a switch already in force, a refusal): it is logged as an error."""
        if self._audit is None:
            return
        try:
            self._audit.append(kind, **fields)
        except Exception:  # boundary: the audit log's failure is reported, the outcome stands
            log.exception("audit record %s of alias %s could not be written", kind, fields.get("alias"))

    # ----------------------------------------------------------------- evaluation

    def _run_path(self, suite: Suite, backend: str, stamp: str) -> Path:
        # The layout ``switchyard eval run`` uses, so that its runs of a backend are reused too.
        return self.runs_dir / "runs" / _safe(suite.name) / f"{_safe(backend)}-{stamp}.json"

    def stored_run(self, suite: Suite, backend: str, *, judge: str | None) -> tuple[Path, RunFile] | None:
        """The newest stored run of ``backend`` alone on ``suite``'s dataset (same hash, same
        judge: the name of the judge that scored the candidate's run), written by an earlier
        promotion or by ``switchyard eval run --model BACKEND``. A run with failed cases
        (``timings.failed_cases``, or a case whose every metric is an error) is never reused:
        a backend that was down for part of it would make a bad baseline."""
        found: list[tuple[float, Path, RunFile]] = []
        wanted = {backend, BACKEND_PREFIX + backend}
        for path in (self.runs_dir / "runs" / _safe(suite.name)).glob("*.json"):
            try:
                run = load_run(path)
            except RunFileError as exc:
                log.warning("stored eval run not reused: %s", exc)
                continue
            if run.dataset_hash == suite.hash and run.judge == judge and run.model in wanted:
                if _failed_cases(run):
                    log.info("stored eval run %s not reused: %d failed case(s)", path, _failed_cases(run))
                    continue
                found.append((run.started_at.timestamp(), path, run))
        if not found:
            return None
        _, path, run = max(found, key=lambda item: item[0])
        return path, run

    async def _run(self, suite: Suite, backend: str, sla: LatencySla | None) -> tuple[Path, RunFile]:
        run = await self._evaluate(suite, backend, sla=sla)
        path = self._run_path(suite, backend, _stamp())
        path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(write_run, run, path)
        return path, run

    async def _gate_suite(
        self,
        suite: Suite,
        primary: str,
        backend: str,
        sla: LatencySla | None,
        thresholds: Thresholds,
        report_dir: Path,
        primary_down: str | None = None,
    ) -> SuiteGate:
        candidate_path, candidate = await self._run(suite, backend, sla)
        stored = await asyncio.to_thread(self.stored_run, suite, primary, judge=candidate.judge)
        set_aside: Path | None = None
        result: GateResult | None = None
        if stored is not None:
            baseline_path, baseline = stored
            result = compare(baseline.by_case(), candidate.by_case(), thresholds)
            if result.exit_code == 2:
                # The stored run cannot be compared (e.g. it predates the alias's SLA, so
                # only the candidate has latency_within): run the baseline now instead.
                log.warning("stored baseline %s cannot be gated against the candidate (exit 2); running %s again",
                            baseline_path, primary)
                set_aside, stored, result = baseline_path, None, None
        if stored is None:
            if primary_down is not None:
                raise EvaluationFailedError(
                    f"the baseline backend {primary!r} is unreachable ({primary_down}) and no stored run of it can be reused"
                )
            baseline_path, baseline = await self._run(suite, primary, sla)
            result = compare(baseline.by_case(), candidate.by_case(), thresholds)
        assert result is not None
        reused = stored is not None
        report_dir.mkdir(parents=True, exist_ok=True)
        name = _safe(suite.name)
        reports = [report_dir / f"{name}.gate.md"]
        header = (
            f"# Promotion gate: suite `{suite.name}`\n\n"
            f"- baseline: `{baseline.backend}` ({baseline_path}{', reused' if reused else ''})\n"
            + (f"- stored baseline set aside (the gate could not compare it): {set_aside}\n" if set_aside else "")
            + f"- candidate: `{candidate.backend}` ({candidate_path})\n"
            f"- dataset hash: `{suite.hash}`\n\n"
        )
        await asyncio.to_thread(_write_text, reports[0], header + render_markdown(result))
        if self._render_html is not None:
            reports.append(report_dir / f"{name}.gate.html")
            await asyncio.to_thread(_write_text, reports[1], self._render_html(result, baseline, candidate))
        return SuiteGate(
            suite=suite.name, dataset_hash=suite.hash, result=result, baseline_run=str(baseline_path),
            candidate_run=str(candidate_path), baseline_reused=reused, reports=tuple(str(p) for p in reports),
            baseline_rerun=None if set_aside is None else str(set_aside),
        )


def _failed_cases(run: RunFile) -> int:
    """How many cases of ``run`` failed: its ``timings.failed_cases``, or the cases whose
    every metric is an error, whichever is more."""
    recorded = (run.timings or {}).get("failed_cases")
    counted = sum(1 for case in run.cases if case.errors and set(case.values) <= set(case.errors))
    return max(recorded if isinstance(recorded, int) else 0, counted)


def _write_text(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(text, encoding="utf-8")
    scratch.replace(path)

