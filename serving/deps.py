"""FastAPI dependencies: long-lived objects from ``app.state`` as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.auth import Authenticator, Principal
from serving.errors import RequestError
from serving.limits import RateLimiter
from serving.observability import ServingMetrics
from serving.openai.service import ChatCompletionService
from serving.platform import Platform
from serving.shared.ratelimit import RedisRateLimiter

__all__ = ["ChatServiceDep", "DeadlineDep", "MetricsDep", "PlatformDep", "PrincipalDep", "RequestIdDep", "require_key"]


async def _platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


async def _chat_service(request: Request) -> ChatCompletionService:
    service: ChatCompletionService = request.app.state.chat_service
    return service


async def _metrics(request: Request) -> ServingMetrics:
    metrics: ServingMetrics = request.app.state.metrics
    return metrics


async def _principal(request: Request) -> Principal:
    authenticator: Authenticator = request.app.state.authenticator
    principal = await authenticator.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    if authenticator.enabled:
        limiter: RateLimiter | RedisRateLimiter = request.app.state.rate_limiter
        await limiter.check(principal)
    request.state.principal = principal
    return principal


async def _deadline(request: Request) -> float:
    configured: float = request.app.state.platform.settings.server.run_deadline_s
    asked = request.headers.get("x-run-deadline-s")
    if asked is None:
        return configured
    try:
        value = float(asked)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise RequestError("x-run-deadline-s must be a positive number of seconds", param="x-run-deadline-s")
    return min(value, configured)


async def _request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "-"))


PlatformDep = Annotated[Platform, Depends(_platform)]
ChatServiceDep = Annotated[ChatCompletionService, Depends(_chat_service)]
MetricsDep = Annotated[ServingMetrics, Depends(_metrics)]
RequestIdDep = Annotated[str, Depends(_request_id)]
PrincipalDep = Annotated[Principal, Depends(_principal)]
DeadlineDep = Annotated[float, Depends(_deadline)]
"""Seconds this request's run may take: the configured deadline, or less if asked."""
"""The authenticated caller (401 without a valid key, unless the server runs --dev)."""
require_key = Depends(_principal)
"""For ``dependencies=[...]`` on routers whose every route needs a key."""
