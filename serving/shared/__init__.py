"""State that replicas of one deployment share (`settings.StateSettings`): run records,
API keys and promotions in PostgreSQL, rate-limit buckets in Redis."""

PG_TCP: dict[str, int] = {
    # Probe an idle connection after 10 s, every 5 s, 3 times: a peer gone without a FIN
    # (a failed-over server, a dropped NAT entry) is found in ~25 s, not the kernel's hours.
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    # Data sent and not acknowledged for 25 s fails the connection (keepalives only
    # probe an idle one; retransmissions would otherwise last ~15 min).
    "tcp_user_timeout": 25_000,
}
"""libpq connection options of every shared-state connection (keys, promotions, the run
board's pool, its LISTEN and its replica-id lock)."""
