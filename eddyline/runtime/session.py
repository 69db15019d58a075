"""The one place that builds a SparkSession.

Spark startup costs seconds, so a process keeps one session. Two settings matter for
correctness, not just speed:

* the Python workers must run this interpreter (``PYSPARK_PYTHON``), otherwise they start the
  system ``python3`` that has no pyarrow and every Arrow kernel fails;
* adaptive query execution must not coalesce the lane shuffle: lane *i* has to stay partition *i*.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark checks an Arrow batch's size in bytes after every row it hands to Python, unless
    # this is exactly Int.MaxValue, and the check is a large part of handing rows to the lanes
    # (docs/perf-notes.md). Batches stay bounded by maxRecordsPerBatch (10,000 rows).
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647b",
    "spark.python.worker.reuse": "true",
    # The JVM and the Python workers talk over a Unix domain socket instead of TCP on
    # localhost: over TCP each direction of a task's hand-off can stall on delayed ACKs.
    "spark.python.unix.domain.socket.enabled": "true",
    # Local files through Hadoop's raw local file system: the default (checksummed) one writes a
    # `.crc` file beside every file and checks for one on every read, a visible share of a small
    # epoch's Parquet write (docs/perf-notes.md).
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.driver.memory": "2g",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.speculation": "false",
    "spark.ui.showConsoleProgress": "false",
}

# On a cluster (any master but local[...]): how fast a lost host is noticed. Spark's defaults wait
# 120 s (spark.network.timeout) before it gives up on an executor that stopped answering, checks
# for silent ones once a minute, and retries a shuffle fetch from a dead host 3 times 5 s apart,
# each attempt waiting out the connection timeout; an epoch would stall for minutes. With these a
# host that dies or drops off the network is given up on within about 10 s and its tasks run
# elsewhere (docs/cluster.md). $EDDYLINE_SPARK_CONF overrides them (see spark_conf_from_env).
CLUSTER_CONF: dict[str, str] = {
    "spark.network.timeout": "10s",
    "spark.executor.heartbeatInterval": "2s",
    "spark.network.timeoutInterval": "2s",
    "spark.shuffle.io.maxRetries": "1",
    "spark.shuffle.io.retryWait": "1s",
}

# G1 regions of 16 MB instead of the 1 MB a 2 GB heap gets by default. Spark allocates 1-4 MB
# buffers every stage (a broadcast's 4 MB chunk, 1 MB task-serialisation chunks, Parquet's
# dictionaries, read and compression buffers); with 1 MB regions each one is a "humongous"
# object, allocated in the old generation, and each can start a concurrent marking cycle that
# takes a core and ends in a remark pause, under the slowest epochs (docs/perf-notes.md).
JVM_OPTIONS = "-XX:G1HeapRegionSize=16m"


def get_spark(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """Return this process's SparkSession, creating it on first use (``local[*]`` by default)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.master(master or "local[*]").appName("eddyline")
    # Passed to the JVMs when they start: the log configuration keeps Spark's startup chatter
    # quiet; the JVM options are JVM_OPTIONS.
    log_config = Path(__file__).with_name("log4j2.properties")
    java = f"-Dlog4j2.configurationFile={log_config.as_uri()} {JVM_OPTIONS}"
    launch = {"spark.driver.extraJavaOptions": java, "spark.executor.extraJavaOptions": JVM_OPTIONS}
    on_cluster = {} if (master or "local").startswith("local") else CLUSTER_CONF
    for key, value in {**DEFAULT_CONF, **on_cluster, **launch, **spark_conf_from_env(), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_analysis_errors()
    return spark


def spark_conf_from_env() -> dict[str, str]:
    """Spark settings from ``$EDDYLINE_SPARK_CONF``: ``key=value`` pairs separated by spaces, e.g.
    ``spark.network.timeout=30s spark.task.maxFailures=8``; they win over Eddyline's defaults."""
    from eddyline.errors import EddylineError

    found = {}
    for item in os.environ.get("EDDYLINE_SPARK_CONF", "").split():
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("spark."):
            raise EddylineError(f"EDDYLINE_SPARK_CONF: {item!r} is not spark.KEY=VALUE")
        found[key] = value
    return found


def quiet_analysis_errors() -> None:
    """PySpark logs every analysis error with its JVM stack the moment the exception is made,
    before anyone catches it. Eddyline catches those a user can fix (an unknown column, a bad
    expression) and reports them once, with Spark's reason, naming the step; any other still
    reaches the user as the exception itself. So these two loggers stay quiet."""
    import logging

    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
