"""A run in flight finishes on the backend it started on: the gateway tries the backend
that already served the run first, across a reload that drains it, a weight change, or
a target coming back after the run fell back."""

from __future__ import annotations

from gateway import Alias, AliasTarget, Backend, ModelGateway, ModelRegistry

MESSAGES = {"messages": [{"role": "user", "content": "hello"}]}


def _backend(backend_id: str) -> Backend:
    return Backend.model_validate({
        "id": backend_id, "kind": "vllm", "base_url": f"http://127.0.0.1:9/{backend_id}/v1", "model": backend_id,
        "capabilities": {"context_window": 4096, "tools": True},
    })


def _registry(targets: dict[str, int], fallbacks: tuple[str, ...] = ()) -> ModelRegistry:
    backends = {b: _backend(b) for b in ("a", "b", "c")}
    alias = Alias(
        name="main", targets=tuple(AliasTarget(backend=b, weight=w) for b, w in targets.items()), fallbacks=fallbacks
    )
    return ModelRegistry(backends, {"main": alias})


def _ids(gateway: ModelGateway, pinned: str | None) -> list[str]:
    return [b.id for b in gateway.attempts("main", "thread-1", MESSAGES, pinned=pinned)]


def test_the_backend_that_served_the_run_comes_first_after_a_drain() -> None:
    gateway = ModelGateway(_registry({"a": 100, "b": 0}))
    assert _ids(gateway, None) == ["a"]
    gateway.reload(_registry({"a": 0, "b": 100}))
    assert _ids(gateway, None) == ["b"]  # new runs go to the new target
    assert _ids(gateway, "a") == ["a", "b"]  # the run that started on a finishes there


def test_a_run_that_fell_back_stays_on_its_fallback() -> None:
    gateway = ModelGateway(_registry({"a": 1}, fallbacks=("c",)))
    assert _ids(gateway, None) == ["a", "c"]
    assert _ids(gateway, "c") == ["c", "a"]


def test_a_backend_the_alias_no_longer_lists_is_not_pinned() -> None:
    gateway = ModelGateway(_registry({"b": 1}))
    assert _ids(gateway, "a") == ["b"]  # removed from the alias: the run moves on
    assert _ids(gateway, "c") == ["b"]  # served another alias of the run: not this one's
