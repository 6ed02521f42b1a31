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
from gateway.registry import Backend, Capabilities, ModelRegistry, load_registry
from gateway.router import ModelGateway
from gateway.settings import GatewaySettings

__all__ = [
    "Backend",
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
    "UnknownModelError",
    "load_registry",
]
