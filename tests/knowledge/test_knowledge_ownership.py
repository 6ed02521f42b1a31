"""Document ownership in the knowledge base itself (issue 11, item 7), on real Qdrant
local mode: a tenant replaces and deletes only what it wrote, a refused ingestion
writes nothing, the operator (no tenant) may replace or delete anything, and
``delete_missing`` removes only the writer's own documents."""

from __future__ import annotations

import pytest

from knowledge import Document, DocumentOwnershipError, KnowledgeBase

pytestmark = pytest.mark.integration


async def test_a_tenant_replaces_and_deletes_only_its_own_documents(knowledge: KnowledgeBase) -> None:
    await knowledge.ingest("shared", [Document(id="plan", text="Acme's plan.")], tenant="acme")
    with pytest.raises(DocumentOwnershipError, match=r"tenant 'globex' .* 'plan'; nothing was changed"):
        await knowledge.ingest(
            "shared", [Document(id="notes", text="Globex notes."), Document(id="plan", text="Globex's plan.")], tenant="globex"
        )
    with pytest.raises(DocumentOwnershipError, match="'plan'"):
        await knowledge.delete("shared", "plan", tenant="globex")
    stored = await knowledge.store.documents("shared")
    assert list(stored) == ["plan"] and stored["plan"].owner == "acme"  # "notes" was not written either
    assert stored["plan"].version == Document(id="plan", text="Acme's plan.").hash
    assert await knowledge.delete("shared", "plan", tenant="acme") is True


async def test_the_operator_may_replace_anything_and_delete_missing_keeps_others_documents(knowledge: KnowledgeBase) -> None:
    await knowledge.ingest("shared", [Document(id="acme-doc", text="Acme's document.")], tenant="acme")
    await knowledge.ingest("shared", [Document(id="old", text="Operator's old page."), Document(id="keep", text="Kept.")])
    report = await knowledge.ingest("shared", [Document(id="keep", text="Kept.")], delete_missing=True)
    assert report.deleted == 1
    assert sorted(await knowledge.store.documents("shared")) == ["acme-doc", "keep"]  # acme's stays

    tenant_report = await knowledge.ingest("shared", [], delete_missing=True, tenant="acme")
    assert tenant_report.deleted == 1  # acme's own, lost from its source
    assert sorted(await knowledge.store.documents("shared")) == ["keep"]

    await knowledge.ingest("shared", [Document(id="acme-doc", text="Acme again.")], tenant="acme")
    await knowledge.ingest("shared", [Document(id="acme-doc", text="The operator's correction.")])
    assert (await knowledge.store.documents("shared"))["acme-doc"].owner is None  # the writer owns it now
    with pytest.raises(DocumentOwnershipError):
        await knowledge.delete("shared", "acme-doc", tenant="acme")
    assert await knowledge.delete("shared", "acme-doc") is True


async def test_write_locks_do_not_outlive_their_writers(knowledge: KnowledgeBase) -> None:
    """Collection names come from clients: deletes on made-up collections (each a 404)
    must leave no lock behind, and a name no store can hold is refused first."""
    from knowledge import InvalidCollectionNameError, UnknownCollectionError  # noqa: PLC0415

    for index in range(50):
        with pytest.raises(UnknownCollectionError):
            await knowledge.delete(f"made-up-{index}", "x", tenant="acme")
    with pytest.raises(InvalidCollectionNameError):
        await knowledge.delete("x" * 60_000, "x", tenant="acme")
    await knowledge.ingest("kept", [Document(id="a.md", text="Alpha.", source="a.md")], tenant="acme")
    assert await knowledge.delete("kept", "a.md", tenant="acme")
    assert knowledge._writing == {}  # noqa: SLF001 - the leak this test is about
