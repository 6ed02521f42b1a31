"""The promotions file (gateway/promotions.py): promoted targets replace only an alias's
targets, rollbacks undo promotions last first, a conflicting writer is refused (also after
a round trip back to the same targets), an entry naming a backend the registry no longer
has is an error naming it, writes are atomic under a lock (two processes appending at once
lose nothing) and an unwritable directory is a `PromotionStoreError`; what a promotion's
targets become (canaries of several targets, finishing a canary)."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from gateway import AliasTarget, ModelRegistry
from gateway.promotions import (
    NothingToRollBackError,
    PromotionConflictError,
    PromotionStore,
    PromotionStoreError,
    PromotionsFileError,
    promotion_targets,
    promotions_path,
)
from gateway.registry import Backend

A, B, C = (AliasTarget(backend=name, weight=100) for name in ("a", "b", "c"))


def _backend(name: str) -> Backend:
    return Backend.model_validate({
        "id": name, "kind": "openai", "base_url": f"http://127.0.0.1:9/{name}/v1", "model": name,
        "capabilities": {"context_window": 2048},
    })


def _registry(*names: str) -> ModelRegistry:
    return ModelRegistry(
        {name: _backend(name) for name in names},
        {
            "main": {"targets": [{"backend": "a", "weight": 100}], "fallbacks": ["a"], "sticky": "none",
                     "sla": {"ttft_s": 2.0}},
            "other": "a",
        },
    )


def _promote(store: PromotionStore, to: tuple[AliasTarget, ...], *, backend: str, expected: tuple[AliasTarget, ...] | None,
             from_: tuple[AliasTarget, ...] = (A,)) -> int:
    entry = store.record_promotion(
        "main", expected_override=expected, from_targets=from_, to_targets=to, by="test", backend=backend, weight=None,
        scores={"chat": {"facts_contained": {"baseline": 1.0, "candidate": 1.0}}}, reports=["r.md"],
        runs={"chat": {"baseline": "b.json", "candidate": "c.json"}},
    )
    return entry.seq


def test_apply_replaces_only_the_targets(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    registry = _registry("a", "b")
    assert store.apply(registry) is registry  # no file: the registry as it is
    _promote(store, (AliasTarget(backend="a", weight=90), AliasTarget(backend="b", weight=10)), backend="b", expected=None)
    served = store.apply(registry)
    main = served.aliases["main"]
    assert [(t.backend, t.weight) for t in main.targets] == [("a", 90), ("b", 10)]
    assert main.fallbacks == ("a",) and main.sticky == "none" and main.sla is not None and main.sla.ttft_s == 2.0
    assert served.aliases["other"] == registry.aliases["other"]
    assert registry.aliases["main"].targets == (A,)  # the input is not changed


def test_rollbacks_undo_promotions_last_first(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    registry = _registry("a", "b", "c")
    _promote(store, (B,), backend="b", expected=None)
    _promote(store, (C,), backend="c", expected=(B,), from_=(B,))
    assert store.apply(registry).aliases["main"].targets == (C,)
    first = store.record_rollback("main", current_targets=(C,), by="test")
    assert (first.rolls_back, first.to_targets) == (2, (B,))
    assert store.apply(registry).aliases["main"].targets == (B,)
    second = store.record_rollback("main", current_targets=(B,), by="test")
    assert (second.rolls_back, second.to_targets) == (1, (A,))
    assert store.alias("main").targets is None  # back on the models file's targets
    assert store.apply(registry).aliases["main"].targets == (A,)
    with pytest.raises(NothingToRollBackError, match="'main' has no promotion to roll back"):
        store.record_rollback("main", current_targets=(A,), by="test")
    assert [(e.seq, e.action) for e in store.history("main")] == [(1, "promote"), (2, "promote"), (3, "rollback"), (4, "rollback")]
    with pytest.raises(NothingToRollBackError):
        store.record_rollback("never-promoted", current_targets=None, by="test")


def test_a_stale_writer_is_refused(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    _promote(store, (B,), backend="b", expected=None)
    before = store.path.read_bytes()
    with pytest.raises(PromotionConflictError, match="someone else"):
        _promote(store, (C,), backend="c", expected=None)  # decided before the first was written
    assert store.path.read_bytes() == before


def test_a_check_that_fails_writes_nothing(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))

    def refuse(_aliases: object) -> None:
        raise PromotionsFileError(str(store.path), ["no"])

    with pytest.raises(PromotionsFileError):
        store.record_promotion("main", expected_override=None, from_targets=(A,), to_targets=(B,), by="t", backend="b",
                               weight=None, check=refuse)
    assert not store.path.exists()


def test_removed_backend_and_alias_are_named(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    _promote(store, (AliasTarget(backend="a", weight=50), AliasTarget(backend="b", weight=50)), backend="b", expected=None)
    with pytest.raises(PromotionsFileError, match=r"aliases\.main\.targets: promoted to backend\(s\) 'b' that the model registry no longer has"):
        store.apply(_registry("a"))
    data = json.loads(store.path.read_text())
    data["aliases"]["gone"] = data["aliases"].pop("main")
    store.path.write_text(json.dumps(data))
    with pytest.raises(PromotionsFileError, match="no alias 'gone'"):
        store.apply(_registry("a", "b"))


def test_invalid_file_names_the_field(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    store.path.parent.mkdir(parents=True)
    store.path.write_text('{"format": 1, "aliases": {"main": {"targets": [{"backend": "a", "weight": -1}]}}}')
    with pytest.raises(PromotionsFileError, match=r"aliases\.main\.targets\.0\.weight"):
        store.load()
    store.path.write_text("{not json")
    with pytest.raises(PromotionsFileError, match="promotions.json"):
        store.load()


def _promote_and_roll_back(path: str, rounds: int) -> None:
    store = PromotionStore(Path(path))
    for _ in range(rounds):
        # Each round reads the current override under its own lock-free read and retries on
        # a conflict, as two servers' requests would.
        while True:
            current = store.alias("main").targets
            try:
                store.record_promotion("main", expected_override=current, from_targets=current or (A,),
                                       to_targets=(B,) if current != (B,) else (C,), by="p", backend="b", weight=None)
                break
            except PromotionConflictError:
                continue


def test_two_processes_lose_no_entry(tmp_path: Path) -> None:
    path = promotions_path(tmp_path)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_promote_and_roll_back, args=(str(path), 25)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    history = PromotionStore(path).history("main")
    assert [e.seq for e in history] == list(range(1, 51))
    assert not list(path.parent.glob(".*.tmp"))


def _t(**weights: int) -> tuple[AliasTarget, ...]:
    return tuple(AliasTarget(backend=name, weight=weight) for name, weight in weights.items())


def test_promotion_targets_baseline_and_after() -> None:
    # A plain promotion and a canary of a new backend: the primary is the baseline.
    assert promotion_targets(_t(a=100), "b", None) == ("a", _t(b=100))
    assert promotion_targets(_t(a=100), "b", 30) == ("a", _t(a=70, b=30))
    # A canary at 60% makes b the primary; promoting b again finishes it against a.
    assert promotion_targets(_t(a=40, b=60), "b", None) == ("a", _t(b=100))
    assert promotion_targets(_t(a=40, b=60), "b", 80) == ("a", _t(a=20, b=80))
    assert promotion_targets(_t(a=40, b=60), "b", 100) == ("a", _t(b=100))
    # Several targets: the others keep their proportions of 100-W, nothing is dropped.
    assert promotion_targets(_t(a=60, c=40), "b", 50) == ("a", _t(a=30, c=20, b=50))
    assert promotion_targets(_t(a=1, c=1, d=1), "b", 50) == ("a", _t(a=17, c=17, d=16, b=50))
    # A share that rounds to 0 stays listed, drained; so does a drained target.
    assert promotion_targets(_t(a=98, c=1, e=0), "b", 90) == ("a", _t(a=10, c=0, e=0, b=90))
    # Equal others: the first is the baseline.
    assert promotion_targets(_t(a=50, c=50), "b", None)[0] == "a"
    with pytest.raises(ValueError, match="already the primary target"):
        promotion_targets(_t(b=100), "b", None)
    with pytest.raises(ValueError, match="already the primary target"):
        promotion_targets(_t(b=100, a=0), "b", 50)
    with pytest.raises(ValueError, match="already has 60% of the traffic"):
        promotion_targets(_t(a=4, b=6), "b", 60)


def test_a_writer_is_refused_after_a_round_trip(tmp_path: Path) -> None:
    """A promotion and a rollback in between that land back on the same override: the
    history says someone else wrote, so the stale writer is still refused."""
    store = PromotionStore(promotions_path(tmp_path))
    _promote(store, (B,), backend="b", expected=None)
    seen = store.alias("main")
    _promote(store, (C,), backend="c", expected=(B,), from_=(B,))
    store.record_rollback("main", current_targets=(C,), by="test")
    assert store.alias("main").targets == seen.targets  # (b) again
    before = store.path.read_bytes()
    with pytest.raises(PromotionConflictError, match="someone else"):
        store.record_promotion("main", expected_override=seen.targets, expected_seq=len(seen.history), from_targets=(B,),
                               to_targets=(C,), by="t", backend="c", weight=None)
    assert store.path.read_bytes() == before


def test_an_unwritable_store_is_a_store_error(tmp_path: Path) -> None:
    """A data directory that cannot be written: `PromotionStoreError` naming the file,
    nothing written. Simulated with the lock file's path taken by a directory, because
    a read-only ``chmod`` does not stop root (these tests may run as root)."""
    store = PromotionStore(promotions_path(tmp_path))
    _promote(store, (B,), backend="b", expected=None)
    before = store.path.read_bytes()
    lock = store.path.with_name(store.path.name + ".lock")
    lock.unlink()
    lock.mkdir()
    with pytest.raises(PromotionStoreError, match=r"cannot write the promotions file .*promotions\.json.*nothing changed"):
        _promote(store, (C,), backend="c", expected=(B,), from_=(B,))
    with pytest.raises(PromotionStoreError, match="nothing changed"):
        store.record_rollback("main", current_targets=(B,), by="test")
    assert store.path.read_bytes() == before
    assert store.alias("main").targets == (B,)  # reading still works


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory; see the test above")
def test_a_read_only_directory_is_a_store_error(tmp_path: Path) -> None:
    store = PromotionStore(promotions_path(tmp_path))
    _promote(store, (B,), backend="b", expected=None)
    store.path.parent.chmod(0o555)
    try:
        with pytest.raises(PromotionStoreError, match="nothing changed"):
            _promote(store, (C,), backend="c", expected=(B,), from_=(B,))
    finally:
        store.path.parent.chmod(0o755)
    assert store.alias("main").targets == (B,)
