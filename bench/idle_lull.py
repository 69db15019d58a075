"""The first epoch after a lull in the input, with and without the engine's worker keep-alive.

PySpark stops a Python worker that has been idle for a minute. A stream whose input pauses for
longer would start new workers in its next epoch (they import pyarrow and the kernels again and
have lost the lanes' state cache), unless the engine keeps them busy while it waits
(``WORKER_KEEPALIVE_S`` in ``eddyline/runtime/engine.py``).

After a warm-up run that is not counted, for each mode (keep-alive off, on): a keyed dedup over Parquet files (2 lanes, ``local[2]``)
reads 6 files, one per epoch; the engine then waits ``--lull`` seconds with nothing to read; two
more files arrive and are read. Printed per mode: the median epoch before the lull, the first and
second epochs after it, and the first one's state loads from disk (cache misses). Spark
Structured Streaming has no peer for this: its dedup runs in the JVM, without Python workers.

Usage: ``python bench/idle_lull.py [--lull 75]`` (about 3 minutes); writes
``bench/results/idle_lull.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import results_io

HERE = Path(__file__).resolve().parent
ROWS = 200_000


def write_file(path: Path, i: int) -> None:
    rng = np.random.default_rng(i)
    t0 = np.datetime64("2026-01-01T00:00:00", "ms") + np.timedelta64(i * 2000, "ms")
    pq.write_table(
        pa.table(
            {
                "key": rng.integers(0, 50_000, ROWS),
                "value": rng.random(ROWS),
                "event_time": t0 + np.sort(rng.integers(0, 2000, ROWS)).astype("timedelta64[ms]"),
            }
        ),
        str(path / f"{i:05d}.parquet"),
    )


def spec(data: Path, out: Path) -> Any:
    from eddyline.api.validate import load_spec

    return load_spec(
        {
            "name": "lull",
            "trigger": 0,
            "lanes": 2,
            "key_groups": 64,
            "sources": [{"name": "events", "files": {"path": str(data), "format": "parquet", "max_files_per_epoch": 1}}],
            "steps": [{"name": "first", "input": "events", "dedup": {"key": "key", "time": "event_time", "ttl": "600s"}}],
            "sinks": [{"name": "out", "input": "first", "files": {"path": str(out), "format": "parquet"}}],
        }
    )


def run_mode(spark: Any, tmp: Path, keepalive: bool, lull_s: float) -> dict[str, Any]:
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.upkeep import WORKER_KEEPALIVE_S

    data, ckpt = tmp / "in", tmp / "ckpt"
    data.mkdir()
    for i in range(6):
        write_file(data, i)
    net = spec(data, tmp / "out")
    interval = WORKER_KEEPALIVE_S if keepalive else None

    class Recorder(ProgressReporter):
        def __init__(self) -> None:
            super().__init__(live=False)
            self.records: list[dict[str, Any]] = []

        def report(self, record: dict[str, Any]) -> None:
            self.records.append(record)

    def epochs(**run: Any) -> tuple[list[dict[str, Any]], Any]:
        with Recorder() as rep:
            summary = Engine(net, spark, str(ckpt), reporter=rep, worker_keepalive_s=interval).run(**run)
        return rep.records, summary

    before, _ = epochs(epochs=6)
    t = time.perf_counter()
    _, waiting = epochs(duration_s=lull_s)  # nothing to read: the engine waits
    idle_s = time.perf_counter() - t
    for i in (6, 7):
        write_file(data, i)
    after, _ = epochs(epochs=2)

    def row(r: dict[str, Any]) -> dict[str, Any]:
        op = next(o for o in r["stateOperators"] if o["operatorName"] == "first")
        m = op["customMetrics"]
        return {
            "epoch": r["batchId"],
            "ms": r["durationMs"]["triggerExecution"],
            "cache_misses": m.get("cacheMisses", 0),
            "lane_load_ms": [round(x["load"], 1) for x in m["laneMs"]],
        }

    return {
        "keepalive": keepalive,
        "idle_s": round(idle_s, 1),
        "keepalive_jobs": waiting.worker_keepalives,
        "before": [row(r) for r in before],
        "after": [row(r) for r in after],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lull", type=float, default=75.0, help="seconds without input (PySpark's limit is 60)")
    ap.add_argument("--out", default=str(HERE / "results" / "idle_lull.json"))
    args = ap.parse_args()

    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]")
    with tempfile.TemporaryDirectory(prefix="lull-") as tmp:  # JIT and first-job costs, not counted
        run_mode(spark, Path(tmp), True, 1.0)
    results = []
    for keepalive in (False, True):
        with tempfile.TemporaryDirectory(prefix="lull-") as tmp:
            results.append(run_mode(spark, Path(tmp), keepalive, args.lull))
    print(f"{'keep-alive':10s} {'epoch before (median ms)':>25s} {'1st after':>10s} {'2nd after':>10s}"
          f" {'1st/before':>10s} {'state loads in 1st':>19s} {'keep-alive jobs':>16s}")
    for r in results:
        steady = statistics.median(e["ms"] for e in r["before"][2:])
        a1, a2 = r["after"][0], r["after"][1]
        r["summary"] = {"before_median_ms": steady, "first_after_ms": a1["ms"], "ratio": round(a1["ms"] / steady, 2)}
        print(f"{'on' if r['keepalive'] else 'off':10s} {steady:25.0f} {a1['ms']:10.0f} {a2['ms']:10.0f}"
              f" {a1['ms'] / steady:10.2f} {a1['cache_misses']:19d} {r['keepalive_jobs']:16d}")
    out = {"benchmark": "idle_lull", "when": datetime.now(UTC).isoformat(), "lull_s": args.lull, "rows_per_file": ROWS,
           "modes": results}
    results_io.write(Path(args.out), out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
