"""``runs.join_stream(..., stream_mode=...)`` (issue 12, finding 3): the joined stream
of a background run sends only the requested modes' events, plus ``metadata``,
``error`` and ``end``, for a live run and for the replay of a finished one, with the
run's own event ids so ``Last-Event-ID`` still resumes; an unknown mode is a 422
naming it. Through the official ``langgraph-sdk`` client against the real server and
the real local model; the subgraph case (``mode|ns``) on a real `RunRecord`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import UnprocessableEntityError

from gateway import Backend
from serving.langgraph_api.service import frame
from serving.runs.registry import RunRecord
from tests.conftest import ServerHandle
from tests.promql import backend_idle

HI = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]}
MODES = ["values", "updates", "messages-tuple"]
CONTROL = {"metadata", "error", "end"}


@pytest.fixture
async def client(server: ServerHandle) -> AsyncIterator[LangGraphClient]:
    client = get_client(url=server.url, api_key=None)
    yield client
    await client.http.client.aclose()


async def _join(client: LangGraphClient, tid: str, run_id: str, **kwargs: Any) -> list[Any]:
    return [part async for part in client.runs.join_stream(tid, run_id, **kwargs)]


@pytest.mark.e2e
@pytest.mark.llm
async def test_join_stream_keeps_only_the_requested_modes(client: LangGraphClient, local_backend: Backend) -> None:
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "chat", input=HI, stream_mode=MODES,
                                   context={"model_params": {"max_tokens": 60, "temperature": 0}})
    # Live: joined while the run is going on.
    live = await _join(client, tid, run["run_id"], stream_mode="values")
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
    assert live[0].event == "metadata"
    assert {p.event for p in live} <= {"values"} | CONTROL and "values" in {p.event for p in live}

    # The whole stream, for comparison: every mode the run was started with.
    everything = await _join(client, tid, run["run_id"])
    assert {"messages", "updates", "values"} <= {p.event for p in everything}
    assert [int(p.id) for p in everything] == list(range(len(everything)))

    def kept(modes: set[str], after: int = -1) -> list[tuple[str, str]]:
        return [(p.event, p.id) for p in everything if (p.event in modes | CONTROL) and int(p.id) > after]

    # The ids of a live join are the run's own.
    assert [(p.event, p.id) for p in live] == kept({"values"})
    # Replay of the finished run, several modes (the SDK repeats the parameter).
    replay = await _join(client, tid, run["run_id"], stream_mode=["values", "updates"])
    assert [(p.event, p.id) for p in replay] == kept({"values", "updates"})
    # `messages-tuple` is the `messages` events; resuming after an id keeps the filter.
    tokens = [p for p in everything if p.event == "messages"]
    middle = int(tokens[len(tokens) // 2].id)
    resumed = await _join(client, tid, run["run_id"], stream_mode="messages-tuple", last_event_id=str(middle))
    assert resumed and [(p.event, p.id) for p in resumed] == kept({"messages"}, after=middle)
    assert [(p.event, p.id) for p in await _join(client, tid, run["run_id"], stream_mode="messages")] == kept({"messages"})

    with pytest.raises(UnprocessableEntityError, match="unknown stream_mode 'bogus'") as unknown:
        await _join(client, tid, run["run_id"], stream_mode=["values", "bogus"])
    assert unknown.value.status_code == 422
    backend_idle(local_backend, within_s=30)


async def test_a_subgraphs_events_count_as_their_mode() -> None:
    record = RunRecord(run_id="r", thread_id="t", assistant_id="a", tenant="x", multitask_strategy="reject",
                       metadata={})
    record.frames = []
    for index, (name, data) in enumerate([
        ("metadata", {"run_id": "r"}), ("values|child:1", {"a": 1}), ("updates|child:1", {"n": {}}),
        ("values", {"a": 2}), ("messages|child:1", [{}, {}]), ("error", {"error": "X"}),
    ]):
        record.append(frame(name, data, index))
    record.finish("error")
    sent = [f async for f in record.follow(events=frozenset({"values"}))]
    assert [f.split("\n")[0] for f in sent] == [
        "event: metadata", "event: values|child:1", "event: values", "event: error"]
    resumed = [f async for f in record.follow(1, events=frozenset({"messages"}))]
    assert [f.split("\n")[2] for f in resumed] == ["id: 4", "id: 5"]


def test_a_json_array_of_modes_is_its_modes() -> None:
    """The JS SDK 2.0 sends several modes as one JSON array value."""
    from serving.errors import ServingError
    from serving.langgraph_api.service import join_events

    assert join_events(['["values","updates"]']) == join_events(["values", "updates"]) == frozenset({"values", "updates"})
    assert join_events(['["values"]', "custom"]) == frozenset({"values", "custom"})
    assert join_events(["[]"]) is None and join_events([""]) is None
    for bad in ('["values", 1]', "[values", '{"a": 1}', '["bogus"]'):
        with pytest.raises(ServingError) as refused:
            join_events([bad])
        assert refused.value.status == 422
