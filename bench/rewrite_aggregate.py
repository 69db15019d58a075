"""What the local/global split buys a keyed aggregate with a hot key: the same network run
unsplit and with the split planned at epoch 2 (``control.rewrite.schedule``), alternating, in
one process.

The network: generator ticks over ``--keys`` keys with Zipf skew ``--skew`` (the hottest key
carries most rows), ``--per-epoch`` ticks an epoch, 2 lanes, into an ``aggregate`` of count, sum,
avg, min, max and last of ``value`` per key, written to a discarding sink. It reports, per run,
the rows the aggregate's busiest key group received and its slowest lane's busy time in the
epochs after the split (from the controller's load history), and the wall time of those epochs.

Usage: ``./dev.sh bench bench/rewrite_aggregate.py`` or ``python bench/rewrite_aggregate.py
--runs 3``. Writes ``bench/results/rewrite-aggregate-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import results_io

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def network(args: argparse.Namespace, split: bool) -> dict[str, Any]:
    rewrite = {"auto": False, "schedule": {2: ["per_key"]}} if split else {"auto": False}
    return {
        "name": "rewrite-aggregate", "trigger": 0, "lanes": 2, "key_groups": 64,
        "sources": [{"name": "ticks", "limit": args.ticks, "max_rows_per_epoch": args.per_epoch,
                     "generator": {"rate": 100_000, "unpaced": True, "keys": args.keys, "skew": args.skew, "seed": 1}}],
        "steps": [{"name": "per_key", "input": "ticks", "aggregate": {
            "key": "key", "time": "event_time", "aggregates": {
                "n": "count(*)", "total": "sum(value)", "mean": "avg(value)", "low": "min(value)",
                "high": "max(value)", "latest": "last(value)"}}}],
        "sinks": [{"name": "out", "input": "per_key", "discard": {}}],
        "control": {"load": "rows", "rewrite": rewrite},
    }


def one_run(spark: Any, args: argparse.Namespace, split: bool, ckpt: Path) -> dict[str, Any]:
    from eddyline.api.validate import load_spec
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.engine import Engine

    t0 = time.perf_counter()
    Engine(load_spec(network(args, split)), spark, str(ckpt)).run(until_idle=True)
    wall = time.perf_counter() - t0
    history = Checkpoint(str(ckpt)).latest_commit().control["manager"]["history"]["per_key"]
    after = [h for h in history if h["epoch"] >= 3 and h["input_rows"]]  # the split runs from epoch 2
    return {
        "split": split, "wall_s": wall,
        "epochs": [{"epoch": h["epoch"], "hot_rows": max(h["kg_rows"].values()),
                    "slowest_lane_ms": round(max(h["lane_busy_ms"]), 1), "wall_s": round(h["wall_s"], 3)}
                   for h in after],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=1_200_000)
    ap.add_argument("--per-epoch", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--skew", type=float, default=1.5)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    tmp = Path(tempfile.mkdtemp(prefix="eddyline-rewrite-bench-"))
    one_run(spark, args, False, tmp / "warm")  # Python workers, imports
    runs = []
    for i in range(args.runs):
        for split in (False, True):
            r = one_run(spark, args, split, tmp / f"{i}-{split}")
            runs.append(r)
            lanes = ", ".join(f"{e['slowest_lane_ms']:.0f}" for e in r["epochs"])
            hot = ", ".join(f"{e['hot_rows']:,}" for e in r["epochs"])
            print(f"run {i} {'split  ' if split else 'unsplit'}: {r['wall_s']:.2f} s; epochs 3+: slowest lane ms {lanes}; "
                  f"rows of the busiest key group {hot}", flush=True)
    for split in (False, True):
        lanes = [e["slowest_lane_ms"] for r in runs if r["split"] == split for e in r["epochs"]]
        walls = [e["wall_s"] * 1000 for r in runs if r["split"] == split for e in r["epochs"]]
        print(f"{'split' if split else 'unsplit':>8}: slowest lane median {statistics.median(lanes):.0f} ms "
              f"(range {min(lanes):.0f}–{max(lanes):.0f}); epoch wall median {statistics.median(walls):.0f} ms "
              f"(range {min(walls):.0f}–{max(walls):.0f})")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    results_io.write(RESULTS / f"rewrite-aggregate-{stamp}.json", {"args": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
