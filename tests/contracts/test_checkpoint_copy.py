"""``acopy_thread`` and ``aput`` in place (``threads.copy``, ``PATCH .../state``) on both
checkpointers: SQLite (embedded) and PostgreSQL (a real server from the fixtures), each
test on a fresh database, with a real LangGraph graph (subgraph, interrupt, pending
writes) writing the checkpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from graphs.chat.state import ChatState
from serving.persistence import ThreadSettings, ThreadStores, open_thread_stores

pytestmark = [pytest.mark.integration]


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ThreadStores]:
    if request.param == "postgres":
        settings = ThreadSettings(postgres_dsn=request.getfixturevalue("postgres_dsn"))
    else:
        settings = ThreadSettings()
    opened = await open_thread_stores(settings, tmp_path)
    assert opened.backend == request.param
    yield opened
    await opened.aclose()


def _graph(stores: ThreadStores) -> Any:
    def ask(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer: {interrupt('go on?')}")]}

    inner = StateGraph(ChatState)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)

    def hello(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage("hello")]}

    outer = StateGraph(ChatState)
    outer.add_node("hello", hello)
    outer.add_node("child", inner.compile())
    outer.add_edge(START, "hello")
    outer.add_edge("hello", "child")
    outer.add_edge("child", END)
    return outer.compile(checkpointer=stores.checkpointer)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


async def _history(graph: Any, thread_id: str) -> list[tuple[Any, ...]]:
    return [
        (s.config["configurable"]["checkpoint_id"], s.values, s.next, [t.interrupts for t in s.tasks])
        async for s in graph.aget_state_history(_config(thread_id))
    ]


async def test_copy_thread_copies_every_checkpoint_and_write(stores: ThreadStores) -> None:
    graph = _graph(stores)
    await graph.ainvoke({"messages": [HumanMessage("hi")]}, _config("a"))
    source = await _history(graph, "a")
    assert source[0][2] == ("child",) and len(source[0][3][0]) == 1  # waits at the interrupt
    inner = await graph.aget_state(_config("a"), subgraphs=True)

    await stores.checkpointer.acopy_thread("a", "b")  # type: ignore[attr-defined]
    assert await _history(graph, "b") == source
    copied_inner = await graph.aget_state(_config("b"), subgraphs=True)
    assert copied_inner.tasks[0].state.values == inner.tasks[0].state.values  # the subgraph's checkpoints too

    # The copy goes its own way; the source is untouched.
    result = await graph.ainvoke(Command(resume="yes"), _config("b"))
    assert result["messages"][-1].content == "answer: yes"
    assert await _history(graph, "a") == source
    await stores.checkpointer.adelete_thread("b")
    assert await _history(graph, "b") == []
    assert await _history(graph, "a") == source


async def test_a_checkpoint_put_again_keeps_its_place(stores: ThreadStores) -> None:
    """What ``PATCH /threads/{id}/state`` does: the latest checkpoint written again with
    more metadata under its parent; values, parent and history stay."""
    graph = _graph(stores)
    await graph.ainvoke({"messages": [HumanMessage("hi")]}, _config("a"))
    before = await _history(graph, "a")
    saver = stores.checkpointer
    saved = await saver.aget_tuple({"configurable": {"thread_id": "a", "checkpoint_ns": ""}})
    assert saved is not None and saved.parent_config is not None
    await saver.aput(saved.parent_config, saved.checkpoint, {**saved.metadata, "reviewed": True}, {})
    again = await saver.aget_tuple({"configurable": {"thread_id": "a", "checkpoint_ns": ""}})
    assert again is not None
    assert again.metadata == {**saved.metadata, "reviewed": True}
    assert again.parent_config == saved.parent_config and again.checkpoint["id"] == saved.checkpoint["id"]
    assert await _history(graph, "a") == before
    result = await graph.ainvoke(Command(resume="ok"), _config("a"))  # pending writes still resume it
    assert result["messages"][-1].content == "answer: ok"




async def test_prune_keep_latest_keeps_each_namespace_latest_state(stores: ThreadStores) -> None:
    """``POST /threads/prune`` with ``keep_latest``: the latest checkpoint of the root
    and of the waiting subgraph stay (with the pending writes that resume it); older
    ones go; another thread is untouched."""
    graph = _graph(stores)
    for thread_id in ("a", "b"):
        await graph.ainvoke({"messages": [HumanMessage("hi")]}, _config(thread_id))
    other = await _history(graph, "b")
    before = await graph.aget_state(_config("a"), subgraphs=True)
    assert len(await _history(graph, "a")) > 1
    subgraph_ns = before.tasks[0].state.config["configurable"]["checkpoint_ns"]
    inner_before = [t async for t in stores.checkpointer.alist({"configurable": {"thread_id": "a", "checkpoint_ns": subgraph_ns}})]

    await stores.checkpointer.aprune(["a"], strategy="keep_latest")  # type: ignore[attr-defined]

    history = await _history(graph, "a")
    assert len(history) == 1 and history[0][0] == before.config["configurable"]["checkpoint_id"]
    after = await graph.aget_state(_config("a"), subgraphs=True)
    assert after.values == before.values and after.next == before.next and after.parent_config is None
    assert after.tasks[0].state.values == before.tasks[0].state.values
    inner_after = [t async for t in stores.checkpointer.alist({"configurable": {"thread_id": "a", "checkpoint_ns": subgraph_ns}})]
    assert len(inner_before) > 1 and [t.checkpoint["id"] for t in inner_after] == [inner_before[0].checkpoint["id"]]
    assert await _history(graph, "b") == other  # another thread: untouched
    result = await graph.ainvoke(Command(resume="yes"), _config("a"))  # still resumes
    assert result["messages"][-1].content == "answer: yes"
    # Pruning again, or an unknown thread, is harmless.
    await stores.checkpointer.aprune(["a", "nope"], strategy="keep_latest")  # type: ignore[attr-defined]
    assert len(await _history(graph, "a")) == 1
