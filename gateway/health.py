"""Readiness probes for backends."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from gateway.registry import Backend

__all__ = ["BackendHealth", "probe"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendHealth:
    """The outcome of one probe."""

    backend_id: str
    ready: bool
    reason: str
    """``"ok"`` when ready, else what was seen (refused, status 503 loading...), with
    the backend's address and answer: for the operator's log."""
    public_reason: str = ""
    """The same without the address or anything the backend said (its status only):
    what an unauthenticated probe (``/readyz``) may show. Defaults to ``reason``."""

    def __post_init__(self) -> None:
        if not self.public_reason:
            object.__setattr__(self, "public_reason", self.reason)


async def probe(backend: Backend, client: httpx.AsyncClient, timeout_s: float) -> BackendHealth:
    """Ask a backend whether it can serve now.

    llama.cpp and vLLM expose ``GET /health`` (llama.cpp answers 503 while the model
    loads); a hosted ``openai`` backend is probed with ``GET /v1/models``.
    """
    url = f"{backend.base_url}/models" if backend.kind == "openai" else f"{backend.root_url}/health"
    headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key_env else {}
    try:
        response = await client.get(url, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return BackendHealth(
            backend_id=backend.id, ready=False, reason=f"no answer from {url} in {timeout_s:g}s",
            public_reason=f"no answer in {timeout_s:g}s",
        )
    except httpx.HTTPError as exc:
        return BackendHealth(
            backend_id=backend.id, ready=False, reason=f"cannot reach {url}: {exc.__class__.__name__}",
            public_reason=f"cannot reach the backend: {exc.__class__.__name__}",
        )
    if response.status_code == 200:
        return BackendHealth(backend_id=backend.id, ready=True, reason="ok")
    detail = response.text[:200].strip()
    return BackendHealth(
        backend_id=backend.id, ready=False, reason=f"{url} answered {response.status_code} {detail}".strip(),
        public_reason=f"the backend answered {response.status_code}",
    )
