"""Errors raised by the gateway. One root, `GatewayError`; subclasses carry fields."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BackendResponseError",
    "BackendUnavailableError",
    "CapabilityError",
    "GatewayError",
    "LocalBackendError",
    "RegistryError",
    "UnknownModelError",
]


class GatewayError(Exception):
    """Root of every error the gateway raises."""


class RegistryError(GatewayError):
    """The model registry file is missing or invalid.

    Attributes:
        path: the registry file.
        problems: one ``"key.path: message"`` line per problem found.
    """

    def __init__(self, path: str, problems: Iterable[str]) -> None:
        self.path = path
        self.problems = list(problems)
        super().__init__(f"invalid model registry {path}: " + "; ".join(self.problems))


class UnknownModelError(GatewayError):
    """A model name that is neither an alias nor otherwise known.

    Attributes:
        name: the name asked for.
        available: the names that would have been accepted.
    """

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available = sorted(available)
        super().__init__(
            f"unknown model {name!r}; available: {', '.join(self.available) or 'none'}"
        )


class CapabilityError(GatewayError):
    """A request needs something the backend's capability contract does not offer.

    Attributes:
        backend_id: the backend that lacks the capability.
        capability: the contract field, e.g. ``"tools"`` or ``"context_window"``.
        param: the request field that asked for it, e.g. ``"tools"``.
        needed: for a prompt past the context window, its estimated tokens.
    """

    def __init__(self, backend_id: str, capability: str, param: str, message: str, *, needed: int | None = None) -> None:
        self.backend_id = backend_id
        self.capability = capability
        self.param = param
        self.needed = needed
        super().__init__(message)


class BackendUnavailableError(GatewayError):
    """A backend could not be reached or is not ready.

    Attributes:
        backend_id: the backend's registry id.
        reason: what the probe or the connection attempt saw.
    """

    def __init__(self, backend_id: str, reason: str) -> None:
        self.backend_id = backend_id
        self.reason = reason
        super().__init__(f"model backend {backend_id!r} is unavailable: {reason}")


class LocalBackendError(GatewayError):
    """Starting, stopping or locating the local llama.cpp backend failed."""


class BackendResponseError(GatewayError):
    """A backend answered a request with an error status.

    Attributes:
        backend_id: the backend's registry id.
        status: the HTTP status it answered (4xx: the request was refused, e.g. a
            prompt longer than the context; 5xx: the backend failed).
        detail: the start of its error message.
    """

    def __init__(self, backend_id: str, status: int, detail: str) -> None:
        self.backend_id = backend_id
        self.status = status
        self.detail = detail
        super().__init__(f"model backend {backend_id!r} answered {status}: {detail}")
