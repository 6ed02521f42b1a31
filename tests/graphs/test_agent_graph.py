"""The ``agent`` graph's policy in-process, over the FAKE scripted backend (it forges
the calls): the tenant's tool list narrows the graph's, and the graph refuses to
build with a tool that does not exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage

from gateway.chat import GatewayChatModel
from graphs import GraphDeps, RunContext
from graphs.agent import make_graph
from tests.fakes.graphs import PROBE_LOG_ENV, make_probe_agent
from tools import ToolCallRecord, ToolRegistry, ToolsSettings


class _NoModels:
    def chat_model(self, alias: str) -> Any:
        raise AssertionError("no other model is used")


def _deps(fake_backend_url: str, tool_names: tuple[str, ...]) -> GraphDeps:
    model = GatewayChatModel(model="fake-tools", api_key="k", base_url=fake_backend_url, http_async_client=httpx.AsyncClient())
    return GraphDeps(
        graph_id="agent", model=model, models=_NoModels(), tools=ToolRegistry.builtin(ToolsSettings()), tool_names=tool_names
    )


async def test_the_tenants_list_narrows_the_graphs(fake_backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "probe.log"
    log.write_text("")
    monkeypatch.setenv(PROBE_LOG_ENV, str(log))
    graph = make_probe_agent(_deps(fake_backend_url, ("probe", "tally", "calculator"))).compile()
    records: list[ToolCallRecord] = []
    # The graph allows calculator and the probes; this tenant only calculator.
    context = RunContext(allowed_tools=("calculator", "current_time"), on_tool_call=records.append)
    state = await graph.ainvoke({"messages": [HumanMessage("SCRIPT:loop")]}, context=context)
    assert {r.decision for r in records} == {"refused"}
    assert "tool 'tally' is not allowed here; the tools you can call are: calculator" in records[0].reason
    assert log.read_text() == ""  # not one call ran
    assert state["messages"][-1].type == "ai"
    calc: list[ToolCallRecord] = []
    await graph.ainvoke({"messages": [HumanMessage("SCRIPT:calc")]}, context=RunContext(allowed_tools=("calculator",), on_tool_call=calc.append))
    assert [r.decision for r in calc] == ["executed"]


def test_a_graph_naming_an_unknown_tool_does_not_build(fake_backend_url: str) -> None:
    with pytest.raises(ValueError, match="unknown tool 'calculater' in the graph's tools"):
        make_graph(_deps(fake_backend_url, ("calculater",)))
