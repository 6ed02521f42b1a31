"""OpenAI chat-completions over a pooled httpx client: send, check, parse the SSE.

Shared by the alias relay (`ModelGateway.stream_chat`) and the chat models graphs use
(`GatewayChatModel._astream`). Parsing chunks with ``json.loads`` into dicts, instead of
the ``openai`` SDK building a pydantic object per chunk, was the largest single cost of
a streamed graph run (about a third of its CPU; see docs/performance.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from gateway.errors import BackendResponseError, BackendUnavailableError

__all__ = ["iter_chunks", "open_chat", "post_json", "read_json"]


async def open_chat(
    client: httpx.AsyncClient, backend_id: str, url: str, api_key: str, payload: Mapping[str, Any]
) -> httpx.Response:
    """POST a chat completion and return the open response once its status is 200.

    Raises:
        BackendUnavailableError: no connection, or no answer in time.
        BackendResponseError: an error status; the backend's own message is kept.
    """
    request = client.build_request(
        "POST", f"{url}/chat/completions", json=payload, headers={"Authorization": f"Bearer {api_key}", "Accept-Encoding": "identity"}
    )
    return await _send(client, backend_id, request)


async def _send(client: httpx.AsyncClient, backend_id: str, request: httpx.Request) -> httpx.Response:
    """Send ``request`` and return the open response once its status is 200.

    Raises:
        BackendUnavailableError: no connection, or no answer in time.
        BackendResponseError: an error status; the backend's own message is kept.
    """
    try:
        response = await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise BackendUnavailableError(backend_id, f"timed out ({exc.__class__.__name__})") from exc
    except httpx.HTTPError as exc:
        raise BackendUnavailableError(backend_id, f"{exc.__class__.__name__}: {exc}") from exc
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")
        await response.aclose()
        try:
            detail = str(json.loads(body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            detail = body[:300]
        raise BackendResponseError(backend_id, response.status_code, detail)
    return response


async def _lines(response: httpx.Response) -> AsyncIterator[bytes]:
    # SSE lines as bytes, split on LF (a CR before it is stripped by the caller's
    # strip()). Straight from the raw body: no text decoding layer for JSON that
    # json.loads reads as bytes anyway.
    pending = b""
    encoded = response.headers.get("content-encoding", "identity") != "identity"
    async for data in response.aiter_bytes() if encoded else response.aiter_raw():
        pending += data
        if b"\n" not in data:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


async def iter_chunks(response: httpx.Response, backend_id: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE chat-completion stream, up to ``[DONE]``; closes the
    response when done or closed early (which makes the backend stop generating).

    Raises:
        BackendResponseError: the backend sent an in-band error object.
        BackendUnavailableError: the stream broke off.
    """
    try:
        async for line in _lines(response):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                raise BackendResponseError(backend_id, 502, f"stream sent a line that is not JSON: {data[:100]!r}") from None
            if not isinstance(chunk, dict):
                raise BackendResponseError(backend_id, 502, f"stream sent {type(chunk).__name__}, not an object")
            if "error" in chunk:
                error = chunk["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                raise BackendResponseError(backend_id, 502, str(message))
            yield chunk
    except httpx.HTTPError as exc:
        raise BackendUnavailableError(backend_id, f"stream broken: {exc.__class__.__name__}") from exc
    finally:
        await response.aclose()


async def read_json(response: httpx.Response, backend_id: str) -> dict[str, Any]:
    """The whole JSON body of an open response; closes it.

    Raises:
        BackendUnavailableError: the body broke off.
        BackendResponseError: the body is not a JSON object.
    """
    try:
        body = await response.aread()
    except httpx.HTTPError as exc:
        raise BackendUnavailableError(backend_id, f"answer broken: {exc.__class__.__name__}") from exc
    finally:
        await response.aclose()
    try:
        answer = json.loads(body)
    except ValueError:
        raise BackendResponseError(backend_id, 502, "answer is not JSON") from None
    if not isinstance(answer, dict):
        raise BackendResponseError(backend_id, 502, "answer is not a JSON object")
    return answer


async def post_json(
    client: httpx.AsyncClient, backend_id: str, url: str, api_key: str, payload: Mapping[str, Any]
) -> dict[str, Any]:
    """POST a JSON request (``/embeddings``...) and return the JSON answer.

    Raises:
        BackendUnavailableError: no connection, no answer in time, a broken body.
        BackendResponseError: an error status, or an answer that is not a JSON object.
    """
    request = client.build_request("POST", url, json=payload, headers={"Authorization": f"Bearer {api_key}"})
    return await read_json(await _send(client, backend_id, request), backend_id)
