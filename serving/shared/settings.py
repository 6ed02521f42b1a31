"""The ``state`` section: what replicas of one deployment share.

One replica needs none of it. Several replicas behind a load balancer share their
threads through PostgreSQL (``threads.postgres_dsn``), and, through the same
database (or ``state.postgres_dsn``), the run registry (status, cancel, join, the
frames of background runs), the API keys and the model promotions, so that any
replica can serve any request. Rate-limit buckets are shared through Redis when
``state.redis_url`` is set; otherwise each replica counts its own.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["StateSettings"]


class StateSettings(BaseModel):
    """The ``state`` section (``SWITCHYARD_STATE__*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    postgres_dsn: str | None = None
    """The database replicas share run records, API keys and promotions in; default
    ``threads.postgres_dsn``. Neither set: one replica, state in the data directory."""
    redis_url: str | None = None
    """``redis://host:6379/0``: rate-limit buckets shared by every replica. Unset: each
    replica has its own buckets (N replicas let a key through N times as fast)."""
    replica_id: str | None = None
    """This replica's name in the run registry (Kubernetes: the pod's name). Default under
    ``switchyard serve``: ``<hostname>-<hash of the data directory>``, the same after a
    restart on the same data, so the restarted server ends the runs its predecessor left.
    Two live processes cannot share one: the second stops at start naming it."""
    heartbeat_s: float = Field(default=2.0, gt=0, le=60)
    """How often a replica says it is alive (and looks for replicas that are not)."""
    lease_s: float = Field(default=10.0, gt=0, le=600)
    """A replica not heard from for this long is dead: its runs end as errors and their
    threads become usable again on the other replicas."""
    reload_s: float = Field(default=1.0, gt=0, le=60)
    """How often a replica reads changes to the shared API keys and promotions."""

    @model_validator(mode="after")
    def _lease_outlasts_heartbeats(self) -> StateSettings:
        if self.lease_s < 2 * self.heartbeat_s:
            raise ValueError(f"lease_s ({self.lease_s:g}) must be at least twice heartbeat_s ({self.heartbeat_s:g})")
        return self
