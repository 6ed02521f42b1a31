"""The ``graphrag`` golden set: two-hop questions over the sample corpus extended with
the city-services documents, with the curated facts the collection's knowledge graph
is built from. Checks that the suite is honest (each case needs two documents, the
second one not named in the question, the facts quoted from it, the curated facts
valid under the ontology) and that the suite format's new parts (a list of corpora, a
knowledge graph) load, hash and fail as the rest of the format does. No services."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eval.datasets import DATASETS_DIR, DatasetError, load_suite
from knowledge.extraction.curated import parse_curated
from knowledge.ontology import load_ontology, normalise_name
from serving.eval_runner import corpus_documents

REPO = Path(__file__).resolve().parents[2]
CORPUS = DATASETS_DIR / "graphrag-corpus"


def documents() -> dict[str, str]:
    suite = load_suite("graphrag")
    found: dict[str, str] = {}
    for item in corpus_documents(suite):
        assert not isinstance(item, Exception), item
        found[item.id] = item.text
    return found


def curated_lines() -> list[dict[str, object]]:
    return [json.loads(line) for line in (CORPUS / "facts.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_suite_loads_with_both_corpora_and_its_graph() -> None:
    suite = load_suite("graphrag")
    assert suite.graph == "graphrag"
    assert [p.resolve() for p in suite.corpora] == [DATASETS_DIR / "corpus", CORPUS / "documents"]
    assert suite.corpus is not None and suite.corpus.resolve() == DATASETS_DIR / "corpus"
    assert suite.ontology is not None and suite.ontology.resolve() == CORPUS / "ontology.yaml"
    assert suite.facts is not None and suite.facts.resolve() == CORPUS / "facts.jsonl"
    answerable = [case for case in suite.cases if not case.expect_no_answer]
    assert len(answerable) >= 12 and len(suite.cases) - len(answerable) >= 2
    docs = documents()
    # The sample corpus and the new documents are one collection.
    assert "01-harbor-tides.md" in docs and "31-unemployment-benefit.md" in docs and "faq-003" in docs


def test_the_ontology_is_the_sample_ontology() -> None:
    shipped = load_ontology(CORPUS / "ontology.yaml")
    assert shipped.fingerprint == load_ontology(REPO / "config" / "ontologies" / "city-services.yaml").fingerprint


def test_every_case_needs_two_documents_and_quotes_the_second() -> None:
    suite = load_suite("graphrag")
    docs = documents()
    names_by_doc: dict[str, set[str]] = {}
    for line in curated_lines():
        if line["kind"] == "entity":
            keys = {normalise_name(str(line["name"])), *(normalise_name(str(a)) for a in line.get("aliases", []))}  # type: ignore[union-attr]
            names_by_doc.setdefault(str(line["source"]), set()).update(keys)
    for case in suite.cases:
        if case.expect_no_answer:
            continue
        assert len(case.expected_sources) == 2, case.id
        first, second = case.expected_sources
        assert first in docs and second in docs, case.id
        for fact in case.expected_facts:
            assert fact in docs[second], f"{case.id}: {fact!r} is not in {second}"
        # The question names the first document's subject, never the second's: only a
        # relation leads there.
        question = normalise_name(case.input)
        first_names = {n for n in names_by_doc[first] if n in question}
        assert first_names, f"{case.id}: names nothing of {first}"
        only_second = names_by_doc[second] - names_by_doc[first]
        assert not [n for n in only_second if n in question], f"{case.id}: names {second}'s entities"


def test_the_curated_facts_are_valid_and_cover_every_new_document() -> None:
    ontology = load_ontology(CORPUS / "ontology.yaml")
    text = (CORPUS / "facts.jsonl").read_text(encoding="utf-8")
    parsed = parse_curated(text.splitlines(), ontology)
    assert parsed.problems == []
    assert len(parsed.entities) + len(parsed.relations) == len(curated_lines())
    docs = documents()
    new = {doc_id for doc_id in docs if doc_id[:2] in {str(n) for n in range(31, 45)}}
    sources = {str(line["source"]) for line in curated_lines()}
    assert sources == new
    for line in curated_lines():
        # Facts link to the chunks of their document that name them.
        names = [line["name"]] if line["kind"] == "entity" else [line["from"], line["to"]]
        for name in names:
            assert str(name) in docs[str(line["source"])], f"{name} is not named in {line['source']}"


def copy_suite(tmp_path: Path) -> Path:
    directory = tmp_path / "graphrag"
    shutil.copytree(DATASETS_DIR / "graphrag", directory)
    shutil.copytree(CORPUS, tmp_path / "graphrag-corpus")
    shutil.copytree(DATASETS_DIR / "corpus", tmp_path / "corpus")
    return directory


def test_the_hash_covers_the_facts_and_the_ontology(tmp_path: Path) -> None:
    directory = copy_suite(tmp_path)
    before = load_suite(directory)
    assert before.hash == load_suite("graphrag").hash
    facts = tmp_path / "graphrag-corpus" / "facts.jsonl"
    facts.write_text(facts.read_text(encoding="utf-8").replace("12 Tallow Lane", "13 Tallow Lane"), encoding="utf-8")
    changed = load_suite(directory).hash
    assert changed != before.hash
    ontology = tmp_path / "graphrag-corpus" / "ontology.yaml"
    ontology.write_text(ontology.read_text(encoding="utf-8") + "\n# a comment changes the bytes\n", encoding="utf-8")
    assert load_suite(directory).hash not in {before.hash, changed}
    # A document of the second corpus is part of the hash too.
    doc = tmp_path / "graphrag-corpus" / "documents" / "33-resident-card.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert load_suite(directory).hash != before.hash


def test_a_bad_knowledge_graph_section_names_the_field(tmp_path: Path) -> None:
    directory = copy_suite(tmp_path)
    config = directory / "suite.yaml"
    text = config.read_text(encoding="utf-8")
    (tmp_path / "graphrag-corpus" / "bad.yaml").write_text("name: bad\nentity_types: {}\n", encoding="utf-8")
    config.write_text(
        text.replace("ontology: ../graphrag-corpus/ontology.yaml", "ontology: ../graphrag-corpus/bad.yaml").replace(
            "facts: ../graphrag-corpus/facts.jsonl", "facts: ../graphrag-corpus/missing.jsonl"
        ),
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as error:
        load_suite(directory)
    found = [(p.field, p.message) for p in error.value.problems]
    assert [field for field, _ in found] == ["knowledge_graph.ontology", "knowledge_graph.facts"]
    assert "bad.yaml" in found[0][1] and "missing.jsonl" in found[1][1]
    line = next(n for n, l in enumerate(text.splitlines(), start=1) if l.startswith("knowledge_graph:"))
    assert all(p.line == line for p in error.value.problems)


@pytest.mark.parametrize(
    ("corpus", "message"),
    [
        ("[]", "a corpus list names at least one path"),
        ("[../corpus, ../nowhere]", "no such file or directory"),
    ],
)
def test_a_bad_corpus_list_is_an_error(tmp_path: Path, corpus: str, message: str) -> None:
    directory = copy_suite(tmp_path)
    config = directory / "suite.yaml"
    config.write_text(
        config.read_text(encoding="utf-8").replace("corpus: [../corpus, ../graphrag-corpus/documents]", f"corpus: {corpus}"),
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as error:
        load_suite(directory)
    assert any(p.field == "corpus" and message in p.message for p in error.value.problems), error.value


def test_a_knowledge_graph_needs_a_corpus(tmp_path: Path) -> None:
    directory = copy_suite(tmp_path)
    config = directory / "suite.yaml"
    lines = [l for l in config.read_text(encoding="utf-8").splitlines() if not l.startswith(("corpus:", "collection:"))]
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="a suite with a knowledge graph has a corpus"):
        load_suite(directory)
