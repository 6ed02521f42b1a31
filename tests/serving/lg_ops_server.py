"""The server the LangGraph thread and run operation tests share: two tenants with keys,
the chat graph on the scripted backend (``fake-ok``), and the graphs of
``tests/fakes/gated.py`` (a gate the test opens, a subgraph that interrupts), and
``tests/fakes/memory.py`` (a node that remembers in the store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.fakes.gated import GATE_DIR_ENV

_LIMITS = {"requests_per_s": 1000, "burst": 1000, "max_concurrent_runs": 50}
TENANTS = {"acme": {"graphs": ["*"], "limits": _LIMITS}, "globex": {"graphs": ["*"], "limits": _LIMITS}}
BLOCKED = "xylophone"
"""A term the input filter refuses."""


@dataclass(frozen=True, slots=True)
class OpsServer:
    handle: ServerHandle
    keys: dict[str, str]
    gates: Path

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    async def passed(self, name: str) -> None:
        """Wait until the run waiting at gate ``name`` has gone through it."""
        marker = (self.gates / name).with_suffix(".passed")
        for _ in range(3000):  # a bound, not a timing assertion: the run is local
            if marker.exists():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no run went through gate {name}")


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[OpsServer]:
    tmp = tmp_path_factory.mktemp("langgraph-ops")
    gates = tmp / "gates"
    gates.mkdir()
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {
            "chat": {"path": "graphs.chat:make_graph", "model": "chat-default"},
            "gated": {"path": "tests.fakes.gated:make_gated_graph", "model": "chat-default"},
            "nested": {"path": "tests.fakes.gated:make_nested_graph", "model": "chat-default"},
            "confirm": {"path": "tests.fakes.graphs:make_confirm_graph", "model": "chat-default"},
            "parallel_confirm": {"path": "tests.fakes.graphs:make_parallel_confirm_graph", "model": "chat-default"},
            "memory": {"path": "tests.fakes.memory:make_memory_graph", "model": "chat-default"},
        },
        "auth": {"tenants": TENANTS},
        "guardrails": {"blocked_terms": [BLOCKED]},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False, env={GATE_DIR_ENV: str(gates)})
    try:
        yield OpsServer(handle=handle, keys=keys, gates=gates)
    finally:
        stop_server(handle)


@pytest.fixture
async def clients(ops_server: OpsServer) -> AsyncIterator[dict[str, LangGraphClient]]:
    clients = {tenant: get_client(url=ops_server.handle.url, api_key=key) for tenant, key in ops_server.keys.items()}
    yield clients
    for client in clients.values():
        await client.http.client.aclose()


def says(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}
