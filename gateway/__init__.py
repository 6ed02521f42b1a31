"""The model layer: which models exist, how to reach them, and what they can do.

`gateway` is the bottom layer: it imports nothing from the other Switchyard packages.
It owns the model registry (``config/models.yaml``), the LangChain chat models that
graphs call, backend health probes and the local llama.cpp backend's process.
"""

from gateway.errors import (
    BackendResponseError,
    BackendUnavailableError,
    CapabilityError,
    GatewayError,
    LocalBackendError,
    RegistryError,
    UnknownModelError,
)
from gateway.balancer import RouteScope
from gateway.registry import Alias, AliasSla, AliasTarget, Backend, BreakerSettings, Capabilities, ModelRegistry, load_registry
from gateway.routed import ROUTE_SCOPE, RoutedChatModel
from gateway.router import ModelGateway
from gateway.settings import GatewaySettings

__all__ = [
    "ROUTE_SCOPE",
    "Alias",
    "AliasSla",
    "AliasTarget",
    "Backend",
    "BreakerSettings",
    "BackendResponseError",
    "BackendUnavailableError",
    "Capabilities",
    "CapabilityError",
    "GatewayError",
    "GatewaySettings",
    "LocalBackendError",
    "ModelGateway",
    "ModelRegistry",
    "RegistryError",
    "RouteScope",
    "RoutedChatModel",
    "UnknownModelError",
    "load_registry",
]
