"""Small epochs run without compiling Java code (issue #24, the epoch floor)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import eddyline
from eddyline.io.sinks import make_sink
from eddyline.kinds.window import _uncombined as _real_uncombined
from eddyline.runtime.engine import Engine
from eddyline.runtime.epoch import execute


def _compilations(spark) -> int:
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _windows(spark, checkpoint: Path) -> tuple[pa.Table, int]:
    """Six epochs of 500 bids through sliding windows; the rows, and the classes Spark compiled
    in the last four (the second epoch may compile what is the same in every epoch, once). The
    window writes its late rows out, so its plan holds the watermark and is built every epoch
    (otherwise it is built once, and Spark finds its compiled code in its cache)."""
    net = eddyline.Network("small", trigger=0, lanes=2, key_groups=8)
    bids = net.source("bids", eddyline.Nexmark(stream="bid", rate=1_000, unpaced=True), max_rows_per_epoch=500)
    windows = bids.window_aggregate(key="auction", time="date_time", window=eddyline.sliding("4s", "2s"),
                                    aggregates={"n": "count(*)", "top": "max(price)", "total": "sum(price)",
                                                "mean": "avg(price)"},
                                    late=eddyline.Files(str(checkpoint.parent / f"{checkpoint.name}-late")))
    windows.to(eddyline.Memory(), name="windows")
    windows.to(eddyline.Files(str(checkpoint.parent / f"{checkpoint.name}-out")), name="files")
    sinks = {s.name: make_sink(s) for s in net.spec.sinks}
    engine = Engine(net.spec, spark, str(checkpoint), sinks=sinks)
    engine.run(epochs=2)  # nothing is known about the first epoch's size: it compiles
    start = _compilations(spark)
    engine.run(epochs=4)
    rows = sinks["windows"].table()
    assert rows is not None and rows.num_rows > 0
    return rows.sort_by([("window_start", "ascending"), ("auction", "ascending")]), _compilations(spark) - start


def test_epochs_after_a_small_one_compile_no_code_and_write_parquet_from_the_driver(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """...and hand their window's (row, window) pairs to the lanes uncombined: the windows, and
    their state carried from a large epoch into small ones, are those of combining every epoch."""
    from eddyline.kinds import window

    uncombined = []

    def spied(*args):
        uncombined.append(args[2])
        return _real_uncombined(*args)

    monkeypatch.setattr(window, "_uncombined", spied)
    before = spark.conf.get("spark.sql.codegen.wholeStage")
    small, compiled = _windows(spark, tmp_path / "a")
    assert compiled == 0  # offsets and watermarks differ every epoch, yet no class was compiled
    assert len(uncombined) == 5  # every epoch but the first (the late target has it built every epoch)
    assert spark.conf.get("spark.sql.codegen.wholeStage") == before  # the session is left as it was

    epochs = sorted((tmp_path / "a-out").glob("epoch=*"))
    by_driver = [sorted(p.name for p in e.glob("*.parquet"))[0].endswith("-driver.snappy.parquet") for e in epochs]
    assert by_driver == [False, True, True, True, True, True]  # the first epoch's size was not known
    schemas = {pq.read_schema(f).remove_metadata() for e in epochs for f in e.glob("*.parquet")}
    assert len(schemas) == 1, schemas  # one schema, whoever wrote the epoch (timestamps: INT64 micros)
    written = pa.concat_tables(pq.read_table(e).replace_schema_metadata(None) for e in epochs)
    assert written.sort_by([("window_start", "ascending"), ("auction", "ascending")]).equals(small)

    monkeypatch.setattr(execute, "SMALL_EPOCH_ROWS", -1)  # every epoch compiled and written by Spark
    reference, compiled = _windows(spark, tmp_path / "b")
    assert compiled > 0 and len(uncombined) == 5
    assert small.equals(reference)
