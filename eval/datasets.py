"""Golden datasets: the JSON Lines case format, suites, and their hash.

A *case* is one line of a ``.jsonl`` file::

    {"id": "tides-1", "input": "What is the spring tidal range at Verrin Harbor?",
     "expected_facts": ["5.8 metres"], "expected_sources": ["01-harbor-tides.md"],
     "expected_tools": [], "expect_no_answer": false, "collection": null}

A *suite* is a directory ``eval/datasets/<suite>/`` holding ``suite.yaml`` (what the
suite is: its name, the graph it drives, the corpus it needs and the collection that
corpus goes into, a version) and ``cases.jsonl``. A suite is self-contained: it names
its corpus (one folder or file, or several), so ``eval run`` can ingest it into a
scratch collection when missing; a ``graphrag`` suite also names the ontology and the
curated facts (JSON Lines) its collection's knowledge graph is built from.

Everything wrong with a file is reported at once, each problem as
``file:line: field: message`` (``cases.jsonl:17: expected_tools.0.args: Input should
be a valid dictionary``), in one `DatasetError`.

`Suite.hash` identifies what a run was measured on: a sha256 over the canonical
bytes of the suite's description, its cases, its corpus files (sorted by path) and its
knowledge graph's ontology and facts files, so
that two runs can be compared only when they saw the same questions over the same
documents. It does not depend on the machine, the checkout path, key order or
whitespace in the files, or line endings of text files.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from knowledge.errors import OntologyError
from knowledge.ontology import load_ontology

__all__ = [
    "DATASETS_DIR",
    "Case",
    "DatasetError",
    "KnowledgeGraphConfig",
    "DatasetProblem",
    "ExpectedTool",
    "Suite",
    "SuiteConfig",
    "hash_dataset",
    "list_suites",
    "load_dataset",
    "load_suite",
]

DATASETS_DIR = Path(__file__).resolve().parent / "datasets"
"""Where the shipped suites live, one directory each."""

SUITE_FILE = "suite.yaml"
CASES_FILE = "cases.jsonl"
_SUITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Corpus files whose bytes are text: CRLF is folded to LF before hashing, so a checkout
# with Windows line endings hashes like one without.
_TEXT_SUFFIXES = frozenset({".md", ".markdown", ".txt", ".html", ".htm", ".jsonl", ".json", ".csv", ".yaml", ".yml"})


class ExpectedTool(BaseModel):
    """A tool call the graph is expected to make."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    """The tool's registered name, e.g. ``calculator``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """The arguments expected (a JSON object); empty when any arguments will do."""


class Case(BaseModel):
    """One golden case: a question and what a good answer to it has."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    """Unique within its file; how reports and paired comparisons name the case."""
    input: str
    """The user's message (non-empty)."""
    expected_facts: list[str] = Field(default_factory=list)
    """Short strings the answer must contain (compared after normalisation)."""
    expected_sources: list[str] = Field(default_factory=list)
    """Document ids (as ingestion names them) retrieval should find."""
    expected_tools: list[ExpectedTool] = Field(default_factory=list)
    """Tool calls the graph should make, in order."""
    expect_no_answer: StrictBool = False
    """True when nothing in the collection answers it: the graph should say so."""
    collection: str | None = None
    """The collection to ask; None means the suite's."""

    @field_validator("input")
    @classmethod
    def _input_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("expected_facts", "expected_sources")
    @classmethod
    def _no_blank_items(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("items must not be empty")
        return value

    @model_validator(mode="after")
    def _no_answer_has_no_sources(self) -> Case:
        if self.expect_no_answer and (self.expected_sources or self.expected_facts):
            raise ValueError("a case with expect_no_answer has no expected_sources or expected_facts")
        return self


class KnowledgeGraphConfig(BaseModel):
    """``knowledge_graph`` in ``suite.yaml``: how the suite's collection gets its graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ontology: str = Field(min_length=1)
    """The ontology file the collection's graph is bound to, relative to the suite's
    directory (or absolute)."""
    facts: str | None = Field(default=None, min_length=1)
    """Curated facts (``switchyard graph import``'s JSON Lines: entities and relations,
    each with the ``source`` document id) imported into the collection's graph after
    its corpus is ingested. None: the graph is left empty (answers from chunks only)."""


class SuiteConfig(BaseModel):
    """``suite.yaml``: what a suite is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    """The suite's name (shown in reports)."""
    graph: Literal["rag", "graphrag", "agent", "chat"]
    """The graph the cases run through."""
    description: str = ""
    """What the suite measures."""
    corpus: str | list[str] | None = None
    """Documents the cases need: a file or directory, or a list of them, relative to the
    suite's directory (or absolute). ``eval run`` ingests them into ``collection`` when
    that does not hold them; ids as ``switchyard ingest`` gives them, per folder."""
    collection: str | None = None
    """The collection the cases ask (a case's own ``collection`` wins)."""
    version: int = Field(default=1, ge=1)
    """Bumped when the cases change meaning; the hash changes with any edit anyway."""
    max_tokens: int | None = Field(default=None, ge=1)
    """The most tokens an answer may have in this suite's runs (sent as ``max_tokens`` with
    every case). The cases' answers are short; without a bound a small model that rambles
    to the backend's default limit makes a run many times longer and scores no better.
    None: the backend's default."""

    knowledge_graph: KnowledgeGraphConfig | None = None
    """The knowledge graph of the suite's collection (``graphrag`` suites): its ontology
    and curated facts, imported by ``eval run`` after the corpus."""

    @field_validator("corpus")
    @classmethod
    def _corpus_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (not value or any(not item.strip() for item in value)):
            raise ValueError("a corpus list names at least one path, none of them empty")
        return value

    @model_validator(mode="after")
    def _corpus_needs_collection(self) -> SuiteConfig:
        if self.corpus is not None and self.collection is None:
            raise ValueError("a suite with a corpus names the collection it goes into")
        if self.knowledge_graph is not None and self.corpus is None:
            raise ValueError("knowledge_graph: a suite with a knowledge graph has a corpus (facts name its documents)")
        return self

    @property
    def corpus_paths(self) -> list[str]:
        """``corpus`` as a list (empty when there is none)."""
        if self.corpus is None:
            return []
        return [self.corpus] if isinstance(self.corpus, str) else list(self.corpus)


@dataclass(frozen=True, slots=True)
class DatasetProblem:
    """One thing wrong with a dataset file."""

    file: str
    """The file, as it was named to the loader."""
    line: int | None
    """1-based line, when the problem has one."""
    field: str | None
    """Dotted path of the field (``expected_tools.0.args``), when it is about one."""
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class DatasetError(Exception):
    """A dataset or suite cannot be loaded; `problems` lists everything wrong with it."""

    def __init__(self, problems: Sequence[DatasetProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class Suite:
    """A loaded suite: its description, its cases and where its corpus is."""

    config: SuiteConfig
    directory: Path
    """The suite's directory."""
    cases: tuple[Case, ...]
    corpus: Path | None
    """The corpus resolved to a path (the first one, when the suite lists several), or
    None when the suite needs none."""
    hash: str
    """sha256 (hex) of the suite's canonical bytes; see the module docstring."""
    corpus_files: tuple[Path, ...] = field(default=())
    """The corpus files the hash covers, sorted by their path inside the corpus."""
    corpora: tuple[Path, ...] = field(default=())
    """Every corpus path, resolved, in the order ``suite.yaml`` lists them."""
    ontology: Path | None = None
    """The knowledge graph's ontology file, resolved (``knowledge_graph.ontology``)."""
    facts: Path | None = None
    """The knowledge graph's curated facts file, resolved (``knowledge_graph.facts``)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def graph(self) -> str:
        return self.config.graph

    def collection_for(self, case: Case) -> str | None:
        """The collection ``case`` asks: its own, else the suite's."""
        return case.collection or self.config.collection


def _field(loc: Iterable[int | str]) -> str | None:
    return ".".join(str(part) for part in loc) or None


def _parse_cases(text: str, file: str) -> tuple[list[Case], list[DatasetProblem]]:
    cases: list[Case] = []
    problems: list[DatasetProblem] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            problems.append(DatasetProblem(file, number, None, f"not valid JSON: {exc}"))
            continue
        if not isinstance(record, dict):
            problems.append(DatasetProblem(file, number, None, "a case must be a JSON object"))
            continue
        case_id = record.get("id")
        if isinstance(case_id, str) and case_id:
            if case_id in first_line:
                problems.append(DatasetProblem(file, number, "id", f"duplicate id {case_id!r} (first on line {first_line[case_id]})"))
            else:
                first_line[case_id] = number
        try:
            cases.append(Case.model_validate(record))
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                problems.append(DatasetProblem(file, number, _field(error["loc"]), error["msg"]))
    if not cases and not problems:
        problems.append(DatasetProblem(file, None, None, "no cases in it"))
    return cases, problems


def _read(path: Path, file: str) -> tuple[str | None, DatasetProblem | None]:
    try:
        return path.read_bytes().decode("utf-8-sig"), None
    except OSError as exc:
        return None, DatasetProblem(file, None, None, f"cannot read: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        return None, DatasetProblem(file, None, None, f"not UTF-8 text (byte {exc.start}: {exc.reason})")


def load_dataset(file: str | Path) -> list[Case]:
    """The cases of one JSON Lines file, in file order (blank lines are skipped).

    Raises:
        DatasetError: the file cannot be read, or some lines are not valid cases
            (every bad line and field is listed, as ``file:line: field: message``).
    """
    name = str(file)
    text, problem = _read(Path(file), name)
    if problem is not None:
        raise DatasetError([problem])
    assert text is not None
    cases, problems = _parse_cases(text, name)
    if problems:
        raise DatasetError(problems)
    return cases


def _key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line in a YAML mapping (for error messages)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


def _parse_config(text: str, file: str) -> tuple[SuiteConfig | None, list[DatasetProblem]]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return None, [DatasetProblem(file, mark.line + 1 if mark else None, None, f"not valid YAML: {exc}")]
    if not isinstance(data, dict):
        return None, [DatasetProblem(file, None, None, "must be a YAML mapping")]
    try:
        return SuiteConfig.model_validate(data), []
    except ValidationError as exc:
        lines = _key_lines(text)
        problems = []
        for error in exc.errors(include_url=False):
            loc = error["loc"]
            line = lines.get(str(loc[0])) if loc else None
            problems.append(DatasetProblem(file, line, _field(loc), error["msg"]))
        return None, problems


def _corpus_files(corpus: Path) -> list[tuple[str, Path]]:
    """``(path inside the corpus, file)`` for every non-hidden file, sorted by that path."""
    if corpus.is_file():
        return [(corpus.name, corpus)]
    found = []
    for path in corpus.rglob("*"):
        relative = path.relative_to(corpus)
        # Like ingestion: hidden files and folders, and symbolic links, are not read.
        if any(part.startswith(".") for part in relative.parts) or path.is_symlink() or not path.is_file():
            continue
        found.append((relative.as_posix(), path))
    return sorted(found)


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _hash(
    config: SuiteConfig | None,
    cases: Sequence[Case],
    corpus: Sequence[tuple[str, Path]],
    graph_files: Sequence[tuple[str, Path]] = (),
) -> str:
    # Each part is framed (a label, its length, its bytes), so moving bytes from one
    # part to the next cannot give the same digest.
    digest = hashlib.sha256()

    def part(label: str, data: bytes) -> None:
        head = label.encode()
        digest.update(len(head).to_bytes(8, "big") + head + len(data).to_bytes(8, "big"))
        digest.update(data)

    if config is not None:
        described = config.model_dump(mode="json")
        for key in ("max_tokens", "knowledge_graph"):  # added later: unset keeps older hashes
            if described.get(key) is None:
                described.pop(key, None)
        part(SUITE_FILE, _canonical_json(described))
    part(CASES_FILE, b"\n".join(_canonical_json(case.model_dump(mode="json")) for case in cases))
    for relative, path in corpus:
        data = path.read_bytes()
        if path.suffix.lower() in _TEXT_SUFFIXES:
            data = data.replace(b"\r\n", b"\n")
        part(f"corpus/{relative}", data)
    for label, path in graph_files:
        part(label, path.read_bytes().replace(b"\r\n", b"\n"))
    return digest.hexdigest()


def hash_dataset(cases: Sequence[Case]) -> str:
    """The hash of a bare dataset (``eval run --dataset FILE``): its cases only, computed
    the way `Suite.hash` computes their part."""
    return _hash(None, cases, [])


def list_suites() -> list[str]:
    """Names of the shipped suites (directories of `DATASETS_DIR` with a suite.yaml)."""
    if not DATASETS_DIR.is_dir():
        return []
    return sorted(path.name for path in DATASETS_DIR.iterdir() if (path / SUITE_FILE).is_file())


def load_suite(name_or_path: str | Path, *, root: Path | None = None) -> Suite:
    """A suite by name (a directory of ``eval/datasets/``) or by path (its directory, or
    its ``suite.yaml``).

    Args:
        name_or_path: a shipped suite's name (``rag``), or ``path/to/suite``, or
            ``path/to/suite/suite.yaml``.
        root: what a relative ``corpus`` is resolved against; by default the suite's
            own directory (the shipped suites say ``corpus: ../corpus``), so a suite and
            its corpus can be copied anywhere together.

    Raises:
        DatasetError: no such suite, or its files are invalid (all problems listed),
            or its corpus does not exist.
    """
    given = Path(name_or_path)
    # A bare name is a shipped suite, whatever the working directory holds.
    if isinstance(name_or_path, str) and _SUITE_NAME.match(name_or_path) and (DATASETS_DIR / name_or_path / SUITE_FILE).is_file():
        directory = DATASETS_DIR / name_or_path
    elif given.is_file() and given.name == SUITE_FILE:
        directory = given.parent
    elif given.is_dir():
        directory = given
    else:
        known = ", ".join(list_suites()) or "none"
        raise DatasetError([DatasetProblem(str(name_or_path), None, None, f"no such suite (shipped suites: {known})")])

    config_file, cases_file = directory / SUITE_FILE, directory / CASES_FILE
    problems: list[DatasetProblem] = []
    config: SuiteConfig | None = None
    cases: list[Case] = []
    config_text, problem = _read(config_file, str(config_file))
    if problem is not None:
        problems.append(problem)
    else:
        assert config_text is not None
        config, found = _parse_config(config_text, str(config_file))
        problems += found
    cases_text, problem = _read(cases_file, str(cases_file))
    if problem is not None:
        problems.append(problem)
    else:
        assert cases_text is not None
        cases, found = _parse_cases(cases_text, str(cases_file))
        problems += found

    corpora: list[Path] = []
    files: list[tuple[str, Path]] = []
    graph_files: list[tuple[str, Path]] = []
    ontology: Path | None = None
    facts: Path | None = None
    if config is not None:
        lines = _key_lines(config_text or "")
        for number, relative in enumerate(config.corpus_paths):
            path = (root or directory) / relative
            corpora.append(path)
            if not path.exists():
                problems.append(DatasetProblem(str(config_file), lines.get("corpus"), "corpus", f"no such file or directory: {path}"))
                continue
            found = _corpus_files(path)
            if not found:
                problems.append(DatasetProblem(str(config_file), lines.get("corpus"), "corpus", f"no files in {path}"))
            # The first corpus keeps the labels a one-corpus suite always had (its hash
            # does not change); the others are numbered so equal paths cannot collide.
            prefix = "" if number == 0 else f"{number}:"
            files += [(prefix + name, file) for name, file in found]
        if config.knowledge_graph is not None:
            ontology, facts, found_problems = _graph_files(config.knowledge_graph, root or directory, str(config_file), lines)
            problems += found_problems
            graph_files = [("graph/ontology", ontology)] + ([("graph/facts", facts)] if facts is not None else [])
    if problems:
        raise DatasetError(problems)
    assert config is not None
    return Suite(
        config=config,
        directory=directory,
        cases=tuple(cases),
        corpus=corpora[0] if corpora else None,
        hash=_hash(config, cases, files, graph_files),
        corpus_files=tuple(path for _, path in files),
        corpora=tuple(corpora),
        ontology=ontology,
        facts=facts,
    )


def _graph_files(
    graph: KnowledgeGraphConfig, base: Path, file: str, lines: dict[str, int]
) -> tuple[Path, Path | None, list[DatasetProblem]]:
    """The knowledge graph's ontology and facts files, resolved; problems: a file that
    does not exist, an ontology that does not load (its error names the field)."""
    line = lines.get("knowledge_graph")
    problems = []
    ontology = base / graph.ontology
    if not ontology.is_file():
        problems.append(DatasetProblem(file, line, "knowledge_graph.ontology", f"no such file: {ontology}"))
    else:
        try:
            load_ontology(ontology)
        except OntologyError as exc:
            problems.append(DatasetProblem(file, line, "knowledge_graph.ontology", str(exc)))
    facts = base / graph.facts if graph.facts is not None else None
    if facts is not None and not facts.is_file():
        problems.append(DatasetProblem(file, line, "knowledge_graph.facts", f"no such file: {facts}"))
    return ontology, facts, problems
