"""Reading an ontology file (YAML or JSON) into an `Ontology`, with errors naming the
file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from knowledge.errors import OntologyError
from knowledge.ontology.schema import Ontology

__all__ = ["load_ontology", "parse_ontology"]

MAX_FILE_BYTES = 1_000_000


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_ontology(text: str, *, source: str = "<ontology>") -> Ontology:
    """An ontology from YAML (or JSON) text.

    Raises:
        OntologyError: not YAML, not a mapping, or a field that does not validate;
            the message names ``source`` and the field.
    """
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise OntologyError(f"{source}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}", source=source) from None
    if not isinstance(data, dict):
        raise OntologyError(f"{source}: an ontology is a mapping with name, entity_types and relation_types", source=source)
    try:
        return Ontology.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_field(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise OntologyError(f"{source}: " + "; ".join(problems), source=source, problems=problems) from None


def load_ontology(path: Path | str) -> Ontology:
    """The ontology in the file ``path``.

    Raises:
        OntologyError: the file cannot be read, or its content does not validate.
    """
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise OntologyError(f"{path}: larger than {MAX_FILE_BYTES} bytes", source=str(path))
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OntologyError(f"{path}: cannot read the ontology ({exc.strerror or exc})", source=str(path)) from None
    except UnicodeDecodeError:
        raise OntologyError(f"{path}: not UTF-8 text", source=str(path)) from None
    return parse_ontology(text, source=str(path))
