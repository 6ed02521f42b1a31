"""Document ownership in a collection two tenants share, on a real server with real
keys (issue 11, item 7): tenant B could overwrite, then delete, tenant A's document.
Now a document records the tenant that wrote it; only that tenant may replace or
delete it (403 naming it, nothing changed), both tenants still read and search it,
and ``switchyard ingest --delete-missing`` through the server removes only the
caller's own documents."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, SWITCHYARD, ServerHandle, create_key, start_server, stop_server, write_models_file

pytestmark = pytest.mark.e2e

TENANTS = {"acme": {"collections": ["shared"]}, "globex": {"collections": ["shared"]}}
PLAN = "The acme launch plan: the harbour ferry leaves at dawn on the first of May."


@pytest.fixture(scope="module")
def tenants_server(
    tmp_path_factory: pytest.TempPathFactory, fake_backend_url: str
) -> Iterator[tuple[ServerHandle, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("knowledge-owners")
    models = write_models_file(tmp / "models.yaml", None, fake_backend_url, chat_default="fake-ok")
    settings: dict[str, Any] = {
        "gateway": {"models_file": str(models)},
        "graphs": {"chat": {"path": "graphs.chat:make_graph", "model": "chat-default"}},
        "auth": {"tenants": TENANTS},
    }
    config = tmp / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **settings}))
    keys = {tenant: create_key(config, tenant) for tenant in TENANTS}
    handle = start_server(tmp, settings, dev=False)
    try:
        yield handle, keys
    finally:
        stop_server(handle)


class _Tenant:
    def __init__(self, server: ServerHandle, key: str) -> None:
        self.url = server.url + "/v1/collections/shared"
        self.headers = {"Authorization": f"Bearer {key}"}

    def upload(self, *documents: tuple[str, str]) -> httpx.Response:
        body = {"documents": [{"id": doc_id, "text": text} for doc_id, text in documents]}
        return httpx.post(self.url + "/documents", json=body, headers=self.headers, timeout=120)

    def delete(self, doc_id: str) -> httpx.Response:
        return httpx.delete(f"{self.url}/documents/{doc_id}", headers=self.headers, timeout=60)

    def listed(self) -> dict[str, dict[str, Any]]:
        response = httpx.get(self.url + "/documents", headers=self.headers, timeout=60)
        assert response.status_code == 200, response.text
        return {d["doc_id"]: d for d in response.json()["documents"]}

    def search(self, query: str) -> list[dict[str, Any]]:
        response = httpx.post(self.url + "/search", json={"query": query, "k": 5}, headers=self.headers, timeout=60)
        assert response.status_code == 200, response.text
        return list(response.json()["results"])


def test_a_tenant_may_not_replace_or_delete_another_tenants_document(
    tenants_server: tuple[ServerHandle, dict[str, str]],
) -> None:
    server, keys = tenants_server
    acme, globex = _Tenant(server, keys["acme"]), _Tenant(server, keys["globex"])
    assert acme.upload(("plan.md", PLAN)).json()["added"] == 1
    version = acme.listed()["plan.md"]["version"]

    overwrite = globex.upload(("globex-notes.md", "Globex notes."), ("plan.md", "Globex rewrote the plan."))
    assert overwrite.status_code == 403, overwrite.text
    error = overwrite.json()["error"]
    assert "'plan.md'" in error["message"] and "nothing was changed" in error["message"]
    assert (error["type"], error["code"], error["param"]) == ("permission_error", "document_not_owned", "doc_id")
    deleted = globex.delete("plan.md")
    assert deleted.status_code == 403 and "'plan.md'" in deleted.json()["error"]["message"]

    # Nothing changed: acme's version is live, globex's other document was not written.
    assert set(acme.listed()) == {"plan.md"} and acme.listed()["plan.md"]["version"] == version
    for tenant in (acme, globex):  # both still read it
        assert tenant.search("when does the ferry leave for the launch")[0]["text"].endswith(PLAN)

    seen_by_globex, seen_by_acme = globex.listed()["plan.md"], acme.listed()["plan.md"]
    assert (seen_by_globex["owned"], seen_by_globex["writable"]) == (False, False)
    assert (seen_by_acme["owned"], seen_by_acme["writable"]) == (True, True)

    # Globex writes and deletes its own; acme replaces and deletes its own.
    assert globex.upload(("globex-notes.md", "Globex notes.")).json()["added"] == 1
    assert acme.delete("globex-notes.md").status_code == 403
    assert globex.delete("globex-notes.md").status_code == 204
    assert acme.upload(("plan.md", PLAN + " Updated.")).json()["updated"] == 1
    assert acme.delete("plan.md").status_code == 204
    assert acme.listed() == {}


def _ingest(server: ServerHandle, key: str, source: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SWITCHYARD), "--config", str(server.config), "ingest", str(source), "-c", "shared", "--json", *flags],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "SWITCHYARD_API_KEY": key}, timeout=300,
        check=False,
    )


def test_the_cli_through_the_server_touches_only_the_callers_documents(
    tenants_server: tuple[ServerHandle, dict[str, str]], tmp_path: Path
) -> None:
    server, keys = tenants_server
    acme, globex = _Tenant(server, keys["acme"]), _Tenant(server, keys["globex"])
    assert acme.upload(("acme-guide.md", "The acme guide to the tram depot.")).status_code == 200

    source = tmp_path / "globex"
    source.mkdir()
    (source / "globex-a.md").write_text("# A\n\nGlobex note A about the observatory.\n")
    (source / "globex-b.md").write_text("# B\n\nGlobex note B about the museum.\n")
    first = _ingest(server, keys["globex"], source)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["added"] == 2

    # --delete-missing removes globex's own lost document, never acme's.
    (source / "globex-b.md").unlink()
    again = _ingest(server, keys["globex"], source, "--delete-missing")
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["skipped"], json.loads(again.stdout)["deleted"]) == (1, 1)
    assert set(acme.listed()) == {"acme-guide.md", "globex-a.md"}

    # A source holding acme's document id is refused before anything is sent.
    (source / "acme-guide.md").write_text("# Hijacked\n\nGlobex's version of the guide.\n")
    (source / "globex-c.md").write_text("# C\n\nGlobex note C.\n")
    refused = _ingest(server, keys["globex"], source, "--delete-missing")
    assert refused.returncode == 1
    assert "'acme-guide.md'" in refused.stderr and "nothing was changed" in refused.stderr
    listed = acme.listed()
    assert set(listed) == {"acme-guide.md", "globex-a.md"} and listed["acme-guide.md"]["owned"]
    assert "tram depot" in acme.search("tram depot guide")[0]["text"]
