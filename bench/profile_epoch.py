"""Where does one epoch's time go? Time growing prefixes of the sliding-window epoch's plan.

Each line adds one layer to the Spark job of one epoch (same data as ``run_bench.py``'s
``sliding_auction``), so consecutive differences estimate that layer's cost:

1. an empty Spark job (scheduling overhead);
2. generating the epoch's Nexmark bids;
3. + window assignment (5 windows per bid) and partial aggregation (first shuffle);
4. + the lane shuffle on routing values;
5. + Arrow transfer to a Python lane that returns nothing (worker + Arrow conversion);
6. the real epoch through the engine (kernel, state I/O, Parquet write, commit).

Usage: ``python bench/profile_epoch.py [--rows 400000] [--repeat 5]``; prints a table and writes
``bench/results/profile-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _drop(batches: Iterator) -> Iterator:
    for _ in batches:
        pass
    return iter(())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--lanes", type=int, default=2)
    args = ap.parse_args()

    from run_bench import eddyline_spec  # type: ignore[import-not-found]

    from eddyline.api.validate import load_spec
    from eddyline.io.nexmark import Nexmark, nexmark_frame
    from eddyline.observe.progress import ProgressReporter
    from eddyline.plan.keygroups import RoutingTable
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": str(args.lanes)})
    params = Nexmark(stream="bid", rate=args.rows / 2, unpaced=True)
    routes = ", ".join(f"{v}L" for v in RoutingTable.uniform(128, args.lanes).route_values())
    start = [args.rows * 10]

    def bids():  # a fresh offset range each time, like consecutive epochs
        start[0] += args.rows
        return nexmark_frame(spark, params, start[0], start[0] + args.rows, args.lanes)

    def windows():
        return (
            bids()
            .selectExpr("auction", "price", "CAST(floor(unix_micros(date_time) / 1000) AS BIGINT) AS _t")
            .selectExpr("*", "explode(sequence(_t - pmod(_t, 2000) - 8000, _t - pmod(_t, 2000), 2000)) AS window_start")
            .selectExpr("*", "CAST(pmod(xxhash64(auction), 128) AS INT) AS _kg")
            .groupBy("_kg", "auction", "window_start")
            .agg({"*": "count", "price": "max"})
        )

    def lanes():
        return windows().selectExpr("*", f"element_at(array({routes}), _kg + 1) AS _route").repartition(args.lanes, "_route")

    def python_lane():
        return lanes().mapInArrow(_drop, lanes().schema)

    stages: list[tuple[str, Callable[[], object]]] = [
        ("empty Spark job", lambda: spark.range(0, 0, 1, args.lanes)),
        ("generate bids", bids),
        ("+ windows, partial aggregate (shuffle 1)", windows),
        ("+ lane shuffle (shuffle 2)", lanes),
        ("+ Arrow to Python lanes (identity)", python_lane),
    ]
    results = {}
    for name, build in stages:
        times = []
        for _ in range(args.repeat + 1):
            df = build()
            t = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]
            times.append((time.perf_counter() - t) * 1000)
        results[name] = statistics.median(times[1:])

    with tempfile.TemporaryDirectory() as tmp:
        spec = load_spec(eddyline_spec("sliding_auction", args.rows, args.lanes, Path(tmp) / "out"))
        progress = Path(tmp) / "p.jsonl"
        with ProgressReporter(live=False, json_path=str(progress)) as rep:
            Engine(spec, spark, str(Path(tmp) / "ckpt"), reporter=rep).run(epochs=args.repeat + 3)
        records = [json.loads(x) for x in progress.read_text().splitlines()][3:]
    med = lambda key: statistics.median(r["durationMs"][key] for r in records)  # noqa: E731
    lane = {k: statistics.median(lm[k] for r in records for lm in r["stateOperators"][0]["customMetrics"]["laneMs"])
            for k in ("receive", "load", "kernel", "write")}
    results["engine epoch: planning (driver builds DataFrames)"] = med("planning")
    results["engine epoch: execution (Spark jobs incl. Parquet write)"] = med("execution")
    results["engine epoch: publish + commit"] = med("publish") + med("commit")
    results["engine epoch: total"] = med("triggerExecution")
    for k, v in lane.items():
        results[f"  per lane (inside execution): {k}"] = v

    width = max(map(len, results))
    print(f"{'layer':{width}}  median ms   ({args.rows:,} offsets per epoch, {args.lanes} lanes)")
    for k, v in results.items():
        print(f"{k:{width}}  {v:9.1f}")
    out = HERE / "results" / f"profile-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": args.rows, "lanes": args.lanes, "median_ms": results}, indent=2))


if __name__ == "__main__":
    main()
