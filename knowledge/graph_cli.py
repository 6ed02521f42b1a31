"""``switchyard ontology validate|schema`` and ``switchyard graph import|neighbors|stats``.

Mounted by ``serving/cli.py`` with ``ingest --graph`` and ``search --graph``
(``knowledge/cli.py``). Like those, the graph commands work on the data directory's
stores when no server holds them, and through that server's HTTP API
(``/v1/collections/{name}/graph/...``) when one does.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from knowledge._client import check, headers, segment
from knowledge.errors import KnowledgeError
from knowledge.extraction.extractor import extraction_schema
from knowledge.graphstore.base import Entity, Fact
from knowledge.ontology import Ontology, load_ontology
from knowledge.vectorstore.base import valid_collection_name

__all__ = ["fact_json", "graph_app", "graph_stats_json", "neighbors_json", "ontology_app", "print_graph_report", "read_ontology", "through"]

ontology_app = typer.Typer(help="Check ontology files (the types a knowledge graph may hold).", no_args_is_help=True)
graph_app = typer.Typer(help="A collection's knowledge graph: import curated facts, look around an entity.", no_args_is_help=True)

CollectionOption = Annotated[str, typer.Option("--collection", "-c", help="The collection whose graph to use.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
OntologyOption = Annotated[
    Path | None,
    typer.Option(
        "--ontology",
        help="An ontology YAML file: binds the collection's graph to it the first time (a different one later is refused).",
    ),
]


def read_ontology(path: Path | None) -> tuple[Ontology | None, str | None]:
    """The ontology in ``path`` and its text (what is sent to a server), or (None, None).

    Raises:
        OntologyError: the file cannot be read or does not validate.
    """
    if path is None:
        return None, None
    ontology = load_ontology(path)
    return ontology, path.read_text(encoding="utf-8")


def _entity_json(entity: Entity) -> dict[str, Any]:
    return {
        "id": entity.id,
        "type": entity.type,
        "name": entity.name,
        "aliases": list(entity.aliases),
        "description": entity.description,
        "properties": dict(entity.properties),
    }


def fact_json(fact: Fact) -> dict[str, Any]:
    """A fact as the CLI and the HTTP API show it (``doc_id``: its first source document)."""
    doc_ids = list(fact.doc_ids)
    return {
        "kind": "fact",
        "text": fact.text(),
        "subject": fact.source.name,
        "subject_type": fact.source.type,
        "relation": fact.relation,
        "object": fact.target.name,
        "object_type": fact.target.type,
        "hops": fact.hops,
        "doc_id": doc_ids[0] if doc_ids else None,
        "doc_ids": doc_ids,
        "chunk_ids": list(fact.chunk_ids),
    }


def neighbors_json(result: Any) -> dict[str, Any]:
    """`NeighborsResult` as JSON."""
    return {
        "collection": result.collection,
        "matched": [_entity_json(e) for e in result.matched],
        "facts": [fact_json(f) for f in result.facts],
    }


async def through(url: str, method: str, path: str, *, timeout: float = 120, **kwargs: Any) -> Any:
    """One request to the server at ``url``; its answer's JSON (errors as `KnowledgeError`)."""
    async with httpx.AsyncClient(base_url=url, headers=headers(), timeout=timeout) as client:
        return check(await client.request(method, path, **kwargs), url)


@ontology_app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="The ontology YAML file.")],
    as_json: JsonOption = False,
) -> None:
    """Check an ontology file; a bad file fails naming the field (exit status 1)."""
    ontology = load_ontology(file)
    summary = {
        "file": str(file),
        "name": ontology.name,
        "fingerprint": ontology.fingerprint,
        "entity_types": sorted(ontology.entity_types),
        "relation_types": sorted(ontology.relation_types),
    }
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"{file}: ontology {ontology.describe()} is valid: {len(ontology.entity_types)} entity types "
        f"({', '.join(summary['entity_types'])}), {len(ontology.relation_types)} relation types "
        f"({', '.join(summary['relation_types']) or 'none'})"
    )


@ontology_app.command("schema")
def schema(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="The ontology YAML file.")],
) -> None:
    """Print the JSON schema extraction asks the model to follow for this ontology
    (with ``knowledge.graph.extraction``'s limits)."""
    ontology = load_ontology(file)
    typer.echo(json.dumps(extraction_schema(ontology, ctx.obj.knowledge_settings().graph.extraction), indent=2))


def print_graph_report(report: dict[str, Any], *, file: Any = None) -> None:
    """A `GraphReport` (as JSON) in a few lines."""
    out = file or sys.stdout
    entities = sum(report.get("entities", {}).values())
    relations = sum(report.get("relations", {}).values())
    invalid = report.get("invalid", {})
    typer.echo(
        f"graph of {report['collection']} (ontology {report.get('ontology')}): {report.get('documents', 0)} documents, "
        f"{report.get('chunks', 0)} chunks, {entities} entities, {relations} relations written; "
        f"{sum(invalid.values())} invalid items dropped, {report.get('failed_chunks', 0)} chunks failed"
        + (f", facts of {report['removed']} deleted documents removed" if report.get("removed") else "")
        + f" ({report.get('seconds', 0):.1f}s)",
        file=out,
    )
    for reason, count in sorted(invalid.items()):
        typer.echo(f"  invalid: {reason}: {count}", file=out)
    for problem in report.get("problems", [])[:20]:
        typer.echo(f"  {problem.get('where')}: {problem.get('reason')}: {problem.get('detail', '')}", file=out)


@graph_app.command("import")
def import_facts(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Curated facts: one JSON object per line (kind entity or relation).")],
    collection: CollectionOption,
    ontology_file: OntologyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import curated entities and relations into a collection's graph, under its
    ontology; invalid lines are dropped and reported with their line numbers."""
    valid_collection_name(collection)
    ontology, text = read_ontology(ontology_file)
    try:
        # Lines end at "\n" only: str.splitlines() also splits at U+2028 and other
        # separators a JSON string may hold, which broke lines and their numbers.
        lines = [line.removesuffix("\r") for line in file.read_text(encoding="utf-8").split("\n")]
        if lines and not lines[-1]:
            lines.pop()
    except (OSError, UnicodeDecodeError) as exc:
        raise KnowledgeError(f"{file}: cannot read the facts ({exc})") from None
    env = ctx.obj

    async def run() -> dict[str, Any]:
        async with env.open_knowledge_graph(extraction=False) as target:
            if isinstance(target, str):
                typer.echo(f"the stores are held by the server at {target}; importing through it", err=True)
                body = {"lines": lines, "ontology": text, "source": str(file)}
                return dict(await through(target, "POST", f"/v1/collections/{segment(collection)}/graph/import", json=body))
            report = await target.import_facts(collection, lines, ontology=ontology, source=str(file))
            return dict(report.model_dump(mode="json"))

    report = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(report))
    else:
        print_graph_report(report)


@graph_app.command("extract")
def extract(
    ctx: typer.Context,
    collection: CollectionOption,
    ontology_file: OntologyOption = None,
    force: Annotated[bool, typer.Option("--force", help="Extract again documents whose facts are up to date.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Extract entities and relations from every document of a collection already
    ingested (those up to date are skipped), and remove the facts of documents the
    collection no longer has. A model call per chunk."""
    valid_collection_name(collection)
    ontology, text = read_ontology(ontology_file)
    env = ctx.obj
    show_bar = sys.stderr.isatty()

    async def run() -> dict[str, Any]:
        async with env.open_knowledge_graph() as target:
            if isinstance(target, str):
                typer.echo(f"the stores are held by the server at {target}; extracting there (a model call per chunk)...", err=True)
                body = {"ontology": text, "force": force}
                path = f"/v1/collections/{segment(collection)}/graph/extract"
                return dict(await through(target, "POST", path, json=body, timeout=None))
            if show_bar:
                with typer.progressbar(length=1, label="extracting", file=sys.stderr) as bar:

                    def progress(done: int, total: int) -> None:
                        bar.length = total
                        bar.update(done - bar.pos)

                    report = await target.extract(collection, None, ontology=ontology, progress=progress, force=force)
            else:
                report = await target.extract(collection, None, ontology=ontology, force=force)
            return dict(report.model_dump(mode="json"))

    report = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(report))
    else:
        print_graph_report(report)
    if report.get("failed_chunks"):
        raise SystemExit(2)


@graph_app.command("neighbors")
def neighbors(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="An entity's name or alias.")],
    collection: CollectionOption,
    hops: Annotated[int, typer.Option("-k", "--hops", min=1, max=4, help="How many hops away.")] = 2,
    fanout: Annotated[int | None, typer.Option("--fanout", min=1, max=500, help="Relations followed per entity per hop.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most facts shown.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """The facts within k hops of the entity named NAME."""
    valid_collection_name(collection)
    if not name.strip():
        raise KnowledgeError("the entity name is empty")
    env = ctx.obj

    async def run() -> dict[str, Any]:
        async with env.open_knowledge_graph(extraction=False) as target:
            if isinstance(target, str):
                params: dict[str, Any] = {"name": name, "hops": hops, "limit": limit}
                if fanout is not None:
                    params["fanout"] = fanout
                return dict(await through(target, "GET", f"/v1/collections/{segment(collection)}/graph/neighbors", params=params))
            result = await target.neighbors(collection, name, hops=hops, fanout=fanout, limit=limit)
            return neighbors_json(result)

    result = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    if not result["matched"]:
        typer.echo(f"no entity named {name!r} in the graph of {collection}")
        return
    typer.echo("matched: " + ", ".join(f"{e['name']} ({e['type']})" for e in result["matched"]))
    if not result["facts"]:
        typer.echo("no relations")
    for fact in result["facts"]:
        typer.echo(f"  [{fact['hops']}] {fact['text']}  <- {', '.join(fact['doc_ids'])}")


@graph_app.command("stats")
def stats(ctx: typer.Context, collection: CollectionOption, as_json: JsonOption = False) -> None:
    """What a collection's graph holds: its ontology, entities and relations per type."""
    valid_collection_name(collection)
    env = ctx.obj

    async def run() -> dict[str, Any]:
        async with env.open_knowledge_graph(extraction=False) as target:
            if isinstance(target, str):
                return dict(await through(target, "GET", f"/v1/collections/{segment(collection)}/graph"))
            found = await target.stats(collection)
            return graph_stats_json(collection, found)

    result = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(
        f"{collection}: ontology {result['ontology']}, {result['documents']} documents, {result['chunks']} chunks"
    )
    for kind in ("entities", "relations"):
        counts = result[kind]
        typer.echo(f"  {kind}: {sum(counts.values())}" + "".join(f"\n    {t}: {n}" for t, n in sorted(counts.items())))


def graph_stats_json(collection: str, found: Any) -> dict[str, Any]:
    """`GraphStats` as JSON."""
    return {
        "collection": collection,
        "ontology": found.ontology,
        "documents": found.documents,
        "chunks": found.chunks,
        "entities": dict(found.entities),
        "relations": dict(found.relations),
    }
