"""FastAPI dependencies: long-lived objects from ``app.state`` as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.observability import ServingMetrics
from serving.openai.service import ChatCompletionService
from serving.platform import Platform

__all__ = ["ChatServiceDep", "MetricsDep", "PlatformDep", "RequestIdDep"]


def _platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def _chat_service(request: Request) -> ChatCompletionService:
    service: ChatCompletionService = request.app.state.chat_service
    return service


def _metrics(request: Request) -> ServingMetrics:
    metrics: ServingMetrics = request.app.state.metrics
    return metrics


def _request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "-"))


PlatformDep = Annotated[Platform, Depends(_platform)]
ChatServiceDep = Annotated[ChatCompletionService, Depends(_chat_service)]
MetricsDep = Annotated[ServingMetrics, Depends(_metrics)]
RequestIdDep = Annotated[str, Depends(_request_id)]
