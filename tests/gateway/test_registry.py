"""The model registry: loading, environment references, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import CapabilityError, ModelGateway, RegistryError, UnknownModelError, load_registry
from tests.conftest import REPO


VALID = """
backends:
  gpu:
    kind: vllm
    base_url: ${TEST_VLLM_URL:-http://10.0.0.5:8000/v1}
    model: qwen
    capabilities: {context_window: 4096, tools: true}
aliases:
  chat-default: gpu
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_shipped_registries_load() -> None:
    local = load_registry(REPO / "config/models.yaml")
    assert local.resolve("chat-default").kind == "llamacpp"
    assert local.resolve("chat-default").launch is not None
    vllm = load_registry(REPO / "config/models.vllm.yaml")
    assert vllm.resolve("chat-default").kind == "vllm"
    assert vllm.resolve("chat-default").launch is not None  # the printed `vllm serve` profile (test_vllm_args.py)


def test_environment_references_use_default_or_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, VALID)
    monkeypatch.delenv("TEST_VLLM_URL", raising=False)
    assert load_registry(path).resolve("chat-default").base_url == "http://10.0.0.5:8000/v1"
    monkeypatch.setenv("TEST_VLLM_URL", "http://gpu-7:9000/v1/")
    backend = load_registry(path).resolve("chat-default")
    assert backend.base_url == "http://gpu-7:9000/v1"
    assert backend.root_url == "http://gpu-7:9000"


def test_missing_environment_variable_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = _write(tmp_path, VALID.replace("${TEST_VLLM_URL:-http://10.0.0.5:8000/v1}", "${NOT_SET_ANYWHERE}"))
    with pytest.raises(RegistryError, match=r"backends\.gpu\.base_url: environment variable NOT_SET_ANYWHERE"):
        load_registry(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("kind: vllm", "kind: tgi"), r"backends\.gpu\.kind: Input should be 'vllm', 'llamacpp' or 'openai'"),
        (("context_window: 4096", "context_window: -1"), r"backends\.gpu\.capabilities\.context_window"),
        (("model: qwen", "model: qwen\n    colour: blue"), r"backends\.gpu\.colour: Extra inputs are not permitted"),
        (("chat-default: gpu", "chat-default: cpu"), r"aliases\.chat-default: unknown backend 'cpu' \(known: gpu\)"),
        (("base_url: ${TEST_VLLM_URL:-http://10.0.0.5:8000/v1}", "base_url: gpu:8000"), r"backends\.gpu\.base_url"),
        (("model: qwen", "model: qwen\n    launch: {}"), r"backends\.gpu\.launch\.model: Field required"),
    ],
)
def test_invalid_entries_name_the_key(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        load_registry(_write(tmp_path, VALID.replace(*change)))


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="file not found"):
        load_registry(tmp_path / "absent.yaml")
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_registry(_write(tmp_path, "backends: [unclosed"))


def test_unknown_alias_lists_the_known_ones(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, VALID))
    with pytest.raises(UnknownModelError, match="available: chat-default"):
        registry.resolve("gpt-4")


def test_capability_contract_refuses_before_sending(tmp_path: Path) -> None:
    backend = load_registry(_write(tmp_path, VALID)).resolve("chat-default")
    ModelGateway.check_capabilities(backend, {"tools": [{"type": "function"}], "max_tokens": 4096})
    with pytest.raises(CapabilityError, match="json_schema") as refused:
        ModelGateway.check_capabilities(backend, {"response_format": {"type": "json_schema"}})
    assert refused.value.param == "response_format"
    with pytest.raises(CapabilityError, match="exceeds the context window") as too_long:
        ModelGateway.check_capabilities(backend, {"max_completion_tokens": 5000})
    assert too_long.value.param == "max_completion_tokens"
