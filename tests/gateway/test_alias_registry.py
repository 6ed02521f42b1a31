"""Alias entries in ``models.yaml`` (issue 13): the old ``alias: backend`` form, the targets
form and its defaults, the ``breaker:`` and ``scrape:`` sections, and errors that name the
key that was wrong. Files are written to tmp_path and read with `load_registry`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway import Alias, AliasTarget, BreakerSettings, RegistryError, load_registry
from gateway.registry import ScrapeSettings


def _backend(port: int, **extra: object) -> dict[str, object]:
    return {
        "kind": "vllm",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "model": f"m{port}",
        "capabilities": {"context_window": 4096},
        **extra,
    }


BACKENDS = {"a": _backend(9001), "b": _backend(9002), "local": _backend(9003)}


def _write(tmp_path: Path, aliases: dict[str, object], **sections: object) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"backends": sections.pop("backends", BACKENDS), **sections, "aliases": aliases}))
    return path


def _problems(tmp_path: Path, aliases: dict[str, object], **sections: object) -> str:
    with pytest.raises(RegistryError) as caught:
        load_registry(_write(tmp_path, aliases, **sections))
    return str(caught.value)


def test_old_form_is_one_target_of_weight_one(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, {"chat-default": "local"}))
    alias = registry.alias("chat-default")
    assert alias == Alias(name="chat-default", targets=(AliasTarget(backend="local", weight=1),))
    assert alias.fallbacks == () and alias.sticky == "thread" and alias.balance == "weighted"
    assert registry.resolve("chat-default").id == "local"
    assert [b.id for b in registry.candidates("chat-default")] == ["local"]


def test_targets_form_with_fallbacks_and_defaults(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, {
        "canary": {"targets": [{"backend": "a", "weight": 90}, {"backend": "b", "weight": 10}], "fallbacks": ["local"]},
        "drain": {"targets": [{"backend": "a", "weight": 0}, {"backend": "b"}]},
        "spread": {"targets": [{"backend": "a"}, {"backend": "b"}], "sticky": "none", "balance": "least_loaded"},
    }))
    canary = registry.alias("canary")
    assert canary.targets == (AliasTarget(backend="a", weight=90), AliasTarget(backend="b", weight=10))
    assert canary.fallbacks == ("local",)
    assert (canary.sticky, canary.balance) == ("thread", "weighted")  # the defaults
    assert registry.resolve("canary").id == "a"  # the heaviest target
    assert [b.id for b in registry.candidates("canary")] == ["a", "b", "local"]
    drain = registry.alias("drain")
    assert drain.targets[1].weight == 1  # weight defaults to 1
    assert [t.backend for t in drain.weighted] == ["b"]  # weight 0 takes no traffic
    assert registry.resolve("drain").id == "b"
    spread = registry.alias("spread")
    assert (spread.sticky, spread.balance) == ("none", "least_loaded")


def test_breaker_and_scrape_sections_and_a_backend_override(tmp_path: Path) -> None:
    backends = {**BACKENDS, "b": _backend(9002, breaker={"failures": 1, "cooldown_s": 0.5})}
    registry = load_registry(_write(
        tmp_path, {"x": "a", "y": "b"}, backends=backends,
        breaker={"failures": 5, "cooldown_s": 2}, scrape={"interval_s": 1, "timeout_s": 0.25},
    ))
    assert registry.breaker == BreakerSettings(failures=5, cooldown_s=2)
    assert registry.scrape == ScrapeSettings(interval_s=1, timeout_s=0.25)
    assert registry.breaker_for(registry.backends["a"]) == BreakerSettings(failures=5, cooldown_s=2)
    assert registry.breaker_for(registry.backends["b"]) == BreakerSettings(failures=1, cooldown_s=0.5)


def test_sections_default_when_absent(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, {"x": "a"}))
    assert registry.breaker == BreakerSettings(failures=3, cooldown_s=10)
    assert registry.scrape == ScrapeSettings(interval_s=5, timeout_s=2)
    assert registry.breaker_for(registry.backends["a"]) == registry.breaker


def test_a_partial_backend_breaker_inherits_the_registry_fields_it_does_not_set(tmp_path: Path) -> None:
    backends = {**BACKENDS, "b": _backend(9002, breaker={"failures": 1})}
    registry = load_registry(_write(tmp_path, {"y": "b"}, backends=backends, breaker={"failures": 5, "cooldown_s": 2}))
    assert registry.breaker_for(registry.backends["b"]) == BreakerSettings(failures=1, cooldown_s=2)


@pytest.mark.parametrize(
    ("aliases", "sections", "expected"),
    [
        pytest.param({"chat-default": "nope"}, {}, "aliases.chat-default: unknown backend 'nope'", id="old-form-unknown"),
        pytest.param(
            {"canary": {"targets": [{"backend": "a"}, {"backend": "ghost", "weight": 5}]}}, {},
            "aliases.canary.targets: unknown backend 'ghost'", id="unknown-target",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a"}], "fallbacks": ["local", "gone"]}}, {},
            "aliases.canary.fallbacks: unknown backend 'gone'", id="unknown-fallback",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a", "weight": 1}, {"backend": "a", "weight": 2}]}}, {},
            "aliases.canary.targets: a backend is listed twice", id="duplicate-target",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a", "weight": 0}, {"backend": "b", "weight": 0}]}}, {},
            "aliases.canary.targets: every target has weight 0", id="all-weights-zero",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a", "weight": -1}, {"backend": "b"}]}}, {},
            "aliases.canary.targets.0.weight:", id="negative-weight",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a", "weight": 1.5}]}}, {},
            "aliases.canary.targets.0.weight:", id="fractional-weight",
        ),
        pytest.param({"canary": {"targets": []}}, {}, "aliases.canary.targets:", id="no-targets"),
        pytest.param(
            {"canary": {"targets": [{"backend": "a"}], "sticky": "session"}}, {},
            "aliases.canary.sticky:", id="bad-sticky",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a"}], "balance": "round_robin"}}, {},
            "aliases.canary.balance:", id="bad-balance",
        ),
        pytest.param(
            {"canary": {"targets": [{"backend": "a"}], "weights": [1]}}, {},
            "aliases.canary.weights:", id="unknown-alias-key",
        ),
        pytest.param({"canary": 42}, {}, "aliases.canary:", id="alias-not-a-mapping"),
        pytest.param({"x": "a"}, {"breaker": {"failures": 0}}, "breaker.failures:", id="breaker-failures-0"),
        pytest.param({"x": "a"}, {"breaker": {"cooldown_s": -1}}, "breaker.cooldown_s:", id="breaker-negative-cooldown"),
        pytest.param({"x": "a"}, {"breaker": {"cooldown": 5}}, "breaker.cooldown:", id="breaker-unknown-key"),
        pytest.param({"x": "a"}, {"scrape": {"interval_s": 0}}, "scrape.interval_s:", id="scrape-interval-0"),
        pytest.param(
            {"x": "a"}, {"backends": {**BACKENDS, "a": _backend(9001, breaker={"failures": 0})}},
            "backends.a.breaker.failures:", id="backend-breaker-failures-0",
        ),
    ],
)
def test_errors_name_the_key(tmp_path: Path, aliases: dict[str, object], sections: dict[str, object], expected: str) -> None:
    message = _problems(tmp_path, aliases, **sections)
    assert expected in message, message
    assert "models.yaml" in message


def test_every_bad_alias_is_reported_at_once(tmp_path: Path) -> None:
    message = _problems(tmp_path, {
        "one": {"targets": [{"backend": "a", "weight": -3}]},
        "two": {"targets": [{"backend": "b"}], "sticky": "sometimes"},
    })
    assert "aliases.one.targets.0.weight:" in message and "aliases.two.sticky:" in message, message
