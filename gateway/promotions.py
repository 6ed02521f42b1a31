"""Promotions: alias targets switched by ``switchyard models promote``, kept beside the
operator's registry file instead of in it.

``<data_dir>/gateway/promotions.json`` holds, per alias, the targets a promotion put in
place (they replace the alias's ``targets`` from ``models.yaml``; its fallbacks, ``sticky``,
``balance`` and ``sla`` stay as the file says) and the alias's history: every promotion
and rollback with who, when, from which targets to which, the gate's scores and the
report and run files. ``models.yaml`` is never rewritten: an operator's file stays theirs,
and removing ``promotions.json`` returns every alias to it.

Writers (the server, a CLI with no server running) take an exclusive ``fcntl`` lock on
``promotions.json.lock`` for the read-modify-write and replace the file atomically
(a temporary file, then a rename), so readers (the server's reload) see the old file or
the whole new one and two writers never interleave. A promotion records the override it
replaced and is refused if another writer changed the alias since its evaluation began
(its override, or its history: a rollback and a promotion that land back on the same
targets still count). A data directory that cannot be written (read-only, full) is a
`PromotionStoreError` and changes nothing.

A rollback returns the alias to the targets in force before its last promotion that was
not rolled back yet (promotions stack: promote A, promote B, rollback, rollback is back
where it started).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import GatewayError, RegistryError
from gateway.registry import AliasTarget, ModelRegistry

__all__ = [
    "PROMOTIONS_FILE",
    "AliasPromotions",
    "HistoryEntry",
    "NothingToRollBackError",
    "PromotionConflictError",
    "PromotionError",
    "PromotionStore",
    "PromotionStoreError",
    "PromotionsFile",
    "PromotionsFileError",
    "promotion_targets",
    "promotions_path",
]

PROMOTIONS_FILE = "promotions.json"


def promotions_path(data_dir: Path) -> Path:
    """Where a data directory keeps its promotions: ``<data_dir>/gateway/promotions.json``."""
    return Path(data_dir) / "gateway" / PROMOTIONS_FILE


class PromotionError(GatewayError):
    """A promotion or rollback cannot be done; the message says why."""


class NothingToRollBackError(PromotionError):
    """The alias has no promotion left to roll back."""


class PromotionConflictError(PromotionError):
    """Another writer changed the alias's promotion while this one was being decided."""


class PromotionStoreError(PromotionError):
    """``promotions.json`` cannot be written (a read-only or full data directory, a lock
    file that cannot be opened): nothing changed."""


class PromotionsFileError(RegistryError):
    """``promotions.json`` is unreadable or invalid, or promotes an alias or backend the
    registry does not have. A `RegistryError`: the reload that meets it is refused and the
    running registry stays."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HistoryEntry(_Frozen):
    """One promotion or rollback of an alias."""

    seq: int = Field(ge=1)
    """1, 2, ... per alias."""
    at: datetime
    """When it took effect (UTC)."""
    by: str
    """Who asked: ``tenant <name>`` over HTTP, ``cli <user>`` from the command line."""
    action: Literal["promote", "rollback"]
    from_targets: tuple[AliasTarget, ...]
    """The alias's targets before."""
    to_targets: tuple[AliasTarget, ...]
    """The alias's targets after."""
    previous_override: tuple[AliasTarget, ...] | None = None
    """For a promotion: the promoted targets it replaced, or None when the alias followed
    ``models.yaml`` (what a rollback restores)."""
    backend: str | None = None
    """For a promotion: the candidate backend."""
    weight: int | None = None
    """For a promotion: the candidate's canary weight (None: it took all the traffic)."""
    rolls_back: int | None = None
    """For a rollback: the ``seq`` of the promotion it undid."""
    verdict: str | None = None
    """For a promotion: the gate's decision (``pass``)."""
    scores: dict[str, Any] = Field(default_factory=dict)
    """For a promotion: suite -> metric -> baseline, candidate, delta, verdict."""
    reports: list[str] = Field(default_factory=list)
    """For a promotion: the gate reports written (Markdown, HTML)."""
    runs: dict[str, dict[str, str]] = Field(default_factory=dict)
    """For a promotion: suite -> ``{"baseline": file, "candidate": file}``."""


class AliasPromotions(_Frozen):
    """One alias's promoted targets and history."""

    targets: tuple[AliasTarget, ...] | None = None
    """The targets in force, replacing ``models.yaml``'s; None: the file's targets."""
    history: tuple[HistoryEntry, ...] = ()

    def open_promotions(self) -> list[HistoryEntry]:
        """The promotions not rolled back yet, oldest first (a rollback undoes the last)."""
        stack: list[HistoryEntry] = []
        for entry in self.history:
            if entry.action == "promote":
                stack.append(entry)
            elif stack:
                stack.pop()
        return stack


class PromotionsFile(_Frozen):
    """``promotions.json``."""

    format: Literal[1] = 1
    aliases: dict[str, AliasPromotions] = Field(default_factory=dict)


def promotion_targets(
    targets: Sequence[AliasTarget], backend: str, weight: int | None
) -> tuple[str, tuple[AliasTarget, ...]]:
    """The baseline a promotion of ``backend`` is gated against, and the alias's targets
    after it.

    The baseline is the heaviest target taking traffic other than ``backend`` (the first of
    equals): the alias's primary, or, when ``backend`` is already a canary target, the
    heaviest of the others, so a canary at any weight (60% makes it the primary) can be
    finished by promoting it again.

    After: with no ``weight`` (or 100), ``backend`` alone at 100. With ``weight`` W,
    ``backend`` at W and every other target kept, their weights scaled in proportion to
    100-W (largest remainders, so the weights sum to 100): ``[a 60, c 40]`` with b at 50 is
    ``[a 30, c 20, b 50]``. A target whose share rounds to 0 stays listed at weight 0
    (drained), so a rollback or a later promotion still sees it; so do drained targets.
    ``backend`` keeps its place when it was a target, else it comes last.

    Raises:
        ValueError: ``backend`` already takes all the traffic, or already has share W.
    """
    weighted = [t for t in targets if t.weight > 0]
    others = [t for t in weighted if t.backend != backend]
    if not others:
        raise ValueError(f"backend {backend!r} is already the primary target (it takes all the traffic)")
    baseline = max(others, key=lambda t: t.weight).backend  # max keeps the first of equals
    if weight is None or weight == 100:
        return baseline, (AliasTarget(backend=backend, weight=100),)
    total = sum(t.weight for t in weighted)
    mine = sum(t.weight for t in weighted if t.backend == backend)
    if mine * 100 == weight * total:
        raise ValueError(f"backend {backend!r} already has {weight}% of the traffic")
    rest = 100 - weight
    others_total = sum(t.weight for t in others)
    exact = {t.backend: t.weight * rest / others_total for t in others}
    scaled = {name: int(share) for name, share in exact.items()}
    # Largest remainders get the points lost to rounding down (the first of equals first).
    order = sorted(exact, key=lambda name: -(exact[name] - scaled[name]))
    for name in order[: rest - sum(scaled.values())]:
        scaled[name] += 1
    after: list[AliasTarget] = []
    for t in targets:
        if t.backend == backend:
            continue
        after.append(AliasTarget(backend=t.backend, weight=scaled.get(t.backend, 0)))
    place = next((i for i, t in enumerate(targets) if t.backend == backend), len(after))
    after.insert(min(place, len(after)), AliasTarget(backend=backend, weight=weight))
    return baseline, tuple(after)


class PromotionStore:
    """Reads and writes one ``promotions.json``; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    @property
    def location(self) -> str:
        """Where the promotions live, as errors name it (the file; a store keeping them
        elsewhere, as replicas sharing a database do, says where)."""
        return str(self.path)

    def load(self) -> PromotionsFile:
        """The file's content (empty when there is none).

        Raises:
            PromotionsFileError: the file is unreadable, not JSON or invalid (naming the field).
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return PromotionsFile()
        except (OSError, UnicodeDecodeError) as exc:
            raise PromotionsFileError(str(self.path), [f"cannot read: {exc}"]) from None
        try:
            return PromotionsFile.model_validate_json(text)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in item['loc']) or '(top level)'}: {item['msg']}" for item in exc.errors()
            ]
            raise PromotionsFileError(str(self.path), problems) from None

    def alias(self, name: str) -> AliasPromotions:
        return self.load().aliases.get(name, AliasPromotions())

    def history(self, alias: str) -> tuple[HistoryEntry, ...]:
        return self.alias(alias).history

    def apply(self, registry: ModelRegistry, *, source: Mapping[str, AliasPromotions] | None = None) -> ModelRegistry:
        """``registry`` with each promoted alias's targets replaced (the rest of each alias
        as the registry has it).

        Raises:
            PromotionsFileError: the file is invalid, or promotes an alias the registry does
                not have or a backend it no longer has (roll the alias back, or restore the
                backend).
        """
        aliases = self.load().aliases if source is None else source
        problems: list[str] = []
        replaced = {}
        for name, promoted in aliases.items():
            if promoted.targets is None:
                continue
            if name not in registry.aliases:
                problems.append(f"aliases.{name}: promoted, but the model registry has no alias {name!r}")
                continue
            missing = [t.backend for t in promoted.targets if t.backend not in registry.backends]
            if missing:
                problems.append(
                    f"aliases.{name}.targets: promoted to backend(s) {', '.join(map(repr, missing))} that the model "
                    f"registry no longer has (roll {name!r} back or restore the backend)"
                )
                continue
            replaced[name] = registry.aliases[name].model_copy(update={"targets": promoted.targets})
        if problems:
            raise PromotionsFileError(self.location, problems)
        if not replaced:
            return registry
        try:
            return registry.with_aliases(replaced)
        except ValueError as exc:  # a fallback and a target that clash: not expected, but named
            raise PromotionsFileError(self.location, [str(exc)]) from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The exclusive lock for a read-modify-write; an `OSError` of the lock or the
        write (a read-only or full data directory) is a `PromotionStoreError`."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = self._lock_path.open("a")
        except OSError as exc:
            raise PromotionStoreError(self._cannot(exc)) from None
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            except OSError as exc:
                raise PromotionStoreError(self._cannot(exc)) from None
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _cannot(self, exc: OSError) -> str:
        where = exc.filename or self.path
        return f"cannot write the promotions file {self.path} ({where}: {exc.strerror or exc}); nothing changed"

    def _write(self, content: PromotionsFile) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(content.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def record_promotion(
        self,
        alias: str,
        *,
        expected_override: tuple[AliasTarget, ...] | None,
        expected_seq: int | None = None,
        from_targets: tuple[AliasTarget, ...],
        to_targets: tuple[AliasTarget, ...],
        by: str,
        backend: str,
        weight: int | None,
        verdict: str = "pass",
        scores: Mapping[str, Any] | None = None,
        reports: list[str] | None = None,
        runs: Mapping[str, Mapping[str, str]] | None = None,
        check: Any = None,
    ) -> HistoryEntry:
        """Put ``to_targets`` in force for ``alias`` and append the promotion to its history.

        Args:
            expected_override: the alias's promoted targets when the decision began; if the
                file says otherwise now, another writer got there first.
            expected_seq: the number of the alias's history entries when the decision
                began (None: not checked); more now means another writer got there first,
                even if the targets came back to ``expected_override``.
            check: called with the new file's aliases before it is written (the server
                checks the registry it makes); raising there writes nothing.

        Raises:
            PromotionConflictError: the alias changed since ``expected_override`` was read.
            PromotionStoreError: the file cannot be written (nothing changed).
        """
        with self._locked():
            content = self.load()
            current = content.aliases.get(alias, AliasPromotions())
            if current.targets != expected_override or (expected_seq is not None and len(current.history) != expected_seq):
                raise PromotionConflictError(
                    f"alias {alias!r} was promoted or rolled back by someone else while this promotion was "
                    "being evaluated; nothing changed: look at its history and try again"
                )
            entry = HistoryEntry(
                seq=len(current.history) + 1,
                at=datetime.now(UTC),
                by=by,
                action="promote",
                from_targets=from_targets,
                to_targets=to_targets,
                previous_override=current.targets,
                backend=backend,
                weight=weight,
                verdict=verdict,
                scores=dict(scores or {}),
                reports=list(reports or []),
                runs={k: dict(v) for k, v in (runs or {}).items()},
            )
            updated = AliasPromotions(targets=to_targets, history=(*current.history, entry))
            new = content.model_copy(update={"aliases": {**content.aliases, alias: updated}})
            if check is not None:
                check(new.aliases)
            self._write(new)
            return entry

    def record_rollback(
        self, alias: str, *, current_targets: tuple[AliasTarget, ...] | None, by: str, check: Any = None
    ) -> HistoryEntry:
        """Return ``alias`` to the targets before its last open promotion.

        Args:
            current_targets: the targets served now (what the history says it came from);
                the promoted ones when None.
            check: as for `record_promotion`.

        Raises:
            NothingToRollBackError: the alias has no promotion left to roll back.
            PromotionStoreError: the file cannot be written (nothing changed).
        """
        with self._locked():
            content = self.load()
            current = content.aliases.get(alias, AliasPromotions())
            open_ = current.open_promotions()
            if not open_:
                done = " (every promotion of it was rolled back)" if current.history else ""
                raise NothingToRollBackError(f"alias {alias!r} has no promotion to roll back{done}")
            last = open_[-1]
            restored = last.previous_override
            entry = HistoryEntry(
                seq=len(current.history) + 1,
                at=datetime.now(UTC),
                by=by,
                action="rollback",
                from_targets=current_targets or current.targets or last.to_targets,
                to_targets=restored if restored is not None else last.from_targets,
                previous_override=current.targets,
                rolls_back=last.seq,
            )
            updated = AliasPromotions(targets=restored, history=(*current.history, entry))
            new = content.model_copy(update={"aliases": {**content.aliases, alias: updated}})
            if check is not None:
                check(new.aliases)
            self._write(new)
            return entry
