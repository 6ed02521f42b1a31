"""The collections API against bad and unusual input, on a real server (Qdrant local
mode, the packaged embedder): metadata filters of every type match as documented, and
what no store can apply is a 422 naming the field, never a 500 (issue 10, item 6)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServerHandle, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

DOCUMENTS = [
    {"id": "float", "text": "The tide table for the harbour.", "metadata": {"score": 1.5, "": "empty", "a.b": "dotted"}},
    {"id": "int", "text": "The tide table for the river.", "metadata": {"score": 2, "flag": True}},
]


@pytest.fixture(scope="module")
def knowledge_server(tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str) -> Iterator[ServerHandle]:
    """Switchyard in --dev with a ``tides`` collection (graphs on the FAKE backend; the
    collections API needs no model)."""
    tmp = tmp_path_factory.mktemp("knowledge-api")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    handle = start_server(
        tmp,
        {
            "gateway": {"models_file": str(models)},
            "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        },
    )
    try:
        uploaded = httpx.post(handle.url + "/v1/collections/tides/documents", json={"documents": DOCUMENTS}, timeout=120)
        assert uploaded.status_code == 200 and uploaded.json()["added"] == 2, uploaded.text
        yield handle
    finally:
        stop_server(handle)


def _search(server: ServerHandle, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(
        server.url + "/v1/collections/tides/search",
        content=content.encode("utf-8", "surrogatepass"),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"score": 1.5}, ["float"]),  # was a 500: Qdrant's exact match takes no float
        ({"score": 2.0}, ["int"]),  # a number with a decimal point matches by value
        ({"score": 2}, ["int"]),
        ({"": "empty"}, ["float"]),  # was a 500: "metadata." is no field path
        ({"a.b": "dotted"}, ["float"]),  # one field named "a.b", not a path
        ({"flag": True}, ["int"]),
        ({"flag": 1}, []),  # a boolean is not a number
    ],
)
def test_metadata_filters_match(knowledge_server: ServerHandle, metadata: dict[str, Any], expected: list[str]) -> None:
    response = _search(knowledge_server, {"query": "tide table", "k": 10, "filter": {"metadata": metadata}})
    assert response.status_code == 200, response.text
    assert sorted(r["doc_id"] for r in response.json()["results"]) == expected


@pytest.mark.parametrize(
    ("raw_filter", "named"),
    [
        ('{"metadata": {"a\\"b": 1}}', "metadata['a\"b']"),
        ('{"metadata": {"a\\\\b": 1}}', "metadata['a\\\\b']"),
        ('{"metadata": {"a": 18446744073709551616}}', "metadata['a']"),  # over 64 bits
        ('{"metadata": {"a": NaN}}', "metadata['a']"),  # Python's JSON parser reads it
        ('{"metadata": {"a": Infinity}}', "metadata['a']"),
        ('{"metadata": {"a": 1e999}}', "metadata['a']"),  # parsed as infinity
        ('{"metadata": {"a": "\\ud800"}}', "metadata['a']"),  # a lone surrogate
        ('{"metadata": {"\\udfff": 1}}', "metadata['\\udfff']"),
        ('{"metadata": {"a": [1]}}', "metadata['a']"),
        ('{"metadata": {"a": null}}', "metadata['a']"),
    ],
)
def test_filters_no_store_can_apply_are_a_422_naming_the_field(
    knowledge_server: ServerHandle, raw_filter: str, named: str
) -> None:
    response = _search(knowledge_server, '{"query": "tide table", "filter": ' + raw_filter + "}")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "filter.metadata" and named in error["message"], error


@pytest.mark.parametrize("field", ["doc_ids", "tags"])
def test_doc_ids_and_tags_that_are_not_text_are_refused(knowledge_server: ServerHandle, field: str) -> None:
    response = _search(knowledge_server, '{"query": "tide table", "filter": {"' + field + '": ["ok", "\\ud800"]}}')
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == f"filter.{field}" and f"{field}[1]" in error["message"], error
