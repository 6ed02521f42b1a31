"""Which backend serves a request: circuit breakers and the weighted, sticky choice.

A breaker per backend counts consecutive failures (a refused connection, a timeout, a
5xx, a stream that broke before its first token). At ``breaker.failures`` it opens:
the backend gets no traffic for ``cooldown_s``; then one request is let through as a
probe (half-open); the probe's success closes the breaker, its failure opens it again.

The choice for one request is an ordered list of backends to try: the alias's target
picked by weight (from a hash of the sticky key, or at random), the other targets
(picked the same way among those left), then the fallbacks in order. The gateway walks
that list, skipping backends whose breaker refuses, until one produces a first token.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gateway.registry import Alias, AliasTarget, Backend, BreakerSettings

__all__ = ["Breaker", "BreakerState", "Breakers", "RouteScope", "attempt_order", "key_point"]

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "half_open", "open"]


class Breaker:
    """One backend's circuit breaker (single event loop: no locking needed)."""

    def __init__(
        self,
        backend_id: str,
        settings: BreakerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState, str], None] | None = None,
    ) -> None:
        self.backend_id = backend_id
        self.settings = settings
        self.state: BreakerState = "closed"
        self.failures = 0
        """Consecutive failures counted while closed."""
        self.opened_at = 0.0
        self._probing = False
        self._clock = clock
        self._on_change = on_change

    def _move(self, state: BreakerState, why: str) -> None:
        if state == self.state:
            return
        self.state = state
        if state == "open":
            log.warning("backend %s: circuit open for %gs (%s)", self.backend_id, self.settings.cooldown_s, why)
        elif state == "half_open":
            log.info("backend %s: circuit half-open, sending one probe request", self.backend_id)
        else:
            log.info("backend %s: circuit closed (%s)", self.backend_id, why)
        if self._on_change is not None:
            self._on_change(self.backend_id, state, why)

    def available(self) -> bool:
        """Whether `allow` would let a request through now (without taking the probe)."""
        if self.state == "closed":
            return True
        if self.state == "open":
            return self._clock() - self.opened_at >= self.settings.cooldown_s
        return not self._probing

    def allow(self) -> bool:
        """Take the right to send one request: always when closed; when open past its
        cool-down, the probe (the breaker goes half-open); never otherwise. A caller
        that was allowed must end with `success`, `failure` or `release`."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if self._clock() - self.opened_at < self.settings.cooldown_s:
                return False
            self._move("half_open", "cool-down over")
        if self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        """The backend answered (a first token, a whole answer, or a 4xx: it is alive)."""
        self.failures = 0
        self._probing = False
        self._move("closed", "a request succeeded")

    def failure(self, why: str) -> None:
        """The backend failed a request."""
        self._probing = False
        if self.state == "half_open":
            self.opened_at = self._clock()
            self._move("open", f"the probe failed: {why}")
            return
        self.failures += 1
        if self.state == "closed" and self.failures >= self.settings.failures:
            self.opened_at = self._clock()
            self._move("open", f"{self.failures} consecutive failures, the last: {why}")

    def release(self) -> None:
        """The probe ended without a verdict (cancelled, 429): another may probe.
        Only the caller that took the probe may call this."""
        self._probing = False


class Breakers:
    """The breakers of every backend, by id; they outlive registry reloads (a backend
    that keeps its id keeps its state; new thresholds apply from the next failure)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._breakers: dict[str, Breaker] = {}
        self._clock = clock
        self.transitions: Counter[tuple[str, BreakerState]] = Counter()
        """Transitions so far, by (backend id, state entered)."""

    def _changed(self, backend_id: str, state: BreakerState, why: str) -> None:
        self.transitions[(backend_id, state)] += 1

    def get(self, backend_id: str, settings: BreakerSettings) -> Breaker:
        breaker = self._breakers.get(backend_id)
        if breaker is None:
            breaker = Breaker(backend_id, settings, clock=self._clock, on_change=self._changed)
            self._breakers[backend_id] = breaker
        else:
            breaker.settings = settings
        return breaker

    def states(self) -> dict[str, BreakerState]:
        """Each known backend's breaker state (an open breaker past its cool-down still
        reads ``open`` until a request probes it)."""
        return {backend_id: b.state for backend_id, b in self._breakers.items()}

    def forget(self, keep: set[str]) -> None:
        """Drop the breakers of backends no longer in the registry."""
        for backend_id in set(self._breakers) - keep:
            del self._breakers[backend_id]


@dataclass(slots=True)
class RouteScope:
    """One run's routing: its sticky key, and which backends served it.

    The serving layer makes one per run and hands it to the gateway (alias relays) or
    to the graph's run config (`ROUTE_SCOPE`), where the routed chat model finds it.
    """

    key: str | None = None
    """The sticky key: a thread id, or a request id for a stateless run."""
    served: list[str] = field(default_factory=list)
    """Backend ids that produced a first token for this run, in order."""
    retried: list[str] = field(default_factory=list)
    """Backend ids that failed before their first token and were passed over."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Alias overrides for this run (a route's alias instead of the graph's own)."""
    route: str | None = None
    """The route that chose the run's graph and alias, if one did."""

    @property
    def backend(self) -> str | None:
        """The backend that produced the run's latest answer."""
        return self.served[-1] if self.served else None

    def record(self, backend_id: str) -> None:
        if not self.served or self.served[-1] != backend_id:
            self.served.append(backend_id)


def key_point(key: str) -> float:
    """A stable point in [0, 1) for a sticky key (the same on every replica and release)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _pick(targets: list[AliasTarget], point: float) -> AliasTarget:
    total = sum(t.weight for t in targets)
    mark = point * total
    for target in targets:
        if mark < target.weight:
            return target
        mark -= target.weight
    return targets[-1]


def attempt_order(
    alias: Alias,
    key: str | None,
    *,
    load: Callable[[str], float | None] | None = None,
    rng: random.Random | None = None,
) -> list[str]:
    """The backend ids to try for one request, in order.

    Args:
        alias: the alias asked for.
        key: the sticky key; ignored (random choice) under ``sticky: none`` or when None.
        load: each backend's current load (running + waiting requests), or None when
            unknown; used under ``balance: least_loaded``.
        rng: the random source for non-sticky choices.

    Returns:
        Weighted targets (the first picked by weight, the rest picked the same way
        among those left), then fallbacks not already listed.
    """
    point = key_point(key) if key is not None and alias.sticky == "thread" else (rng or random).random()
    left = list(alias.weighted)
    order: list[str] = []
    while left:
        chosen = _pick(left, point)
        if alias.balance == "least_loaded" and load is not None:
            peers = [t for t in left if t.weight == chosen.weight]
            loads = {t.backend: load(t.backend) for t in peers}
            known = {b: v for b, v in loads.items() if v is not None}
            if len(known) == len(peers) and len(peers) > 1:
                least = min(known.values())
                if known[chosen.backend] > least:
                    chosen = next(t for t in peers if known[t.backend] == least)
        order.append(chosen.backend)
        left.remove(chosen)
    order += [b for b in dict.fromkeys(alias.fallbacks) if b not in order]
    return order


def capable(backends: Mapping[str, Backend], order: list[str], needs: Callable[[Backend], str | None]) -> tuple[list[str], dict[str, str]]:
    """``order`` without the backends whose contract cannot serve the request.

    Args:
        needs: returns why a backend cannot serve the request, or None if it can.

    Returns:
        The capable ids, in order, and why each other one was left out.
    """
    kept: list[str] = []
    refused: dict[str, str] = {}
    for backend_id in order:
        why = needs(backends[backend_id])
        if why is None:
            kept.append(backend_id)
        else:
            refused[backend_id] = why
    return kept, refused
