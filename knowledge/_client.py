"""What the knowledge commands share to talk to a running server's HTTP API."""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import httpx

from knowledge.errors import KnowledgeError

__all__ = ["check", "documents_path", "headers", "segment"]


def headers() -> dict[str, str]:
    key = os.environ.get("SWITCHYARD_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def segment(value: str) -> str:
    """``value`` as one URL path segment: every reserved character percent-encoded, and
    ``.`` too, so that no client or proxy reads ``..`` as "the parent"."""
    return urllib.parse.quote(value, safe="").replace(".", "%2E")


def documents_path(collection: str, doc_id: str | None = None) -> str:
    path = f"/v1/collections/{segment(collection)}/documents"
    return path if doc_id is None else f"{path}/{segment(doc_id)}"


def check(response: httpx.Response, url: str) -> Any:
    if response.status_code == 401:
        raise KnowledgeError(f"the server at {url} needs an API key: set SWITCHYARD_API_KEY")
    if response.status_code >= 400:
        try:
            detail = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = response.text[:300]
        raise KnowledgeError(f"the server at {url} refused ({response.status_code}): {detail}")
    return response.json() if response.content else None
