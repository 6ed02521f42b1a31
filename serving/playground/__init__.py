"""The chat playground: one static page served by the app at ``/playground``.

The page (``static/index.html``, ``app.js``, ``style.css``: plain files, no build
step, no third-party code) speaks this server's LangGraph-compatible API from the
same origin, the way any client does: it lists graphs and threads, streams runs over
SSE, resumes interrupted runs with Approve / Edit / Reject, and shows each answer's
citations, tool calls, request id, run id and backend. docs/playground.md describes it.

The page holds no data, so serving it needs no API key; every API call it makes sends
the key typed into it. It is served with a strict Content-Security-Policy (its own
script and style only, fetches to its own origin, no frames, no inline code), so a
hostile answer, document title or tool argument that slipped past the page's
``textContent``-only rendering still could not run script.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from serving.errors import ServingError

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "playground_router"]

_STATIC = Path(__file__).parent / "static"

ASSETS: dict[str, str] = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
"""The only files served under ``/playground/assets/`` (name -> media type): a fixed
list, so no path a client sends ever reaches the file system."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
"""The page's policy: only its own script and style, API calls to its own origin."""

_HEADERS = {
    "x-content-type-options": "nosniff",
    # Revalidated on every load: a server upgrade never leaves an old app.js running
    # against a new API.
    "cache-control": "no-cache",
}


def _file(name: str) -> bytes:
    return (_STATIC / name).read_bytes()


def playground_router(*, redirect_root: bool) -> APIRouter:
    """The page's routes.

    Args:
        redirect_root: also answer ``GET /`` with a 307 to ``/playground`` (``serve
            --dev``: the address a developer opens first). Off, ``/`` stays a 404: a
            production server's root says nothing about what it serves.
    """
    router = APIRouter(include_in_schema=False)

    @router.get("/playground")
    async def page() -> Response:
        """The page itself (no key needed: it holds no data)."""
        return Response(
            _file("index.html"),
            media_type="text/html; charset=utf-8",
            headers={**_HEADERS, "content-security-policy": CONTENT_SECURITY_POLICY},
        )

    @router.get("/playground/assets/{name}")
    async def asset(name: str) -> Response:
        """The page's script or style sheet; any other name is a 404."""
        media_type = ASSETS.get(name)
        if media_type is None:
            raise ServingError(404, f"no playground asset {name!r}; the assets are: {', '.join(sorted(ASSETS))}")
        return Response(_file(name), media_type=media_type, headers=_HEADERS)

    if redirect_root:

        @router.get("/")
        async def root() -> RedirectResponse:
            """In dev mode the root opens the playground."""
            return RedirectResponse("/playground", status_code=307)

    return router
