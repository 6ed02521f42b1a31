"""Thread operations of the LangGraph Server API (issue 12, finding 3): ``threads.update``
(PATCH), ``threads.delete``, ``threads.update_state``, ``PATCH .../state``
(``patchState``), ``get_state`` with a checkpoint object and ``subgraphs``, and
``threads.copy``, through the official ``langgraph-sdk`` client on a real server with
two tenants (another tenant's thread is a 404 on every one of them). Runs go through
the scripted backend and the gate graph of ``tests/fakes/gated.py``, so a run is in
progress exactly while a test needs it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import yaml
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import BadRequestError, ConflictError, NotFoundError, UnprocessableEntityError

from serving.runs.registry import RunRecord, RunRegistry
from serving.errors import ServingError
from tests.conftest import ServerHandle, create_key, start_server, stop_server, write_models_file
from tests.serving.lg_ops_server import BLOCKED, OpsServer, clients, ops_server, says  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


async def _ran(client: LangGraphClient, graph: str = "gated", text: str = "hello") -> str:
    tid = (await client.threads.create(metadata={"owner": "test"}))["thread_id"]
    await client.runs.wait(tid, graph, input=says(text))
    return tid


async def test_update_merges_metadata_and_refuses_ttl(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = (await acme.threads.create(metadata={"a": 1, "b": 1}))["thread_id"]
    thread = await acme.threads.update(tid, metadata={"b": 2, "c": 3})
    assert thread["thread_id"] == tid and thread["metadata"] == {"a": 1, "b": 2, "c": 3}
    assert (await acme.threads.get(tid))["metadata"] == {"a": 1, "b": 2, "c": 3}
    assert await acme.threads.update(tid, metadata={"d": 4}, return_minimal=True) is None
    assert (await acme.threads.get(tid))["metadata"]["d"] == 4
    with pytest.raises(BadRequestError, match="ttl is not supported"):
        await acme.threads.update(tid, metadata={"e": 5}, ttl=60)
    assert "e" not in (await acme.threads.get(tid))["metadata"]  # refused whole
    with pytest.raises(NotFoundError):
        await globex.threads.update(tid, metadata={"x": 1})
    with pytest.raises(NotFoundError):
        await acme.threads.update(str(uuid.uuid4()), metadata={"x": 1})
    assert "x" not in (await acme.threads.get(tid))["metadata"]


async def test_delete_removes_the_record_and_the_checkpoints(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme)
    assert len(await acme.threads.get_history(tid)) > 1
    with pytest.raises(NotFoundError):
        await globex.threads.delete(tid)  # another tenant's: 404, and nothing happens
    assert (await acme.threads.get(tid))["values"]["messages"]

    await acme.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await acme.threads.get(tid)
    with pytest.raises(NotFoundError):
        await acme.threads.get_state(tid)
    with pytest.raises(NotFoundError):
        await acme.threads.delete(tid)
    # The same id again is a new, empty thread: no checkpoint of the old one is left.
    again = await acme.threads.create(thread_id=tid)
    assert again["values"] is None and again["metadata"] == {}
    assert await acme.threads.get_history(tid) == []
    assert await acme.runs.list(tid) == []


async def test_delete_cancels_the_run_in_progress_first(clients: dict[str, LangGraphClient], ops_server: OpsServer) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex  # never opened: the run waits until it is cancelled
    run = await acme.runs.create(tid, "gated", input=says(f"gate:{gate}"), stream_mode=["custom"])
    async for part in acme.runs.join_stream(tid, run["run_id"]):
        if part.event == "custom":
            break  # the run is at the gate, with its first checkpoints written
    assert (await acme.threads.get(tid))["status"] == "busy"

    await acme.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await acme.threads.get(tid)
    with pytest.raises(NotFoundError):
        await acme.runs.get(tid, run["run_id"])
    # Nothing the cancelled run wrote while ending came back.
    await acme.threads.create(thread_id=tid)
    assert await acme.threads.get_history(tid) == []
    assert (await acme.threads.get(tid))["status"] == "idle"


async def test_a_claimed_thread_admits_no_run() -> None:
    """The rule that keeps a run from writing to a half-deleted thread, on the registry."""
    runs = RunRegistry()
    record = RunRecord(run_id="r", thread_id="t", assistant_id="a", tenant="x", multitask_strategy="enqueue", metadata={})
    with runs.claim("t", "delete"):
        with pytest.raises(ServingError, match="a delete is in progress") as refused:
            runs.admit(record)
        assert refused.value.status == 409
        with pytest.raises(ServingError):
            with runs.claim("t", "update"):
                pass
        # A run creating the thread (if_not_exists: create) checks before and after.
        assert runs.deleting("t")
        with pytest.raises(ServingError, match="a delete is in progress"):
            runs.refuse_if_deleting("t")
    runs.admit(record)  # released
    assert not runs.deleting("t")
    runs.refuse_if_deleting("t")
    with runs.claim("t", "copy"):
        runs.admit(record)  # a copy only keeps the thread from being deleted
        with pytest.raises(ServingError, match="a copy is in progress"):
            with runs.claim("t", "delete"):
                pass
    runs.add(record)
    with pytest.raises(ServingError, match="has a run in progress"):
        with runs.claim("t", "update"):
            pass


async def test_update_state_writes_as_a_node_through_the_input_filter(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme)
    before = await acme.threads.get_state(tid)
    assert [m["content"] for m in before["values"]["messages"]][-1] == "2 messages"

    answer = await acme.threads.update_state(tid, {"messages": [{"role": "user", "content": "edited"}]}, as_node="gate")
    checkpoint = answer["checkpoint"]
    assert checkpoint["thread_id"] == tid and checkpoint["checkpoint_ns"] == ""
    after = await acme.threads.get_state(tid)
    assert after["checkpoint"]["checkpoint_id"] == checkpoint["checkpoint_id"]
    assert after["values"]["messages"][-1]["content"] == "edited"
    assert after["next"] == ["reply"]  # as if `gate` had returned it
    assert after["parent_checkpoint"]["checkpoint_id"] == before["checkpoint"]["checkpoint_id"]

    # On an older checkpoint: a fork from there.
    first = (await acme.threads.get_history(tid))[-1]["checkpoint"]
    forked = await acme.threads.update_state(tid, {"messages": [{"role": "user", "content": "fork"}]},
                                             as_node="reply", checkpoint=first)
    assert (await acme.threads.get_state(tid))["checkpoint"]["checkpoint_id"] == forked["checkpoint"]["checkpoint_id"]

    with pytest.raises(UnprocessableEntityError, match="as_node: graph 'gated' has no node 'nope'; its nodes: gate, reply"):
        await acme.threads.update_state(tid, {"messages": []}, as_node="nope")
    with pytest.raises(BadRequestError, match=BLOCKED):
        await acme.threads.update_state(tid, {"messages": [{"role": "user", "content": f"say {BLOCKED}"}]}, as_node="gate")
    with pytest.raises(NotFoundError):
        await acme.threads.update_state(tid, {"messages": []}, as_node="gate", checkpoint_id=str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await globex.threads.update_state(tid, {"messages": []}, as_node="gate")
    assert (await acme.threads.get_state(tid))["checkpoint"]["checkpoint_id"] == forked["checkpoint"]["checkpoint_id"]

    fresh = (await acme.threads.create())["thread_id"]
    with pytest.raises(ConflictError, match="has no graph yet"):
        await acme.threads.update_state(fresh, {"messages": []}, as_node="gate")


async def test_update_state_waits_for_no_run_and_sets_the_status(
    clients: dict[str, LangGraphClient], ops_server: OpsServer
) -> None:
    acme = clients["acme"]
    tid = (await acme.threads.create())["thread_id"]
    gate = uuid.uuid4().hex
    run = await acme.runs.create(tid, "gated", input=says(f"gate:{gate}"), stream_mode=["custom"])
    async for part in acme.runs.join_stream(tid, run["run_id"]):
        if part.event == "custom":
            break
    with pytest.raises(ConflictError, match="has a run in progress"):
        await acme.threads.update_state(tid, {"messages": []}, as_node="gate")
    ops_server.open_gate(gate)
    await acme.runs.join(tid, run["run_id"])

    # An interrupt: answered by writing the state as the asking node, the thread is idle.
    asked = await _ran(acme, "confirm")
    assert (await acme.threads.get(asked))["status"] == "interrupted"
    await acme.threads.update_state(asked, {"messages": [{"role": "ai", "content": "Cancelled."}]}, as_node="confirm")
    thread = await acme.threads.get(asked)
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    # ...and going back to before the question asks it again.
    await acme.threads.update_state(asked, None, as_node="draft")
    assert (await acme.threads.get_state(asked))["next"] == ["confirm"]


async def test_patch_state_merges_checkpoint_metadata(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme)
    before = await acme.threads.get_state(tid)
    history = await acme.threads.get_history(tid)
    response = await acme.http.client.patch(f"/threads/{tid}/state", json={"metadata": {"reviewed": True, "step": 99}})
    assert response.status_code == 204
    after = await acme.threads.get_state(tid)
    assert after["checkpoint"] == before["checkpoint"] and after["values"] == before["values"]
    assert after["parent_checkpoint"] == before["parent_checkpoint"]
    assert after["metadata"] == {**before["metadata"], "reviewed": True, "step": 99}
    assert len(await acme.threads.get_history(tid)) == len(history)

    assert (await globex.http.client.patch(f"/threads/{tid}/state", json={"metadata": {"x": 1}})).status_code == 404
    fresh = (await acme.threads.create())["thread_id"]
    refused = await acme.http.client.patch(f"/threads/{fresh}/state", json={"metadata": {"x": 1}})
    assert refused.status_code == 409 and "no state yet" in refused.json()["detail"]
    missing = await acme.http.client.patch(f"/threads/{tid}/state", json={})
    assert missing.status_code == 422 and "metadata" in missing.json()["detail"]


async def test_get_state_at_a_checkpoint_object_and_with_subgraphs(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme, "nested")
    state = await acme.threads.get_state(tid)
    assert state["next"] == ["child"] and state["tasks"][0]["state"] is None
    where = state["tasks"][0]["checkpoint"]
    assert where["checkpoint_ns"].startswith("child:")

    deep = await acme.threads.get_state(tid, subgraphs=True)
    inner = deep["tasks"][0]["state"]
    assert inner["next"] == ["ask"] and inner["tasks"][0]["interrupts"][0]["value"] == {"question": "inner?"}
    assert inner["checkpoint"]["checkpoint_ns"].startswith("child:")

    # A checkpoint object (what getState sends for one): the same state as by id.
    at = await acme.threads.get_state(tid, checkpoint={"checkpoint_id": state["checkpoint"]["checkpoint_id"]})
    assert at == state
    by_id = await acme.threads.get_state(tid, checkpoint_id=state["checkpoint"]["checkpoint_id"], subgraphs=True)
    assert by_id["tasks"][0]["state"]["next"] == ["ask"]
    # The subgraph's own state, by its namespace.
    child = await acme.threads.get_state(tid, checkpoint={"checkpoint_ns": where["checkpoint_ns"]})
    assert child["next"] == ["ask"] and child["checkpoint"]["checkpoint_ns"].startswith("child:")
    with pytest.raises(NotFoundError):
        await acme.threads.get_state(tid, checkpoint={"checkpoint_id": str(uuid.uuid4())})
    with pytest.raises(NotFoundError):
        await acme.threads.get_state(tid, checkpoint={"checkpoint_ns": "nowhere:1"})
    with pytest.raises(NotFoundError):
        await globex.threads.get_state(tid, checkpoint={"checkpoint_id": state["checkpoint"]["checkpoint_id"]})


async def test_copy_makes_a_new_thread_with_every_checkpoint(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme, "confirm")
    source = await acme.threads.get(tid)
    copy = await acme.threads.copy(tid)
    assert copy["thread_id"] != tid
    assert copy["metadata"] == source["metadata"] and copy["status"] == "interrupted"
    assert copy["values"] == source["values"]
    old = [s["checkpoint"]["checkpoint_id"] for s in await acme.threads.get_history(tid, limit=100)]
    new = [s["checkpoint"]["checkpoint_id"] for s in await acme.threads.get_history(copy["thread_id"], limit=100)]
    assert new == old
    assert {t["thread_id"] for t in await acme.threads.search(metadata={"owner": "test"}, limit=1000)} >= {tid, copy["thread_id"]}

    # The copy goes its own way: its interrupt answered there only.
    await acme.runs.wait(copy["thread_id"], "confirm", command={"resume": "no"})
    assert (await acme.threads.get(copy["thread_id"]))["values"]["messages"][-1]["content"] == "Cancelled."
    assert (await acme.threads.get(tid))["status"] == "interrupted"
    assert len(await acme.threads.get_history(tid, limit=100)) == len(old)

    with pytest.raises(NotFoundError):
        await globex.threads.copy(tid)
    with pytest.raises(NotFoundError):
        await globex.threads.get(copy["thread_id"])
    empty = await acme.threads.copy((await acme.threads.create(metadata={"k": "v"}))["thread_id"])
    assert empty["values"] is None and empty["metadata"] == {"k": "v"} and empty["status"] == "idle"


async def test_other_tenants_threads_are_404_on_every_new_route(clients: dict[str, LangGraphClient]) -> None:
    acme, globex = clients["acme"], clients["globex"]
    tid = await _ran(acme)
    http = globex.http.client
    for method, path, body in [
        ("PATCH", f"/threads/{tid}", {"metadata": {}}),
        ("DELETE", f"/threads/{tid}", None),
        ("POST", f"/threads/{tid}/state", {"values": None, "as_node": "gate"}),
        ("PATCH", f"/threads/{tid}/state", {"metadata": {}}),
        ("POST", f"/threads/{tid}/state/checkpoint", {"checkpoint": {}}),
        ("POST", f"/threads/{tid}/copy", None),
        ("GET", f"/threads/{tid}/stream", None),
        ("GET", f"/threads/{tid}/runs?limit=5", None),
    ]:
        response = await http.request(method, path, json=body)
        assert response.status_code == 404, (method, path, response.text)
    assert (await acme.threads.get(tid))["status"] == "idle"
    with pytest.raises(httpx.HTTPStatusError):
        await globex.threads.get(tid)


async def test_a_text_plain_body_is_refused_by_default(ops_server: OpsServer) -> None:
    """``server.proxy_text_bodies`` is off by default: a keyed ``text/plain`` body is the
    422 FastAPI gives any body that is not labelled JSON (as before the proxy support)."""
    key = ops_server.keys["acme"]
    async with httpx.AsyncClient(base_url=ops_server.handle.url) as http:
        for label in ("text/plain;charset=UTF-8", None):
            headers = {"x-api-key": key, **({"content-type": label} if label else {})}
            refused = await http.post("/threads", content='{"metadata": {"via": "proxy"}}', headers=headers)
            assert refused.status_code == 422, (label, refused.text)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[tuple[ServerHandle, str]]:
    """A server with ``server.proxy_text_bodies`` on (as behind Agent Chat UI's
    production proxy), keys on: its handle and a key."""
    tmp = tmp_path_factory.mktemp("proxy-bodies")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "auth": {"tenants": {"acme": {"graphs": ["*"]}}},
        "server": {"proxy_text_bodies": True},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    key = create_key(config, "acme")
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, key
    finally:
        stop_server(handle)


async def test_a_keyed_text_plain_body_is_read_as_json_behind_a_proxy(proxied: tuple[ServerHandle, str]) -> None:
    """Agent Chat UI's production proxy (``langgraph-nextjs-api-passthrough``) forwards a
    body as text and drops the SDK's ``content-type``: its ``fetch`` labels it
    ``text/plain;charset=UTF-8``. With ``server.proxy_text_bodies`` a keyed request's
    body is JSON whatever that label says (as LangGraph Server reads it); an unkeyed
    one is refused (401), never parsed into a run, and a label that is neither JSON nor
    text keeps its 422."""
    handle, key = proxied
    raw = '{"metadata": {"via": "proxy"}}'
    async with httpx.AsyncClient(base_url=handle.url) as http:
        for label in ("text/plain;charset=UTF-8", "text/plain", None):
            headers = {"x-api-key": key, **({"content-type": label} if label else {})}
            created = await http.post("/threads", content=raw, headers=headers)
            assert created.status_code == 200, (label, created.text)
            tid = created.json()["thread_id"]
            assert created.json()["metadata"] == {"via": "proxy"}
            bearer = {"authorization": f"Bearer {key}", "content-type": "text/plain;charset=UTF-8"}
            found = await http.post("/threads/search", content='{"metadata": {"via": "proxy"}, "limit": 100}', headers=bearer)
            assert found.status_code == 200, found.text
            assert tid in [t["thread_id"] for t in found.json()]
        # A run and the history, as the proxy forwards them (same-origin fetch marks are fine).
        text = {"x-api-key": key, "content-type": "text/plain;charset=UTF-8"}
        ran = await http.post(
            f"/threads/{tid}/runs/wait", content='{"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "hi"}]}}',
            headers={**text, "sec-fetch-mode": "cors", "sec-fetch-site": "same-origin"},
        )
        assert ran.status_code == 200, ran.text
        assert ran.json()["messages"][-1]["type"] == "ai"
        history = await http.post(f"/threads/{tid}/history", content='{"limit": 10}', headers=text)
        assert history.status_code == 200 and len(history.json()) > 1, history.text
        # Broken JSON under the text label: the same 422 as under application/json.
        broken = await http.post("/threads", content="{", headers=text)
        assert broken.status_code == 422, broken.text
        # No key: nothing is read (a browser sends text/plain across origins unasked).
        unkeyed = await http.post("/threads", content=raw, headers={"content-type": "text/plain"})
        assert unkeyed.status_code == 401, unkeyed.text
        form = await http.post("/threads", content=raw, headers={"x-api-key": key, "content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 422, form.text


async def test_behind_a_proxy_a_browser_s_own_request_is_not_relabelled(proxied: tuple[ServerHandle, str]) -> None:
    """What a hostile page can make a browser send through the proxy (which adds the key):
    a ``<form enctype=text/plain>`` (``sec-fetch-mode: navigate``), a ``no-cors`` fetch,
    anything ``sec-fetch-site: cross-site``; and credentials the browser adds by itself
    (Basic) are not a key. None of these bodies is read: 422, nothing created."""
    handle, key = proxied
    raw = '{"metadata": {"via": "hostile"}}'
    text = {"x-api-key": key, "content-type": "text/plain"}
    async with httpx.AsyncClient(base_url=handle.url) as http:
        for marks in (
            {"sec-fetch-mode": "navigate", "sec-fetch-site": "same-origin"},
            {"sec-fetch-mode": "no-cors", "sec-fetch-site": "same-origin"},
            {"sec-fetch-mode": "cors", "sec-fetch-site": "cross-site"},
            {"Sec-Fetch-Site": "Cross-Site"},
        ):
            refused = await http.post("/threads", content=raw, headers={**text, **marks})
            assert refused.status_code == 422, (marks, refused.text)
        # Basic credentials are no key: nothing relabelled, and no key either (401).
        basic = await http.post("/threads", content=raw, headers={"authorization": "Basic dXNlcjpwdw==", "content-type": "text/plain"})
        assert basic.status_code == 401, basic.text
        found = await http.post("/threads/search", json={"metadata": {"via": "hostile"}}, headers={"x-api-key": key})
        assert found.status_code == 200 and found.json() == [], found.text


async def test_behind_a_proxy_a_store_item_is_deleted_with_a_text_body(proxied: tuple[ServerHandle, str]) -> None:
    """The SDK's ``store.deleteItem`` sends its JSON body with DELETE; the proxy labels
    it ``text/plain`` like any other."""
    handle, key = proxied
    text = {"x-api-key": key, "content-type": "text/plain;charset=UTF-8"}
    item = {"namespace": ["notes", "proxy"], "key": "k1"}
    async with httpx.AsyncClient(base_url=handle.url) as http:
        put = await http.put("/store/items", content=orjson.dumps({**item, "value": {"text": "hi"}}), headers=text)
        assert put.status_code == 204, put.text
        got = await http.get("/store/items", params={"namespace": "notes.proxy", "key": "k1"}, headers={"x-api-key": key})
        assert got.status_code == 200 and got.json()["value"] == {"text": "hi"}, got.text
        deleted = await http.request("DELETE", "/store/items", content=orjson.dumps(item), headers=text)
        assert deleted.status_code == 204, deleted.text
        gone = await http.get("/store/items", params={"namespace": "notes.proxy", "key": "k1"}, headers={"x-api-key": key})
        assert gone.status_code == 200 and gone.json() is None, gone.text
