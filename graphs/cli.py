"""``switchyard graphs list|draw|new`` and ``switchyard ask``.

Mounted by ``serving/cli.py``, which puts an object satisfying `GraphsCliEnv` in the
Typer context and turns `GraphError` (and the gateway's errors) into a one-line message
and exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import importlib.resources
import os
import re
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, aclosing
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from graphs.context import RunContext
from graphs.errors import GraphError
from graphs.events import Finish, TextDelta, ToolResult, message_events
from graphs.registry import GraphRegistry, GraphSpec

__all__ = ["GraphsCliEnv", "ask", "graphs_app", "scaffold_graph"]


class GraphsCliEnv(Protocol):
    """What these commands need from the composition root."""

    def graph_specs(self) -> Mapping[str, GraphSpec]: ...

    def open_graphs(self, only: str | None = None) -> AbstractAsyncContextManager[GraphRegistry]:
        """Build the registry (all graphs, or ``only`` that one) and the gateway behind
        it; close both on exit."""
        ...


graphs_app = typer.Typer(help="List, draw and scaffold graphs.", no_args_is_help=True)

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@graphs_app.command("list")
def list_graphs(ctx: typer.Context) -> None:
    """The registered graphs: id, model alias, path, description."""
    env: GraphsCliEnv = ctx.obj
    for graph_id, spec in env.graph_specs().items():
        typer.echo(f"{graph_id}\tmodel={spec.model}\t{spec.path}\t{spec.description}")


@graphs_app.command("draw")
def draw(ctx: typer.Context, graph_id: Annotated[str, typer.Argument(help="A registered graph id.")]) -> None:
    """Print the graph as Mermaid text."""
    env: GraphsCliEnv = ctx.obj

    async def render() -> str:
        async with env.open_graphs() as registry:
            return registry.get(graph_id).graph.get_graph().draw_mermaid()

    typer.echo(asyncio.run(render()))


def scaffold_graph(name: str, directory: Path) -> tuple[Path, Path, str]:
    """Write ``directory/name.py`` (a graph builder) and ``directory/test_name.py``.

    Returns:
        The two files and the ``path`` value to register (relative to the cwd when
        the directory is under it).

    Raises:
        GraphError: a bad name, or a file that already exists (nothing is overwritten).
    """
    if not _NAME.match(name):
        raise GraphError(f"graph name {name!r}: use lowercase letters, digits and '_', starting with a letter")
    module = directory / f"{name}.py"
    test = directory / f"test_{name}.py"
    for path in (module, test):
        if path.exists():
            raise GraphError(f"{path} already exists; not overwriting it")
    try:
        shown = module.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = module.resolve()
    graph_path = f"{shown}:make_graph"
    templates = importlib.resources.files("graphs").joinpath("templates")
    fields = {"name": name, "graph_path": graph_path, "test_path": str(test)}
    directory.mkdir(parents=True, exist_ok=True)
    module.write_text(templates.joinpath("graph.py.tmpl").read_text().format(**fields))
    test.write_text(templates.joinpath("test_graph.py.tmpl").read_text().format(**fields))
    return module, test, graph_path


@graphs_app.command("new")
def new(
    name: Annotated[str, typer.Argument(help="Graph id and module name, e.g. summarize.")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write the module and its test.")] = Path(
        "my_graphs"
    ),
) -> None:
    """Scaffold a graph module and its test, and print the config entry to add."""
    module, test, graph_path = scaffold_graph(name, directory)
    typer.echo(f"wrote {module}\nwrote {test}\n")
    typer.echo("Register it in config/switchyard.yaml under `graphs:`:\n")
    typer.echo(f"  {name}:\n    path: {graph_path}\n    model: chat-default\n")
    typer.echo(f"Then: switchyard ask {name} \"Hello\"   and   pytest {test}")


def _human_interrupt(value: Any) -> dict[str, Any] | None:
    """The ``HumanInterrupt`` in an interrupt value (itself, or a list of one), if any."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict) and isinstance(value.get("action_request"), dict) and isinstance(value.get("config"), dict):
        return value
    return None


def _approve(value: Any) -> Any:
    """Ask the person at the terminal to answer an interrupt: a ``HumanInterrupt``
    (a tool approval) gets a list of one ``HumanResponse``; any other value, the text
    typed."""
    request = _human_interrupt(value)
    if request is None:
        return typer.prompt(f"\nThe graph asks: {value!r}\nyour answer")
    tool = str(request["action_request"].get("action"))
    args = json.dumps(request["action_request"].get("args"), ensure_ascii=False)
    typer.echo(f"\nThe model wants to call {tool}({args}).", err=True)
    config = request["config"]
    offered = {
        key: label
        for key, label, allowed in (
            ("a", "[a]ccept", config.get("allow_accept")),
            ("e", "[e]dit the arguments", config.get("allow_edit")),
            ("r", "[r]espond instead", config.get("allow_respond")),
            ("i", "[i]gnore", config.get("allow_ignore")),
        )
        if allowed
    }
    if not offered:
        raise GraphError(f"the approval of {tool} allows no answer")
    choice = ""
    while choice not in offered:
        choice = typer.prompt(", ".join(offered.values()) + "?", default=next(iter(offered)), err=True).strip().lower()[:1]
    if choice == "e":
        edited = typer.prompt("arguments (JSON object)", default=args, err=True)
        try:
            new_args = json.loads(edited)
        except ValueError:
            new_args = None
        if not isinstance(new_args, dict):
            typer.echo("not a JSON object: the call is declined", err=True)
            return [{"type": "response", "args": "the edited arguments were not a JSON object"}]
        return [{"type": "edit", "args": {"action": tool, "args": new_args}}]
    if choice == "r":
        return [{"type": "response", "args": typer.prompt("your message to the model", default="declined at the terminal", err=True)}]
    if choice == "i":
        return [{"type": "ignore", "args": None}]
    return [{"type": "accept", "args": None}]


def ask(
    ctx: typer.Context,
    graph_id: Annotated[str, typer.Argument(help="A registered graph id, e.g. chat.")],
    question: Annotated[str, typer.Argument(help="The question.")],
    max_tokens: Annotated[int, typer.Option(help="Cap on the answer's tokens.")] = 256,
) -> None:
    """Ask a graph a question; the answer streams to the terminal."""
    env: GraphsCliEnv = ctx.obj

    async def run() -> Finish | None:
        async with env.open_graphs(only=graph_id) as registry:
            # A checkpointer of its own, so that a tool approval can pause the run here.
            graph = registry.get(graph_id).graph.copy(update={"checkpointer": InMemorySaver()})
            config = {"configurable": {"thread_id": f"cli-{os.getpid()}"}}
            context = RunContext(
                request_id=f"cli-{os.getpid()}", model_params={"max_tokens": max_tokens}, approvals=True
            )
            graph_input: Any = {"messages": [HumanMessage(question)]}
            finish = None
            while True:
                stream = graph.astream(graph_input, config, context=context, stream_mode=["messages", "updates"], version="v2")
                async with aclosing(message_events(stream)) as events:
                    async for event in events:
                        if isinstance(event, TextDelta):
                            sys.stdout.write(event.text)
                            sys.stdout.flush()
                        elif isinstance(event, ToolResult):
                            typer.secho(f"[tool {event.name}: {event.content[:200]}]", fg=typer.colors.BRIGHT_BLACK, err=True)
                        elif isinstance(event, Finish):
                            finish = event
                pending = [i for task in (await graph.aget_state(config)).tasks for i in task.interrupts]
                if not pending:
                    break
                graph_input = Command(resume=_approve(pending[0].value))
            sys.stdout.write("\n")
            return finish

    finish = asyncio.run(run())
    if finish is not None:
        typer.secho(
            f"[{finish.reason}; {finish.prompt_tokens} prompt + {finish.completion_tokens} completion tokens]",
            fg=typer.colors.BRIGHT_BLACK,
            err=True,
        )
