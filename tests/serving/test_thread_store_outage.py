"""A thread store that stops answering (issue 10): while another process holds the
SQLite file's write lock, requests that need a write get a 503 with ``Retry-After``
naming the thread store (never a 500), ``/readyz`` says the store does not answer,
and once the lock is gone the very next request works: nothing stays broken."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file

pytestmark = [pytest.mark.e2e]

HI = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("outage")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models), "probe_timeout_s": 2},
            "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "fake-ok"}},
            "threads": {"busy_timeout_s": 0.3, "timeout_s": 1.5},
        },
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def test_a_locked_store_is_a_503_and_the_next_request_works(server: ServerHandle) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        thread = http.post("/threads", json={}).json()["thread_id"]
        holder = sqlite3.connect(server.data_dir / "threads.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's writer, stuck
        try:
            for request in (
                lambda: http.post("/threads", json={}),
                lambda: http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", "input": HI}),
                lambda: http.post(f"/threads/{thread}/runs/stream", json={"assistant_id": "chat", "input": HI}),
            ):
                response = request()
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert "thread" in response.json()["detail"]
            ready = http.get("/readyz")
            assert ready.status_code == 503 and "does not answer" in ready.json()["threads"]
            # The OpenAI API needs no thread store: it is served all along.
            chat = http.post("/v1/chat/completions", json={"model": "chat", "messages": HI["messages"]})
            assert chat.status_code == 200
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        deadline = time.monotonic() + 10
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the store did not come back"
            time.sleep(0.1)
        assert http.post("/threads", json={}).status_code == 200
        answer = http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "chat", "input": HI})
        assert answer.status_code == 200 and answer.json()["messages"][-1]["content"] == "Hello from the fake"
        assert http.get(f"/threads/{thread}").json()["status"] == "idle"
        assert "unhandled error" not in server.log_file.read_text()  # no 500 on the way
