"""Overload: a 3x burst against a declared latency bound, in one process, on the same arriving data.

Systems (one SparkSession, ``local[2]``, run one after the other; ``--rounds N`` alternates the
order between rounds; before the first round, 15 s of the first Eddyline system and a short
native run warm up and are not reported, so that no system pays for the first runs of the
Python workers and of the shed points):

* ``lp``       Eddyline, ``control.overload.shedding: lp`` (coordinated shedding, fitted cost model);
* ``uniform``  Eddyline, ``shedding: uniform``: one keep fraction at every shed point;
* ``off``      Eddyline, ``shedding: off``: admission control only (the backlog waits in the source);
* ``native``   Spark Structured Streaming on the same rows, arriving at the same wall-clock pace;
* ``lp-declared``, ``uniform-declared`` (full mode, or ``--declared``) as ``lp`` / ``uniform``
  with a ``cost_model`` from the calibration runs declared instead of the fitted one.

**Workload.** A paced ``generator`` source (``keys`` keys, ``value`` uniform in [0, 1000)) with
three phases of event time: normal rate R, a burst, normal again (16 / 12 / 24 s; ``--quick``:
10 / 10 / 14 s).
Rows arrive at wall-clock speed: offset ``o`` becomes readable at ``started_at + (event_time(o) -
start_time)``, ``started_at`` being the moment Eddyline opened the checkpoint. Two query outputs
read the same source:

* ``q1`` (utility 1): tumbling 2 s window per key, ``n = count(*)``, ``total = sum(value)``;
* ``q2`` (utility 0.3): ``dedup`` on ``(key, value)``, a pair remembered for ``ttl`` of event
  time (its lanes receive every raw row: the expensive step).

Both sinks are Parquet files with ``qos: {latency: B, utility: w}``.

**Calibration** (before the systems; skipped with ``--rate`` and ``--bound`` unless a declared
system runs): the same network, unpaced, 1 s of event time per epoch, at two fixed epoch sizes,
fitted to ``D(n) = F + c n``. Without ``--bound`` the bound is ``B = 2.5 F`` rounded up to 0.5 s (an epoch's fixed cost is large and noisy on this machine, so the budget ``0.8 B`` leaves
about ``F`` for rows); the capacity within the budget is ``n_max = (0.8 B - F) / c`` rows per epoch,
i.e. ``R_max = n_max / (0.8 B)`` rows/s when epochs run back to back; the normal rate is
``R = R_max / 2`` and the burst ``3 R_max`` (so the burst is ``--burst-factor`` x what an epoch can
process within the bound), unless a row cap (``--max-rows``) lowers both (then said in the JSON).
On this shared machine that estimate was not reliable (see README.md); the reported runs give
``--bound 4.5 --rate 67000 --burst-factor 6``.

**Native Spark.** Before its run, the same rows (``generator_frame`` over all offsets) are written
as Parquet chunks of 0.5 s of event time each (file name = first and last offset). A feeder thread
moves (renames) each chunk into the watched directory when its last row's arrival time has come
(same schedule as Eddyline's source, relative to the native run's start). Two streaming queries
(``readStream.parquet``, all new files per micro-batch, ``trigger(processingTime = trigger)``):
``q1`` = ``withWatermark(0 s)`` + ``groupBy(window(2 s), key)`` count/sum, append; ``q2`` =
``withWatermark(ttl / 2).dropDuplicatesWithinWatermark([key, value])``. The files of each
micro-batch come from the query's file-source log (``checkpoint/sources/0``).

**Latency, the same way for all systems:** for each epoch / micro-batch with input,
``latency = end wall time - arrival wall time of the slice's NEWEST offset`` (end = after the
commit; native: progress ``timestamp`` + ``durationMs.triggerExecution``). It is the processing
duration plus how long the newest row waited. ``latency_oldest`` (same, oldest offset) is kept too.
An epoch belongs to the phase of its newest row (backlog drained later counts where it arrived).

**Error** of q1 against the exact answer (DuckDB over the generated rows): per window, relative
error of ``n`` and ``total``; a window that the exact answer has but the output lacks (all its rows
shed) counts with error 1; only windows inside the span a system emitted are compared (native
Spark never emits the last windows). ``within`` = share of shed windows whose exact value lies
inside the reported ``n_error`` / ``total_error`` half-width.

**Utility:** per query, rows kept by the shed point / rows read; ``keptUtility`` = Σ_q u_q kept_q /
Σ_q u_q read_q (utility-weighted fraction of input kept), and ``outputUtility`` = Σ_q u_q x
output rows_q.

Usage::

    python bench/overload/run_overload.py            # calibrate + 6 systems: ~9-12 min
    python bench/overload/run_overload.py --quick    # shorter phases, lp, uniform, off, native: ~5 min
    python bench/overload/run_overload.py --bound 4.5 --rate 67000 --burst-factor 6   # as reported
    python bench/overload/run_overload.py --md-from bench/results/overload.json   # only report

Writes ``bench/results/overload.json``, ``bench/overload/overload.png`` and the
``<!-- overload:start -->`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
RESULTS = BENCH / "results"
OUT_JSON = RESULTS / "overload.json"
OUT_PNG = HERE / "overload.png"
sys.path.insert(0, str(BENCH))
import results_io  # noqa: E402

MD_START, MD_END = "<!-- overload:start -->", "<!-- overload:end -->"

WINDOW_MS = 2000
UTILITY = {"q1": 1.0, "q2": 0.3}
PHASES = ("normal", "burst", "after")
CHUNK_S = 0.5  # native feed: one Parquet file per 0.5 s of event time


# ----------------------------------------------------------------------------- the network
def network(cfg: dict[str, Any], out: Path, system: str | None, *, unpaced_rows: int | None = None) -> dict[str, Any]:
    """The benchmark network; ``system`` None: no overload control (calibration)."""
    if unpaced_rows is not None:
        # 1 s of event time per epoch, like a paced epoch: window firing and TTL expiry per epoch
        # cost time that grows with the event time an epoch spans, not with its rows
        gen: dict[str, Any] = {"rate": unpaced_rows, "keys": cfg["keys"], "seed": cfg["seed"], "unpaced": True}
        source: dict[str, Any] = {"name": "src", "generator": gen, "max_rows_per_epoch": unpaced_rows}
    else:
        source = {"name": "src", "generator": generator_params(cfg), "limit": cfg["rows_total"]}
    qos = {"latency": f"{cfg.get('bound_ms', 1000)}ms"}
    spec: dict[str, Any] = {
        "name": "overload",
        "trigger": 0 if unpaced_rows else f"{cfg['trigger_ms']}ms",
        "lanes": 2,
        "key_groups": 64,
        "sources": [source],
        "steps": [
            {"name": "win", "input": "src", "window_aggregate": {
                "key": "key", "time": "event_time", "window": {"size": f"{WINDOW_MS}ms"},
                "aggregates": {"n": "count(*)", "total": "sum(value)"}}},
            {"name": "dedup", "input": "src", "dedup": {
                "key": ["key", "value"], "time": "event_time", "ttl": f"{cfg['ttl_ms']}ms"}},
        ],
        "sinks": [
            {"name": "q1", "input": "win", "files": {"path": str(out / "q1")},
             **({"qos": {**qos, "utility": UTILITY["q1"]}} if system else {})},
            {"name": "q2", "input": "dedup", "files": {"path": str(out / "q2")},
             **({"qos": {**qos, "utility": UTILITY["q2"]}} if system else {})},
        ],
    }
    if system:
        mode = {"lp": "lp", "lp-declared": "lp", "uniform": "uniform", "uniform-declared": "uniform",
                "off": "off"}[system]
        overload: dict[str, Any] = {"shedding": mode, "seed": 11, "headroom": cfg["headroom"],
                                    "probe_rows": cfg["probe_rows"]}
        if system.endswith("-declared"):
            overload["cost_model"] = cfg["declared_cost_model"]
        spec["control"] = {"overload": overload}
    return spec


def generator_params(cfg: dict[str, Any]) -> dict[str, Any]:
    d1, d2, d3 = cfg["phases_s"]
    return {"rate": cfg["rate"], "keys": cfg["keys"], "seed": cfg["seed"],
            "phases": [{"duration": f"{d1}s"}, {"duration": f"{d2}s", "rate": cfg["burst_rate"]},
                       {"duration": f"{d3}s"}]}


def generator_model(cfg: dict[str, Any]) -> Any:
    from eddyline.io.generator import Generator

    return Generator(**generator_params(cfg))


class _Timeline:
    """Arrival times (s after the run's start) of offsets, from the generator's phase schedule."""

    def __init__(self, cfg: dict[str, Any]):
        from eddyline.io.generator import epoch_micros, generator_available, generator_event_time_ms

        self.params = generator_model(cfg)
        self.start_ms = epoch_micros(self.params.start_time) // 1000
        self._et = generator_event_time_ms
        d1, d2, d3 = cfg["phases_s"]
        self.bounds_s = [0.0, float(d1), float(d1 + d2), float(d1 + d2 + d3)]
        self.burst_first = generator_available(self.params, d1)  # first offset after normal phase 1 (approx)
        self.burst_end = generator_available(self.params, d1 + d2)  # offsets of phases 1-2

    def arrival_s(self, offset: int) -> float:
        return (self._et(self.params, offset) - self.start_ms) / 1000.0

    def phase_of_wall(self, t_s: float) -> str:
        if t_s < self.bounds_s[1]:
            return "normal"
        if t_s < self.bounds_s[2]:
            return "burst"
        return "after"

    def phase_of_offset(self, offset: int) -> str:
        return "normal" if offset < self.burst_first else "burst" if offset < self.burst_end else "after"

    def split(self, start: int, end: int) -> dict[str, int]:
        """How many of the offsets [start, end) belong to each phase."""
        cuts = [0, self.burst_first, self.burst_end, 2**62]
        return {p: max(0, min(end, cuts[i + 1]) - max(start, cuts[i])) for i, p in enumerate(PHASES)}

    def phase_of_event_ms(self, ms: int) -> str:
        return self.phase_of_wall((ms - self.start_ms) / 1000.0)


# ----------------------------------------------------------------------------- calibration
class _Keep:
    """A reporter that keeps each record with the wall time it was reported at."""

    console = None

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def report(self, record: dict[str, Any]) -> None:
        record["_wall"] = time.time()
        self.records.append(record)


def calibrate(spark: Any, cfg: dict[str, Any], tmp: Path, sizes: list[int], epochs: int) -> dict[str, Any]:
    """D(n) = F + c n from unpaced runs at fixed epoch sizes (the first 2 epochs are warm-up)."""
    from eddyline.api.validate import load_spec
    from eddyline.runtime.engine import Engine

    points: list[tuple[int, float]] = []
    spans: dict[str, list[tuple[int, float]]] = {"win": [], "dedup": []}
    per_size = {}
    for n in sizes:
        rep = _Keep()
        d = tmp / f"calib-{n}"
        Engine(load_spec(network(cfg, d, None, unpaced_rows=n)), spark, str(d / "ck"), reporter=rep).run(epochs=2 + epochs)  # type: ignore[arg-type]
        measured = rep.records[2:]
        durs = [r["durationMs"]["triggerExecution"] for r in measured]
        per_size[n] = {"durations_ms": durs, "median_ms": statistics.median(durs)}
        for r in measured:
            points.append((r["numInputRows"], r["durationMs"]["triggerExecution"]))
            for step, load in r["load"].items():
                spans[step].append((r["numInputRows"], max(load["laneBusyMs"], default=0.0)))
        shutil.rmtree(d, ignore_errors=True)
        print(f"  calibration {n:>9,} rows/epoch: {', '.join(f'{x:.0f}' for x in durs)} ms", flush=True)
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    c, f = np.polyfit(x, y, 1)
    med = [per_size[n]["median_ms"] for n in sizes]
    c_med = (med[-1] - med[0]) / (sizes[-1] - sizes[0])
    step_c = {}
    for step, pts in spans.items():
        sx = np.array([p[0] for p in pts], float)
        sy = np.array([p[1] for p in pts], float)
        step_c[step] = max(0.0, float(np.polyfit(sx, sy, 1)[0]))
    return {
        "sizes": sizes, "per_size": per_size, "fit": {"F_ms": float(f), "c_ms_per_row": float(c)},
        "median_fit": {"F_ms": med[0] - c_med * sizes[0], "c_ms_per_row": c_med},
        "F_small_median_ms": med[0],
        "lane_makespan_ms_per_row": step_c,
    }


def derive_rates(cfg: dict[str, Any], cal: dict[str, Any] | None, args: argparse.Namespace) -> None:
    """Fill bound, rates and the declared cost model in ``cfg`` (see the module docstring)."""
    if cal is not None:
        f = max(cal["fit"]["F_ms"], cal["F_small_median_ms"] * 0.8)
        c = max(cal["fit"]["c_ms_per_row"], cal["median_fit"]["c_ms_per_row"], 1e-5)
    else:
        f, c = float("nan"), float("nan")
    cfg["bound_ms"] = int(args.bound * 1000) if args.bound else max(1000, int(math.ceil(2.5 * f / 500) * 500))
    budget = cfg["headroom"] * cfg["bound_ms"]
    if cal is not None:
        n_max = max(budget - f, 0.1 * budget) / c
        cfg["capacity_rows_per_epoch"] = round(n_max)
        cfg["capacity_rows_per_s"] = round(n_max / (budget / 1000))
    if args.rate:
        cfg["rate"] = float(args.rate)
        cfg["burst_rate"] = cfg["rate"] * args.burst_factor
        cfg["rates_from"] = "command line"
    else:
        r_max = cfg["capacity_rows_per_s"]
        burst = args.burst_factor * r_max
        normal = r_max / 2
        d1, d2, d3 = cfg["phases_s"]
        total = normal * (d1 + d3) + burst * d2
        if total > args.max_rows:
            scale = args.max_rows / total
            normal, burst = normal * scale, burst * scale
            cfg["rates_capped_by_max_rows"] = round(scale, 3)
        cfg["rate"] = float(round(normal, -2))
        cfg["burst_rate"] = float(round(burst, -2))
        cfg["rates_from"] = "calibration"
    from eddyline.io.generator import generator_available

    cfg["rows_total"] = generator_available(generator_model(cfg), sum(cfg["phases_s"]))
    cfg["probe_rows"] = max(10_000, int(cfg["rate"] * budget / 1000))
    if cal is not None:
        steps = {"win": cal["lane_makespan_ms_per_row"]["win"], "dedup": cal["lane_makespan_ms_per_row"]["dedup"]}
        # each step's lanes are a separate Spark stage, so their makespans add up; the rest of the
        # per-row cost (generating, routing, the window's partial aggregate) is reading
        read = max(0.0, c - sum(steps.values()))
        cfg["declared_cost_model"] = {"fixed_ms": round(f, 1), "read_ms_per_row": round(read, 6),
                                      "step_ms_per_row": {k: round(v, 6) for k, v in steps.items()}}


# ----------------------------------------------------------------------------- Eddyline
def run_eddyline(
    spark: Any, cfg: dict[str, Any], system: str, tmp: Path, timeline: _Timeline, *, warm_s: float | None = None
) -> dict[str, Any]:
    """One system's run; ``warm_s``: a warm-up of that many seconds, not reported."""
    from eddyline.api.validate import load_spec
    from eddyline.runtime.engine import Engine

    out = tmp / (f"{system}-warm" if warm_s else system)
    shutil.rmtree(out, ignore_errors=True)
    spec = load_spec(network(cfg, out, system))
    rep = _Keep()
    deadline = [0.0]
    t_begin = time.time()
    deadline[0] = t_begin + (warm_s or sum(cfg["phases_s"]) + cfg["drain_s"])
    engine = Engine(spec, spark, str(out / "ck"), reporter=rep)  # type: ignore[arg-type]
    summary = engine.run(until_idle=True, should_stop=lambda: time.time() > deadline[0])
    started_at = json.loads((out / "ck" / "metadata.json").read_text())["started_at"]
    epochs = []
    for r in rep.records:
        src = r["sources"][0]
        start, end = src["startOffset"], src["endOffset"]
        t_end = r["_wall"] - started_at
        e: dict[str, Any] = {
            "epoch": r["batchId"], "t_end": round(t_end, 3), "rows": r["numInputRows"], "start": start, "end": end,
            "duration_ms": r["durationMs"]["triggerExecution"], "planning_ms": r["durationMs"]["planning"],
            "backlog": r.get("backlog", {}).get("src", 0), "sinks": {s["description"]: s["numOutputRows"] for s in r["sinks"]},
        }
        if end > start:
            e["phase"] = timeline.phase_of_offset(end - 1)
            e["lat_newest_ms"] = round((t_end - timeline.arrival_s(end - 1)) * 1000, 1)
            e["lat_oldest_ms"] = round((t_end - timeline.arrival_s(start)) * 1000, 1)
        e["makespan_ms"] = {step: max(load["laneBusyMs"], default=0.0) for step, load in r.get("load", {}).items()}
        ov = r.get("overload")
        if ov:
            e["shed"] = {q: v["shedFraction"] for q, v in ov["quality"].items()}
            e["keep"] = {s: v["keep"] for s, v in ov["shed"].items()}
            e["offered_kept"] = {s: [v["offered"], v["kept"]] for s, v in ov["shed"].items()}
        dec = next((d for d in r.get("decisions", []) if d.get("kind") == "overload"), None)
        if dec:
            why = dec["why"]
            e["why"] = {k: why.get(k) for k in ("reason", "takeRows", "availableRows", "budgetMs", "predictedMs",
                                                "predictedMsAllRows", "capacityMs", "status", "keep", "expectedUtility")
                        if k in why}
            if "model" in why:
                m = why["model"]
                e["why"]["model"] = {"F": m.get("F"), "a": m.get("a"), "cost": m.get("cost"),
                                     "selectivity": m.get("selectivity"), "sink_selectivity": m.get("sink_selectivity")}
        epochs.append(e)
    unread = cfg["rows_total"] - (epochs[-1]["end"] if epochs else 0)
    result = {"system": system, "epochs": epochs, "wall_s": round(time.time() - t_begin, 1),
              "input_rows": summary.input_rows, "unread_rows_at_stop": unread,
              "output_rows": summary.output_rows, "stopped_by_deadline": time.time() > deadline[0]}
    result["q1_windows"] = _eddyline_windows(out / "q1")
    return result


def _eddyline_windows(path: Path) -> Any:
    import duckdb

    files = list(path.glob("epoch=*/*.parquet"))
    if not files:
        return None
    con = duckdb.connect()
    return con.sql(f"""
        SELECT key, epoch_ms(window_start::TIMESTAMP) AS ws, n::DOUBLE AS n, total::DOUBLE AS total,
               {'n_error' if _has(con, path, 'n_error') else 'NULL'}::DOUBLE AS n_error,
               {'total_error' if _has(con, path, 'total_error') else 'NULL'}::DOUBLE AS total_error,
               CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS BIGINT) AS epoch, revision
        FROM read_parquet('{path}/epoch=*/*.parquet', union_by_name = true, filename = true, hive_partitioning = false)
    """).to_arrow_table()


def _has(con: Any, path: Path, col: str) -> bool:
    cols = [c[0] for c in con.execute(
        f"DESCRIBE SELECT * FROM read_parquet('{path}/epoch=*/*.parquet', union_by_name = true, hive_partitioning = false)").fetchall()]
    return col in cols


# ----------------------------------------------------------------------------- native Spark
def write_feed(spark: Any, cfg: dict[str, Any], timeline: _Timeline, staging: Path) -> list[dict[str, Any]]:
    """All rows as Parquet chunks of CHUNK_S seconds of event time; returns the chunk list."""
    import pyarrow.parquet as pq

    from eddyline.io.generator import generator_available, generator_frame

    staging.mkdir(parents=True, exist_ok=True)
    table = generator_frame(spark, timeline.params, 0, cfg["rows_total"], 2).toArrow()
    assert table.num_rows == cfg["rows_total"]
    chunks = []
    total_s = sum(cfg["phases_s"])
    lo, k = 0, 0
    t = CHUNK_S
    while lo < cfg["rows_total"]:
        hi = min(cfg["rows_total"], generator_available(timeline.params, t)) if t < total_s else cfg["rows_total"]
        if hi > lo:
            name = f"{k:05d}_{lo:010d}_{hi - 1:010d}.parquet"
            pq.write_table(table.slice(lo, hi - lo), staging / name)
            chunks.append({"name": name, "first": lo, "last": hi - 1, "arrival_s": timeline.arrival_s(hi - 1)})
            k += 1
        lo = hi
        t += CHUNK_S
    return chunks


def run_native(spark: Any, cfg: dict[str, Any], tmp: Path, staging: Path, chunks: list[dict[str, Any]],
               timeline: _Timeline, *, warm: bool = False) -> dict[str, Any]:
    from pyspark.sql import functions as F

    base = tmp / ("native-warm" if warm else "native")
    shutil.rmtree(base, ignore_errors=True)
    feed = base / "feed"
    feed.mkdir(parents=True)
    use = chunks[:4] if warm else chunks
    schema = "offset long, key long, value long, event_time timestamp"
    src = spark.readStream.schema(schema).parquet(str(feed))
    trigger = {"availableNow": True} if warm else {"processingTime": f"{cfg['trigger_ms']} milliseconds"}
    q1 = (
        src.withWatermark("event_time", "0 seconds")
        .groupBy(F.window("event_time", f"{WINDOW_MS} milliseconds"), "key")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))
        .select("key", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "n", "total")
        .writeStream.format("parquet").option("path", str(base / "q1")).option("checkpointLocation", str(base / "ck1"))
        .outputMode("append").queryName(f"native_q1{'_warm' if warm else ''}").trigger(**trigger)
    )
    q2 = (
        src.withWatermark("event_time", f"{cfg['ttl_ms'] // 2} milliseconds")
        .dropDuplicatesWithinWatermark(["key", "value"])
        .writeStream.format("parquet").option("path", str(base / "q2")).option("checkpointLocation", str(base / "ck2"))
        .outputMode("append").queryName(f"native_q2{'_warm' if warm else ''}").trigger(**trigger)
    )
    if warm:
        for c in use:
            shutil.copy2(staging / c["name"], feed / c["name"])
        for w in (q1, q2):
            w.start().awaitTermination(300)
        return {}
    moved: list[float] = []
    stop = threading.Event()
    t0 = [0.0]

    def feeder() -> None:
        for c in use:
            wait = t0[0] + c["arrival_s"] - time.time()
            if wait > 0 and stop.wait(wait):
                return
            os.rename(staging / c["name"], feed / c["name"])
            moved.append(time.time() - t0[0] - c["arrival_s"])

    t0[0] = time.time()
    queries = {"q1": q1.start(), "q2": q2.start()}
    th = threading.Thread(target=feeder, daemon=True)
    th.start()
    deadline = t0[0] + sum(cfg["phases_s"]) + cfg["drain_s"]
    last_name = use[-1]["name"]
    try:
        while time.time() < deadline:
            time.sleep(0.5)
            for q in queries.values():
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
            if not th.is_alive() and all(last_name in _batch_files(base / f"ck{i}")["__all__"] for i in (1, 2)):
                time.sleep(2 * cfg["trigger_ms"] / 1000)  # one more (no-data) batch may emit windows
                break
    finally:
        stop.set()
        for q in queries.values():
            q.stop()
        th.join(timeout=5)
    for c in use:  # put the chunks back for another round
        if (feed / c["name"]).exists():
            os.rename(feed / c["name"], staging / c["name"])
    by_name = {c["name"]: c for c in use}
    epochs: dict[str, list[dict[str, Any]]] = {}
    for qname, q in queries.items():
        files = _batch_files(base / f"ck{qname[1]}")
        rows = []
        for p in q.recentProgress:
            t_start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            t_end = t_start + p["durationMs"]["triggerExecution"] / 1000 - t0[0]
            e: dict[str, Any] = {"epoch": p["batchId"], "t_end": round(t_end, 3), "rows": p["numInputRows"],
                                 "duration_ms": p["durationMs"]["triggerExecution"]}
            names = [n for n in files.get(p["batchId"], set()) if n in by_name]
            if names and p["numInputRows"] > 0:
                newest = max(by_name[n]["last"] for n in names)
                oldest = min(by_name[n]["first"] for n in names)
                e.update(start=oldest, end=newest + 1, phase=timeline.phase_of_offset(newest),
                         lat_newest_ms=round((t_end - timeline.arrival_s(newest)) * 1000, 1),
                         lat_oldest_ms=round((t_end - timeline.arrival_s(oldest)) * 1000, 1))
            rows.append(e)
        epochs[qname] = rows
    consumed = max((e.get("end", 0) for e in epochs["q1"] + epochs["q2"]), default=0)
    unread = {q: cfg["rows_total"] - max((e.get("end", 0) for e in es), default=0) for q, es in epochs.items()}
    result = {
        "system": "native", "epochs_by_query": epochs,
        # one timeline: every micro-batch of either query (each is a commit of one query output)
        "epochs": sorted(epochs["q1"] + epochs["q2"], key=lambda e: e["t_end"]),
        "unread_rows_at_stop": unread, "consumed": consumed,
        "feeder_late_s": {"max": round(max(moved, default=0.0), 3), "median": round(statistics.median(moved), 3) if moved else 0},
        "q1_windows": _native_windows(base / "q1"),
        "output_rows": {q: _parquet_rows(base / q) for q in ("q1", "q2")},
    }
    return result


def _batch_files(ck: Path) -> dict[Any, set[str]]:
    """batchId -> file names, from a file source's metadata log (plain and .compact files)."""
    out: dict[Any, set[str]] = {"__all__": set()}
    log = ck / "sources" / "0"
    if not log.exists():
        return out
    for f in log.iterdir():
        if f.name.startswith(".") or f.name.endswith(".tmp"):
            continue
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            name = entry["path"].rsplit("/", 1)[-1]
            out.setdefault(entry["batchId"], set()).add(name)
            out["__all__"].add(name)
    return out


def _parquet_rows(path: Path) -> int:
    import duckdb

    if not list(path.rglob("*.parquet")):
        return 0
    return int(duckdb.connect().execute(
        f"SELECT count(*) FROM read_parquet('{path}/**/*.parquet', hive_partitioning = false)").fetchone()[0])


def _native_windows(path: Path) -> Any:
    import duckdb

    if not list(path.glob("*.parquet")):
        return None
    return duckdb.connect().sql(f"""
        SELECT key, epoch_ms(window_start::TIMESTAMP) AS ws, n::DOUBLE AS n, total::DOUBLE AS total,
               NULL::DOUBLE AS n_error, NULL::DOUBLE AS total_error, -1::BIGINT AS epoch, 0 AS revision
        FROM read_parquet('{path}/*.parquet')
    """).to_arrow_table()


# ----------------------------------------------------------------------------- analysis
def exact_windows(staging: Path) -> Any:
    import duckdb

    return duckdb.connect().sql(f"""
        SELECT key, (epoch_ms(event_time::TIMESTAMP) // {WINDOW_MS}) * {WINDOW_MS} AS ws,
               count(*)::DOUBLE AS n, sum(value)::DOUBLE AS total
        FROM read_parquet('{staging}/*.parquet') GROUP BY ALL
    """).to_arrow_table()


def window_errors(exact: Any, got: Any, timeline: _Timeline) -> dict[str, Any]:
    """Relative errors of q1's n and total per window, per phase and per emitting epoch."""
    import duckdb

    if got is None:
        return {}
    con = duckdb.connect()
    con.register("exact", exact)
    con.register("got", got)
    rows = con.execute("""
        WITH span AS (SELECT min(ws) AS lo, max(ws) AS hi FROM got),
             g AS (SELECT key, ws, sum(n) AS n, sum(total) AS total, max(n_error) AS n_error,
                          max(total_error) AS total_error, min(epoch) AS epoch, count(*) AS versions
                   FROM got GROUP BY key, ws)
        SELECT e.key, e.ws, e.n AS xn, e.total AS xt, g.n, g.total, g.n_error, g.total_error, g.epoch, g.versions
        FROM exact e, span LEFT JOIN g ON e.key = g.key AND e.ws = g.ws
        WHERE e.ws BETWEEN span.lo AND span.hi
    """).fetchall()
    per: dict[str, dict[str, list[float]]] = {p: {"n": [], "total": [], "in_n": [], "in_t": [], "missing": []} for p in PHASES}
    by_epoch: dict[int, list[float]] = {}
    for _key, ws, xn, xt, n, total, ne, te, epoch, _v in rows:
        ph = timeline.phase_of_event_ms(ws)
        if n is None:
            rn = rt = 1.0
            per[ph]["missing"].append(1.0)
        else:
            rn = abs(n - xn) / xn
            rt = abs(total - xt) / xt if xt else (0.0 if total == 0 else 1.0)
            per[ph]["missing"].append(0.0)
            if ne is not None and ne > 0:
                per[ph]["in_n"].append(float(abs(n - xn) <= ne + 1e-6))
            if te is not None and te > 0:
                per[ph]["in_t"].append(float(abs(total - xt) <= te + 1e-6))
            if epoch is not None and epoch >= 0:
                by_epoch.setdefault(int(epoch), []).append(rn)
        per[ph]["n"].append(rn)
        per[ph]["total"].append(rt)

    def mean(v: list[float]) -> float | None:
        return round(float(np.mean(v)), 5) if v else None

    return {
        "windows_compared": len(rows),
        "per_phase": {p: {"mre_n": mean(d["n"]), "mre_total": mean(d["total"]), "windows": len(d["n"]),
                          "missing": int(sum(d["missing"])), "shed_windows": len(d["in_n"]),
                          "within_error_n": mean(d["in_n"]), "within_error_total": mean(d["in_t"])}
                      for p, d in per.items()},
        "all": {"mre_n": mean([x for d in per.values() for x in d["n"]]),
                "mre_total": mean([x for d in per.values() for x in d["total"]]),
                "within_error_n": mean([x for d in per.values() for x in d["in_n"]]),
                "within_error_total": mean([x for d in per.values() for x in d["in_t"]])},
        "by_epoch": {e: round(float(np.mean(v)), 5) for e, v in sorted(by_epoch.items())},
    }


def _pct(v: list[float], q: float) -> float | None:
    return round(float(np.percentile(v, q)), 1) if v else None


def summarize(run: dict[str, Any], cfg: dict[str, Any], timeline: _Timeline) -> dict[str, Any]:
    """Per phase (of the data: an epoch belongs to the phase of its newest row): latency, shed
    fractions and kept utility (an epoch's rows are split over phases by offset)."""
    epochs = [e for e in run["epochs"] if "lat_newest_ms" in e]
    bound = cfg["bound_ms"]
    eddy = run["system"] != "native"
    s: dict[str, Any] = {"per_phase": {}}
    read = dict.fromkeys(PHASES, 0)
    kept = {p: dict.fromkeys(UTILITY, 0.0) for p in PHASES}
    for e in epochs:
        for p, n in timeline.split(e["start"], e["end"]).items():
            read[p] += n
            for q in UTILITY:
                kept[p][q] += n * (1 - e.get("shed", {}).get(q, 0.0))

    def kept_utility(r: int, k: dict[str, float]) -> float | None:
        return round(sum(UTILITY[q] * k[q] for q in UTILITY) / (sum(UTILITY.values()) * r), 4) if r else None

    for p in PHASES:
        es = [e for e in epochs if e["phase"] == p]
        lat = [e["lat_newest_ms"] for e in es]
        old = [e["lat_oldest_ms"] for e in es]
        dur = [e["duration_ms"] for e in es]
        d: dict[str, Any] = {
            "epochs": len(es), "rows": read[p],
            "lat_p50": _pct(lat, 50), "lat_p99": _pct(lat, 99), "lat_max": max(lat, default=None),
            "lat_min": min(lat, default=None), "lat_oldest_p99": _pct(old, 99),
            "dur_p50": _pct(dur, 50), "dur_p99": _pct(dur, 99),
            "within_bound": round(sum(x <= bound for x in lat) / len(lat), 3) if lat else None,
        }
        if eddy:
            d["shed"] = {q: round(1 - kept[p][q] / read[p], 4) if read[p] else 0.0 for q in UTILITY}
            d["kept_utility"] = kept_utility(read[p], kept[p])
            d["shedding_epochs"] = sum(1 for e in es if any(v > 0 for v in e.get("shed", {}).values()))
        s["per_phase"][p] = d
    s["output_utility"] = round(sum(UTILITY[q] * v for q, v in run["output_rows"].items() if q in UTILITY), 1)
    if eddy:
        total = sum(read.values())
        tk = {q: sum(kept[p][q] for p in PHASES) for q in UTILITY}
        s["kept_fraction"] = {q: round(tk[q] / total, 4) if total else None for q in UTILITY}
        s["kept_utility"] = kept_utility(total, tk)
        # epochs whose whole slice comes after the burst: index of the last one that sheds
        after = [e for e in run["epochs"] if e["start"] >= timeline.burst_end and e["rows"] > 0]
        shedding_after = [i for i, e in enumerate(after) if any(v > 0 for v in e.get("shed", {}).values())]
        s["epochs_after_burst"] = len(after)
        s["shedding_epochs_after_burst"] = len(shedding_after)
        s["shedding_stops_after"] = (shedding_after[-1] + 1) if shedding_after else 0
        s["shed_any"] = any(any(v > 0 for v in e.get("shed", {}).values()) for e in run["epochs"])
        # the same, for epochs that END after the burst's last row arrived (wall time)
        wall_after = [e for e in run["epochs"] if e["t_end"] > timeline.bounds_s[2] and e["rows"] > 0]
        shed_wall = [i for i, e in enumerate(wall_after) if any(v > 0 for v in e.get("shed", {}).values())]
        s["epochs_ending_after_burst"] = len(wall_after)
        s["shedding_stops_after_wall"] = (shed_wall[-1] + 1) if shed_wall else 0
        s["shedding_after_wall_s"] = round(wall_after[shed_wall[-1]]["t_end"] - timeline.bounds_s[2], 1) if shed_wall else 0.0
        ratios = [e["why"]["predictedMs"] / e["duration_ms"] for e in run["epochs"]
                  if e.get("why", {}).get("predictedMs") and e["duration_ms"] > 0 and e.get("keep")]
        s["predicted_over_actual"] = [round(min(ratios), 2), round(statistics.median(ratios), 2), round(max(ratios), 2)] if ratios else None
    burst = [e for e in epochs if e["phase"] == "burst"]
    lat = [e["lat_newest_ms"] for e in burst]
    s["burst_trend_ms_per_s"] = round(float(np.polyfit([e["t_end"] for e in burst], lat, 1)[0]), 1) if len(burst) >= 3 else None
    s["burst_latency_first_last"] = [lat[0], lat[-1]] if lat else None
    return s


# ----------------------------------------------------------------------------- report
def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, judged on the first round's runs (see the README for the criteria)."""
    sm = {k: v["summary"] for k, v in result["runs"].items()}
    bound = result["config"]["bound_ms"]
    out = []
    for lp_name, un_name, label in (("lp", "uniform", "fitted cost model"), ("lp-declared", "uniform-declared", "declared cost model")):
        if lp_name not in sm or un_name not in sm:
            continue
        lp, un = sm[lp_name], sm[un_name]
        p99 = [lp["per_phase"]["burst"]["lat_p99"], un["per_phase"]["burst"]["lat_p99"]]
        both_shed = lp["shed_any"] and un["shed_any"]
        # "at the same latency": LP's burst p99 at most 10 % above uniform's
        same = None not in p99 and p99[0] <= 1.1 * p99[1]
        better = (lp["kept_utility"] or 0) > (un["kept_utility"] or 0)
        within = all(x is not None and x <= bound for x in p99)
        out.append({"goal": f"1. LP-coordinated shedding beats uniform shedding on total utility at the same latency ({label})",
                    "met": bool(same and better) if both_shed else None,
                    "evidence": (("" if both_shed else "not tested: a system did not shed; ")
                                 + f"utility-weighted kept fraction LP {_f(lp['kept_utility'], 1, True)} vs uniform "
                                 f"{_f(un['kept_utility'], 1, True)}; Σ u·output rows LP {_f(lp['output_utility'])} vs uniform "
                                 f"{_f(un['output_utility'])}; burst p99 latency LP {_f(p99[0])} ms vs uniform {_f(p99[1])} ms "
                                 f"({'both' if within else 'not both'} within B = {bound} ms)")})
    if "native" in sm:
        nv = sm["native"]
        trend = nv.get("burst_trend_ms_per_s")
        fl = nv.get("burst_latency_first_last") or [None, None]
        # growing = rising through the burst (> 0.1 s per s) and ending it above the bound
        grows = trend is not None and trend > 100 and fl[1] is not None and fl[1] > bound
        eddy = [k for k in ("lp", "lp-declared") if k in sm]
        bounded = {k: (sm[k]["per_phase"]["burst"]["lat_p99"] or 1e18) <= bound for k in eddy}
        out.append({"goal": "2. native Spark's latency keeps growing during the burst while Eddyline's stays bounded",
                    "met": bool(grows and bounded.get("lp")),
                    "evidence": (f"native: burst latency {_f(fl[0])} → {_f(fl[1])} ms (trend {trend} ms per s), burst p99 "
                                 f"{_f(nv['per_phase']['burst']['lat_p99'])} ms, after p99 {_f(nv['per_phase']['after']['lat_p99'])} ms; "
                                 + "; ".join(f"Eddyline {k}: burst p99 {_f(sm[k]['per_phase']['burst']['lat_p99'])} ms, after p99 "
                                             f"{_f(sm[k]['per_phase']['after']['lat_p99'])} ms" for k in eddy)
                                 + f" (bounded = burst p99 ≤ B = {bound} ms)")})
    shedders = [k for k in ("lp", "uniform", "lp-declared", "uniform-declared") if k in sm and sm[k]["shed_any"]]
    never = [k for k in ("lp", "uniform", "lp-declared", "uniform-declared") if k in sm and not sm[k]["shed_any"]]
    if shedders:
        rows = [f"{k}: {sm[k]['shedding_stops_after']} / {sm[k]['shedding_stops_after_wall']}" for k in shedders]
        ok = all(sm[k]["shedding_stops_after"] <= 3 and sm[k]["shedding_stops_after_wall"] <= 3 for k in shedders)
        out.append({"goal": "3. after the burst, shedding stops within 3 epochs", "met": bool(ok),
                    "evidence": ("last shedding epoch among epochs whose slice starts after the burst's last row / among epochs "
                                 "ending after the burst's last row arrived: " + "; ".join(rows)
                                 + (f" (never shed: {', '.join(never)})" if never else ""))})
    return out


def _f(x: Any, nd: int = 0, pct: bool = False) -> str:
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:.{nd}f} %"
    return f"{x:,.{nd}f}"


def tables_md(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = []
    cal = result.get("calibration")
    lines.append(
        f"Run {result['when'][:16]} ({'--quick' if cfg['quick'] else 'full'}; {cfg['rounds']} round(s)), "
        f"`local[2]`, 2 lanes. Phases (event time = arrival time): normal {cfg['phases_s'][0]} s at "
        f"{cfg['rate']:,.0f} rows/s → burst {cfg['phases_s'][1]} s at {cfg['burst_rate']:,.0f} rows/s → normal "
        f"{cfg['phases_s'][2]} s; {cfg['rows_total']:,} rows, {cfg['keys']:,} keys. Latency bound B = {cfg['bound_ms']} ms "
        f"on both sinks (headroom {cfg['headroom']}: epoch budget {cfg['headroom'] * cfg['bound_ms']:.0f} ms), "
        f"trigger {cfg['trigger_ms']} ms.")
    if cal:
        lines.append("")
        lines.append(
            f"Calibration (unpaced, same network, {', '.join(f'{n:,}' for n in cal['sizes'])} rows/epoch, median ms "
            f"{', '.join(_f(cal['per_size'][str(n)]['median_ms'] if str(n) in cal['per_size'] else cal['per_size'][n]['median_ms']) for n in cal['sizes'])}): "
            f"D(n) ≈ {cal['fit']['F_ms']:,.0f} ms + {cal['fit']['c_ms_per_row'] * 1000:.2f} µs × n (least squares; "
            f"medians: {cal['median_fit']['F_ms']:,.0f} ms + {cal['median_fit']['c_ms_per_row'] * 1000:.2f} µs × n). "
            f"Capacity within the budget ≈ {_f(cfg.get('capacity_rows_per_epoch'))} rows/epoch ≈ "
            f"{_f(cfg.get('capacity_rows_per_s'))} rows/s back to back; the burst is {cfg['burst_rate'] / cfg['capacity_rows_per_s']:.1f}× that "
            f"(rates from the {cfg.get('rates_from', 'calibration')})"
            f"{' (rates scaled by ' + str(cfg['rates_capped_by_max_rows']) + ' to cap the rows)' if cfg.get('rates_capped_by_max_rows') else ''}."
            if cfg.get("capacity_rows_per_s") else "")
    lines.append("")
    lines.append("Latency = epoch end − arrival of its newest row (ms); p99 (min–max) per phase; an epoch / micro-batch "
                 "belongs to the phase of its newest row (so backlog drained later counts where it arrived); "
                 "native Spark: the micro-batches of both queries. "
                 "Error = mean relative error of q1's `n` / `total` per window vs the exact answer (windows by event time).")
    lines.append("")
    lines.append("| system | phase | epochs | latency p50 | latency p99 (min–max) | ≤ B | shed q1 / q2 | q1 error n / total | exact within `_error` (n / total) |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    names = {"lp": "Eddyline, LP shedding", "uniform": "Eddyline, uniform shedding", "off": "Eddyline, admission only",
             "native": "Spark Structured Streaming", "lp-declared": "Eddyline, LP, declared cost model",
             "uniform-declared": "Eddyline, uniform, declared cost model"}
    for sys_name, run in result["runs"].items():
        s = run["summary"]
        err = run.get("errors", {}).get("per_phase", {})
        for p in PHASES:
            d = s["per_phase"][p]
            e = err.get(p, {})
            shed = f"{_f(d['shed']['q1'], 0, True)} / {_f(d['shed']['q2'], 0, True)}" if "shed" in d else "–"
            lines.append(
                f"| {names.get(sys_name, sys_name) if p == 'normal' else ''} | {p} | {d['epochs']} | {_f(d['lat_p50'])} | "
                f"{_f(d['lat_p99'])} ({_f(d['lat_min'])}–{_f(d['lat_max'])}) | {_f(d['within_bound'], 0, True)} | {shed} | "
                f"{_f(e.get('mre_n'), 3)} / {_f(e.get('mre_total'), 3)} | "
                f"{_f(e.get('within_error_n'), 0, True)} / {_f(e.get('within_error_total'), 0, True)} |")
    lines.append("")
    lines.append("Utility over the whole run (q1 utility 1, q2 utility 0.3): kept = Σ u·rows kept / Σ u·rows read; "
                 "output = Σ u·output rows; unread = rows not read when the run stopped "
                 f"(each run stops {cfg['drain_s']} s after the last row arrived).")
    lines.append("")
    lines.append("| system | kept q1 | kept q2 | kept utility | burst kept utility | output utility | unread at stop | "
                 "shedding epochs after the burst‡ | predicted / actual epoch ms (min, median, max) | load avg (start → end) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sys_name, run in result["runs"].items():
        s = run["summary"]
        load = " → ".join(f"{x:.1f}" for x in run.get("load_avg", []))
        unread = run.get("unread_rows_at_stop")
        if isinstance(unread, dict):
            unread = max(unread.values())
        if sys_name == "native":
            lines.append(f"| {names[sys_name]} | 100 % | 100 % | 100 % | 100 % | {_f(s['output_utility'])} | {_f(unread)} | – | – | {load} |")
            continue
        lines.append(
            f"| {names.get(sys_name, sys_name)} | {_f(s['kept_fraction']['q1'], 1, True)} | {_f(s['kept_fraction']['q2'], 1, True)} | "
            f"{_f(s['kept_utility'], 1, True)} | {_f(s['per_phase']['burst'].get('kept_utility'), 1, True)} | "
            f"{_f(s['output_utility'])} | {_f(unread)} | {s['shedding_stops_after']} of {s['epochs_after_burst']} / "
            f"{s['shedding_stops_after_wall']} of {s['epochs_ending_after_burst']} ({s['shedding_after_wall_s']} s) | "
            f"{', '.join(str(x) for x in s['predicted_over_actual']) if s.get('predicted_over_actual') else '–'} | {load} |")
    lines.append("")
    lines.append("‡ index of the last shedding epoch among the epochs whose slice starts after the burst's last row, "
                 "of how many; / the same among the epochs that end after the burst's last row arrived (wall time), "
                 "and how long after it that epoch ended. Predicted = the overload decision's `predictedMs`, "
                 "shedding epochs only.")
    lines.append("")
    lines.append("| goal | met? | evidence |")
    lines.append("|---|---|---|")
    for g in result["goals"]:
        met = "not tested" if g["met"] is None else "yes" if g["met"] else "no"
        lines.append(f"| {g['goal']} | **{met}** | {g['evidence']} |")
    return "\n".join(lines)


def write_results_md(result: dict[str, Any], prose: str = "") -> None:
    path = BENCH / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{MD_START}\n## Overload: a 3× burst against a latency bound (`bench/overload/run_overload.py`)\n\n" \
            f"{tables_md(result)}\n{prose}{MD_END}"
    if MD_START in text and MD_END in text:
        text = text[: text.index(MD_START)] + block + text[text.index(MD_END) + len(MD_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def plot(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    b = np.cumsum([0, *cfg["phases_s"]])
    colors = {"lp": "tab:blue", "uniform": "tab:orange", "off": "tab:green", "native": "tab:red",
              "lp-declared": "tab:purple", "uniform-declared": "tab:brown"}
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    for name, run in result["runs"].items():
        es = [e for e in run["epochs"] if "lat_newest_ms" in e]
        if name == "native":
            for q, marker in (("q1", "o"), ("q2", "x")):
                qs = [e for e in run["epochs_by_query"][q] if "lat_newest_ms" in e]
                axes[0].plot([e["t_end"] for e in qs], [e["lat_newest_ms"] / 1000 for e in qs], marker=marker, ms=3,
                             color=colors[name], lw=1, label=f"native Spark {q}")
        else:
            axes[0].plot([e["t_end"] for e in es], [e["lat_newest_ms"] / 1000 for e in es], marker="o", ms=3,
                         color=colors.get(name), lw=1.2, label=name)
            axes[2].plot([e["t_end"] for e in run["epochs"]], [e.get("shed", {}).get("q1", 0) for e in run["epochs"]],
                         color=colors.get(name), lw=1.2, ls="-", label=f"{name} q1")
            axes[2].plot([e["t_end"] for e in run["epochs"]], [e.get("shed", {}).get("q2", 0) for e in run["epochs"]],
                         color=colors.get(name), lw=1.2, ls="--", label=f"{name} q2")
        by_epoch = run.get("errors", {}).get("by_epoch", {})
        if by_epoch and name != "native":
            t = {e["epoch"]: e["t_end"] for e in run["epochs"]}
            pts = sorted((t[int(k)], v) for k, v in by_epoch.items() if int(k) in t)
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=colors.get(name), lw=1, label=name)
    axes[0].axhline(cfg["bound_ms"] / 1000, color="k", ls=":", lw=1, label="bound B")
    axes[0].set_ylabel("latency, newest row (s)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("q1 mean rel. error of n\n(windows emitted per epoch)")
    axes[2].set_ylabel("shed fraction (— q1, -- q2)")
    axes[2].set_xlabel("wall time since the run started (s)")
    for ax in axes:
        for x in b[1:3]:
            ax.axvline(x, color="gray", ls="--", lw=0.8)
        ax.axvspan(b[1], b[2], color="orange", alpha=0.08)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=3)
    axes[1].legend(fontsize=7, ncol=3)
    axes[2].legend(fontsize=6, ncol=4)
    axes[0].set_title(f"3× burst (shaded) vs latency bound {cfg['bound_ms'] / 1000:g} s; normal {cfg['rate']:,.0f} rows/s, "
                      f"burst {cfg['burst_rate']:,.0f} rows/s")
    fig.tight_layout()
    fig.savefig(OUT_PNG, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter phases, no lp-declared run")
    ap.add_argument("--systems", default=None, help="comma list of lp,uniform,off,native,lp-declared,uniform-declared")
    ap.add_argument("--declared", action="store_true", help="also run lp with a declared cost model (default in full mode)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every system, alternating the order")
    ap.add_argument("--bound", type=float, default=None, help="latency bound in s (default: from calibration)")
    ap.add_argument("--rate", type=float, default=None, help="normal rate, rows/s (default: from calibration)")
    ap.add_argument("--burst-factor", type=float, default=3.0)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--max-rows", type=int, default=None, help="cap on the rows of the whole run")
    ap.add_argument("--phases", default=None, help="phase durations in s, e.g. 20,20,30 (multiples of 2)")
    ap.add_argument("--drain", type=float, default=None, help="s a run goes on after the last row arrived")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--md-from", default=None, help="only rewrite RESULTS.md and the plot from this JSON")
    args = ap.parse_args()

    if args.md_from:
        result = results_io.read(Path(args.md_from), detail=True)
        result["goals"] = goals(result)
        plot(result)
        write_results_md(result, result.get("prose", ""))
        print(tables_md(result))
        return

    quick = args.quick
    cfg: dict[str, Any] = {
        "quick": quick, "rounds": args.rounds, "keys": args.keys, "seed": 5, "ttl_ms": 4000, "headroom": 0.8,
        "phases_s": [10, 10, 14] if quick else [16, 12, 24], "drain_s": 12 if quick else 20,
        "trigger_ms": 1000,
    }
    if args.phases:
        cfg["phases_s"] = [int(x) for x in args.phases.split(",")]
    if args.drain is not None:
        cfg["drain_s"] = args.drain
    args.max_rows = args.max_rows or (8_000_000 if quick else 15_000_000)
    systems = (args.systems.split(",") if args.systems else
               (["lp-declared", "uniform-declared"] if (args.declared or not quick) else []) + ["lp", "uniform", "native", "off"])

    from eddyline.runtime.session import get_spark

    spark = get_spark(args.master, {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g",
                                    "spark.sql.streaming.numRecentProgressUpdates": "1000"})
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    t_all = time.time()
    try:
        cal = None
        if not (args.rate and args.bound) or any(x.endswith("-declared") for x in systems):
            print("calibrating ...", flush=True)
            # a wide spread of sizes: the fixed cost's noise (±1 s) must not hide the per-row cost,
            # and the large size near a burst epoch's (the dedup's cost per row grows with its state)
            sizes = [50_000, 1_000_000] if quick else [100_000, 2_000_000]
            cal = calibrate(spark, cfg, tmp, sizes, 3)
            cal["load_avg"] = round(os.getloadavg()[0], 2)
        derive_rates(cfg, cal, args)
        timeline = _Timeline(cfg)
        print(f"bound {cfg['bound_ms']} ms, normal {cfg['rate']:,.0f} rows/s, burst {cfg['burst_rate']:,.0f} rows/s, "
              f"{cfg['rows_total']:,} rows; calibration {cal and cal['fit']}", flush=True)
        staging = tmp / "staging"
        chunks = write_feed(spark, cfg, timeline, staging)
        exact = exact_windows(staging)
        if "native" in systems:
            run_native(spark, cfg, tmp, staging, chunks, timeline, warm=True)
        ours = [x for x in systems if x != "native"]
        if ours:  # otherwise the first of them pays for the workers' and the shed points' first runs
            run_eddyline(spark, cfg, ours[0], tmp, timeline, warm_s=15)
        runs: dict[str, list[dict[str, Any]]] = {}
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else list(reversed(systems))
            for name in order:
                t = time.time()
                load0 = os.getloadavg()[0]
                if name == "native":
                    run = run_native(spark, cfg, tmp, staging, chunks, timeline)
                else:
                    run = run_eddyline(spark, cfg, name, tmp, timeline)
                run["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
                run["errors"] = window_errors(exact, run.pop("q1_windows"), timeline)
                run["summary"] = summarize(run, cfg, timeline)
                runs.setdefault(name, []).append(run)
                ph = run["summary"]["per_phase"]
                print(f"[round {rnd + 1}] {name:12s} {time.time() - t:5.0f} s: latency p99 "
                      + ", ".join(f"{p} {ph[p]['lat_p99']}" for p in PHASES)
                      + f"; q1 err n {run['errors'].get('all', {}).get('mre_n')}"
                      + (f"; kept utility {run['summary'].get('kept_utility')}" if name != "native" else ""), flush=True)
        result: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(), "config": cfg, "calibration": cal,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_end": os.getloadavg()},
            "wall_s": round(time.time() - t_all, 1),
            # the first round's runs are the ones reported; later rounds give the spread
            "runs": {k: v[0] for k, v in runs.items()},
            "rounds": {k: [r["summary"] for r in v] for k, v in runs.items()} if args.rounds > 1 else None,
        }
        result["goals"] = goals(result)
        results_io.write(OUT_JSON, result, default=str)
        plot(result)
        write_results_md(result)
        print(tables_md(result))
        print(f"total {time.time() - t_all:.0f} s; load average {os.getloadavg()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
