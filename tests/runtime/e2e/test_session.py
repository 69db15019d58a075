"""The settings the engine's speed and correctness rest on reach the JVM's session."""

from __future__ import annotations

INT_MAX = 2**31 - 1


def test_the_lane_shuffle_is_not_coalesced(spark) -> None:
    conf = spark._jsparkSession.sessionState().conf()
    assert not conf.adaptiveExecutionEnabled()


def test_rows_reach_python_without_a_size_check_per_row(spark) -> None:
    # Spark skips its per-row Arrow size check only when the limit is exactly Int.MaxValue
    conf = spark._jsparkSession.sessionState().conf()
    assert conf.arrowMaxBytesPerBatch() == INT_MAX
    assert 0 < conf.arrowMaxRecordsPerBatch() <= 10_000


def test_local_files_go_through_the_raw_local_file_system(spark) -> None:
    # the checksummed default writes a .crc beside every file Spark writes locally
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get("fs.file.impl") == "org.apache.hadoop.fs.RawLocalFileSystem"


def test_spark_buffers_are_not_humongous_objects(spark) -> None:
    # with 1 MB regions, Spark's per-stage 1-4 MB buffers each start a G1 concurrent cycle
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    region = int(bean.getVMOption("G1HeapRegionSize").getValue())
    assert region >= 2 * (4 * 1024 * 1024 + 16)  # a broadcast's 4 MB chunk fits in half a region
