"""Eddyline's Nexmark queries against native Spark Structured Streaming and PyFlink, on one fixed
data set.

Issue #3. The data set is generated once as Parquet (``person/``, ``auction/``, ``bid/``, the
same number of files each; file ``k`` of every stream holds the events with global numbers in
``[k * E, (k + 1) * E)``, so name order is event-time order). Then, for each query:

* **Eddyline** runs ``examples/nexmark/qN.yaml`` with every ``nexmark`` source replaced by a
  ``files`` source over the matching directory (``max_files_per_epoch = F``), trigger 0, 2 lanes,
  a ``discard`` sink (``--sink files``: a Parquet files sink), until idle (so the end-of-stream
  epochs that flush open windows count);
* **Structured Streaming** runs the query written with the DataFrame API as close as possible to
  the Flink SQL of the nexmark project, ``readStream.parquet`` over the same directories with
  ``maxFilesPerTrigger = F``, ``withWatermark`` where it needs one, a ``noop`` sink (``--sink
  files``: Parquet, append), and ``trigger(availableNow=True)``. Where Spark rejects the query,
  every formulation tried is kept with Spark's exact error.
* **PyFlink** (issue #24) runs the nexmark project's Flink SQL (``flink_runner.py``, in its own
  virtualenv, one JVM for the whole run) in streaming mode, parallelism 2, on the CSV or
  JSON-lines copy (the ``apache-flink`` wheel has no Parquet format), with a ``blackhole`` sink
  (``--sink files``: JSON lines).

Issue #21: ``--formats parquet,csv,json`` runs the same comparison over CSV and JSON-lines copies
of the data set too (made once from the Parquet files: same names, same order, same mtimes;
timestamps as ``2026-01-01T00:00:00.000100Z``, read back by Spark to the same rows, checked).
Eddyline reads them with a ``files`` source of that ``format`` and the stream's ``schema``;
Structured Streaming with ``readStream.schema(...).csv(dir)`` / ``.json(dir)``. PyFlink runs
only on these copies; with PyFlink among ``--engines`` the CSV copy is added when no text format
was asked for.

Every engine is warmed first on a tiny prefix of the data (the first files of each stream) with
the same query, so JIT, codegen and Python workers are warm. The measured wall time runs from the
start of the first epoch / micro-batch to the end of the last one (progress timestamps); for
PyFlink, Flink's net runtime of the job (submission to end); events/s = the rows of the query's
input streams (the same count for all, from the data set's manifest) / that time. One
SparkSession, ``local[2]``, 2 shuffle partitions.

Usage::

    python bench/nexmark/run_nexmark.py                       # 2M events, Parquet + CSV
    python bench/nexmark/run_nexmark.py --formats parquet,csv,json        # and JSON lines
    python bench/nexmark/run_nexmark.py --events 200000 --queries q0,q5   # a quick check
    python bench/nexmark/run_nexmark.py --engines eddyline,spark          # without PyFlink
    python bench/nexmark/run_nexmark.py --sink files          # write the outputs and compare them

Writes ``bench/results/nexmark-<timestamp>.json`` (``queries``: the Parquet runs, as before;
``by_format``: the other formats' runs, shaped the same) and the generated tables inside the
``<!-- nexmark:start -->`` section of ``bench/RESULTS.md`` (prose around them is kept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
SPECS = (
    ROOT / "examples" / "nexmark"
)  # replaced in main() by the specs next to the imported eddyline
STREAMS = ("person", "auction", "bid")
FORMATS = ("parquet", "csv", "json")
FORMAT_NAMES = {"parquet": "Parquet", "csv": "CSV", "json": "JSON-lines"}
EXTENSIONS = {"parquet": "parquet", "csv": "csv", "json": "jsonl"}
#: how the text copies write timestamps (UTC, to the microsecond); Spark's default parser reads
#: this form back exactly, so neither engine is given a ``timestampFormat``
TEXT_TIMESTAMP = "%Y-%m-%dT%H:%M:%SZ"  # %S is "SS.ffffff" for microsecond timestamps
#: bump when the text copies are written differently, so cached copies are made again
TEXT_COPY_VERSION = 1
#: ``--engines`` names → the keys of each engine's results in a query entry
ENGINES = {"eddyline": "eddyline", "spark": "native", "flink": "flink"}
ENGINE_NAMES = {"eddyline": "Eddyline", "native": "Spark SS", "flink": "PyFlink"}
SINKS = ("discard", "files")
#: PyFlink, installed by the benchmark into its own virtualenv (its pins clash with PySpark's)
FLINK_PACKAGE = "apache-flink==2.3.0"
#: the formats the apache-flink wheel reads (its lib/ has flink-csv and flink-json, no parquet)
FLINK_FORMATS = ("csv", "json")
FLINK_PARALLELISM = 2

sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(HERE))
import flink_runner  # noqa: E402
import results_io  # noqa: E402  (its digest helpers import nothing from PyFlink)
from run_bench import _lane_medians, _ts, cached_data_set, save_manifest, write_section  # noqa: E402  (the issue #2 benchmark's helpers)


# ----------------------------------------------------------------------------- the data set
def generate(spark: Any, data: Path, events: int, files: int, rate: float) -> dict[str, Any]:
    """Write the data set (or reuse it when the manifest matches); returns the manifest."""
    import pyarrow.parquet as pq

    from eddyline.io.nexmark import Nexmark, _stream_events_before, nexmark_frame

    wanted = {"events": events, "files": files, "rate": rate}
    cached = cached_data_set(data, wanted)
    if cached is not None:
        return cached
    per_file = -(-events // files)
    t0 = time.perf_counter()
    rows: dict[str, list[int]] = {}
    base = time.time() - 3600  # increasing mtimes in name order: Spark's file source orders by them
    for stream in STREAMS:
        # One Spark job per stream, then sliced by event number: row i is the stream's i-th event.
        table = nexmark_frame(
            spark, Nexmark(stream=stream, rate=rate, unpaced=True), 0, events, 2
        ).toArrow()
        (data / stream).mkdir(parents=True)
        rows[stream] = []
        for k in range(files):
            lo = _stream_events_before(stream, min(k * per_file, events))
            hi = _stream_events_before(stream, min((k + 1) * per_file, events))
            path = data / stream / f"{k:05d}.parquet"
            pq.write_table(table.slice(lo, hi - lo), path)
            os.utime(path, (base + k, base + k))
            rows[stream].append(hi - lo)
        assert sum(rows[stream]) == table.num_rows
    manifest = {
        **wanted,
        "events_per_file": per_file,
        "rows": rows,
        "generate_s": round(time.perf_counter() - t0, 1),
    }
    return save_manifest(data, manifest)


def warm_copy(root: Path, files: int, fmt: str = "parquet") -> Path:
    """The first ``files`` files of each stream under ``root``, for warm-up runs."""
    warm = root / "warm"
    ext = EXTENSIONS[fmt]
    for stream in STREAMS:
        (warm / stream).mkdir(parents=True, exist_ok=True)
        for k in range(files):
            target = warm / stream / f"{k:05d}.{ext}"
            if not target.exists():
                shutil.copy2(root / stream / f"{k:05d}.{ext}", target)
    return warm


def read_text(reader: Any, fmt: str, path: str) -> Any:
    """A text copy through Spark's reader (batch or streaming) with its default options:
    PERMISSIVE, no header, timestamps by Spark's default parser. The one place both the check of
    the copy and the native runs read it, so the check covers what the benchmark reads."""
    return reader.csv(path) if fmt == "csv" else reader.json(path)


def text_copy(spark: Any, data: Path, manifest: dict[str, Any], fmt: str) -> dict[str, Any]:
    """A ``fmt`` (``csv`` or ``json``) copy of the Parquet data set in ``data/fmt/`` (made once,
    then reused): the same streams, file names and row order, each file with its Parquet file's
    mtime. Read back by Spark with the stream's schema, it must give the Parquet rows (count and
    ``sum(hash(*))`` per stream), or the run stops. Returns the copy's record (``copy.json``)."""
    from eddyline.io.nexmark import nexmark_schema

    root = data / fmt
    marker = root / "copy.json"
    if marker.exists():
        done = json.loads(marker.read_text())
        if done.get("version") == TEXT_COPY_VERSION:
            return {**done, "reused": True}
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    for stream in STREAMS:
        (root / stream).mkdir(parents=True)
        for k in range(manifest["files"]):
            source = data / stream / f"{k:05d}.parquet"
            target = root / stream / f"{k:05d}.{EXTENSIONS[fmt]}"
            _write_text(source, target, fmt)
            mtime = source.stat().st_mtime
            os.utime(target, (mtime, mtime))
    write_s = time.perf_counter() - t0
    checks: dict[str, Any] = {}
    for stream in STREAMS:
        ddl = nexmark_schema(stream)
        names = spark.createDataFrame([], ddl).columns
        parquet = _digest(spark.read.parquet(str(data / stream)).select(*names))
        text = _digest(read_text(spark.read.schema(ddl), fmt, str(root / stream)))
        if text != parquet:
            raise SystemExit(
                f"the {fmt} copy of {stream} does not read back as the Parquet rows: "
                f"(rows, sum(hash)) {text} against {parquet}; see {root / stream}"
            )
        checks[stream] = {"rows": parquet[0], "sum_hash": parquet[1]}
    done = {
        "version": TEXT_COPY_VERSION,
        "format": fmt,
        "write_s": round(write_s, 1),
        "check_s": round(time.perf_counter() - t0 - write_s, 1),
        "mb": round(sum(f.stat().st_size for s in STREAMS for f in (root / s).iterdir()) / 1e6, 1),
        "checked": checks,
    }
    marker.write_text(json.dumps(done, indent=2))
    return done


def _write_text(source: Path, target: Path, fmt: str) -> None:
    """One Parquet file as CSV (no header; unquoted values, or every string quoted if some value
    must be) or as JSON lines, timestamps in :data:`TEXT_TIMESTAMP`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pq.read_table(source)
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            utc = table.column(i).cast(pa.timestamp("us", tz="UTC"))
            table = table.set_column(i, field.name, pc.strftime(utc, format=TEXT_TIMESTAMP))
    if fmt == "csv":
        try:  # plain values, as Spark's own CSV writer would write these
            pacsv.write_csv(
                table, target, pacsv.WriteOptions(include_header=False, quoting_style="none")
            )
        except pa.ArrowInvalid:  # a value holds a comma, quote or line break: quote strings
            pacsv.write_csv(
                table, target, pacsv.WriteOptions(include_header=False, quoting_style="needed")
            )
        return
    names = table.column_names
    columns = [c.to_pylist() for c in table.columns]
    with target.open("w", encoding="utf-8") as f:
        f.writelines(
            json.dumps(dict(zip(names, row, strict=True)), separators=(",", ":")) + "\n"
            for row in zip(*columns, strict=True)
        )


def _digest(df: Any) -> tuple[int, int]:
    """(rows, sum of Spark's ``hash`` of every row)."""
    row = df.selectExpr("count(*) AS n", "coalesce(sum(hash(*)), 0) AS h").first()
    return int(row["n"]), int(row["h"])


def code_version() -> dict[str, Any]:
    """Which Eddyline ran: its source tree, the commit, and whether the tree had local changes.

    To measure a commit while others edit the working tree, run from an exported copy:
    ``git archive HEAD | tar -x -C SNAP && git rev-parse HEAD > SNAP/.commit`` and
    ``PYTHONPATH=SNAP python bench/nexmark/run_nexmark.py`` (Spark's Python workers inherit it).
    """
    import subprocess

    import eddyline

    root = Path(eddyline.__file__).resolve().parents[1]
    out: dict[str, Any] = {"root": str(root)}
    try:
        git = ["git", "-C", str(root)]
        out["commit"] = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            [*git, "status", "--porcelain", "--", "eddyline", "examples"],
            capture_output=True,
            text=True,
            check=True,
        )
        out["local_changes"] = bool(status.stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        marker = root / ".commit"
        out["commit"] = marker.read_text().strip() if marker.exists() else None
        out["local_changes"] = False if marker.exists() else None
    return out


def worker_eddyline(spark: Any) -> set[str]:
    """Where the Python workers import eddyline from (their sys.path starts with the cwd)."""

    def where(_: Any) -> Any:
        import eddyline

        yield str(Path(eddyline.__file__).resolve().parents[1])

    n = spark.sparkContext.defaultParallelism
    return set(spark.sparkContext.parallelize(range(n), n).mapPartitions(where).collect())


def spec_streams(raw: dict[str, Any]) -> list[str]:
    return sorted({s["nexmark"]["stream"] for s in raw["sources"] if "nexmark" in s})


# ----------------------------------------------------------------------------- Eddyline
def eddyline_spec(
    query: str,
    data: Path,
    per_epoch: int,
    lanes: int,
    out: Path,
    fmt: str = "parquet",
    sink: str = "files",
) -> dict[str, Any]:
    import yaml

    from eddyline.io.nexmark import nexmark_schema

    raw = yaml.safe_load((SPECS / f"{query}.yaml").read_text())
    raw["trigger"] = 0
    raw["lanes"] = lanes
    for src in raw["sources"]:
        stream = src.pop("nexmark")["stream"]
        src["files"] = {"path": str(data / stream), "format": fmt}
        if per_epoch:  # 0: no cap, the engine sizes its epochs by the backlog
            src["files"]["max_files_per_epoch"] = per_epoch
        if fmt != "parquet":  # text files need their schema (Spark DDL)
            src["files"]["schema"] = nexmark_schema(stream)
    for target in raw["sinks"]:
        target.pop("files", None)
        target.pop("console", None)
        target.pop("memory", None)
        if sink == "discard":  # computes and counts the output, keeps none (Spark's noop)
            target["discard"] = {}
        else:
            target["files"] = {"path": str(out / target["name"]), "format": "parquet"}
    return raw


def run_eddyline(spark: Any, raw: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run the network ``raw`` until idle, checkpointing under ``tmp``."""
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    spec = load_spec(raw)
    progress = tmp / "progress.jsonl"
    t0 = time.perf_counter()
    with ProgressReporter(live=False, json_path=str(progress)) as rep:
        summary = Engine(spec, spark, str(tmp / "ckpt"), reporter=rep).run(until_idle=True)
    outer = time.perf_counter() - t0
    records = [json.loads(x) for x in progress.read_text().splitlines()]
    first, last = records[0], records[-1]
    # A record's timestamp is taken when its epoch has committed.
    wall = _ts(last["timestamp"]) - (
        _ts(first["timestamp"]) - first["durationMs"]["triggerExecution"] / 1000
    )
    data_epochs = [r for r in records if r["numInputRows"] > 0]
    return {
        "engine": "eddyline",
        # (start, end) of each data epoch in epoch seconds, for --profile
        "data_epoch_windows": [(_ts(r["timestamp"]) - r["durationMs"]["triggerExecution"] / 1000, _ts(r["timestamp"]))
                               for r in data_epochs],
        "wall_s": wall,
        "outer_s": outer,
        "engine_input_rows": summary.input_rows,
        "output_rows": sum(summary.output_rows.values()),
        "dead_letters": summary.dead_letters,
        "epochs": len(records),
        "data_epochs": len(data_epochs),
        "batch_ms": [r["durationMs"]["triggerExecution"] for r in records],
        "median_ms": statistics.median(r["durationMs"]["triggerExecution"] for r in data_epochs),
        "no_input_ms": round(
            sum(r["durationMs"]["triggerExecution"] for r in records if r["numInputRows"] == 0), 1
        ),
        "breakdown_ms": {
            k: statistics.median(r["durationMs"][k] for r in data_epochs)
            for k in ("planning", "execution", "publish", "commit")
        },
        "breakdown_total_ms": {
            k: round(sum(r["durationMs"][k] for r in records), 1)
            for k in ("triggerExecution", "planning", "execution", "publish", "commit")
        },
        "operators": _operator_profile(records),
        "lane_ms": _lane_medians(data_epochs)
        if any(r["stateOperators"] for r in data_epochs)
        else {},
        "records": [_compact(r) for r in records],
    }


def _operator_profile(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stateful step over the run: lane time summed over epochs (per epoch the slower lane,
    since lanes run in parallel), rows received, peak state, state bytes written, cache use."""
    ops: dict[str, dict[str, Any]] = {}
    for r in records:
        for op in r["stateOperators"]:
            o = ops.setdefault(
                op["operatorName"],
                {
                    "receive": 0.0,
                    "load": 0.0,
                    "kernel": 0.0,
                    "write": 0.0,
                    "lane_critical_ms": 0.0,
                    "rows_in": 0,
                    "peak_state_rows": 0,
                    "peak_state_mb": 0.0,
                    "state_written_mb": 0.0,
                    "cache_hits": 0,
                    "cache_misses": 0,
                },
            )
            lanes = op["customMetrics"]["laneMs"]
            for k in ("receive", "load", "kernel", "write"):
                o[k] += max((lane.get(k, 0.0) for lane in lanes), default=0.0)
            o["lane_critical_ms"] += max((sum(lane.values()) for lane in lanes), default=0.0)
            o["rows_in"] += op["numRowsUpdated"]
            o["peak_state_rows"] = max(o["peak_state_rows"], op["numRowsTotal"])
            o["peak_state_mb"] = max(o["peak_state_mb"], op["memoryUsedBytes"] / 1e6)
            o["state_written_mb"] += op["customMetrics"].get("stateBytesWritten", 0) / 1e6
            o["cache_hits"] += op["customMetrics"].get("cacheHits", 0)
            o["cache_misses"] += op["customMetrics"].get("cacheMisses", 0)
    for o in ops.values():
        for k in (
            "receive",
            "load",
            "kernel",
            "write",
            "lane_critical_ms",
            "peak_state_mb",
            "state_written_mb",
        ):
            o[k] = round(o[k], 1)
    return ops


def _compact(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "batchId": r["batchId"],
        "numInputRows": r["numInputRows"],
        "durationMs": r["durationMs"],
        "endOfStream": r.get("endOfStream"),
        "stateOperators": [
            {
                "operatorName": op["operatorName"],
                "numRowsTotal": op["numRowsTotal"],
                "numRowsUpdated": op["numRowsUpdated"],
                "memoryUsedBytes": op["memoryUsedBytes"],
                "laneMs": op["customMetrics"]["laneMs"],
                "stateBytesWritten": op["customMetrics"].get("stateBytesWritten"),
                "cacheHits": op["customMetrics"].get("cacheHits"),
                "cacheMisses": op["customMetrics"].get("cacheMisses"),
                "laneInputRows": op["customMetrics"]["laneInputRows"],
            }
            for op in r["stateOperators"]
        ],
        "sinks": r["sinks"],
    }


# ----------------------------------------------------------------------------- native Spark
Attempt = tuple[str, str, Callable[[], Any]]  # (formulation, output mode, builder of the frame)


def native_attempts(query: str, S: Callable[[str], Any]) -> list[Attempt]:
    """The query in the DataFrame API, after the nexmark project's Flink SQL; alternatives
    follow the Flink-like form only where Spark rejects it. ``S(stream)`` is the stream's
    ``readStream`` frame (one per stream and query, so a self-join reads one source)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def wm(stream: str, alias: str) -> Any:
        return S(stream).withWatermark("date_time", "0 seconds").alias(alias)

    def bid_cols(df: Any) -> Any:
        return df.select("auction", "bidder", "price", "date_time", "extra")

    def lifetime_join() -> Any:  # q4, q6, q9: bids within their auction's lifetime
        A, B = wm("auction", "A"), wm("bid", "B")
        return A.join(
            B, F.expr("A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires")
        )

    if query == "q0":
        return [("flink", "append", lambda: bid_cols(S("bid")))]
    if query == "q1":
        return [
            (
                "flink",
                "append",
                lambda: S("bid").selectExpr(
                    "auction", "bidder", "0.908 * price AS price", "date_time", "extra"
                ),
            )
        ]
    if query == "q2":
        return [
            (
                "flink",
                "append",
                lambda: S("bid").where("auction % 123 = 0").select("auction", "price"),
            )
        ]
    if query == "q3":

        def q3() -> Any:
            A = S("auction").alias("A").where("A.category = 10")
            P = S("person").alias("P").where("P.state IN ('OR', 'ID', 'CA')")
            return A.join(P, F.expr("A.seller = P.id")).select(
                "P.name", "P.city", "P.state", "A.id"
            )

        return [("flink", "append", q3)]
    if query == "q4":

        def q4() -> Any:
            q = lifetime_join().groupBy("A.id", "A.category").agg(F.max("B.price").alias("final"))
            return q.groupBy("category").agg(F.avg("final").alias("average"))

        return [("flink", mode, q4) for mode in ("append", "update", "complete")]
    if query == "q5":

        def counts() -> Any:
            return (
                S("bid")
                .withWatermark("date_time", "0 seconds")
                .groupBy(F.window("date_time", "10 seconds", "2 seconds"), "auction")
                .agg(F.count(F.lit(1)).alias("num"))
            )

        def q5() -> Any:
            c = counts().alias("C")
            m = c.groupBy("window").agg(F.max("num").alias("maxn")).alias("M")
            return c.join(m, F.expr("C.window = M.window AND C.num >= M.maxn")).select(
                "C.auction",
                "C.num",
                F.col("C.window.start").alias("starttime"),
                F.col("C.window.end").alias("endtime"),
            )

        def q5_window_time() -> Any:  # the max per window as a chained time-window aggregation
            c = counts().alias("C")
            m = (
                c.groupBy(F.window(F.window_time("window"), "2 seconds").alias("w2"))
                .agg(F.max("num").alias("maxn"), F.max("window").alias("mwindow"))
                .alias("M")
            )
            return c.join(m, F.expr("C.window = M.mwindow AND C.num >= M.maxn")).select(
                "C.auction",
                "C.num",
                F.col("C.window.start").alias("starttime"),
                F.col("C.window.end").alias("endtime"),
            )

        return [("flink", "append", q5), ("flink, max via window_time()", "append", q5_window_time)]
    if query == "q6":

        def q6() -> Any:
            q = (
                lifetime_join()
                .groupBy("A.id", "A.seller")
                .agg(F.max("B.price").alias("final"), F.max("B.date_time").alias("date_time"))
            )
            w = Window.partitionBy("seller").orderBy("date_time").rowsBetween(-10, 0)
            return q.select("seller", F.avg("final").over(w).alias("avg"))

        return [("flink", "append", q6), ("flink", "update", q6)]
    if query == "q7":

        def q7() -> Any:
            B = wm("bid", "B")
            B1 = (
                wm("bid", "X")
                .groupBy(F.window("date_time", "10 seconds"))
                .agg(F.max("price").alias("maxprice"))
                .select("maxprice", F.window_time("window").alias("wtime"))
                .alias("B1")
            )
            # Flink: B.dateTime BETWEEN window_end - 10 s AND window_end; window_time = end - 1 µs.
            cond = (
                "B.price = B1.maxprice AND B.date_time BETWEEN B1.wtime - INTERVAL '9.999999' SECOND"
                " AND B1.wtime + INTERVAL '0.000001' SECOND"
            )
            return bid_cols(B.join(B1, F.expr(cond)).select("B.*"))

        return [("flink", "append", q7)]
    if query == "q8":

        def q8() -> Any:
            P = (
                wm("person", "p")
                .groupBy("id", "name", F.window("date_time", "10 seconds"))
                .agg(F.count(F.lit(1)).alias("n"))
                .alias("P")
            )
            A = (
                wm("auction", "a")
                .groupBy("seller", F.window("date_time", "10 seconds"))
                .agg(F.count(F.lit(1)).alias("n"))
                .alias("A")
            )
            return P.join(A, F.expr("P.id = A.seller AND P.window = A.window")).select(
                "P.id", "P.name", F.col("P.window.start").alias("starttime")
            )

        def q8_join_dedup() -> Any:  # window join, then one row per (person, window)
            P = wm("person", "P").select(
                "id", "name", F.window("date_time", "10 seconds").alias("pw")
            )
            A = wm("auction", "A").select("seller", F.window("date_time", "10 seconds").alias("aw"))
            j = P.join(A, F.expr("id = seller AND pw = aw"))
            return j.dropDuplicates(["id", "pw"]).select(
                "id", "name", F.col("pw.start").alias("starttime")
            )

        return [("flink", "append", q8), ("window join + dropDuplicates", "append", q8_join_dedup)]
    if query == "q9":

        def q9() -> Any:
            w = Window.partitionBy("A.id").orderBy(
                F.col("B.price").desc(), F.col("B.date_time").asc()
            )
            j = lifetime_join().select(
                "A.*",
                "B.auction",
                "B.bidder",
                "B.price",
                F.col("B.date_time").alias("bid_date_time"),
                F.row_number().over(w).alias("rownum"),
            )
            return j.where("rownum <= 1").drop("rownum")

        def q9_max_by() -> Any:  # the winning bid as an aggregate over the join, per auction
            j = lifetime_join()
            win = F.max_by(
                F.struct(
                    "B.auction", "B.bidder", "B.price", F.col("B.date_time").alias("bid_date_time")
                ),
                F.struct(F.col("B.price"), -F.unix_micros("B.date_time")),
            )
            cols = [
                "id",
                "item_name",
                "description",
                "initial_bid",
                "reserve",
                "date_time",
                "expires",
                "seller",
                "category",
            ]
            return (
                j.groupBy(*[F.col(f"A.{c}") for c in cols]).agg(win.alias("w")).select(*cols, "w.*")
            )

        return [("flink", "append", q9), ("join + max_by aggregate", "append", q9_max_by)]
    if query == "q11":

        def q11() -> Any:
            s = (
                S("bid")
                .withWatermark("date_time", "0 seconds")
                .groupBy("bidder", F.session_window("date_time", "10 seconds"))
                .agg(F.count(F.lit(1)).alias("bid_count"))
            )
            return s.select(
                "bidder",
                "bid_count",
                F.col("session_window.start").alias("starttime"),
                F.col("session_window.end").alias("endtime"),
            )

        return [("flink", "append", q11)]
    raise ValueError(f"no native formulation for {query}")


def run_native(
    spark: Any,
    query: str,
    data: Path,
    per_epoch: int,
    tmp: Path,
    schemas: dict[str, Any],
    only: int | None = None,
    fmt: str = "parquet",
    sink_kind: str = "files",
) -> dict[str, Any]:
    """The first formulation Spark accepts (or only formulation ``only``); with every error.
    ``schemas``: each stream's schema for the reader of ``fmt``. ``sink_kind`` ``files``: a
    Parquet sink where the output mode is append (``noop`` otherwise); ``discard``: ``noop``."""
    readers: dict[str, Any] = {}

    def S(stream: str) -> Any:
        if stream not in readers:
            reader = spark.readStream.schema(schemas[stream])
            if per_epoch:  # 0: Spark's default, every file waiting in one micro-batch
                reader = reader.option("maxFilesPerTrigger", per_epoch)
            path = str(data / stream)
            readers[stream] = (
                reader.parquet(path) if fmt == "parquet" else read_text(reader, fmt, path)
            )
        return readers[stream]

    tried = []
    for i, (form, mode, build) in enumerate(native_attempts(query, S)):
        if only is not None and i != only:
            continue
        readers.clear()
        sink = "parquet" if mode == "append" and sink_kind == "files" else "noop"
        try:
            writer = (
                build()
                .writeStream.outputMode(mode)
                .option("checkpointLocation", str(tmp / f"ckpt-{i}"))
            )
            if sink == "parquet":
                writer = writer.format("parquet").option("path", str(tmp / f"out-{i}"))
            else:
                writer = writer.format("noop")
            t0 = time.perf_counter()
            q = writer.trigger(availableNow=True).start()
            q.awaitTermination()
            outer = time.perf_counter() - t0
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
        except Exception as e:  # noqa: BLE001 - Spark's analysis errors are what we record
            tried.append({"formulation": form, "mode": mode, "error": _error_text(e)})
            continue
        progress = list(q.recentProgress)
        first, last = progress[0], progress[-1]
        wall = (
            _ts(last["timestamp"])
            + last["durationMs"]["triggerExecution"] / 1000
            - _ts(first["timestamp"])
        )
        data_batches = [p for p in progress if p["numInputRows"] > 0]
        out_rows = (
            spark.read.parquet(str(tmp / f"out-{i}")).count()
            if sink == "parquet"
            else sum(max(p["sink"]["numOutputRows"], 0) for p in progress)
        )
        return {
            "engine": "spark-structured-streaming",
            "data_epoch_windows": [(_ts(p["timestamp"]), _ts(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000)
                                   for p in data_batches],
            "attempt": i,
            "formulation": form,
            "mode": mode,
            "sink": sink,
            "tried": tried,
            "wall_s": wall,
            "outer_s": outer,
            "engine_input_rows": sum(p["numInputRows"] for p in progress),
            "output_rows": out_rows,
            "epochs": len(progress),
            "data_epochs": len(data_batches),
            "batch_ms": [p["durationMs"]["triggerExecution"] for p in progress],
            "median_ms": statistics.median(
                p["durationMs"]["triggerExecution"] for p in data_batches
            ),
            "no_input_ms": sum(
                p["durationMs"]["triggerExecution"] for p in progress if p["numInputRows"] == 0
            ),
            "breakdown_ms": {
                k: statistics.median(p["durationMs"].get(k, 0) for p in data_batches)
                for k in (
                    "latestOffset",
                    "getBatch",
                    "queryPlanning",
                    "addBatch",
                    "walCommit",
                    "commitOffsets",
                )
            },
            "peak_state_rows": max(
                (sum(op["numRowsTotal"] for op in p["stateOperators"]) for p in progress), default=0
            ),
            "peak_state_mb": round(
                max(
                    (sum(op["memoryUsedBytes"] for op in p["stateOperators"]) for p in progress),
                    default=0,
                )
                / 1e6,
                1,
            ),
        }
    return {
        "engine": "spark-structured-streaming",
        "tried": tried,
        "error": tried[0]["error"] if tried else "no attempt",
    }


# ----------------------------------------------------------------------------- PyFlink
def flink_venv() -> Path:
    """Where the PyFlink virtualenv lives: ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/eddyline-bench/flink-venv``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "eddyline-bench" / "flink-venv"


def flink_python() -> Path:
    """The PyFlink virtualenv's interpreter; the virtualenv is made (``python -m venv``, then
    ``pip install`` :data:`FLINK_PACKAGE`) on first use, or when the pinned package changed."""
    venv = flink_venv()
    python = venv / "bin" / "python"
    marker = venv / "eddyline-bench.json"
    installed = json.loads(marker.read_text()) if marker.exists() else {}
    if python.exists() and installed.get("package") == FLINK_PACKAGE:
        return python
    print(f"PyFlink: installing {FLINK_PACKAGE} into {venv} (once; a few minutes)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, FLINK_PACKAGE], check=True)
    now = datetime.now(UTC).isoformat()
    marker.write_text(json.dumps({"package": FLINK_PACKAGE, "installed": now}))
    return python


class FlinkRunner:
    """``flink_runner.py --serve`` in the PyFlink virtualenv: one process (one JVM) for the whole
    benchmark, started on first use; each request is one Flink job. Its log (PyFlink's stderr and
    anything it prints) goes to ``log``."""

    def __init__(self, log: Path, timeout_s: float) -> None:
        self.log_path, self.timeout_s = log, timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.version: str | None = None
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def start(self) -> None:
        python = flink_python()
        # The runner needs nothing of this environment's Python (nor Spark's settings).
        drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a", encoding="utf-8")
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "flink_runner.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=str(self.log_path.parent),
            start_new_session=True,  # its own process group: the JVM goes with it on a kill
        )
        self.answers = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, log), daemon=True).start()
        ready = self._answer()
        if not ready.get("ready"):
            raise SystemExit(
                f"the Flink runner did not start: {ready.get('error')}; see {self.log_path}"
            )
        self.version = ready["flink_version"]
        print(f"PyFlink {self.version} ready ({python}; log {self.log_path})", flush=True)

    def _read(self, proc: subprocess.Popen[str], log: Any) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(flink_runner.RESULT_MARK):
                self.answers.put(json.loads(line[len(flink_runner.RESULT_MARK) :]))
            else:
                log.write(line)
                log.flush()
        self.answers.put(None)

    def _answer(self) -> dict[str, Any]:
        try:
            answer = self.answers.get(timeout=self.timeout_s)
        except queue.Empty:
            self.close(kill=True)
            return {
                "error": f"no answer from the Flink runner within {self.timeout_s:.0f} s (killed)"
            }
        if answer is None:
            self.close(kill=True)
            return {"error": f"the Flink runner exited; see {self.log_path}"}
        return answer

    def run(self, **request: Any) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return {"engine": "pyflink", **self._answer()}

    def close(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if not kill:
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.close()
                proc.wait(timeout=120)
                return
            except (OSError, subprocess.TimeoutExpired):
                pass
        os.killpg(proc.pid, signal.SIGKILL)  # the runner's own group: it and its JVM
        proc.wait()


def output_digest(query: str, out: Path) -> dict[str, Any]:
    """The digest (``flink_runner.Digest``) of a Parquet output directory, over the query's
    columns (``flink_runner.OUTPUT_COLUMNS``: Eddyline's names; Spark's window columns are
    ``starttime``/``endtime``); an Eddyline ``_diff`` column is the row's weight, so a changelog
    gives the digest of the rows it leaves."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = flink_runner.OUTPUT_COLUMNS.get(query)
    if columns is None:
        return {}
    aliases = {
        "window_start": "starttime",
        "window_end": "endtime",
        "session_start": "starttime",
        "session_end": "endtime",
    }
    digest = flink_runner.Digest()
    for path in sorted(out.rglob("*.parquet")):
        if any(part.startswith(("_", ".")) for part in path.relative_to(out).parts):
            continue  # _spark_metadata, staging
        table = pq.read_table(path)
        values = []
        for c in columns:
            name = c if c in table.column_names else aliases.get(c, c)
            if name not in table.column_names:
                return {"digest_error": f"no column {c} in {table.column_names}"}
            col = table.column(name)
            if pa.types.is_timestamp(col.type):  # → microseconds since the epoch
                col = col.cast(pa.timestamp("us"), safe=False).cast(pa.int64())
            values.append(col.to_pylist())
        weights = (
            table.column("_diff").to_pylist()
            if "_diff" in table.column_names
            else [1] * table.num_rows
        )
        for row, weight in zip(zip(*values, strict=True), weights, strict=True):
            digest.add(row, weight)
    return {"final_rows": digest.rows, "digest": digest.as_dict()}


def _error_text(e: BaseException) -> str:
    """Spark's message without the plan dump and stack trace that follow it."""
    text = str(e).strip()
    for marker in ("\n\nJVM stacktrace", "\nJVM stacktrace", ";;\n", "\n== "):
        if marker in text:
            text = text[: text.index(marker)]
    lines = [x for x in text.splitlines() if x.strip()]
    return " ".join(lines[:3]).strip()


# ----------------------------------------------------------------------------- report
def _cell(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "–"


def _short(error: str) -> str:
    """Spark's error class, or the first clause of its message (Flink's without the Java
    exception's class name)."""
    import re

    m = re.search(r"\[([A-Z_.]+)\]", error)
    if m:
        return f"`{m.group(1)}`"
    error = re.sub(r"^(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error): ", "", error)
    text = re.split(r"(?<=[a-z])\. |; |, only ", error)[0]
    return (text if len(text) < 110 else text[:107] + "…").replace("|", "\\|")


def format_entries(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A result's query entries by format, in the order run. Files written before issue #21 have
    only ``queries``, the Parquet runs."""
    by = {"parquet": result["queries"]} if result.get("queries") else {}
    by |= result.get("by_format", {})
    order = result.get("formats", ["parquet"])
    return {f: by[f] for f in sorted(by, key=lambda f: order.index(f) if f in order else 99)}


def _k(rate: float | None) -> str:
    return f"{rate / 1000:,.0f}" if rate else "–"


def _has_flink(by: dict[str, dict[str, Any]]) -> bool:
    """Whether PyFlink was among the engines (results before issue #24 have no ``flink``)."""
    return any("flink" in r for entries in by.values() for r in entries.values())


def _ratio(value: float | None) -> str:
    return f"**{value:.2f}**" if value is not None else "–"


def formats_md(by: dict[str, dict[str, Any]]) -> str:
    """The ratios per query and format, K events/s (every run: Eddyline's / Spark's [/ PyFlink's])."""
    flink = _has_flink(by)
    sides = ("eddyline", "native", "flink") if flink else ("eddyline", "native")
    head = ["query"]
    for fmt in by:
        name = FORMAT_NAMES[fmt]
        if flink:
            head += [f"{name}: Eddyline", "Spark SS", "PyFlink", "E/S", "E/F"]
            head.append("every run E / S / F")
        else:
            head += [f"{name}: Eddyline", "Spark SS", "ratio", "every run E / S"]
    width = 6 if flink else 4
    lines = [
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * width * len(by),
    ]
    below: dict[str, list[str]] = {fmt: [] for fmt in by}
    below_flink: dict[str, list[str]] = {  # the formats PyFlink ran on
        fmt: []
        for fmt, entries in by.items()
        if any(r.get("ratio_flink") for r in entries.values())
    }
    queries = list(dict.fromkeys(q for entries in by.values() for q in entries))
    for q in queries:
        cells = [q]
        for fmt, entries in by.items():
            r = entries.get(q)
            if r is None:
                cells += ["–"] * width
                continue
            e, n, f = (r.get(k, {}) for k in ("eddyline", "native", "flink"))
            ratio, ratio_flink = r.get("ratio"), r.get("ratio_flink")
            if ratio is not None and ratio < 1.0:
                below[fmt].append(f"{q} {ratio:.2f}")
            if ratio_flink is not None and ratio_flink < 1.0 and fmt in below_flink:
                below_flink[fmt].append(f"{q} {ratio_flink:.2f}")
            runs = " / ".join(
                ", ".join(_k(x) for x in r.get(side, {}).get("runs_events_per_s", [])) or "–"
                for side in sides
            )
            cells += [
                _k(e.get("events_per_s")) if "wall_s" in e else ("failed" if e else "–"),
                _k(n.get("events_per_s")) if "wall_s" in n else "–",
            ]
            if flink:
                cells.append(_k(f.get("events_per_s")) if "wall_s" in f else "–")
            cells.append(_ratio(ratio))
            if flink:
                cells.append(_ratio(ratio_flink))
            cells.append(runs)
        lines.append("| " + " | ".join(cells) + " |")
    verdicts = []
    for peer, lows in (("Spark", below), ("PyFlink", below_flink)):
        if peer == "PyFlink" and not flink:
            continue
        ratio_name = "ratio" if not flink else ("E/S" if peer == "Spark" else "E/F")
        if any(lows.values()):
            verdicts.append(
                f"Eddyline slower than {peer} ({ratio_name} below 1.0): "
                + "; ".join(
                    f"{FORMAT_NAMES[fmt]} {', '.join(b) if b else 'none'}"
                    for fmt, b in lows.items()
                )
                + "."
            )
        elif flink:
            verdicts.append(
                f"{ratio_name} of 1.0 or more on every query that {peer} runs, in every format."
            )
        else:
            verdicts.append("Ratio of 1.0 or more on every query that Spark runs, in every format.")
    notes = [
        n for q in queries for n in output_notes(q, {f: e[q] for f, e in by.items() if q in e})[0]
    ]
    rows = (
        "Output rows differ between formats: " + "; ".join(notes) + "."
        if notes
        else "Each engine wrote the same number of rows for a query in every format."
    )
    return "\n".join(lines) + f"\n\n{' '.join(verdicts)} {rows}"


def _not_run(r: dict[str, Any], spark: bool) -> str:
    """The cell of an engine that has no rate for a query."""
    if not r:
        return "–"
    if r.get("not_run"):
        return "not run"
    if spark:
        return "not expressible — " + "; ".join(
            f"{t['mode']}: {_short(t['error'])}" for t in r.get("tried", [])
        )
    errors = "; ".join(_short(t["error"]) for t in r.get("tried", []))
    return "not expressible — " + (errors or _short(r.get("error", "?")))


def tables_md(result: dict[str, Any]) -> str:
    by = format_entries(result)
    flink = _has_flink(by)
    # With PyFlink, the first table is the first format it read (it reads no Parquet).
    with_flink = [
        f for f, entries in by.items() if any("wall_s" in r.get("flink", {}) for r in entries.values())
    ]
    main_format = with_flink[0] if with_flink else next(iter(by), "parquet")
    rows, errors, flink_errors, prof, agree = [], [], [], [], []
    for q, r in by.get(main_format, {}).items():
        e, n, f = (r.get(k, {}) for k in ("eddyline", "native", "flink"))
        ev = r["input_events"]
        if "wall_s" in n:
            nat = _cell(n["events_per_s"]) + (
                "" if n["formulation"] == "flink" else f" ({n['formulation']})"
            )
            nb = f"{n['data_epochs']}+{n['epochs'] - n['data_epochs']}"
            nms = f"{n['median_ms']:.0f}"
        else:
            nat = _not_run(n, spark=True)
            nb, nms = "–", "–"
        if "wall_s" in e:
            ecell, eb, ems = (
                _cell(e["events_per_s"]),
                f"{e['data_epochs']}+{e['epochs'] - e['data_epochs']}",
                f"{e['median_ms']:.0f}",
            )
        else:
            ecell, eb, ems = ("failed: " + _short(e["error"]) if e else "–"), "–", "–"
        sides = (e, n, f) if flink else (e, n)
        spread = " / ".join(
            ", ".join(f"{x / 1000:.0f}" for x in side.get("runs_events_per_s", [])) or "–"
            for side in sides
        )
        if flink:
            if "wall_s" in f:
                fcell = _cell(f["events_per_s"]) + (
                    "" if f["formulation"] == "nexmark" else f" ({f['formulation']})"
                )
            else:
                fcell = _not_run(f, spark=False)
            rows.append(
                f"| {q} | {', '.join(r['streams'])} | {ev:,} | {ecell} | {nat} | {fcell} | {_ratio(r.get('ratio'))} "
                f"| {_ratio(r.get('ratio_flink'))} | {spread} | {eb} / {nb} | {ems} / {nms} |"
            )
        else:
            rows.append(
                f"| {q} | {', '.join(r['streams'])} | {ev:,} | {ecell} | {nat} | {_ratio(r.get('ratio'))} | {spread} | {eb} / {nb} | {ems} / {nms} |"
            )
        for t in n.get("tried", []):
            errors.append(f"- **{q}** ({t['formulation']}, {t['mode']} mode): `{t['error']}`")
        for t in f.get("tried", []):
            flink_errors.append(f"- **{q}** ({t['formulation']}): `{t['error']}`")
        if "digest" in e:
            same = [
                name
                for key, name in (("native", "Spark"), ("flink", "PyFlink"))
                if r.get(key, {}).get("digest") == e["digest"]
            ]
            agree.append(f"{q}: {', '.join(same) if same else 'none'}")
        if "wall_s" in e:
            b = e["breakdown_total_ms"]
            ops = "; ".join(
                f"{name}: recv {o['receive']:.0f} / load {o['load']:.0f} / kernel {o['kernel']:.0f} / write {o['write']:.0f}"
                f" (peak state {o['peak_state_rows']:,} rows, {o['peak_state_mb']:.0f} MB; {o['state_written_mb']:.0f} MB written)"
                for name, o in e["operators"].items()
            )
            prof.append(
                f"| {q} | {b['triggerExecution'] / 1000:.1f} | {b['planning'] / 1000:.1f} | {b['execution'] / 1000:.1f} "
                f"| {(b['publish'] + b['commit']) / 1000:.1f} | {ops or '–'} |"
            )
    m = result["dataset"]
    v = result.get("eddyline", {})
    commit = f"Eddyline `{(v.get('commit') or '?')[:7]}`" + (
        " + local changes" if v.get("local_changes") else ""
    )
    head = (
        f"Run {result['when'][:16]} · {commit} · {m['events']:,} events ({result['rate']:,.0f} events/s of event time, "
        f"{m['events'] / result['rate']:.0f} s), {m['files']} files per stream, "
        + (f"{result['files_per_epoch']} files per stream per epoch (≈ {m['events_per_file'] * result['files_per_epoch']:,} "
           "events)" if result["files_per_epoch"] else "the backlog run: every file waits at the start, each engine "
           "chooses what an epoch reads")
        + " · best of "
        f"{result.get('repeat', 1)} runs per engine · whole run "
        f"{result['total_s'] / 60:.1f} min\n\n"
    )
    if "sink" in result or flink:
        pf = result.get("pyflink")
        head += (
            "Sink: "
            + (
                "discard (Eddyline `discard`, Spark `noop`, Flink `blackhole`)"
                if result.get("sink") == "discard"
                else "files (Parquet; PyFlink JSON lines)"
            )
            + (
                f" · PyFlink {pf['version']}: streaming mode, parallelism {pf['parallelism']}, local "
                "mini-cluster; its time is Flink's net runtime of the job (submission to end)"
                if isinstance(pf, dict)
                else ""
            )
            + "\n\n"
        )
    if list(by) != ["parquet"]:
        copies = result.get("text_copies", {})
        head += (
            "Formats: "
            + ", ".join(
                FORMAT_NAMES[f] + (f" ({copies[f]['mb']:,.0f} MB)" if f in copies else "")
                for f in by
            )
            + f". The first table is the {FORMAT_NAMES[main_format]} run"
            + (" (PyFlink reads no Parquet)" if flink and main_format != next(iter(by)) else "")
            + "; the second compares the formats (K events/s).\n\n"
        )
    if flink:
        table = (
            "| query | streams | input events | Eddyline events/s | Spark SS events/s | PyFlink events/s | E/S | E/F "
            "| every run, K events/s E / S / F | epochs (data+no-input) E / S | median data-epoch ms E / S |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
        )
    else:
        table = (
            "| query | streams | input events | Eddyline events/s | Spark SS events/s | ratio | every run, K events/s E / S "
            "| epochs (data+no-input) E / S | median data-epoch ms E / S |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
            + "\n".join(rows)
        )
    per_format = "\n\n" + formats_md(by) if list(by) != ["parquet"] else ""
    same_rows = (
        f"\n\nThe engines whose {FORMAT_NAMES[main_format]} output leaves the same rows as Eddyline's "
        "(digest of the rows, changelogs applied): " + "; ".join(agree) + "."
        if agree
        else ""
    )
    errs = (
        "\n\nSpark's errors, exactly (first lines), for each formulation tried:\n\n"
        + "\n".join(errors)
        if errors
        else ""
    )
    if flink_errors:
        errs += "\n\nFlink's errors, exactly, for each formulation tried:\n\n" + "\n".join(
            flink_errors
        )
    profile = (
        "\n\nEddyline"
        + (f" on {FORMAT_NAMES[main_format]}" if list(by) != ["parquet"] else "")
        + ", summed over the run (s): epoch total, driver planning, Spark execution (includes the "
        "lanes), publish + commit; per stateful step the lanes' time summed over epochs (ms, the slower lane "
        "of each epoch):\n\n| query | total | planning | execution | publish+commit | lanes (ms) |\n"
        "|---|---:|---:|---:|---:|---|\n" + "\n".join(prof)
    )
    return head + table + per_format + same_rows + errs + profile


SECTION_START, SECTION_END = "<!-- nexmark:start -->", "<!-- nexmark:end -->"
TABLE_START, TABLE_END = "<!-- nexmark-table:start -->", "<!-- nexmark-table:end -->"


def write_results_md(result: dict[str, Any]) -> None:
    """Replace the generated tables inside the nexmark section (the backlog run's: its own);
    create the section if absent."""
    if not result["files_per_epoch"]:
        write_section(
            ("<!-- nexmark-backlog:start -->", "<!-- nexmark-backlog:end -->"),
            ("<!-- nexmark-backlog-table:start -->", "<!-- nexmark-backlog-table:end -->"),
            tables_md(result),
            "### The backlog run (`run_nexmark.py --backlog`, issue #55)\n\n",
        )
        return
    write_section(
        (SECTION_START, SECTION_END),
        (TABLE_START, TABLE_END),
        tables_md(result),
        "## Nexmark queries (`bench/nexmark/run_nexmark.py`, issue #3)\n\nSee `bench/nexmark/README.md` for the method.\n\n",
    )


PROFILE_START, PROFILE_END = "<!-- nexmark-profile:start -->", "<!-- nexmark-profile:end -->"
PROFILE_TABLE_START, PROFILE_TABLE_END = "<!-- nexmark-profile-table:start -->", "<!-- nexmark-profile-table:end -->"


def profile_md(result: dict[str, Any]) -> str:
    """Where a data epoch goes, per query, format and engine, from a ``--profile`` run."""
    lines = [
        f"Run {result['when'][:16]} · Eddyline `{(result['eddyline'].get('commit') or '?')[:7]}` · "
        f"{result['files_per_epoch']} files per stream per epoch · the fastest of "
        f"{result['repeat']} runs per engine · medians over the data epochs, ms",
        "",
        "| query | format | engine | epoch | before its first job | Spark jobs | between and after them "
        "| the jobs' stages: wall ms (tasks' run time ms, tasks) | of which the lanes' own work |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    by_format = format_entries(result)
    for query in sorted({q for v in by_format.values() for q in v}, key=lambda q: int(q[1:])):
        for fmt, entries in by_format.items():
            for engine in ("eddyline", "native"):
                r = entries.get(query, {}).get(engine, {})
                p = r.get("profile")
                if not p:
                    continue
                stages = "; ".join(f"`{label}` {d['wall']:.0f} ({d['task_ms']:.0f}, {d['tasks']:g})"
                                   + (f" in {d['epochs']} of {p['epochs']}" if d["epochs"] < p["epochs"] else "")
                                   for label, d in p["stages"].items())
                lanes = r.get("lane_ms") or {}
                own = (" / ".join(f"{k} {v:.0f}" for k, v in lanes.items()) + " (a lane)") if lanes else "–"
                lines.append(
                    f"| {query} | {FORMAT_NAMES[fmt]} | {ENGINE_NAMES[engine]} | {p['wall']:.0f} | "
                    f"{p['before_jobs']:.0f} | {p['jobs']:.0f} | {p['between_jobs'] + p['after_jobs']:.0f} | "
                    f"{stages} | {own} |"
                )
    return "\n".join(lines)


def write_profile_md(result: dict[str, Any]) -> None:
    write_section(
        (PROFILE_START, PROFILE_END),
        (PROFILE_TABLE_START, PROFILE_TABLE_END),
        profile_md(result),
        "### Where a Nexmark epoch goes (`run_nexmark.py --profile`)\n\n",
    )


def check_flink_schemas() -> None:
    """The Flink tables' columns (``flink_runner.STREAM_COLUMNS``) must be Eddyline's streams'."""
    from eddyline.io.nexmark import nexmark_schema

    for stream, cols in flink_runner.STREAM_COLUMNS.items():
        mine = ", ".join(f"{name} {kind}" for name, kind in cols)
        if mine != nexmark_schema(stream):
            raise SystemExit(
                f"flink_runner.STREAM_COLUMNS[{stream!r}] is {mine!r}, "
                f"but Eddyline's {stream} schema is {nexmark_schema(stream)!r}"
            )


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--events", type=int, default=2_000_000, help="global Nexmark events in the data set"
    )
    ap.add_argument("--files", type=int, default=50, help="files per stream")
    ap.add_argument(
        "--files-per-epoch", type=int, default=5, help="files per stream per epoch / micro-batch"
    )
    ap.add_argument(
        "--backlog", action="store_true",
        help="the backlog run: no files-per-epoch cap for any engine (Eddyline sizes its epochs by the backlog, "
        "Structured Streaming reads every file waiting, PyFlink streams)",
    )
    ap.add_argument("--rate", type=float, default=10_000, help="events per second of event time")
    ap.add_argument(
        "--queries", default=None, help="comma-separated, default: every examples/nexmark/q*.yaml"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="measured runs per engine and query (the fastest counts)",
    )
    ap.add_argument(
        "--warmup-files", type=int, default=2, help="files per stream of the warm-up runs"
    )
    ap.add_argument("--data", default=None, help="data set directory (reused when it matches)")
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--keep", default=None, help="keep the measured runs' output and checkpoints here"
    )
    ap.add_argument(
        "--formats",
        default="parquet",
        help="comma-separated data set formats to run, of parquet, csv, json (default: parquet)",
    )
    ap.add_argument(
        "--engines",
        default="eddyline,spark,flink",
        help="comma-separated, of eddyline, spark, flink (default: all three)",
    )
    ap.add_argument(
        "--sink",
        default="discard",
        choices=SINKS,
        help="discard: compute and count the output, keep none (Eddyline discard, Spark noop, "
        "Flink blackhole); files: write it (Parquet; Flink JSON lines) and compare the engines' rows",
    )
    ap.add_argument(
        "--flink-timeout", type=float, default=3600, help="seconds one Flink job may take"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="record Spark's event log and split each Eddyline and Spark run's epochs into driver "
        "time and Spark stages (bench/sparklog.py; its cost is in the times: time without it)",
    )
    ap.add_argument(
        "--execution", default="job", choices=("job", "resident", "auto"),
        help="how Spark runs Eddyline's epochs (resident: a query resident lanes do not take is recorded as "
        "refused; auto: resident lanes where they take the query, else a Spark job an epoch)",
    )
    ap.add_argument("--no-md", action="store_true", help="do not touch bench/RESULTS.md")
    ap.add_argument(
        "--md-from", default=None, help="only rewrite bench/RESULTS.md from this results JSON"
    )
    args = ap.parse_args()
    if args.backlog:
        args.files_per_epoch = 0
    if args.md_from:
        saved = json.loads(Path(args.md_from).read_text())
        profiled = any("profile" in r for v in format_entries(saved).values() for e in v.values()
                       for r in e.values() if isinstance(r, dict))
        (write_profile_md if profiled else write_results_md)(saved)
        return
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or any(f not in FORMATS for f in formats) or len(set(formats)) < len(formats):
        raise SystemExit(f"--formats: expected some of {', '.join(FORMATS)}, got {args.formats!r}")
    chosen = [x.strip() for x in args.engines.split(",") if x.strip()]
    if not chosen or any(x not in ENGINES for x in chosen) or len(set(chosen)) < len(chosen):
        raise SystemExit(f"--engines: expected some of {', '.join(ENGINES)}, got {args.engines!r}")
    engines = [ENGINES[x] for x in chosen]
    if "flink" in engines and not any(f in FLINK_FORMATS for f in formats):
        formats.append("csv")
        print(
            "PyFlink reads no Parquet (the apache-flink wheel has no flink-parquet): "
            "adding the CSV copy, on which all engines run",
            flush=True,
        )

    import yaml

    from eddyline.io.nexmark import nexmark_schema
    from eddyline.runtime.session import get_spark

    global SPECS
    t_all = time.perf_counter()
    version = code_version()
    if (Path(version["root"]) / "examples" / "nexmark").is_dir():
        SPECS = Path(version["root"]) / "examples" / "nexmark"
    print(
        f"eddyline from {version['root']} at {version['commit']} (local changes: {version['local_changes']})",
        flush=True,
    )
    conf = {"spark.sql.shuffle.partitions": str(args.lanes)}
    args.event_log = None
    if args.profile:
        import sparklog

        args.event_log = sparklog.EventLog(tempfile.mkdtemp(prefix="eddyline-nexmark-events-"))
        conf |= args.event_log.spark_conf
    spark = get_spark(args.master, conf)
    workers = worker_eddyline(spark)
    if workers != {version["root"]}:
        raise SystemExit(
            f"Spark's Python workers import eddyline from {sorted(workers)}, the driver from {version['root']}: "
            "run from a directory that holds no other eddyline package (workers put the working directory first)"
        )
    available = sorted((p.stem for p in SPECS.glob("q*.yaml")), key=lambda q: int(q[1:]))
    queries = args.queries.split(",") if args.queries else available
    data = Path(
        args.data
        or Path(tempfile.gettempdir())
        / f"eddyline-nexmark-{args.events}-{args.files}-{args.rate:g}"
    )
    manifest = generate(spark, data, args.events, args.files, args.rate)
    print(f"data set: {data} ({manifest['generate_s']} s to generate)", flush=True)
    # Per format: (the data set's directory, its warm-up copy, each stream's schema for Spark).
    sets: dict[str, tuple[Path, Path, dict[str, Any]]] = {}
    copies: dict[str, Any] = {}
    for fmt in formats:
        if fmt == "parquet":
            schemas = {s: spark.read.parquet(str(data / s)).schema for s in STREAMS}
            sets[fmt] = (data, warm_copy(data, args.warmup_files), schemas)
            continue
        copies[fmt] = text_copy(spark, data, manifest, fmt)
        print(
            f"{FORMAT_NAMES[fmt]} copy: {data / fmt} ({copies[fmt]['mb']:,.0f} MB; "
            + (
                "reused)"
                if copies[fmt].get("reused")
                else f"{copies[fmt]['write_s']} s to write, {copies[fmt]['check_s']} s to check)"
            ),
            flush=True,
        )
        schemas = {s: nexmark_schema(s) for s in STREAMS}
        sets[fmt] = (data / fmt, warm_copy(data / fmt, args.warmup_files, fmt), schemas)
    RESULTS.mkdir(parents=True, exist_ok=True)
    flink = None
    if "flink" in engines:
        check_flink_schemas()
        log = Path(tempfile.gettempdir()) / f"eddyline-nexmark-flink-{os.getpid()}" / "runner.log"
        flink = FlinkRunner(log, args.flink_timeout)

    out: dict[str, dict[str, Any]] = {fmt: {} for fmt in formats}
    try:
        for query in queries:
            streams = spec_streams(yaml.safe_load((SPECS / f"{query}.yaml").read_text()))
            events = sum(sum(manifest["rows"][s]) for s in streams)
            for fmt in formats:
                full, warm, schemas = sets[fmt]
                out[fmt][query] = run_query(
                    spark, args, query, fmt, streams, events, full, warm, schemas, engines, flink
                )
            check_outputs(query, {fmt: out[fmt][query] for fmt in formats})
    finally:
        if flink is not None:
            flink.close()

    when = datetime.now(UTC).isoformat()
    result = {
        "benchmark": "nexmark",
        "when": when,
        "dataset": {k: v for k, v in manifest.items() if k != "rows"}
        | {"rows": {s: sum(v) for s, v in manifest["rows"].items()}},
        "formats": formats,
        "text_copies": copies,
        "rate": args.rate,
        "files_per_epoch": args.files_per_epoch,
        "warmup_files": args.warmup_files,
        "repeat": args.repeat,
        "lanes": args.lanes,
        "master": args.master,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "eddyline": version,
        "engines_run": [k for k, v in ENGINES.items() if v in engines],
        "sink": args.sink,
        "pyflink": {
            "version": flink.version,
            "package": FLINK_PACKAGE,
            "venv": str(flink_venv()),
            "mode": "streaming",
            "parallelism": FLINK_PARALLELISM,
            "formats": [f for f in formats if f in FLINK_FORMATS],
            "watermark_delay_s": math.ceil(args.events / args.rate) + 1,
            "log": str(flink.log_path),
        }
        if flink is not None
        else "not run (--engines)",
        # the Parquet runs where they always were, so older readers of these files still work
        "queries": out.get("parquet", {}),
        "by_format": {fmt: v for fmt, v in out.items() if fmt != "parquet"},
        "total_s": time.perf_counter() - t_all,
    }
    path = RESULTS / f"nexmark{'-backlog' if args.backlog else ''}-{when[:19].replace(':', '')}.json"
    results_io.write(path, result)
    print(f"wrote {path} · whole run {result['total_s'] / 60:.1f} min")
    if args.no_md:
        return
    if args.profile:  # a profiled run's times include the event log's cost: only its profile is shown
        write_profile_md(result)
    else:
        write_results_md(result)


def run_query(
    spark: Any,
    args: argparse.Namespace,
    query: str,
    fmt: str,
    streams: list[str],
    events: int,
    full: Path,
    warm: Path,
    schemas: dict[str, Any],
    engines: list[str],
    flink: FlinkRunner | None = None,
) -> dict[str, Any]:
    """One query on one format: every engine warmed, then ``--repeat`` runs each, alternating
    the order. ``engines``: keys of :data:`ENGINES` values (``native``, ``eddyline``, ``flink``)."""
    entry: dict[str, Any] = {
        "format": fmt,
        "streams": streams,
        "input_events": events,
        "sink": args.sink,
    }
    delay = math.ceil(args.events / args.rate) + 1  # Flink's watermark delay: see the README

    def run(
        engine: str, d: Path, per_epoch: int, tag: str, only: int | None = None
    ) -> dict[str, Any]:
        keep = (
            Path(args.keep) / fmt / query / f"{engine}-{tag}"
            if args.keep and tag != "warmup"
            else None
        )
        if keep is not None:
            shutil.rmtree(keep, ignore_errors=True)
            keep.mkdir(parents=True)
        tmp = keep or Path(tempfile.mkdtemp(prefix=f"nexmark-{query}-{fmt}-{engine}-"))
        try:
            if engine == "native":
                res = run_native(spark, query, d, per_epoch, tmp, schemas, only, fmt, args.sink)
                out = tmp / f"out-{res.get('attempt')}" if res.get("sink") == "parquet" else None
            elif engine == "flink":
                assert flink is not None
                return flink.run(
                    query=query,
                    data=str(d),
                    format=fmt,
                    sink=args.sink,
                    out=str(tmp / "out"),
                    parallelism=FLINK_PARALLELISM,
                    watermark_delay_s=delay,
                    only=only,
                    tag=tag,
                    events=events if d == full else None,
                )
            else:
                try:
                    res = run_eddyline(
                        spark,
                        eddyline_spec(
                            query, d, per_epoch, args.lanes, tmp / "out", fmt, args.sink
                        ) | {"execution": args.execution},
                        tmp,
                    )
                except Exception as exc:  # noqa: BLE001 - recorded, the other queries still run
                    return {"engine": "eddyline", "error": _error_text(exc)}
                out = tmp / "out" if args.sink == "files" else None
            if out is not None and "wall_s" in res:
                res |= output_digest(query, out)
            if args.event_log is not None and "wall_s" in res:
                import sparklog

                res["profile"] = sparklog.profile(args.event_log.read(spark), res["data_epoch_windows"])
            return res
        finally:
            if keep is None:
                shutil.rmtree(tmp, ignore_errors=True)

    active = [e for e in ("native", "eddyline", "flink") if e in engines]
    if "flink" in active and fmt not in FLINK_FORMATS:
        active.remove("flink")
        entry["flink"] = {
            "engine": "pyflink",
            "not_run": f"the apache-flink wheel reads no {FORMAT_NAMES[fmt]} (only CSV, JSON)",
        }
    # Warm-up on the first files; it also finds the formulation Spark (and Flink) accepts (a
    # query rejected is rejected the same way on the full data).
    warmed = {engine: run(engine, warm, 1, "warmup") for engine in active}
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in active if "wall_s" in warmed[e]}
    for rep in range(args.repeat):  # alternating order, so a slow spell of the machine hits all
        for engine in active if rep % 2 == 0 else active[::-1]:
            if engine in runs:
                runs[engine].append(
                    run(
                        engine,
                        full,
                        args.files_per_epoch,
                        f"run{rep}",
                        warmed[engine].get("attempt"),
                    )
                )
    for engine in active:
        done = [r for r in runs.get(engine, []) if "wall_s" in r]
        if not done:
            failed = runs.get(engine) or [warmed[engine]]
            entry[engine] = {
                **failed[0],
                "tried": warmed[engine].get("tried", failed[0].get("tried", [])),
            }
            continue
        best = min(
            done, key=lambda r: r["wall_s"]
        )  # the fastest run: least disturbed by the machine
        best["events_per_s"] = events / best["wall_s"]
        best["runs_wall_s"] = [round(r["wall_s"], 2) for r in done]
        best["runs_events_per_s"] = [round(events / r["wall_s"]) for r in done]
        best["runs_output_rows"] = [r.get("output_rows") for r in done]
        if any("digest" in r for r in done):
            best["runs_digest"] = [r.get("digest") for r in done]
        if engine in ("native", "flink"):
            best["tried"] = warmed[engine].get("tried", [])
        entry[engine] = best
    e, n, f = (entry.get(k, {}) for k in ("eddyline", "native", "flink"))
    entry["ratio"] = (
        e["events_per_s"] / n["events_per_s"] if "wall_s" in e and "wall_s" in n else None
    )
    if "flink" in engines:
        entry["ratio_flink"] = (
            e["events_per_s"] / f["events_per_s"] if "wall_s" in e and "wall_s" in f else None
        )
    parts = []
    for key in ("eddyline", "native", "flink"):
        r = entry.get(key)
        if r is None:
            continue
        if "wall_s" in r:
            more = (
                f"{r['epochs']} epochs, median {r['median_ms']:.0f} ms, "
                if "epochs" in r
                else f"submit {r.get('submit_s', 0):.1f} s, "
            )
            rows = r.get("output_rows")
            parts.append(
                f"{ENGINE_NAMES[key]} {_cell(r['events_per_s'])} ev/s ({more}"
                + (f"{rows} rows out)" if rows is not None else "rows not counted)")
            )
        else:
            parts.append(f"{ENGINE_NAMES[key]}: {r.get('not_run') or r.get('error')}")
    ratios = [
        f"{label} {entry[k]:.2f}"
        for k, label in (("ratio", "E/S"), ("ratio_flink", "E/F"))
        if entry.get(k) is not None
    ]
    print(
        f"{query} {fmt}: " + " · ".join(parts) + (" · " + ", ".join(ratios) if ratios else ""),
        flush=True,
    )
    if e.get("dead_letters"):
        print(f"warning: {query} {fmt}: Eddyline sent {e['dead_letters']:,} rows to dead letters")
    for key, r in entry.items():
        digests = r.get("runs_digest") if isinstance(r, dict) else None
        if digests and any(d != digests[0] for d in digests):
            print(
                f"warning: {query} {fmt}: {ENGINE_NAMES[key]}'s runs left different rows: {digests}"
            )
    return entry


def output_notes(query: str, entries: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """What disagrees about the rows written for ``query`` (entries by format): an engine whose
    output row count changes with the format; and, per format, Eddyline and Spark writing a
    different number of rows (noted when Parquet shows the same difference: Eddyline also
    flushes the windows and sessions still open at the end of the input), or another engine
    leaving other rows than Eddyline (digests, ``--sink files``)."""
    notes, engines = [], []
    for engine, name in (("eddyline", "Eddyline"), ("native", "Spark"), ("flink", "PyFlink")):
        # PyFlink's changelogs depend on timing (mini-batches): the rows they leave do not
        key = "final_rows" if engine == "flink" else "output_rows"
        counts = {
            fmt: ent[engine][key]
            for fmt, ent in entries.items()
            if ent.get(engine, {}).get(key) is not None
        }
        if len(set(counts.values())) > 1:
            notes.append(
                f"{query}: {name} wrote a different number of rows per format: "
                + ", ".join(f"{FORMAT_NAMES[f]} {c:,}" for f, c in counts.items())
            )
    parquet = entries.get("parquet", {})
    for fmt, ent in entries.items():
        ed, nd = ent.get("eddyline", {}), ent.get("native", {})
        e, n = ed.get("output_rows"), nd.get("output_rows")
        if e is not None and n is not None and e != n:
            same = fmt != "parquet" and (
                parquet.get("eddyline", {}).get("output_rows"),
                parquet.get("native", {}).get("output_rows"),
            ) == (e, n)
            engines.append(
                f"{query} {FORMAT_NAMES[fmt]}: Eddyline wrote {e:,} rows, Spark {n:,}"
                + (" (as on Parquet)" if same else "")
            )
        elif e is not None and e == n and "digest" in ed and ed["digest"] != nd.get("digest"):
            engines.append(
                f"{query} {FORMAT_NAMES[fmt]}: Eddyline and Spark wrote {e:,} rows each, "
                "but not the same rows"
            )
        fd = ent.get("flink", {})
        if "digest" in ed and "digest" in fd and ed["digest"] != fd["digest"]:
            engines.append(
                f"{query} {FORMAT_NAMES[fmt]}: Eddyline's output leaves {ed['digest']['rows']:,} "
                f"rows, PyFlink's {fd['digest']['rows']:,}, not the same rows"
            )
    return notes, engines


def check_outputs(query: str, entries: dict[str, dict[str, Any]]) -> None:
    between_formats, between_engines = output_notes(query, entries)
    for note in between_formats + between_engines:
        print(f"warning: {note}", flush=True)


if __name__ == "__main__":
    main()
