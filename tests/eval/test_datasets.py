"""The golden datasets: the shipped suites are valid and honest about the corpus, the
hash is stable and sensitive, and a malformed file names every problem as
``file:line: field: message``. Pure Python: no servers, no model, no embedder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from eval.datasets import (
    DATASETS_DIR,
    Case,
    DatasetError,
    hash_dataset,
    list_suites,
    load_dataset,
    load_suite,
)
from knowledge.ingestion.loaders import discover, load_file
from tools.builtin import calculator, current_time
from tools.builtin.calculator import evaluate
from tools.builtin.search import SearchArgs

SHIPPED = ["agent", "chat", "rag"]
"""The large bilingual suites (the graphrag suite, smaller and English only, has its own tests)."""
CJK = re.compile(r"[\u4e00-\u9fff]")
# The argument schemas of the tools the agent suite expects (knowledge_search is built
# over a knowledge base, so its schema is taken directly).
TOOL_ARGS = {calculator.name: calculator.args_schema, current_time.name: current_time.args_schema, "knowledge_search": SearchArgs}


def corpus_documents(corpus: Path) -> dict[str, str]:
    """Doc id -> text, exactly as ingestion names and reads them."""
    documents: dict[str, str] = {}
    for found in discover([corpus]):
        assert not isinstance(found, Exception), found
        path, doc_id, _ = found
        loaded = load_file(path, doc_id)
        assert not loaded.errors, loaded.errors
        for document in loaded.documents:
            documents[document.id] = document.text
    return documents


# --- the shipped suites -------------------------------------------------------------


def test_the_shipped_suites_are_listed() -> None:
    assert list_suites() == ["agent", "chat", "graphrag", "rag"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_suite_loads_with_enough_cases_in_both_languages(name: str) -> None:
    suite = load_suite(name)
    assert suite.name == name
    assert suite.graph == name
    assert suite.directory == DATASETS_DIR / name
    assert len(suite.cases) >= 40
    chinese = [case for case in suite.cases if CJK.search(case.input)]
    english = [case for case in suite.cases if not CJK.search(case.input)]
    assert len(chinese) >= 10, f"{name}: {len(chinese)} Chinese cases"
    assert len(english) >= 10, f"{name}: {len(english)} English cases"
    assert len({case.id for case in suite.cases}) == len(suite.cases)


def test_the_rag_suite_matches_its_corpus() -> None:
    suite = load_suite("rag")
    assert suite.corpus is not None and suite.corpus.resolve() == Path(__file__).resolve().parents[2] / "eval" / "datasets" / "corpus"
    documents = corpus_documents(suite.corpus)
    assert "faq-003" in documents and "01-harbor-tides.md" in documents
    for case in suite.cases:
        assert suite.collection_for(case) == "eval-sample-corpus"
        if case.expect_no_answer:
            continue
        assert case.expected_sources and case.expected_facts, case.id
        for source in case.expected_sources:
            assert source in documents, f"{case.id}: {source} is not a document of the corpus"
        # Every fact is quoted from the document that answers it.
        text = "\n".join(documents[source] for source in case.expected_sources)
        for fact in case.expected_facts:
            assert fact in text, f"{case.id}: {fact!r} is not in {case.expected_sources}"


def test_the_rag_suite_has_unanswerable_cases_in_both_languages() -> None:
    unanswerable = [case for case in load_suite("rag").cases if case.expect_no_answer]
    assert len([case for case in unanswerable if CJK.search(case.input)]) >= 3
    assert len([case for case in unanswerable if not CJK.search(case.input)]) >= 3


def test_the_rag_suite_covers_every_document() -> None:
    suite = load_suite("rag")
    assert suite.corpus is not None
    cited = {source for case in suite.cases for source in case.expected_sources}
    assert cited == set(corpus_documents(suite.corpus))


def test_the_agent_suite_calls_real_tools_with_valid_arguments() -> None:
    suite = load_suite("agent")
    assert suite.corpus is not None
    documents = corpus_documents(suite.corpus)
    used: dict[str, int] = {}
    no_tool = 0
    for case in suite.cases:
        if not case.expected_tools:
            no_tool += 1
        for call in case.expected_tools:
            assert call.name in TOOL_ARGS, f"{case.id}: unknown tool {call.name}"
            used[call.name] = used.get(call.name, 0) + 1
            if call.args:
                TOOL_ARGS[call.name].model_validate(call.args)
        names = [call.name for call in case.expected_tools]
        if names == ["calculator"]:
            # The expected fact is what the calculator itself answers, rounded the way a
            # person would write it.
            value = evaluate(case.expected_tools[0].args["expression"])
            assert case.expected_facts == [str(round(value, 12)).removesuffix(".0") if isinstance(value, float) else str(value)], case.id
        if names == ["current_time"]:
            assert case.expected_facts == [], f"{case.id}: the time changes, so no facts"
        if names == ["knowledge_search"]:
            assert case.expected_sources, case.id
            text = "\n".join(documents[source] for source in case.expected_sources)
            assert all(fact in text for fact in case.expected_facts), case.id
    assert used.get("calculator", 0) >= 10
    assert used.get("current_time", 0) >= 5
    assert used.get("knowledge_search", 0) >= 10
    assert no_tool >= 5


def test_the_chat_suite_expects_short_facts_and_no_tools_or_sources() -> None:
    for case in load_suite("chat").cases:
        assert case.expected_facts, case.id
        assert all(len(fact) <= 40 for fact in case.expected_facts), case.id
        assert not case.expected_tools and not case.expected_sources and not case.expect_no_answer


# --- the hash -----------------------------------------------------------------------


def copy_suite(tmp_path: Path, name: str = "rag") -> tuple[Path, Path]:
    """A copy of a shipped suite and of its corpus under ``tmp_path`` (its own root)."""
    root = tmp_path / "checkout"
    shutil.copytree(DATASETS_DIR / name, root / "suites" / name)
    source = load_suite(name)
    if source.corpus is not None:
        shutil.copytree(source.corpus, root / "suites" / "corpus")
    return root, root / "suites" / name


def test_the_hash_is_stable_across_loads_and_checkouts(tmp_path: Path) -> None:
    shipped = load_suite("rag")
    assert load_suite("rag").hash == shipped.hash
    assert re.fullmatch(r"[0-9a-f]{64}", shipped.hash)
    # Another checkout in another place, with Windows line endings in a corpus file and
    # the cases rewritten with other whitespace and key order: the same suite.
    root, directory = copy_suite(tmp_path)
    notes = root / "suites" / "corpus" / "21-notes.txt"
    notes.write_bytes(notes.read_bytes().replace(b"\n", b"\r\n"))
    cases = directory / "cases.jsonl"
    lines = [json.loads(line) for line in cases.read_text(encoding="utf-8").splitlines()]
    cases.write_text("\n\n".join(json.dumps(dict(reversed(list(r.items()))), indent=None, separators=(", ", " : ")) for r in lines), encoding="utf-8")
    assert load_suite(directory).hash == shipped.hash
    assert load_suite(directory / "suite.yaml").hash == shipped.hash


def test_the_hash_has_a_known_value_for_known_bytes(tmp_path: Path) -> None:
    # Pins the algorithm documented in docs/eval.md (values checked by recomputing the
    # framed parts by hand): a change to it changes every stored baseline's hash, and
    # must be deliberate.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nAlpha.\n", encoding="utf-8")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "suite.yaml").write_text("name: tiny\ngraph: rag\ncorpus: docs\ncollection: tiny\n", encoding="utf-8")
    (tmp_path / "suite" / "cases.jsonl").write_text('{"id": "1", "input": "What is A?", "expected_facts": ["Alpha"], "expected_sources": ["a.md"]}\n', encoding="utf-8")
    suite = load_suite(tmp_path / "suite", root=tmp_path)
    assert suite.hash == "a5c43e85381e32434ef396d438fe80424c5404989c502fc84adcf07ec39fa300"
    assert hash_dataset(suite.cases) == "79b95e1a3ff225b6df4d1715bab177e4d390af7c72cbb4e876ed074c948ed0d6"


@pytest.mark.parametrize(
    "edit",
    ["a case's facts", "a new case", "the order of cases", "suite.yaml", "a corpus file", "a new corpus file"],
)
def test_the_hash_changes_when_the_suite_changes(tmp_path: Path, edit: str) -> None:
    root, directory = copy_suite(tmp_path)
    before = load_suite(directory).hash
    cases = directory / "cases.jsonl"
    lines = cases.read_text(encoding="utf-8").splitlines()
    corpus = root / "suites" / "corpus"
    if edit == "a case's facts":
        record = json.loads(lines[0])
        record["expected_facts"] = [*record["expected_facts"], "metres"]
        lines[0] = json.dumps(record)
        cases.write_text("\n".join(lines), encoding="utf-8")
    elif edit == "a new case":
        cases.write_text("\n".join([*lines, '{"id": "extra", "input": "Anything else?", "expect_no_answer": true}']), encoding="utf-8")
    elif edit == "the order of cases":
        cases.write_text("\n".join([lines[1], lines[0], *lines[2:]]), encoding="utf-8")
    elif edit == "suite.yaml":
        config = directory / "suite.yaml"
        config.write_text(config.read_text(encoding="utf-8").replace("version: 1", "version: 2"), encoding="utf-8")
    elif edit == "a corpus file":
        path = corpus / "docs.jsonl"
        path.write_text(path.read_text(encoding="utf-8").replace("9间客房", "10间客房"), encoding="utf-8")
    else:
        (corpus / "23-new.md").write_text("# New\n\nA new document.\n", encoding="utf-8")
    assert load_suite(directory).hash != before


# --- malformed files ----------------------------------------------------------------


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def problems(error: pytest.ExceptionInfo[DatasetError]) -> list[str]:
    assert str(error.value) == "\n".join(str(problem) for problem in error.value.problems)
    return [str(problem) for problem in error.value.problems]


def test_a_valid_dataset_loads_with_defaults(tmp_path: Path) -> None:
    file = write(tmp_path / "cases.jsonl", '{"id": "a", "input": "Hi"}', "", '{"id": "b", "input": "现在几点？", "expected_tools": [{"name": "current_time"}]}')
    first, second = load_dataset(file)
    assert first == Case(id="a", input="Hi")
    assert (first.expected_facts, first.expected_sources, first.expected_tools, first.expect_no_answer, first.collection) == ([], [], [], False, None)
    assert second.expected_tools[0].name == "current_time" and second.expected_tools[0].args == {}


def test_every_problem_in_a_file_is_named_by_file_line_and_field(tmp_path: Path) -> None:
    file = write(
        tmp_path / "cases.jsonl",
        '{"id": "ok", "input": "Fine"}',
        '{"id": "broken", "input": "no closing brace"',
        '{"id": "no-input"}',
        '{"id": "tools", "input": "2+2?", "expected_tools": [{"name": "calculator", "args": ["2+2"]}]}',
        '{"id": "ok", "input": "Again"}',
        '{"id": "extra", "input": "Hm", "expected_answer": "x"}',
        '{"id": "blank", "input": "   "}',
        '{"id": "flag", "input": "?", "expect_no_answer": "yes"}',
        '["not", "an", "object"]',
    )
    with pytest.raises(DatasetError) as error:
        load_dataset(file)
    name = str(file)
    found = problems(error)
    assert found[0].startswith(f"{name}:2: not valid JSON: ")
    assert found[1:] == [
        f"{name}:3: input: Field required",
        f"{name}:4: expected_tools.0.args: Input should be a valid dictionary",
        f"{name}:5: id: duplicate id 'ok' (first on line 1)",
        f"{name}:6: expected_answer: Extra inputs are not permitted",
        f"{name}:7: input: Value error, must not be empty",
        f"{name}:8: expect_no_answer: Input should be a valid boolean",
        f"{name}:9: a case must be a JSON object",
    ]
    assert [(p.line, p.field) for p in error.value.problems][1:3] == [(3, "input"), (4, "expected_tools.0.args")]


def test_a_case_cannot_expect_no_answer_and_sources(tmp_path: Path) -> None:
    file = write(tmp_path / "c.jsonl", '{"id": "x", "input": "Q", "expect_no_answer": true, "expected_sources": ["a.md"]}')
    with pytest.raises(DatasetError) as error:
        load_dataset(file)
    assert problems(error) == [f"{file}:1: Value error, a case with expect_no_answer has no expected_sources or expected_facts"]


def test_an_empty_or_missing_dataset_is_an_error(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.jsonl", "", "  ")
    with pytest.raises(DatasetError) as error:
        load_dataset(empty)
    assert problems(error) == [f"{empty}: no cases in it"]
    with pytest.raises(DatasetError) as error:
        load_dataset(tmp_path / "missing.jsonl")
    assert problems(error)[0].startswith(f"{tmp_path / 'missing.jsonl'}: cannot read: ")


def test_a_bad_suite_names_its_problems_in_both_files(tmp_path: Path) -> None:
    directory = tmp_path / "mine"
    directory.mkdir()
    write(directory / "suite.yaml", "name: mine", "graph: graphql", "corpus: nowhere", "collection: c", "owner: me")
    write(directory / "cases.jsonl", '{"id": "a", "input": "Q", "collection": 3}')
    with pytest.raises(DatasetError) as error:
        load_suite(directory, root=tmp_path)
    config, cases = directory / "suite.yaml", directory / "cases.jsonl"
    assert problems(error) == [
        f"{config}:2: graph: Input should be 'rag', 'graphrag', 'agent' or 'chat'",
        f"{config}:5: owner: Extra inputs are not permitted",
        f"{cases}:1: collection: Input should be a valid string",
    ]


def test_a_suite_whose_corpus_is_missing_is_an_error(tmp_path: Path) -> None:
    directory = tmp_path / "mine"
    directory.mkdir()
    write(directory / "suite.yaml", "name: mine", "graph: rag", "collection: c", "corpus: docs/missing")
    write(directory / "cases.jsonl", '{"id": "a", "input": "Q"}')
    with pytest.raises(DatasetError) as error:
        load_suite(directory, root=tmp_path)
    assert problems(error) == [f"{directory / 'suite.yaml'}:4: corpus: no such file or directory: {tmp_path / 'docs' / 'missing'}"]


def test_an_unknown_suite_names_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as error:
        load_suite("nonesuch")
    assert problems(error) == ["nonesuch: no such suite (shipped suites: agent, chat, graphrag, rag)"]


def test_a_bare_name_is_the_shipped_suite_whatever_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rag").mkdir()
    write(tmp_path / "rag" / "suite.yaml", "name: other", "graph: chat")
    write(tmp_path / "rag" / "cases.jsonl", '{"id": "a", "input": "Q"}')
    monkeypatch.chdir(tmp_path)
    assert load_suite("rag").directory == DATASETS_DIR / "rag"
    assert load_suite("./rag").name == "other"
