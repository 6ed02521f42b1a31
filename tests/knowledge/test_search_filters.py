"""Metadata filters on real Qdrant local mode: every value type matches what it should
(floats included, which Qdrant's exact match cannot take), every key is taken
literally (dots, brackets, spaces, an empty name), and what no store can apply is
refused with the field named, before any store call."""

from __future__ import annotations

import pytest

from knowledge import Document, InvalidFilterError, KnowledgeBase, SearchFilter, check_metadata_filter

pytestmark = pytest.mark.integration

DOCUMENTS = [
    Document(
        id="float",
        text="The tide table for the harbour.",
        metadata={"score": 1.5, "year": 2020.0, "a.b": "dotted", "": "empty key", "x[0]": 1, "with space": True},
    ),
    Document(id="int", text="The tide table for the river.", metadata={"score": 2, "year": 2020, "flag": False}),
    Document(id="text", text="The tide table for the bay.", metadata={"score": "1.5", "a": {"b": "nested"}, "big": 2**63 - 1}),
]


@pytest.fixture
async def filtered(knowledge: KnowledgeBase) -> KnowledgeBase:
    report = await knowledge.ingest("f", DOCUMENTS)
    assert report.added == 3
    return knowledge


async def _ids(knowledge: KnowledgeBase, **metadata: object) -> list[str]:
    hits = await knowledge.search("f", "tide table", k=10, where=SearchFilter(metadata=metadata))  # type: ignore[arg-type]
    return sorted(h.doc_id for h in hits)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"score": 1.5}, ["float"]),  # a float (a 500 before: MatchValue takes no float)
        ({"score": 2.0}, ["int"]),  # a float matches an equal integer
        ({"score": 2}, ["int"]),
        ({"score": "1.5"}, ["text"]),  # a string is not a number
        ({"year": 2020}, ["int"]),  # an integer matches integers only (Qdrant's exact match)
        ({"year": 2020.0}, ["float", "int"]),
        ({"flag": False}, ["int"]),
        ({"flag": 0}, []),  # a boolean is not an integer
        ({"with space": True}, ["float"]),
        ({"big": 2**63 - 1}, ["text"]),
        ({"a.b": "dotted"}, ["float"]),  # the dotted key, not a path into "a"
        ({"a.b": "nested"}, []),
        ({"": "empty key"}, ["float"]),  # a 500 before: "metadata." is no path
        ({"x[0]": 1}, ["float"]),
        ({"missing": 1}, []),
        ({"score": 1.5, "year": 2020.0}, ["float"]),  # all must match
    ],
)
async def test_metadata_values_and_keys_match_as_documented(
    filtered: KnowledgeBase, metadata: dict[str, object], expected: list[str]
) -> None:
    assert await _ids(filtered, **metadata) == expected


@pytest.mark.parametrize(
    ("metadata", "field", "reason"),
    [
        ({'a"b': 1}, "metadata['a\"b']", "double quote"),
        ({"a\\b": 1}, "metadata['a\\\\b']", "backslash"),
        ({"a": 2**63}, "metadata['a']", "64 bits"),
        ({"a": -(2**63) - 1}, "metadata['a']", "64 bits"),
        ({"a": float("nan")}, "metadata['a']", "finite"),
        ({"a": float("inf")}, "metadata['a']", "finite"),
        ({"a": "\ud800"}, "metadata['a']", "Unicode"),
        ({"\udfff": 1}, "metadata['\\udfff']", "Unicode"),
        ({"a": [1, 2]}, "metadata['a']", "not list"),
        ({"a": None}, "metadata['a']", "not NoneType"),
    ],
)
async def test_filters_no_store_can_apply_are_refused_naming_the_field(
    filtered: KnowledgeBase, metadata: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(InvalidFilterError) as refused:
        await _ids(filtered, **metadata)
    assert refused.value.field == field and reason in refused.value.reason
    assert str(refused.value).startswith(f"filter {field}: ")


def test_doc_ids_and_tags_must_be_text() -> None:
    with pytest.raises(InvalidFilterError) as refused:
        SearchFilter(tags=["ok", "\ud800"])
    assert refused.value.field == "tags[1]"
    with pytest.raises(InvalidFilterError) as refused:
        SearchFilter(doc_ids=[1])  # type: ignore[list-item]
    assert refused.value.field == "doc_ids[0]"


def test_the_check_returns_the_filter_it_accepts() -> None:
    accepted = {"": "x", "a.b": 1.5, "n": -(2**63), "t": True, "s": "é"}
    assert check_metadata_filter(accepted) == accepted
