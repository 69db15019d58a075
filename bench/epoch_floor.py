"""The per-epoch floor (issue #24): how long an epoch takes when it carries almost no data.

At a few thousand rows per epoch an epoch's time is nearly all fixed cost: planning, Spark job
scheduling, the hand-off to Python, state and sink writes, the commit. That floor is also the
least latency a result can have. This runs ``run_bench.py``'s window and dedup workloads with
``--rows`` input rows per epoch (default 2,000) on Eddyline and on Structured Streaming's
micro-batches, in the same run and SparkSession, ``--rounds`` times each (engines alternating),
and reports the median and 90th percentile epoch / micro-batch time of every round, and where
Eddyline's epoch goes (median ms per stage and per lane step).

Each round also times a *bare Spark job* of the shape a small Eddyline epoch runs, with none of
Eddyline's work in it: ``--rows`` rows made in a Python step (as a generator source's tasks
take their slice), shuffled to the lanes, passed through a Python step per lane (as the lanes'
kernels run) and collected to the driver (as a small epoch's Parquet is written), code
generation off as in small epochs. What an epoch takes beyond that job is Eddyline's own:
planning, the kernels, state, the commit.

Each workload first runs one round unmeasured (``--prewarm-rounds``): the first epochs of a
query in a new JVM are slower while the JVM compiles its code, for either engine.

Usage: ``python bench/epoch_floor.py [--rows 2000] [--batches 30] [--rounds 3] [--prewarm-rounds 1]``. Writes
``bench/results/floor-<timestamp>.json`` and the ``floor`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import results_io
from run_bench import RESULTS, run_eddyline, run_native, write_section

from eddyline.errors import SpecError

WORKLOADS = ("sliding_auction", "dedup_keys")
STAGES = ("planning", "execution", "publish", "commit")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=10)[int(q * 10) - 1] if len(values) > 1 else values[0]


def summary(run: dict[str, Any]) -> dict[str, Any]:
    ms = run["batch_ms"]
    out = {"median_ms": statistics.median(ms), "p90_ms": pct(ms, 0.9), "batches": len(ms)}
    for k in ("breakdown_ms", "lane_ms", "cpu_ms_per_epoch", "wall_ms_per_epoch"):
        if k in run:
            out[k] = run[k]
    return out


def bare_job(spark: Any, rows: int, lanes: int, warmup: int, batches: int) -> dict[str, Any]:
    """The bare Spark job of a small epoch's shape (module docstring), ``warmup + batches`` times."""
    import time

    from eddyline.runtime.epoch.execute import small_epoch

    def through(batches):  # noqa: ANN001, ANN202  (the Python steps do nothing)
        yield from batches

    ms = []
    with small_epoch(spark, True):  # code generation off, as the engine runs a small epoch
        for _ in range(warmup + batches):
            t0 = time.perf_counter()
            (spark.range(0, rows, 1, lanes).mapInArrow(through, "id long").repartition(lanes, "id")
             .mapInArrow(through, "id long").toArrow())
            ms.append((time.perf_counter() - t0) * 1000)
    return {"batch_ms": ms[warmup:]}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| workload | rows / epoch | Eddyline median ms (p90) | resident lanes median ms (p90) "
        "| Spark SS median ms (p90) | ratio SS / Eddyline | bare Spark job median ms (p90) |",
        "|---|---:|---|---|---|---|---|",
    ]
    for name, rounds in result["workloads"].items():
        e = [r["eddyline"] for r in rounds]
        n = [r["spark"] for r in rounds]
        fmt = lambda rs: " · ".join(f"{r['median_ms']:.0f} ({r['p90_ms']:.0f})" for r in rs)  # noqa: E731
        ratios = " · ".join(f"{b['median_ms'] / a['median_ms']:.2f}" for a, b in zip(e, n, strict=True))
        bare = fmt([r["bare"] for r in rounds]) if all("bare" in r for r in rounds) else "–"
        resident = fmt([r["resident"] for r in rounds]) if all("resident" in r for r in rounds) else "–"
        lines.append(f"| {name} | {result['rows']:,} | {fmt(e)} | {resident} | {fmt(n)} | {ratios} | {bare} |")
    lines += ["", "Eddyline's epoch by stage (median ms per round; lanes: median per lane step):", "",
              "| workload | " + " | ".join(STAGES) + " | lanes |", "|---|" + "---:|" * (len(STAGES) + 1)]
    for name, rounds in result["workloads"].items():
        stages = [" · ".join(f"{r['eddyline']['breakdown_ms'][s]:.0f}" for r in rounds) for s in STAGES]
        lanes = "; ".join(f"{k} {v:.0f}" for k, v in rounds[-1]["eddyline"].get("lane_ms", {}).items())
        lines.append(f"| {name} | " + " | ".join(stages) + f" | {lanes} |")
    cpu = [(name, [r["resident"] for r in rounds if "cpu_ms_per_epoch" in r.get("resident", {})])
           for name, rounds in result["workloads"].items()]
    if any(runs and runs[0]["cpu_ms_per_epoch"] for _, runs in cpu):
        lines += ["", "A resident epoch's CPU, ms an epoch of wall time (per round): what runs one after the other "
                  "and what could overlap. With two cores, no overlap of the driver's work with the lanes' gets "
                  "an epoch below half the CPU it takes.", "",
                  "| workload | driver | JVM | Python workers (the lanes) | all / 2 cores | wall ms an epoch |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, runs in cpu:
            if runs and runs[0]["cpu_ms_per_epoch"]:
                cells = [" · ".join(f"{x:.1f}" for x in xs) for xs in zip(*(
                    (r["cpu_ms_per_epoch"]["driver"], r["cpu_ms_per_epoch"]["jvm"],
                     r["cpu_ms_per_epoch"]["python workers"], sum(r["cpu_ms_per_epoch"].values()) / 2,
                     r["wall_ms_per_epoch"]) for r in runs), strict=True)]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rows", type=int, default=2_000)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    # Each workload first runs unmeasured: a query's first few dozen epochs in a JVM run up to
    # twice as slow while the JVM compiles its code, and a continuous query runs for hours.
    ap.add_argument("--prewarm-rounds", type=int, default=1)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--no-md", action="store_true")
    args = ap.parse_args()

    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": str(args.lanes)})
    result: dict[str, Any] = {"when": datetime.now(UTC).isoformat(), "rows": args.rows, "lanes": args.lanes,
                              "batches": args.batches, "warmup": args.warmup, "prewarm_rounds": args.prewarm_rounds,
                              "workloads": {}}
    for name in args.workloads.split(","):
        rounds = []
        for i in range(args.prewarm_rounds + args.rounds):
            tmp = Path(tempfile.mkdtemp(prefix=f"floor-{name}-"))
            try:
                native = run_native(spark, name, args.rows, args.lanes, args.warmup, args.batches, tmp)
                edd = run_eddyline(spark, name, args.rows, args.lanes, args.warmup, args.batches, tmp)
                try:
                    resident = run_eddyline(spark, name, args.rows, args.lanes, args.warmup, args.batches, tmp,
                                            execution="resident")
                except SpecError as e:  # a network resident lanes do not take (its source, say)
                    resident = None
                    print(f"{name}: no resident run: {e}", flush=True)
                bare = bare_job(spark, args.rows, args.lanes, args.warmup, args.batches)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if i < args.prewarm_rounds:
                print(f"{name}: unmeasured round, Eddyline median {statistics.median(edd['batch_ms']):.0f} ms", flush=True)
                continue
            rounds.append({"eddyline": summary(edd), "spark": summary(native), "bare": summary(bare),
                           **({"resident": summary(resident)} if resident is not None else {})})
            res = rounds[-1].get("resident")
            print(f"{name}: Eddyline median {rounds[-1]['eddyline']['median_ms']:.0f} ms "
                  f"(p90 {rounds[-1]['eddyline']['p90_ms']:.0f}), "
                  + (f"resident {res['median_ms']:.0f} ms (p90 {res['p90_ms']:.0f}), " if res else "")
                  + f"Spark SS {rounds[-1]['spark']['median_ms']:.0f} ms "
                  f"(p90 {rounds[-1]['spark']['p90_ms']:.0f}), bare job {rounds[-1]['bare']['median_ms']:.0f} ms; "
                  f"stages {edd['breakdown_ms']} lanes {edd['lane_ms']}", flush=True)
        result["workloads"][name] = rounds
    RESULTS.mkdir(parents=True, exist_ok=True)
    results_io.write(RESULTS / f"floor-{result['when'][:19].replace(':', '')}.json", result)
    print(table(result))
    if not args.no_md:
        write_section(("<!-- floor:start -->", "<!-- floor:end -->"),
                      ("<!-- floor-tables:start -->", "<!-- floor-tables:end -->"), table(result),
                      "## The epoch floor\n\n`python bench/epoch_floor.py` (issue #24): epochs of "
                      f"{args.rows:,} input rows, Eddyline against Structured Streaming's micro-batch in the "
                      "same run; each cell lists every round.\n\n")


if __name__ == "__main__":
    main()
