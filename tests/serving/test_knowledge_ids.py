"""Document ids that look like URL syntax, through the real server (issue 11, item 3).

``switchyard ingest --delete-missing`` through the server once deleted the real
``note-001.md`` when asked to delete the planted ``note-001.md#planted`` (the ``#``
began a fragment), likewise for ``?`` and ``x/../``, kept the planted documents and
reported success; a NUL in an id crashed it half-way. Here the server holds each id
exactly, the CLI names each one exactly, and an id the server cannot hold is refused
before anything changes.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from knowledge import Chunk, Document
from knowledge.vectorstore.edge import EdgeStore
from tests.conftest import REPO, SWITCHYARD, ServerHandle, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

NOTES = {
    "note-001.md": "# Note one\n\nThe harbour ferry leaves at dawn.\n",
    "note-002.md": "# Note two\n\nThe tram depot closes at midnight.\n",
    "note-003.md": "# Note three\n\nThe observatory opens on Tuesdays.\n",
}
PLANTED = ["note-001.md#planted", "note-002.md?planted", "x/../note-003.md"]
LEGACY_ID = "legacy\x00id"


async def _store_legacy_document(data_dir: Path) -> None:
    """A document stored before ids were checked, with a NUL in its id (written with
    the store's own API, as an old version could)."""
    store = EdgeStore(data_dir / "vectors")
    try:
        await store.ensure_collection("legacy", dimensions=512, embedder="use-multilingual-v3")
        document = Document.model_construct(
            id=LEGACY_ID, text="old", title=None, source="old.md", metadata={}, format="text"
        )
        chunk = Chunk(doc_id=LEGACY_ID, index=0, text="old")
        await store.write_document("legacy", document, [chunk], [[0.1] * 512], [([1], [1.0])])
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def ids_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("knowledge-ids")
    asyncio.run(_store_legacy_document(tmp / "data"))
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {"gateway": {"models_file": str(models)}, "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}}},
    )
    try:
        yield handle
    finally:
        stop_server(handle)


def _ingest(server: ServerHandle, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(server.config), "ingest", *args, "--json"],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
    )
    assert "sending the documents through it" in result.stderr  # the server holds the store
    return result


def _listed(server: ServerHandle, collection: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{server.url}/v1/collections/{collection}/documents", timeout=30)
    assert response.status_code == 200, response.text
    return {d["doc_id"]: d for d in response.json()["documents"]}


def _notes(tmp_path: Path) -> Path:
    source = tmp_path / "notes"
    source.mkdir()
    for name, text in NOTES.items():
        (source / name).write_text(text)
    return source


def test_delete_missing_removes_exactly_the_planted_documents(ids_server: ServerHandle, tmp_path: Path) -> None:
    source = _notes(tmp_path)
    first = _ingest(ids_server, str(source), "-c", "notes")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["added"] == 3
    planted = {"documents": [{"id": doc_id, "text": f"Planted text {i}."} for i, doc_id in enumerate(PLANTED)]}
    uploaded = httpx.post(ids_server.url + "/v1/collections/notes/documents", json=planted, timeout=120)
    assert uploaded.status_code == 200 and uploaded.json()["added"] == 3, uploaded.text
    assert sorted(_listed(ids_server, "notes")) == sorted([*NOTES, *PLANTED])

    result = _ingest(ids_server, str(source), "-c", "notes", "--delete-missing")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["skipped"], report["deleted"]) == (3, 3)
    listed = _listed(ids_server, "notes")
    assert sorted(listed) == sorted(NOTES)  # the real notes stay, the planted ones are gone
    found = httpx.post(ids_server.url + "/v1/collections/notes/search", json={"query": "harbour ferry dawn", "k": 1}).json()
    assert found["results"][0]["doc_id"] == "note-001.md"


def _raw_delete(server: ServerHandle, collection: str, segment: str) -> tuple[int, dict[str, Any]]:
    """DELETE with the path sent byte for byte (no client-side encoding or dot-segment
    normalisation)."""
    url = httpx.URL(server.url)
    connection = http.client.HTTPConnection(url.host, url.port, timeout=60)
    try:
        connection.request("DELETE", f"/v1/collections/{collection}/documents/{segment}")
        response = connection.getresponse()
        body = response.read()
        return response.status, json.loads(body) if body else {}
    finally:
        connection.close()


@pytest.mark.parametrize("index", range(len(PLANTED)))
def test_the_server_deletes_exactly_the_id_in_the_path(ids_server: ServerHandle, index: int) -> None:
    doc_id, collection = PLANTED[index], f"exact-{index}"
    real = {"documents": [{"id": name, "text": text} for name, text in NOTES.items()]}
    assert httpx.post(f"{ids_server.url}/v1/collections/{collection}/documents", json=real, timeout=120).status_code == 200
    encoded = urllib.parse.quote(doc_id, safe="")
    # Not stored: 404 naming it, and the document its prefix names is untouched.
    status, body = _raw_delete(ids_server, collection, encoded)
    assert status == 404 and repr(doc_id) in body["error"]["message"]
    assert sorted(_listed(ids_server, collection)) == sorted(NOTES)
    planted = {"documents": [{"id": doc_id, "text": "Planted."}]}
    assert httpx.post(f"{ids_server.url}/v1/collections/{collection}/documents", json=planted, timeout=120).status_code == 200
    assert _raw_delete(ids_server, collection, encoded)[0] == 204
    assert sorted(_listed(ids_server, collection)) == sorted(NOTES)
    # Sent unencoded, `/` and `..` are part of the id too: the server does not resolve them.
    assert httpx.post(f"{ids_server.url}/v1/collections/{collection}/documents", json=planted, timeout=120).status_code == 200
    unencoded = doc_id.replace("#", "%23").replace("?", "%3F")
    assert _raw_delete(ids_server, collection, unencoded)[0] == 204
    assert sorted(_listed(ids_server, collection)) == sorted(NOTES)


@pytest.mark.parametrize(
    ("segment", "doc_id", "reason"),
    [
        ("bad%00id", "bad\x00id", "control character"),
        ("line%0Abreak", "line\nbreak", "control character"),
        ("", "", "empty"),
        ("a" * 513, "a" * 513, "longer than 512"),
    ],
)
def test_an_id_the_server_cannot_hold_is_a_422_before_anything_changes(
    ids_server: ServerHandle, segment: str, doc_id: str, reason: str
) -> None:
    collection = "refused"
    body = {"documents": [{"id": "keep.md", "text": "Kept."}]}
    assert httpx.post(f"{ids_server.url}/v1/collections/{collection}/documents", json=body, timeout=120).status_code == 200
    status, error = _raw_delete(ids_server, collection, segment)
    assert status == 422, error
    assert error["error"]["param"] == "path.doc_id" and reason in error["error"]["message"]
    upload = {"documents": [{"id": "fine.md", "text": "Fine."}, {"id": doc_id, "text": "Bad."}]}
    refused = httpx.post(f"{ids_server.url}/v1/collections/{collection}/documents", json=upload, timeout=120)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == "documents.1.id"
    assert sorted(_listed(ids_server, collection)) == ["keep.md"]  # nothing written, nothing deleted


def test_a_bad_id_in_the_source_is_named_and_the_rest_goes_on(ids_server: ServerHandle, tmp_path: Path) -> None:
    source = tmp_path / "records"
    source.mkdir()
    records = [{"id": "ok-1", "text": "The museum opens at ten."}, {"id": "nul\u0000id", "text": "Bad id."}]
    (source / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = _ingest(ids_server, str(source), "-c", "records")
    assert result.returncode == 2, result.stderr  # some documents failed; no crash
    report = json.loads(result.stdout)
    assert (report["added"], report["failed"]) == (1, 1)
    assert report["errors"][0]["source"] == "records.jsonl:2" and "control character" in report["errors"][0]["reason"]
    assert sorted(_listed(ids_server, "records")) == ["ok-1"]


def test_delete_missing_refuses_before_changing_anything_when_an_id_cannot_be_sent(
    ids_server: ServerHandle, tmp_path: Path
) -> None:
    assert list(_listed(ids_server, "legacy")) == [LEGACY_ID]
    source = _notes(tmp_path)
    result = _ingest(ids_server, str(source), "-c", "legacy", "--delete-missing")
    assert result.returncode == 1
    assert "cannot be asked to delete by id" in result.stderr and repr(LEGACY_ID) in result.stderr
    assert "nothing was changed" in result.stderr
    assert list(_listed(ids_server, "legacy")) == [LEGACY_ID]  # nothing uploaded, nothing deleted


def test_a_collection_name_that_is_not_one_segment_is_refused_by_the_cli(ids_server: ServerHandle, tmp_path: Path) -> None:
    source = _notes(tmp_path)
    result = subprocess.run(
        [str(SWITCHYARD), "--config", str(ids_server.config), "ingest", str(source), "-c", "x/../notes", "--json"],
        capture_output=True, text=True, cwd=REPO, env=os.environ.copy(), timeout=300, check=False,
    )
    assert result.returncode == 1 and "invalid collection name 'x/../notes'" in result.stderr
