"""Request bodies of the LangGraph Server API are JSON whatever their ``content-type``
says, for clients that reach the server through a proxy.

Agent Chat UI's production set-up sends every call through a Next.js route
(``langgraph-nextjs-api-passthrough``, its ``src/app/api/[..._path]/route.ts``) that
forwards the body as text and only the ``x-*`` and ``authorization`` headers: the
``content-type: application/json`` the SDK set is lost, and the proxy's ``fetch``
labels the body ``text/plain;charset=UTF-8``. LangGraph Server parses a body as JSON
whatever its label; FastAPI would refuse it (422, "Input should be a valid dictionary").

So a body labelled ``text/plain`` (or not labelled at all) is read as JSON, but only
on a request that carries a key header (``x-api-key`` or ``authorization``). A browser
sends ``text/plain`` across origins without asking first (a CORS "simple request"),
so without that condition any web page could start runs on a server whose auth is
off (a developer's machine); a key header makes the browser ask first (a preflight),
which only the origins in ``server.cors_origins`` pass. Other labels (form data, XML)
are left alone and refused as before.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

__all__ = ["JsonBodyRoute", "json_body_scope"]

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
_KEY_HEADERS = frozenset({b"x-api-key", b"authorization"})
_JSON = b"application/json"


def _unlabelled_or_text(value: bytes | None) -> bool:
    """Whether a ``content-type`` is absent or ``text/plain`` (with any parameters)."""
    if value is None:
        return True
    media_type = value.split(b";", 1)[0].strip().lower()
    return media_type in (b"", b"text/plain")


def json_body_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` with its body labelled ``application/json`` when it is sent by a keyed
    request as ``text/plain`` or without a label (see the module); otherwise unchanged."""
    if scope.get("method") not in _WITH_BODY:
        return scope
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
    names = {name.lower() for name, _ in headers}
    if not names & _KEY_HEADERS:
        return scope
    content_types = [value for name, value in headers if name.lower() == b"content-type"]
    if len(content_types) > 1 or not _unlabelled_or_text(content_types[0] if content_types else None):
        return scope
    relabelled = [(name, value) for name, value in headers if name.lower() != b"content-type"]
    relabelled.append((b"content-type", _JSON))
    return {**scope, "headers": relabelled}


class JsonBodyRoute(APIRoute):
    """A route of the LangGraph API: reads a keyed request's ``text/plain`` or
    unlabelled body as JSON (`json_body_scope`) before FastAPI parses it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            scope = json_body_scope(request.scope)
            if scope is not request.scope:
                request = Request(scope, request.receive, request._send)  # noqa: SLF001 - FastAPI's own pattern
            return await handler(request)

        return handle
