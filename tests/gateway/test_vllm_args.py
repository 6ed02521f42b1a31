"""vLLM launch blocks in the model registry and ``switchyard backend vllm-args``.

Switchyard never starts vLLM (no GPU here): it prints the ``vllm serve`` command line.
The CLI runs as a real ``switchyard`` process, as a person would run it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway import RegistryError, load_registry
from gateway.errors import GatewayError, LocalBackendError
from gateway.local import launch_command, start_backend
from gateway.registry import LocalLaunch, VllmLaunch, vllm_serve_command
from tests.conftest import REPO, SWITCHYARD

VLLM = """
backends:
  gpu:
    kind: vllm
    base_url: http://10.0.0.5:8000/v1
    model: qwen
    capabilities: {context_window: 4096, tools: true}
    launch:
      model: Qwen/Qwen2.5-7B-Instruct-AWQ
      tool_call_parser: hermes
aliases:
  chat-default: gpu
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def _switchyard(models_file: Path, *args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SWITCHYARD_GATEWAY__MODELS_FILE": str(models_file)}
    env["SWITCHYARD_DATA_DIR"] = str(data_dir)
    env.pop("VLLM_BASE_URL", None)
    env.pop("VLLM_SERVED_MODEL", None)
    command = [str(SWITCHYARD), *args]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)


def _parse(printed: str) -> tuple[list[str], dict[str, str | None]]:
    """Positional words and ``--flag [value]`` pairs, as a shell would read the text."""
    words = shlex.split(printed.replace("\\\n", ""))  # backslash-newline: a shell's line continuation
    positional: list[str] = []
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            assert word not in flags, f"{word} given twice"
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            flags[word] = value
            i += 1 if value is None else 2
        else:
            assert not flags, f"positional {word!r} after the flags"
            positional.append(word)
            i += 1
    return positional, flags


def test_profile_prints_the_documented_command(tmp_path: Path) -> None:
    done = _switchyard(REPO / "config/models.vllm.yaml", "backend", "vllm-args", "vllm", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    # One flag per line, joined by backslash-newlines, so it pastes into a shell as is.
    lines = done.stdout.rstrip("\n").split("\n")
    assert all(line.endswith(" \\") for line in lines[:-1]) and len(lines) > 10
    positional, flags = _parse(done.stdout)
    assert positional == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct-AWQ"]
    assert flags == {
        "--served-model-name": "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "--host": "0.0.0.0",
        "--port": "8000",
        "--max-model-len": "32768",
        "--gpu-memory-utilization": "0.9",
        "--max-num-seqs": "64",
        "--enable-prefix-caching": None,
        "--enable-chunked-prefill": None,
        "--enable-auto-tool-choice": None,
        "--tool-call-parser": "hermes",
        "--kv-cache-dtype": "auto",
        "--tensor-parallel-size": "1",
    }


def test_profile_follows_the_registry_it_is_checked_against(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_BASE_URL", "https://gpu-7.internal/v1")
    monkeypatch.setenv("VLLM_SERVED_MODEL", "qwen-7b")
    backend = load_registry(REPO / "config/models.vllm.yaml").backends["vllm"]
    assert isinstance(backend.launch, VllmLaunch)
    positional, flags = _parse(shlex.join(vllm_serve_command(backend)))
    assert positional[2] == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    # vLLM listens on every interface; the gateway reaches it by the URL's name and port.
    assert (flags["--served-model-name"], flags["--host"], flags["--port"]) == ("qwen-7b", "0.0.0.0", "443")
    assert flags["--max-model-len"] == str(backend.capabilities.context_window)


def test_minimal_block_leaves_vllm_defaults_and_quotes_values(tmp_path: Path) -> None:
    extra = "\n      extra_args: ['--chat-template', 'my template.jinja']"
    text = VLLM.replace("tool_call_parser: hermes", "tool_call_parser: hermes" + extra)
    backend = load_registry(_write(tmp_path, text)).backends["gpu"]
    positional, flags = _parse(shlex.join(vllm_serve_command(backend)))
    assert positional == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct-AWQ"]
    assert flags == {
        "--served-model-name": "qwen",
        "--host": "0.0.0.0",
        "--port": "8000",
        "--max-model-len": "4096",
        "--enable-auto-tool-choice": None,
        "--tool-call-parser": "hermes",
        "--chat-template": "my template.jinja",
    }


def test_switched_off_features_are_printed_as_no_flags(tmp_path: Path) -> None:
    text = VLLM.replace(
        "tool_call_parser: hermes",
        "tool_call_parser: hermes\n      enable_prefix_caching: false\n      enable_chunked_prefill: false",
    )
    _, flags = _parse(shlex.join(vllm_serve_command(load_registry(_write(tmp_path, text)).backends["gpu"])))
    assert "--no-enable-prefix-caching" in flags and "--no-enable-chunked-prefill" in flags
    assert "--enable-prefix-caching" not in flags and "--enable-chunked-prefill" not in flags


def test_no_tools_no_parser_needed(tmp_path: Path) -> None:
    text = VLLM.replace("tools: true", "tools: false").replace("      tool_call_parser: hermes\n", "")
    _, flags = _parse(shlex.join(vllm_serve_command(load_registry(_write(tmp_path, text)).backends["gpu"])))
    assert "--enable-auto-tool-choice" not in flags and "--tool-call-parser" not in flags


BASE = {"model": "m", "tool_call_parser": "hermes"}


@pytest.mark.parametrize(
    ("launch", "message"),
    [
        ({"tool_call_parser": "hermes"}, r"\.launch\.model: Field required"),
        ({**BASE, "model": ""}, r"\.launch\.model: String should have at least 1"),
        ({**BASE, "served_model_name": ""}, r"\.launch\.served_model_name: String should have at least 1"),
        ({**BASE, "max_model_len": 8192}, r"\.launch\.max_model_len: 8192 differs from capabilities\.context_window \(4096\)"),
        ({**BASE, "max_model_len": 0}, r"\.launch\.max_model_len: Input should be greater than 0"),
        ({**BASE, "gpu_memory_utilization": 0}, r"\.launch\.gpu_memory_utilization: Input should be greater than 0"),
        ({**BASE, "gpu_memory_utilization": 1.2}, r"\.launch\.gpu_memory_utilization: Input should be less than or"),
        ({**BASE, "max_num_seqs": 0}, r"\.launch\.max_num_seqs: Input should be greater than 0"),
        ({**BASE, "enable_prefix_caching": "maybe"}, r"\.launch\.enable_prefix_caching: Input should be a valid boolean"),
        ({**BASE, "enable_chunked_prefill": 3}, r"\.launch\.enable_chunked_prefill: Input should be a valid boolean"),
        ({"model": "m"}, r"\.launch\.tool_call_parser: required when capabilities\.tools is true"),
        ({**BASE, "tool_call_parser": ""}, r"\.launch\.tool_call_parser: String should have at least 1"),
        ({**BASE, "kv_cache_dtype": "int4"}, r"\.launch\.kv_cache_dtype: Input should be 'auto', 'fp8'"),
        ({**BASE, "tensor_parallel_size": 0}, r"\.launch\.tensor_parallel_size: Input should be greater than 0"),
        ({**BASE, "context_size": 8192}, r"\.launch\.context_size: Extra inputs are not permitted"),
    ],
)
def test_invalid_launch_values_name_the_key(tmp_path: Path, launch: dict[str, object], message: str) -> None:
    raw = yaml.safe_load(VLLM)
    raw["backends"]["gpu"]["launch"] = launch
    with pytest.raises(RegistryError, match=r"invalid model registry .*: backends\.gpu" + message):
        load_registry(_write(tmp_path, yaml.safe_dump(raw)))


def test_launch_block_follows_the_kind(tmp_path: Path) -> None:
    # A llama.cpp launch block on a vllm backend is refused field by field, not taken as llama.cpp's.
    text = VLLM.replace("model: Qwen/Qwen2.5-7B-Instruct-AWQ", "model_file: x.gguf")
    with pytest.raises(RegistryError, match=r"backends\.gpu\.launch\.model_file: Extra inputs are not permitted"):
        load_registry(_write(tmp_path, text))
    # A hosted backend takes no launch block at all.
    with pytest.raises(RegistryError, match=r"backends\.gpu\.launch: only a llamacpp backend can be launched"):
        load_registry(_write(tmp_path, VLLM.replace("kind: vllm", "kind: openai")))
    # The shipped llama.cpp registry is unchanged.
    assert isinstance(load_registry(REPO / "config/models.yaml").backends["local"].launch, LocalLaunch)


def test_cli_refuses_unknown_and_non_vllm_backends(tmp_path: Path) -> None:
    models = _write(tmp_path, VLLM)
    unknown = _switchyard(models, "backend", "vllm-args", "nope", data_dir=tmp_path)
    assert unknown.returncode == 1 and "unknown backend 'nope'; known: gpu" in unknown.stderr
    assert unknown.stdout == ""
    local = _switchyard(REPO / "config/models.yaml", "backend", "vllm-args", "local", data_dir=tmp_path)
    assert local.returncode == 1 and "backend 'local' (kind llamacpp) has no vLLM launch block" in local.stderr
    no_launch = _write(tmp_path, VLLM[: VLLM.index("    launch:")] + "aliases:\n  chat-default: gpu\n")
    bare = _switchyard(no_launch, "backend", "vllm-args", "gpu", data_dir=tmp_path)
    assert bare.returncode == 1 and "backend 'gpu' (kind vllm) has no vLLM launch block" in bare.stderr


def test_backend_start_refuses_a_vllm_backend(tmp_path: Path) -> None:
    models = _write(tmp_path, VLLM)
    named = _switchyard(models, "backend", "start", "gpu", data_dir=tmp_path)
    assert named.returncode == 1
    assert "backend 'gpu' is a vLLM backend: Switchyard starts only llamacpp backends" in named.stderr
    assert "switchyard backend vllm-args gpu" in named.stderr
    every = _switchyard(models, "backend", "start", data_dir=tmp_path)
    assert every.returncode == 1 and "no backend that Switchyard launches" in every.stderr
    assert not (tmp_path / "run").exists()  # nothing was started or recorded
    # The library refuses too, and `serve` does not count it among the backends it starts.
    registry = load_registry(models)
    backend = registry.backends["gpu"]
    with pytest.raises(LocalBackendError, match="is a vLLM backend"):
        start_backend(backend, tmp_path)
    with pytest.raises(LocalBackendError, match="is a vLLM backend"):
        launch_command(backend, Path("/bin/false"))
    assert registry.managed_backends() == []
    with pytest.raises(GatewayError, match="no vLLM launch block"):
        vllm_serve_command(load_registry(REPO / "config/models.yaml").backends["local"])
