"""The ontology file format: a bad file fails naming the file and the field; a good
one loads into a frozen model whose fingerprint follows content, not layout; the
extraction schema it generates bounds what a model may answer."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from knowledge.errors import OntologyError
from knowledge.ontology import Ontology, load_ontology, normalise_name, parse_ontology

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "config/ontologies/city-services.yaml"

GOOD = """
name: tiny
entity_types:
  Office: {description: A place., properties: {address: string, floors: integer}}
  Document: {description: A certificate.}
relation_types:
  ISSUED_BY: {from: [Document], to: [Office], description: Who issues it.}
"""


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name: x\nentity_types: {A: {}}\nrelation_types: {R: {from: [A], to: [B]}}", "relation_types.R.to", ["'B'", "entity types: A"]),
        ("name: x\nentity_types: {A: {}}\nrelation_types: {R: {to: [A]}}", "relation_types.R.from", ["Field required"]),
        ("entity_types: {A: {}}", "name", ["Field required"]),
        ("name: x\nentity_types: {}", "entity_types", ["at least 1"]),
        ("name: x\nentity_type: {A: {}}", "entity_type", ["Extra inputs"]),
        ("name: x\nentity_types: {Chunk: {}}", "entity_types", ["'Chunk' is reserved"]),
        ("name: x\nentity_types: {Office: {}, office: {}}", "type names", ["'Office' and 'office' differ only in case"]),
        ("name: x\nentity_types: {A: {properties: {Bad: string}}}", "entity_types.A.properties", ["'Bad'"]),
        ("name: x\nentity_types: {A: {properties: {addr: text}}}", "entity_types.A.properties.addr", ["'string'"]),
        ("name: x\nentity_types: {A: {properties: {name: string}}}", "entity_types.A.properties", ["reserved"]),
        ("name: x\nentity_types: {A: {colour: red}}", "entity_types.A.colour", ["Extra inputs"]),
        ("name: x\nentity_types: {A: {}}\nrelation_types: {A: {from: A, to: A}}", "names used", ["both an entity type and a relation type: A"]),
        ("name: x\nentity_types: {1A: {}}", "entity_types", ["'1A' must match"]),
        ("name: 'bad name'\nentity_types: {A: {}}", "name", ["pattern"]),
    ],
)
def test_a_bad_ontology_names_the_file_and_the_field(text: str, field: str, words: list[str]) -> None:
    with pytest.raises(OntologyError) as caught:
        parse_ontology(text, source="bad.yaml")
    message = str(caught.value)
    assert message.startswith("bad.yaml: ")
    assert any(field in p for p in caught.value.problems), caught.value.problems
    for word in words:
        assert word in message


def test_not_yaml_or_not_a_mapping() -> None:
    with pytest.raises(OntologyError, match=r"bad\.yaml: line 1 not valid YAML"):
        parse_ontology("name: [x", source="bad.yaml")
    with pytest.raises(OntologyError, match="an ontology is a mapping"):
        parse_ontology("- a\n- b", source="bad.yaml")
    with pytest.raises(OntologyError, match="an ontology is a mapping"):
        parse_ontology("", source="bad.yaml")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(OntologyError, match="cannot read the ontology") as caught:
        load_ontology(tmp_path / "missing.yaml")
    assert caught.value.source == str(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(OntologyError, match="not UTF-8"):
        load_ontology(binary)
    huge = tmp_path / "huge.yaml"
    huge.write_text("#" * 1_000_001)
    with pytest.raises(OntologyError, match="larger than"):
        load_ontology(huge)


def test_the_sample_ontology_loads() -> None:
    ontology = load_ontology(SAMPLE)
    assert ontology.name == "city-services"
    assert sorted(ontology.entity_types) == ["Document", "Office", "Organisation", "Procedure"]
    assert ontology.allows("ISSUED_BY", "Document", "Organisation")
    assert not ontology.allows("ISSUED_BY", "Office", "Document")
    assert not ontology.allows("NOT_A_TYPE", "Document", "Office")
    assert ontology.describe() == f"'city-services' ({ontology.fingerprint})"


def test_frozen_and_the_fingerprint_follows_content(tmp_path: Path) -> None:
    ontology = parse_ontology(GOOD)
    with pytest.raises(ValidationError):
        ontology.name = "other"  # type: ignore[misc]
    # The same content as JSON, keys in another order, comments: the same fingerprint.
    as_json = tmp_path / "tiny.json"
    as_json.write_text(json.dumps(json.loads(ontology.model_dump_json(by_alias=True))))
    assert load_ontology(as_json).fingerprint == ontology.fingerprint
    reordered = parse_ontology(
        "# a comment\nrelation_types:\n  ISSUED_BY: {to: Office, from: Document, description: Who issues it.}\n"
        "entity_types:\n  Document: {description: A certificate.}\n"
        "  Office: {properties: {floors: integer, address: string}, description: A place.}\nname: tiny\n"
    )
    assert reordered.fingerprint == ontology.fingerprint
    changed = parse_ontology(GOOD.replace("Who issues it.", "Who issues the document."))
    assert changed.fingerprint != ontology.fingerprint


def test_property_checks() -> None:
    ontology = parse_ontology(GOOD)
    assert ontology.check_properties("Office", {"address": "1 Main St", "floors": 3, "unknown": "dropped"}) == {
        "address": "1 Main St",
        "floors": 3,
    }
    with pytest.raises(ValueError, match="'floors' of Office must be a integer"):
        ontology.check_properties("Office", {"floors": "3"})
    with pytest.raises(ValueError, match="'floors'"):
        ontology.check_properties("Office", {"floors": True})


def test_the_extraction_schema_bounds_the_answer() -> None:
    ontology = load_ontology(SAMPLE)
    schema = ontology.extraction_schema(max_entities=2, max_relations=1)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    good = {
        "entities": [{"name": "Separation Certificate", "type": "Document"}, {"name": "Labour Office", "type": "Office"}],
        "relations": [{"type": "ISSUED_BY", "from": "Separation Certificate", "to": "Labour Office"}],
    }
    assert not list(validator.iter_errors(good))
    assert list(validator.iter_errors({**good, "entities": good["entities"] * 2}))  # too many
    assert list(validator.iter_errors({"entities": [{"name": "X", "type": "Person"}], "relations": []}))  # not an enum value
    assert list(validator.iter_errors({"entities": [{"name": "x" * 81, "type": "Office"}], "relations": []}))
    assert list(validator.iter_errors({"entities": [], "relations": [{"type": "KNOWS", "from": "a", "to": "b"}]}))
    assert list(validator.iter_errors({"entities": []}))  # relations required when the ontology has some
    no_relations = Ontology.model_validate({"name": "flat", "entity_types": {"A": {}}})
    assert "relations" not in no_relations.extraction_schema()["properties"]


def test_normalised_names() -> None:
    assert normalise_name("  The  Labour Office. ") == normalise_name("the labour office") == "the labour office"
    assert normalise_name("«Ｓeparation Certificate»") == "separation certificate"  # NFKC, quotes
    assert normalise_name("St. Mary's Office") == "st. mary's office"  # inner punctuation kept
    assert normalise_name(" ... ") == ""
