"""The gateway's choice of backend as a library (issue 13): the circuit breaker's state
machine on an injected clock, and `attempt_order` (weights, stickiness, drained targets,
fallbacks, ``least_loaded``). No server, no backend: these are the pure parts."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from gateway import Alias, AliasTarget, BreakerSettings
from gateway.balancer import Breakers, attempt_order, key_point


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


SETTINGS = BreakerSettings(failures=3, cooldown_s=10)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def breakers(clock: Clock) -> Breakers:
    return Breakers(clock=clock)


# ---- the breaker ------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failures_only(breakers: Breakers) -> None:
    breaker = breakers.get("a", SETTINGS)
    assert breaker.state == "closed" and breaker.allow()
    breaker.failure("boom")
    breaker.failure("boom")
    breaker.success()  # a success in between resets the count
    breaker.failure("boom")
    breaker.failure("boom")
    assert breaker.state == "closed" and breaker.allow()
    breaker.failure("boom")
    assert breaker.state == "open"
    assert breakers.states() == {"a": "open"}
    assert not breaker.allow() and not breaker.available()


def _opened(breakers: Breakers, backend: str = "a") -> None:
    breaker = breakers.get(backend, SETTINGS)
    for _ in range(SETTINGS.failures):
        assert breaker.allow()
        breaker.failure("connection refused")
    assert breaker.state == "open"


def test_open_breaker_refuses_until_cooldown_then_lets_exactly_one_probe(breakers: Breakers, clock: Clock) -> None:
    _opened(breakers)
    breaker = breakers.get("a", SETTINGS)
    clock.advance(SETTINGS.cooldown_s - 0.001)
    assert not breaker.available() and not breaker.allow()
    assert breaker.state == "open"
    clock.advance(0.001)
    assert breaker.available()
    assert breaker.state == "open"  # reading availability takes nothing
    assert breaker.allow()  # the probe
    assert breaker.state == "half_open"
    assert not breaker.available()
    assert not breaker.allow()  # a second request while the probe is out
    clock.advance(3600)
    assert not breaker.allow()  # however long the probe takes
    assert breaker.state == "half_open"


def test_probe_success_closes(breakers: Breakers, clock: Clock) -> None:
    _opened(breakers)
    breaker = breakers.get("a", SETTINGS)
    clock.advance(SETTINGS.cooldown_s)
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed"
    assert breaker.allow() and breaker.allow()  # no more probe limit
    # and the failure count starts again from zero
    breaker.failure("x")
    breaker.failure("x")
    assert breaker.state == "closed"


def test_probe_failure_reopens_with_a_fresh_cooldown(breakers: Breakers, clock: Clock) -> None:
    _opened(breakers)
    breaker = breakers.get("a", SETTINGS)
    clock.advance(SETTINGS.cooldown_s + 5)
    assert breaker.allow()
    clock.advance(2)  # the probe took 2 s to fail
    breaker.failure("probe: 503")
    assert breaker.state == "open"
    assert not breaker.allow()
    clock.advance(SETTINGS.cooldown_s - 0.5)  # counted from the probe's failure, not the first opening
    assert not breaker.allow()
    clock.advance(0.5)
    assert breaker.allow()
    assert breaker.state == "half_open"


def test_release_lets_another_probe_through(breakers: Breakers, clock: Clock) -> None:
    _opened(breakers)
    breaker = breakers.get("a", SETTINGS)
    clock.advance(SETTINGS.cooldown_s)
    assert breaker.allow()
    assert not breaker.allow()
    breaker.release()  # the probe was cancelled: no verdict
    assert breaker.state == "half_open"
    assert breaker.allow()  # the next request probes
    assert not breaker.allow()
    breaker.success()
    assert breaker.state == "closed"


def test_only_the_probe_frees_the_probe_slot(breakers: Breakers, clock: Clock) -> None:
    # The gateway tells the probe from an ordinary call by the state `allow` leaves
    # (half-open: this call is the probe) and releases only the probe.
    breaker = breakers.get("a", SETTINGS)
    assert breaker.allow() and breaker.state == "closed"  # a slow ordinary request, still waiting
    _opened(breakers)  # meanwhile others fail and open the breaker
    clock.advance(SETTINGS.cooldown_s)
    assert breaker.allow() and breaker.state == "half_open"  # the probe
    assert not breaker.allow()  # the slow request ending without a verdict releases nothing: no second probe
    breaker.release()  # the probe is cancelled
    assert breaker.allow()  # now another request probes


def test_transitions_are_counted_per_backend_and_state(breakers: Breakers, clock: Clock) -> None:
    _opened(breakers, "a")
    _opened(breakers, "b")
    a = breakers.get("a", SETTINGS)
    clock.advance(SETTINGS.cooldown_s)
    assert a.allow()
    a.failure("again")  # half_open -> open
    clock.advance(SETTINGS.cooldown_s)
    assert a.allow()
    a.success()  # half_open -> closed
    a.success()  # already closed: no transition
    assert breakers.transitions == Counter({
        ("a", "open"): 2, ("a", "half_open"): 2, ("a", "closed"): 1,
        ("b", "open"): 1,
    })
    assert breakers.states() == {"a": "closed", "b": "open"}


def test_breakers_keep_state_across_settings_changes_and_forget_removed_backends(breakers: Breakers) -> None:
    _opened(breakers, "a")
    _opened(breakers, "b")
    looser = BreakerSettings(failures=10, cooldown_s=1)
    assert breakers.get("a", looser).state == "open"  # same id: same breaker, new thresholds
    assert breakers.get("a", looser).settings == looser
    breakers.forget({"a"})
    assert breakers.states() == {"a": "open"}
    assert breakers.get("b", SETTINGS).state == "closed"  # a new breaker


# ---- attempt_order ------------------------------------------------------------------------


def _alias(*targets: tuple[str, int], fallbacks: tuple[str, ...] = (), **fields: object) -> Alias:
    return Alias(
        name="canary",
        targets=tuple(AliasTarget(backend=b, weight=w) for b, w in targets),
        fallbacks=fallbacks,
        **fields,  # type: ignore[arg-type]
    )


def test_ninety_ten_split_over_distinct_sticky_keys_is_within_the_99_percent_interval() -> None:
    alias = _alias(("a", 90), ("b", 10))
    n, p = 10_000, 0.10
    firsts = Counter(attempt_order(alias, f"thread-{i:05d}")[0] for i in range(n))
    half_width = 2.5758 * math.sqrt(n * p * (1 - p))  # normal approximation, 99% two-sided
    assert set(firsts) == {"a", "b"}
    assert abs(firsts["b"] - n * p) <= half_width, firsts


def test_the_same_key_always_gives_the_same_order() -> None:
    alias = _alias(("a", 50), ("b", 30), ("c", 20), fallbacks=("d",))
    rng = random.Random(7)
    for i in range(200):
        key = f"thread-{i}"
        first = attempt_order(alias, key, rng=rng)
        assert all(attempt_order(alias, key, rng=rng) == first for _ in range(5))
        assert sorted(first[:3]) == ["a", "b", "c"] and first[3] == "d"


def test_sticky_choice_follows_the_key_point() -> None:
    # the first target owns [0, 0.5) of the key space, the second [0.5, 1)
    alias = _alias(("a", 1), ("b", 1))
    for i in range(300):
        key = f"k{i}"
        assert attempt_order(alias, key)[0] == ("a" if key_point(key) < 0.5 else "b")


def test_sticky_none_varies_for_one_key() -> None:
    alias = _alias(("a", 50), ("b", 50), sticky="none")
    rng = random.Random(1234)
    firsts = Counter(attempt_order(alias, "one-thread", rng=rng)[0] for _ in range(400))
    assert firsts["a"] > 100 and firsts["b"] > 100, firsts


def test_no_key_is_random_even_when_sticky() -> None:
    alias = _alias(("a", 50), ("b", 50))
    rng = random.Random(99)
    firsts = Counter(attempt_order(alias, None, rng=rng)[0] for _ in range(400))
    assert firsts["a"] > 100 and firsts["b"] > 100, firsts


def test_weight_zero_targets_never_appear() -> None:
    alias = _alias(("a", 1), ("drained", 0), ("c", 1), fallbacks=("f",))
    rng = random.Random(5)
    for i in range(2000):
        order = attempt_order(alias, f"t{i}")
        assert "drained" not in order and order[-1] == "f"
        assert "drained" not in attempt_order(alias, None, rng=rng)


def test_fallbacks_come_last_in_order_without_duplicates() -> None:
    alias = _alias(("a", 3), ("b", 1), fallbacks=("c", "a", "d"))
    for i in range(200):
        order = attempt_order(alias, f"t{i}")
        assert sorted(order[:2]) == ["a", "b"]
        assert order[2:] == ["c", "d"]  # in the given order, "a" (a target) not again
        assert len(order) == len(set(order))


def test_a_fallback_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        _alias(("a", 1), fallbacks=("c", "c"))


def _first_on(alias: Alias, backend: str) -> str:
    return next(f"t{i}" for i in range(10_000) if attempt_order(alias, f"t{i}")[0] == backend)


def test_least_loaded_picks_the_less_loaded_among_equal_weights_when_all_loads_are_known() -> None:
    alias = _alias(("a", 5), ("b", 5), ("c", 1), balance="least_loaded")
    on_a = _first_on(alias, "a")
    on_b = _first_on(alias, "b")
    loads = {"a": 7.0, "b": 2.0, "c": 0.0}
    assert attempt_order(alias, on_a, load=loads.get)[0] == "b"
    assert attempt_order(alias, on_b, load=loads.get)[0] == "b"
    # c has no equal-weight peer: its weight decides, however idle it is
    on_c = _first_on(alias, "c")
    assert attempt_order(alias, on_c, load=loads.get)[0] == "c"


def test_least_loaded_keeps_the_weighted_choice_otherwise() -> None:
    alias = _alias(("a", 5), ("b", 5), balance="least_loaded")
    on_a = _first_on(alias, "a")
    unknown_b = {"a": 7.0, "b": None}
    assert attempt_order(alias, on_a, load=unknown_b.get)[0] == "a"  # one peer's load unknown
    assert attempt_order(alias, on_a, load={"a": 3.0, "b": 3.0}.get)[0] == "a"  # equal loads
    assert attempt_order(alias, on_a)[0] == "a"  # no load source
    # plain `weighted` ignores loads
    weighted = _alias(("a", 5), ("b", 5))
    assert attempt_order(weighted, on_a, load={"a": 100.0, "b": 0.0}.get)[0] == "a"
    # unequal weights are not peers
    uneven = _alias(("a", 9), ("b", 1), balance="least_loaded")
    on_a_uneven = _first_on(uneven, "a")
    assert attempt_order(uneven, on_a_uneven, load={"a": 100.0, "b": 0.0}.get)[0] == "a"
