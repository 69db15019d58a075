"""Eddyline vs native Spark Structured Streaming on the same data, in one run.

Workloads (issue #2):

* ``sliding_auction``: Nexmark bids, count + max(price) per auction over sliding 10 s / 2 s
  windows, watermark delay 4 s;
* ``tumbling_100k``: generator rows over 100,000 uniform keys, count + sum(value) per key over
  tumbling 10 s windows;
* ``dedup_keys`` (issue #24's epoch floor): generator rows over 100,000 keys, the first row per
  key, a key remembered for 10 s of event time (Structured Streaming:
  ``dropDuplicatesWithinWatermark`` with a 10 s watermark delay).

Both engines get exactly the same rows: Eddyline reads its built-in generators with a fixed
number of rows per epoch; Structured Streaming reads the ``rate-micro-batch`` source with the same
number of rows per micro-batch and turns each row number into the same columns with the same
Spark expressions. Both write Parquet (append). *Sustainable throughput* here = input rows per
second of wall time over the measured batches, at a batch size large enough that each engine runs
flat out (backlog always available), after warm-up batches that are not counted.

Usage: ``./dev.sh bench`` or ``python bench/run_bench.py --rows 400000 --batches 6``.
Writes ``bench/results/<workload>-<timestamp>.json`` and rewrites ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import results_io

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# ----------------------------------------------------------------------------- workloads
def workload(name: str, rows: int, lanes: int) -> dict[str, Any]:
    """Spec pieces shared by both engines. Event time advances 2 s per batch on both."""
    if name == "sliding_auction":
        return {
            "source": {"nexmark": {"stream": "bid", "rate": rows / 2, "unpaced": True}},
            "key": "auction",
            "time": "date_time",
            "window": {"size": "10s", "slide": "2s"},
            "aggregates": {"bids": "count(*)", "top": "max(price)"},
            "watermark_delay": "4s",
        }
    if name == "tumbling_100k":
        return {
            "source": {"generator": {"rate": rows / 2, "keys": 100_000, "unpaced": True}},
            "key": "key",
            "time": "event_time",
            "window": {"size": "10s"},
            "aggregates": {"n": "count(*)", "total": "sum(value)"},
            "watermark_delay": "0s",
        }
    if name == "dedup_keys":
        return {
            "source": {"generator": {"rate": rows / 2, "keys": 100_000, "unpaced": True}},
            "key": "key",
            "time": "event_time",
            "ttl": "10s",
        }
    raise ValueError(name)


def eddyline_spec(name: str, rows: int, lanes: int, out: Path, execution: str = "job") -> dict[str, Any]:
    w = workload(name, rows, lanes)
    return {
        "name": name,
        "execution": execution,
        "trigger": 0,
        "lanes": lanes,
        "sources": [{"name": "input", **w["source"], "max_rows_per_epoch": rows}],
        "steps": [
            {"name": "agg", "input": "input", "dedup": {k: w[k] for k in ("key", "time", "ttl")}}
            if "ttl" in w
            else {
                "name": "agg",
                "input": "input",
                "window_aggregate": {k: w[k] for k in ("key", "time", "window", "aggregates", "watermark_delay")},
            }
        ],
        "sinks": [{"name": "out", "input": "agg", "files": {"path": str(out), "format": "parquet"}}],
    }


# ----------------------------------------------------------------------------- Eddyline
def run_eddyline(spark: Any, name: str, rows: int, lanes: int, warmup: int, batches: int, tmp: Path,
                 execution: str = "job") -> dict[str, Any]:
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    spec = load_spec(eddyline_spec(name, rows, lanes, tmp / f"edd-out-{execution}", execution))
    progress = tmp / f"edd-progress-{execution}.jsonl"
    clock = CpuClock()
    with ProgressReporter(live=False, json_path=str(progress)) as rep:
        engine = Engine(spec, spark, str(tmp / f"edd-ckpt-{execution}"), reporter=rep)
        engine.run(epochs=warmup)
        t0 = time.perf_counter()
        rep.listeners.append(lambda _: clock.tick())
        summary = engine.run(epochs=batches)
        wall = time.perf_counter() - t0
    records = [json.loads(x) for x in progress.read_text().splitlines()][warmup:]
    return {
        "engine": "eddyline",
        "input_rows": summary.input_rows,
        "wall_s": wall,
        "rows_per_s": summary.input_rows / wall,
        "batch_ms": [r["durationMs"]["triggerExecution"] for r in records],
        "breakdown_ms": {
            k: statistics.median(r["durationMs"][k] for r in records)
            for k in ("planning", "execution", "publish", "commit")
        },
        "lane_ms": _lane_medians(records),
        "state_rows": records[-1]["stateOperators"][0]["numRowsTotal"] if records else 0,
        **clock.per_epoch(),
    }


class CpuClock:
    """CPU time by process at the end of each measured epoch: this process (the driver), its JVM
    and Spark's Python workers (a resident stage's lanes among them), read from ``/proc``. The
    processes are found at the first tick (a resident stage starts in the first epoch of a run),
    and the figures are taken from the first tick to the last, so that a stage's start is not
    in them. Meant for resident runs, whose processes stay: a worker that ends meanwhile counts
    as it was when last read, and one that starts is not counted."""

    def __init__(self) -> None:
        self.pids: dict[int, str] = {}
        self.ticks: list[tuple[float, dict[str, float]]] = []
        self._last: dict[int, float] = {}  # CPU seconds of each process when last read

    def tick(self) -> None:
        import os

        if not self.pids and os.path.isdir("/proc"):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if int(pid) == os.getpid():
                    self.pids[int(pid)] = "driver"
                elif b"org.apache.spark.deploy.SparkSubmit" in cmd:
                    self.pids[int(pid)] = "jvm"
                elif b"pyspark.daemon" in cmd:
                    self.pids[int(pid)] = "python workers"
        used = dict.fromkeys(("driver", "jvm", "python workers"), 0.0)
        for pid, kind in self.pids.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self._last[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
            except OSError:
                pass
            used[kind] += self._last.get(pid, 0.0)
        self.ticks.append((time.perf_counter(), used))

    def per_epoch(self) -> dict[str, Any]:
        """CPU ms an epoch by process, and wall ms an epoch, from the first tick to the last."""
        if len(self.ticks) < 2:
            return {}
        (t0, first), (t1, last), n = self.ticks[0], self.ticks[-1], len(self.ticks) - 1
        return {"cpu_ms_per_epoch": {k: (last[k] - first[k]) * 1000 / n for k in last},
                "wall_ms_per_epoch": (t1 - t0) * 1000 / n}


def _lane_medians(records: list[dict[str, Any]]) -> dict[str, float]:
    parts: dict[str, list[float]] = {}
    for r in records:
        for op in r["stateOperators"]:
            for lane in op["customMetrics"]["laneMs"]:
                for k, v in lane.items():
                    parts.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in parts.items()}


# ----------------------------------------------------------------------------- native Spark
def native_frame(spark: Any, name: str, rows: int, lanes: int) -> Any:
    """The same rows as Eddyline's source, from Structured Streaming's rate-micro-batch source."""
    from eddyline.io.generator import Generator
    from eddyline.io.nexmark import Nexmark

    w = workload(name, rows, lanes)
    stream_rows = rows
    if "nexmark" in w["source"]:
        from eddyline.io.nexmark import nexmark_columns

        params = Nexmark(**w["source"]["nexmark"])
        # Eddyline's offsets are global event numbers; bids are 46 of every 50 events.
        stream_rows = rows * 46 // 50
        raw = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", stream_rows).option(
            "numPartitions", lanes
        ).load()
        return nexmark_columns(spark, params, raw.withColumnRenamed("value", "id")), stream_rows
    from eddyline.io.generator import generator_columns

    params = Generator(**w["source"]["generator"])
    raw = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).option("numPartitions", lanes).load()
    return generator_columns(spark, params, raw.withColumnRenamed("value", "id")), stream_rows


def run_native(spark: Any, name: str, rows: int, lanes: int, warmup: int, batches: int, tmp: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    w = workload(name, rows, lanes)
    df, batch_rows = native_frame(spark, name, rows, lanes)
    if "ttl" in w:
        result = df.withWatermark(w["time"], w["ttl"].replace("s", " seconds")).dropDuplicatesWithinWatermark([w["key"]])
    else:
        size = w["window"]["size"]
        slide = w["window"].get("slide", size)
        aggs = []
        for out, text in w["aggregates"].items():
            func, col = text.split("(")[0], text.split("(")[1].rstrip(")")
            aggs.append((F.count(F.lit(1)) if col == "*" else getattr(F, func)(col)).alias(out))
        result = (
            df.withWatermark(w["time"], w["watermark_delay"].replace("s", " seconds"))
            .groupBy(F.window(w["time"], size.replace("s", " seconds"), slide.replace("s", " seconds")), w["key"])
            .agg(*aggs)
        )
    q = (
        result.writeStream.format("parquet")
        .option("path", str(tmp / "native-out"))
        .option("checkpointLocation", str(tmp / "native-ckpt"))
        .outputMode("append")
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while q.lastProgress is None or q.lastProgress["batchId"] < warmup + batches - 1:
            time.sleep(0.05)
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
    finally:
        # The source never runs dry, so a batch is in flight when the query stops; Spark logs its
        # abort at ERROR with a stack trace. The measured batches before it are complete.
        spark.sparkContext.setLogLevel("OFF")
        try:
            q.stop()
        finally:
            spark.sparkContext.setLogLevel("ERROR")
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    measured = [p for p in progress if p["batchId"] >= warmup][:batches]
    wall = (
        _ts(measured[-1]["timestamp"]) - _ts(measured[0]["timestamp"]) + measured[-1]["durationMs"]["triggerExecution"] / 1000
    )
    n = sum(p["numInputRows"] for p in measured)
    return {
        "engine": "spark-structured-streaming",
        "input_rows": n,
        "wall_s": wall,
        "rows_per_s": n / wall,
        "batch_ms": [p["durationMs"]["triggerExecution"] for p in measured],
        "state_rows": measured[-1]["stateOperators"][0]["numRowsTotal"] if measured else 0,
        "batch_rows": batch_rows,
    }


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------- report
def cached_data_set(data: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the data set cached in ``data`` when it was made with ``wanted``;
    otherwise None, with ``data`` cleared for a new one (see :func:`save_manifest`)."""
    path = data / "manifest.json"
    if path.exists():
        manifest = json.loads(path.read_text())
        if all(manifest.get(k) == v for k, v in wanted.items()):
            return manifest
    shutil.rmtree(data, ignore_errors=True)
    return None


def save_manifest(data: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    (data / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def write_section(markers: tuple[str, str], tables: tuple[str, str], generated: str, new_section: str) -> None:
    """Replace the generated tables (between ``tables`` markers) inside a RESULTS.md section
    (between ``markers``); when the section is missing, append it: ``new_section`` is its heading
    and prose, the tables follow. Hand-written prose around the tables is kept."""
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{tables[0]}\n{generated}\n{tables[1]}"
    if markers[0] in text and tables[0] in text:
        text = text[: text.index(tables[0])] + block + text[text.index(tables[1]) + len(tables[1]) :]
    elif markers[0] not in text:
        text = text.rstrip("\n") + f"\n\n{markers[0]}\n{new_section}{block}\n{markers[1]}\n"
    else:
        raise SystemExit(f"{path}: the section {markers[0]} lacks {tables[0]}; not rewriting it")
    path.write_text(text)


def write_results_md() -> None:
    """The latest run of each workload (earlier runs: ``python bench/trend.py throughput``)."""
    latest: dict[str, dict] = {}
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        if "workload" in r and "engines" in r and r["when"] >= latest.get(r["workload"], {}).get("when", ""):
            latest[r["workload"]] = r
    rows = []
    for r in latest.values():
        e, n = r["engines"]["eddyline"], r["engines"]["spark-structured-streaming"]
        rows.append(
            f"| {r['workload']} | {r['rows_per_batch']:,} | {e['rows_per_s']:,.0f} | {n['rows_per_s']:,.0f} "
            f"| **{r['ratio']:.2f}** | {statistics.median(e['batch_ms']):.0f} / {statistics.median(n['batch_ms']):.0f} "
            f"| {r['when'][:16]} |"
        )
    table = "\n".join(rows)
    text = (HERE / "RESULTS.md").read_text() if (HERE / "RESULTS.md").exists() else ""
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    block = (
        f"{start}\n| workload | rows / batch | Eddyline rows/s | Spark SS rows/s | ratio | median batch ms (E / S) | run |\n"
        f"|---|---:|---:|---:|---:|---:|---|\n{table}\n{end}"
    )
    if start in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = f"# Benchmark results\n\n{block}\n"
    (HERE / "RESULTS.md").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="sliding_auction,tumbling_100k")
    ap.add_argument("--rows", type=int, default=400_000, help="input rows per epoch / micro-batch")
    ap.add_argument("--batches", type=int, default=6, help="measured batches per engine")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from eddyline.runtime.session import get_spark

    spark = get_spark(args.master, {"spark.sql.shuffle.partitions": str(args.lanes)})
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.workloads.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        try:
            native = run_native(spark, name, args.rows, args.lanes, args.warmup, args.batches, tmp)
            edd = run_eddyline(spark, name, args.rows, args.lanes, args.warmup, args.batches, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        ratio = edd["rows_per_s"] / native["rows_per_s"]
        when = datetime.now(UTC).isoformat()
        result = {
            "workload": name,
            "when": when,
            "rows_per_batch": args.rows,
            "lanes": args.lanes,
            "master": args.master,
            "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
            "engines": {"eddyline": edd, "spark-structured-streaming": native},
            "ratio": ratio,
        }
        out = RESULTS / f"{name}-{when[:19].replace(':', '')}.json"
        results_io.write(out, result)
        print(f"{name}: eddyline {edd['rows_per_s']:,.0f} rows/s, native {native['rows_per_s']:,.0f} rows/s, ratio {ratio:.2f}")
        print(f"  eddyline per-epoch medians (ms): {edd['breakdown_ms']} lanes: {edd['lane_ms']}")
    write_results_md()


if __name__ == "__main__":
    main()
