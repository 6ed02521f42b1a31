"""Extraction: each invalid item is dropped with its reason; entity resolution within
a document and against the graph; the model's answer parsed and checked; the real
local model answers under the ontology's schema with JSON that validates; a model
that answers garbage or too slowly costs its chunk, never the extraction."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from gateway import Backend, ModelGateway, load_registry
from gateway.errors import CapabilityError
from knowledge.extraction import (
    INVALID_REASONS,
    DocumentGraphBuilder,
    EntityItem,
    Extractor,
    Problem,
    RelationItem,
    check_entity,
    check_relation,
    extraction_schema,
    parse_answer,
    resolve_ends,
)
from knowledge.graphstore import Entity, entity_id
from knowledge.ontology import load_ontology
from knowledge.settings import ExtractionSettings
from tests.scripted import running_scripted_backend

REPO = Path(__file__).resolve().parents[2]
ONTOLOGY = load_ontology(REPO / "config/ontologies/city-services.yaml")


def _reason(item: object) -> str:
    assert isinstance(item, Problem), item
    return item.reason


# ---- items ----------------------------------------------------------------------------------


def test_a_valid_entity() -> None:
    item = check_entity(
        {"type": "Office", "name": "  Labour Office ", "aliases": ["LO", "labour office."], "description": "Desk.",
         "properties": {"address": "4 Quarry Lane", "colour": "red"}, "extra": 1},
        ONTOLOGY, where="line 1",
    )
    assert isinstance(item, EntityItem)
    assert item.name == "Labour Office"
    assert item.aliases == ("LO",)  # the alias that normalises to the name is dropped
    assert item.properties == {"address": "4 Quarry Lane"}  # undeclared properties dropped
    assert item.keys == ("labour office", "lo")
    assert item.where == "line 1"


def test_line_breaks_in_a_name_are_spaces_and_kept_in_a_description() -> None:
    item = check_entity(
        {"type": "Office", "name": "Labour\r\nArbitration \tOffice", "aliases": ["L.A.\nO."], "description": "One.\nTwo."},
        ONTOLOGY, where="line 1",
    )
    assert isinstance(item, EntityItem)
    assert (item.name, item.aliases, item.description) == ("Labour Arbitration Office", ("L.A. O.",), "One.\nTwo.")


@pytest.mark.parametrize(
    ("raw", "reason", "detail"),
    [
        ({"name": "X"}, "missing_field", "type is missing"),
        ({"type": "Person", "name": "X"}, "unknown_entity_type", "'Person'"),
        ({"type": "Office"}, "missing_field", "name is missing"),
        ({"type": "Office", "name": " ... "}, "empty_name", "name is empty"),
        ({"type": "Office", "name": "x" * 201}, "name_too_long", "longer than 200"),
        ({"type": "Office", "name": "X", "aliases": ["ok", ""]}, "empty_name", "aliases[1]"),
        ({"type": "Office", "name": "X", "aliases": ["y" * 201]}, "name_too_long", "aliases[0]"),
        ({"type": "Office", "name": "X", "aliases": "Y"}, "bad_property", "aliases must be a list"),
        ({"type": "Office", "name": 3}, "bad_property", "name must be a string"),
        ({"type": "Office", "name": "X", "properties": {"address": 4}}, "bad_property", "'address' of Office must be a string"),
        ({"type": "Office", "name": "X", "properties": ["address"]}, "bad_property", "properties must be an object"),
        ({"type": "Office", "name": "X", "description": 5}, "bad_property", "description"),
        ({"type": "Office", "name": "Lab\x00our"}, "bad_name", "name holds a control character (U+0000)"),
        ({"type": "Office", "name": "\x1b[31mRed"}, "bad_name", "U+001B"),
        ({"type": "Office", "name": "X", "aliases": ["ok", "b\x85"]}, "bad_name", "aliases[1]"),
        ({"type": "Office", "name": "X", "description": "Desk\x07."}, "bad_name", "description"),
        ({"type": "Office", "name": "X", "properties": {"address": "1\x7f A St"}}, "bad_name", "address"),
    ],
)
def test_invalid_entities(raw: dict[str, object], reason: str, detail: str) -> None:
    problem = check_entity(raw, ONTOLOGY, where="chunk d#0")
    assert _reason(problem) == reason
    assert isinstance(problem, Problem) and detail in problem.detail and problem.where == "chunk d#0"
    assert problem.reason in INVALID_REASONS


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"from": "a", "to": "b"}, "missing_field"),
        ({"type": "KNOWS", "from": "a", "to": "b"}, "unknown_relation_type"),
        ({"type": "ISSUED_BY", "to": "b"}, "missing_field"),
        ({"type": "ISSUED_BY", "from": "a", "to": ""}, "empty_name"),
        ({"type": "ISSUED_BY", "from": "a" * 300, "to": "b"}, "name_too_long"),
        ({"type": "ISSUED_BY", "from": "a", "to": "b\x00"}, "bad_name"),
    ],
)
def test_invalid_relations(raw: dict[str, object], reason: str) -> None:
    assert _reason(check_relation(raw, ONTOLOGY, where="line 2")) == reason


def test_relation_ends() -> None:
    certificate = EntityItem(type="Document", name="Separation Certificate", aliases=("separation paper",))
    office = EntityItem(type="Office", name="Labour Office")
    employer = EntityItem(type="Organisation", name="Labour Office")  # same name, another type
    relation = RelationItem(type="ISSUED_BY", source="the separation paper?", target="labour office", where="x")
    # "the separation paper?" does not normalise to the alias ("the" stays): unknown.
    assert _reason(resolve_ends(relation, [certificate, office], ONTOLOGY)) == "unknown_entity"
    relation = RelationItem(type="ISSUED_BY", source="Separation Paper.", target="LABOUR  office", where="x")
    assert resolve_ends(relation, [certificate, office], ONTOLOGY) == (certificate, office)
    # A name of several types: the first pair the relation allows.
    assert resolve_ends(relation, [employer, certificate, office], ONTOLOGY) == (certificate, employer)
    backwards = RelationItem(type="ISSUED_BY", source="Labour Office", target="Separation Certificate", where="x")
    problem = resolve_ends(backwards, [certificate, office], ONTOLOGY)
    assert _reason(problem) == "relation_not_allowed"
    assert isinstance(problem, Problem) and "Document -> Office/Organisation" in problem.detail and "not Office -> Document" in problem.detail


# ---- resolution -------------------------------------------------------------------------------


def test_resolution_within_a_document() -> None:
    builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0", "d#1", "d#2"])
    a = builder.add_entity(EntityItem(type="Office", name="Labour Office", properties={"address": "1 A St"}), ["d#0"])
    b = builder.add_entity(EntityItem(type="Office", name="LAO", aliases=("the labour office",)), ["d#1"])
    # "labour office." and "Labour  Office" normalise the same: one entity, first name canonical.
    c = builder.add_entity(EntityItem(type="Office", name="labour office.", aliases=("LAO",), description="Desk."), ["d#2"])
    other_type = builder.add_entity(EntityItem(type="Organisation", name="Labour Office"), ["d#2"])
    certificate = builder.add_entity(EntityItem(type="Document", name="Separation Certificate"), ["d#2"])
    builder.add_relation("ISSUED_BY", certificate, b, ["d#2"])
    builder.add_relation("ISSUED_BY", certificate, c, ["d#1"])  # the same relation once b and c merged
    graph = builder.build()
    # c names both a ("labour office") and b ("LAO"): the three are one Office.
    assert len(builder) == 3
    offices = [e for e in graph.entities if e.type == "Office"]
    assert len(offices) == 1
    office = offices[0]
    assert office.id == entity_id("Office", "Labour Office") and office.name == "Labour Office"
    assert set(office.aliases) == {"LAO", "the labour office"}
    assert office.description == "Desk." and office.properties == {"address": "1 A St"}
    assert any(e.type == "Organisation" for e in graph.entities)  # another type, another entity
    assert [(r.type, r.chunk_ids) for r in graph.relations] == [("ISSUED_BY", ("d#1", "d#2"))]
    assert graph.relations[0].target == office.id
    mentioned = {(m.chunk_id, m.entity_id) for m in graph.mentions}
    assert {("d#0", office.id), ("d#1", office.id), ("d#2", office.id)} <= mentioned
    assert {m.entity_id for m in graph.mentions} == {e.id for e in graph.entities}
    assert a != other_type


def test_resolution_against_the_graph() -> None:
    stored = Entity(
        id=entity_id("Office", "Labour Arbitration Office"), type="Office", name="Labour Arbitration Office",
        aliases=("LAO",),
    )
    builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0"], stored=[stored])
    builder.add_entity(EntityItem(type="Office", name="lao", aliases=("Arbitration Office",)), ["d#0"])
    builder.add_entity(EntityItem(type="Organisation", name="LAO"), ["d#0"])  # other type: not the stored one
    graph = builder.build()
    office = next(e for e in graph.entities if e.type == "Office")
    assert office.id == stored.id and office.name == "Labour Arbitration Office"
    assert set(office.aliases) == {"LAO", "Arbitration Office"}
    organisation = next(e for e in graph.entities if e.type == "Organisation")
    assert organisation.id == entity_id("Organisation", "LAO")


def test_a_stored_entity_keeps_its_id_when_an_item_joins_it_to_a_new_one() -> None:
    # "LAO" alone is not a key of the stored office; "Labour Arbitration Office" is;
    # the third item names both, so the three are one entity: the stored one.
    stored = Entity(id=entity_id("Office", "Labour Arbitration Office"), type="Office", name="Labour Arbitration Office")
    builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0", "d#1", "d#2"], stored=[stored])
    builder.add_entity(EntityItem(type="Office", name="LAO"), ["d#0"])
    builder.add_entity(EntityItem(type="Office", name="Labour Arbitration Office"), ["d#1"])
    builder.add_entity(EntityItem(type="Office", name="Labour Arbitration Office", aliases=("LAO",)), ["d#2"])
    (office,) = builder.build().entities
    assert office.id == stored.id and office.name == "Labour Arbitration Office" and office.aliases == ("LAO",)
    # An item naming a new entity and a stored one at once joins the stored one too.
    builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0", "d#1"], stored=[stored])
    builder.add_entity(EntityItem(type="Office", name="LAO"), ["d#0"])
    builder.add_entity(EntityItem(type="Office", name="LAO", aliases=("labour arbitration office",)), ["d#1"])
    graph = builder.build()
    assert [(e.id, e.name, e.aliases) for e in graph.entities] == [(stored.id, "Labour Arbitration Office", ("LAO",))]
    assert {m.chunk_id for m in graph.mentions} == {"d#0", "d#1"}


def test_two_stored_entities_an_item_joins_keep_the_first_id() -> None:
    first = Entity(id=entity_id("Office", "Labour Office"), type="Office", name="Labour Office")
    second = Entity(id=entity_id("Office", "Arbitration Office"), type="Office", name="Arbitration Office")
    for order in ([first, second], [second, first]):
        builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0"], stored=order)
        builder.add_entity(EntityItem(type="Office", name="Arbitration Office"), ["d#0"])
        builder.add_entity(EntityItem(type="Office", name="Labour Office"), ["d#0"])
        builder.add_entity(EntityItem(type="Office", name="Labour Office", aliases=("Arbitration Office",)), ["d#0"])
        # The first cluster the document made keeps its stored id, whatever order the
        # graph gave them in.
        assert [e.id for e in builder.build().entities] == [second.id]


def test_chunks_of_another_document_are_refused() -> None:
    builder = DocumentGraphBuilder(doc_id="d", content_hash="h", chunk_ids=["d#0"])
    with pytest.raises(ValueError, match="not chunks of document 'd'"):
        builder.add_entity(EntityItem(type="Office", name="X"), ["e#0"])


# ---- the model's answer ------------------------------------------------------------------------


def test_parse_answer_keeps_what_passes() -> None:
    answer = json.dumps({
        "entities": [
            {"name": "Unemployment Benefit", "type": "Procedure"},
            {"name": "Separation Certificate", "type": "Document"},
            {"name": "Bob", "type": "Person"},
            "not an object",
        ],
        "relations": [
            {"type": "REQUIRES", "from": "Unemployment Benefit", "to": "Separation Certificate"},
            {"type": "REQUIRES", "from": "Separation Certificate", "to": "Unemployment Benefit"},
            {"type": "ISSUED_BY", "from": "Separation Certificate", "to": "Town Hall"},
            {"type": "LIKES", "from": "Bob", "to": "Unemployment Benefit"},
        ],
    })
    result = parse_answer(answer, ONTOLOGY, chunk_id="d#0")
    assert not result.failed
    assert [e.name for e in result.entities] == ["Unemployment Benefit", "Separation Certificate"]
    assert [(r.type, s.name, t.name) for r, s, t in result.relations] == [
        ("REQUIRES", "Unemployment Benefit", "Separation Certificate")
    ]
    assert sorted(p.reason for p in result.problems) == [
        "bad_json", "relation_not_allowed", "unknown_entity", "unknown_entity_type", "unknown_relation_type",
    ]
    assert {p.where for p in result.problems} == {"chunk d#0"}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [("lorem ipsum", "bad_json"), ('{"entities": [', "bad_json"), ("[1, 2]", "bad_json"), ('{"relations": []}', "missing_field")],
)
def test_an_answer_that_is_not_an_extraction_fails_its_chunk(answer: str, reason: str) -> None:
    result = parse_answer(answer, ONTOLOGY, chunk_id="d#3")
    assert result.failed and not result.entities
    assert [p.reason for p in result.problems] == [reason]


# ---- the model -----------------------------------------------------------------------------------

CHUNKS = {
    "benefit.md#0": "# Unemployment benefit\nTo apply for the unemployment benefit you need a Separation Certificate "
    "from your last employer. The Employment Office on Dock Street handles the unemployment benefit.",
    "certificate.md#0": "# When the employer refuses\nIf an employer refuses to write the Separation Certificate, the "
    "Labour Arbitration Office at 4 Quarry Lane issues it instead after a short hearing.",
}


@pytest.fixture
async def local_gateway(local_backend: Backend, tmp_path: Path) -> AsyncIterator[ModelGateway]:
    # The local backend with a longer read timeout than config/models.yaml's 60 s: an
    # answer of ~400 tokens takes longer than that when the two cores are shared.
    source = yaml.safe_load((REPO / "config/models.yaml").read_text())
    local = {**source["backends"]["local"], "base_url": local_backend.base_url, "timeouts": {"connect_s": 5, "read_s": 300}}
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"backends": {"local": local}, "aliases": {"chat-default": "local"}}))
    gateway = ModelGateway(load_registry(models))
    yield gateway
    await gateway.aclose()


@pytest.mark.integration
@pytest.mark.llm
async def test_the_local_model_answers_schema_valid_json(local_gateway: ModelGateway) -> None:
    # Bounds a 135M model closes its JSON within (see extraction_schema's docstring).
    settings = ExtractionSettings(max_entities=6, max_relations=4, max_tokens=512, timeout_s=300)
    extractor = Extractor(local_gateway, ONTOLOGY, settings)
    extractor.check()
    validator = jsonschema.Draft202012Validator(extraction_schema(ONTOLOGY, settings))
    for chunk_id, text in CHUNKS.items():
        result = await extractor.extract(chunk_id, text)
        # Under llama.cpp's grammar the answer is JSON of the schema (quality not asserted).
        assert not list(validator.iter_errors(json.loads(result.answer))), result.answer
        assert not result.failed, result.problems
        # What passed the checks is of the ontology's types, relations between its own entities.
        for entity in result.entities:
            assert entity.type in ONTOLOGY.entity_types
        for relation, source, target in result.relations:
            assert ONTOLOGY.allows(relation.type, source.type, target.type)
        assert all(p.reason in INVALID_REASONS for p in result.problems)


def _scripted_models(path: Path, base_url: str, *, json_schema: bool = True) -> Path:
    path.write_text(yaml.safe_dump({
        "backends": {
            "scripted": {
                "kind": "vllm", "base_url": base_url, "model": "scripted",
                "timeouts": {"connect_s": 2, "read_s": 30},
                "capabilities": {"context_window": 4096, "json_schema": json_schema},
            },
        },
        "aliases": {"chat-default": "scripted"},
    }))
    return path


@pytest.mark.integration
async def test_garbage_and_slow_answers_fail_their_chunk(tmp_path: Path) -> None:
    # The scripted backend answers lorem ipsum (not JSON), one token per 10 ms, as many
    # tokens as max_tokens: 16 tokens come back in time, 512 do not within 1 s.
    with running_scripted_backend(tmp_path, delay_ms=10) as backend:
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", backend.base_url)))
        try:
            quick = Extractor(gateway, ONTOLOGY, ExtractionSettings(max_tokens=16, timeout_s=20))
            garbage = await quick.extract("d#0", "some text")
            assert garbage.failed and [p.reason for p in garbage.problems] == ["bad_json"]
            assert "cut at max_tokens (16)" in garbage.problems[0].detail
            slow = Extractor(gateway, ONTOLOGY, ExtractionSettings(max_tokens=512, timeout_s=1))
            timed_out = await slow.extract("d#1", "some text")
            assert timed_out.failed and [p.reason for p in timed_out.problems] == ["timeout"]
            assert timed_out.problems[0].where == "chunk d#1"
        finally:
            await gateway.aclose()
        backend.stop()
        gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", backend.base_url)))
        try:
            down = await Extractor(gateway, ONTOLOGY, ExtractionSettings(timeout_s=20)).extract("d#2", "some text")
            assert down.failed and [p.reason for p in down.problems] == ["model_error"]
            assert "BackendUnavailableError" in down.problems[0].detail
        finally:
            await gateway.aclose()


def test_an_alias_without_json_schema_output_is_refused_up_front(tmp_path: Path) -> None:
    gateway = ModelGateway(load_registry(_scripted_models(tmp_path / "models.yaml", "http://127.0.0.1:9/v1", json_schema=False)))
    with pytest.raises(CapabilityError, match="json_schema"):
        Extractor(gateway, ONTOLOGY, ExtractionSettings()).check()
