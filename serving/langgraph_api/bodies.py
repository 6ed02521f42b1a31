"""Request bodies of the LangGraph Server API read as JSON whatever their
``content-type`` says, for clients behind a proxy (opt-in: ``server.proxy_text_bodies``).

Agent Chat UI's production set-up sends every call through a Next.js route
(``langgraph-nextjs-api-passthrough``, its ``src/app/api/[..._path]/route.ts``) that
forwards the body as text and only the ``x-*`` and ``authorization`` headers: the
``content-type: application/json`` the SDK set is lost, and the proxy's ``fetch``
labels the body ``text/plain;charset=UTF-8``. LangGraph Server parses a body as JSON
whatever its label; FastAPI refuses it (422, "Input should be a valid dictionary").

That proxy adds the key itself, so anything that reaches the proxy reaches us keyed.
A browser sends ``text/plain`` across origins without asking first (a CORS "simple
request": ``<form enctype=text/plain>``, ``fetch`` with ``mode: "no-cors"``), so a
hostile page could have the proxy start runs if such bodies were always read. Hence:

- off by default (``server.proxy_text_bodies``): a ``text/plain`` body is a 422 as
  FastAPI has it;
- on, only a request with a key header (``x-api-key``, or ``authorization: Bearer``;
  not Basic, NTLM or Negotiate, which a browser adds by itself) is relabelled, and
  never one a browser marks as a simple request (``sec-fetch-mode: navigate`` or
  ``no-cors``, ``sec-fetch-site: cross-site``): a server-side proxy sends none of
  these. The proxy must still check ``Origin`` / ``Sec-Fetch-Site`` itself, since
  it holds the key (docs/agent-chat-ui.md).

Other labels (form data, XML) are left alone and refused as before.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

__all__ = ["JsonBodyRoute", "json_body_scope"]

# DELETE too: the SDK's ``store.deleteItem`` sends its JSON body with a DELETE.
_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_JSON = b"application/json"
# What a browser sends on a request it makes without a preflight, from a page of
# another site: never relabelled (a server-side proxy sends no ``sec-fetch-*``).
_SIMPLE_FETCH = {b"sec-fetch-mode": frozenset({b"navigate", b"no-cors"}), b"sec-fetch-site": frozenset({b"cross-site"})}


def _unlabelled_or_text(value: bytes | None) -> bool:
    """Whether a ``content-type`` is absent or ``text/plain`` (with any parameters)."""
    if value is None:
        return True
    media_type = value.split(b";", 1)[0].strip().lower()
    return media_type in (b"", b"text/plain")


def _keyed(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request carries an API key: ``x-api-key``, or ``authorization`` with
    the Bearer scheme (a browser adds Basic, NTLM or Negotiate credentials unasked)."""
    for name, value in headers:
        name = name.lower()
        if name == b"x-api-key":
            return True
        if name == b"authorization" and value.strip()[:7].lower() == b"bearer ":
            return True
    return False


def _browser_simple_request(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a browser marks the request as one it sent without a preflight, or
    from another site (``sec-fetch-mode`` / ``sec-fetch-site``)."""
    for name, value in headers:
        refused = _SIMPLE_FETCH.get(name.lower())
        if refused is not None and value.strip().lower() in refused:
            return True
    return False


def json_body_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` with its body labelled ``application/json`` when it is sent by a keyed
    request as ``text/plain`` or without a label, and no browser marked it as a simple
    or cross-site request (see the module); otherwise unchanged. The caller checks
    that ``server.proxy_text_bodies`` is on."""
    if scope.get("method") not in _WITH_BODY:
        return scope
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
    if not _keyed(headers) or _browser_simple_request(headers):
        return scope
    content_types = [value for name, value in headers if name.lower() == b"content-type"]
    if len(content_types) > 1 or not _unlabelled_or_text(content_types[0] if content_types else None):
        return scope
    relabelled = [(name, value) for name, value in headers if name.lower() != b"content-type"]
    relabelled.append((b"content-type", _JSON))
    return {**scope, "headers": relabelled}


class JsonBodyRoute(APIRoute):
    """A route of the LangGraph API: with ``server.proxy_text_bodies`` on (the app's
    ``state.proxy_text_bodies``), reads a keyed request's ``text/plain`` or unlabelled
    body as JSON (`json_body_scope`) before FastAPI parses it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            if not getattr(request.app.state, "proxy_text_bodies", False):
                return await handler(request)
            scope = json_body_scope(request.scope)
            if scope is not request.scope:
                request = Request(scope, request.receive, request._send)  # noqa: SLF001 - FastAPI's own pattern
            return await handler(request)

        return handle
