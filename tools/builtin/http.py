"""``http_get``: fetch a page from an allowed domain, within size and time limits.

Only hosts on the allow-list (a domain and its subdomains) are fetched; redirects
are followed by hand, at most 3, each target checked against the list; the body is
read up to ``max_bytes`` and cut there; the whole call has the tool's timeout.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import httpx
from pydantic import BaseModel, Field

from tools.base import Tool, ToolContext

__all__ = ["http_get"]

_MAX_REDIRECTS = 3


class HttpGetArgs(BaseModel):
    url: str = Field(min_length=8, max_length=2000, description="An http(s) URL on an allowed domain")


def _allowed(url: str, domains: tuple[str, ...]) -> str | None:
    """Why ``url`` may not be fetched, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"only http and https URLs are fetched, not {parts.scheme or 'none'!r}"
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        return "the URL has no host"
    if not any(host == d or host.endswith("." + d) for d in domains):
        return f"host {host!r} is not on the allow-list ({', '.join(domains) or 'empty'})"
    return None


def http_get(allowed_domains: tuple[str, ...], *, max_bytes: int = 200_000, timeout_s: float = 10.0) -> Tool:
    domains = tuple(d.lower().strip(".") for d in allowed_domains)

    async def run(args: HttpGetArgs, context: ToolContext) -> str:
        url = args.url
        async with httpx.AsyncClient(follow_redirects=False, timeout=timeout_s, trust_env=False) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                if (reason := _allowed(url, domains)) is not None:
                    raise PermissionError(reason)
                async with client.stream("GET", url, headers={"Accept": "text/*, application/json"}) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    body = bytearray()
                    cut = False
                    async for piece in response.aiter_bytes():
                        body += piece
                        if len(body) > max_bytes:
                            cut = True
                            break
                    text = bytes(body[:max_bytes]).decode(response.encoding or "utf-8", errors="replace")
                    note = f"\n[cut at {max_bytes} bytes]" if cut else ""
                    return f"HTTP {response.status_code} {url}\n\n{text}{note}"
        raise PermissionError(f"more than {_MAX_REDIRECTS} redirects")

    return Tool(
        name="http_get",
        description=f"Fetch a web page (GET) from an allowed domain: {', '.join(domains) or 'none'}.",
        args_schema=HttpGetArgs,
        run=run,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        idempotent=True,
        max_output_chars=max_bytes + 500,  # the status line and the cut note fit too
        examples=('User: What does the status page say? -> http_get({"url": "https://status.example.com/"})',),
    )
