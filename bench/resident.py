"""Resident lanes against per-epoch jobs (issue #55, item 3): what an epoch costs when the lanes
are the tasks of one long-lived Spark stage fed over a socket (:mod:`eddyline.runtime.resident`).

An epoch here is everything the driver and the lanes do for it: read the epoch's slice (one
Parquet file of ``--rows`` rows, written before the run), work out each row's key group, send
each lane its rows, the lanes run the step's real kernel against the state they hold, write the
changed key groups' state and the epoch's output to files, acknowledge with their manifests, and
the driver writes the epoch's commit (the folded state index) with an atomic rename. Two lanes,
``local[2]``.

Workloads (one stateful step each):

* ``dedup``: the first row per key over 100,000 keys, 10 s TTL (the ``dedup_keys`` workload of
  ``bench/run_bench.py``), event time 2 s an epoch;
* ``join``: Nexmark q3's shape, new auctions joined to their sellers (persons), rows kept 20 s
  (ten epochs).

The gate of the issue: go on to a resident mode of the engine if the median epoch is at most
40 ms and the 99th percentile at most 80 ms at ~16,000 rows an epoch.

Usage: ``python bench/resident.py [--rows 16000] [--epochs 1000] [--workloads dedup,join]``.
Prints a table and writes ``bench/results/resident-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import results_io  # noqa: E402
from run_bench import write_section  # noqa: E402

from eddyline.columns import KG  # noqa: E402
from eddyline.hashing import spark_xxhash64  # noqa: E402
from eddyline.operators.dedup import DedupKernel  # noqa: E402
from eddyline.operators.join import LEFT_PREFIX, RIGHT_PREFIX, SIDE, UnboundedJoinKernel  # noqa: E402
from eddyline.plan.keygroups import RoutingTable  # noqa: E402
from eddyline.runtime.resident import ResidentStage, ResidentStep  # noqa: E402
from eddyline.state.store import with_chains  # noqa: E402
from eddyline.storage import Gate  # noqa: E402

KEY_GROUPS = 128
EPOCH_MS = 2_000
#: how long the join keeps a row: ten epochs (without one, its state and each epoch's cost would
#: grow with the run; that growth is item 5's measurement, not the gate's)
TTL_MS = 20_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- data
def dedup_inputs(rows: int, epochs: int, folder: Path, seed: int = 7) -> tuple[Any, str]:
    rng = np.random.default_rng(seed)
    schema = pa.schema([("key", pa.int64()), ("event_time", pa.timestamp("ms")), ("value", pa.int64())])
    for e in range(1, epochs + 1):
        t = (e - 1) * EPOCH_MS + np.sort(rng.integers(0, EPOCH_MS, rows))
        pq.write_table(pa.table({"key": rng.integers(0, 100_000, rows), "event_time": pa.array(t, pa.timestamp("ms")),
                                 "value": rng.integers(0, 1_000, rows)}, schema=schema), folder / f"{e:06d}.parquet")
    return DedupKernel(schema, ["key"], "event_time", 10_000), "key"


def join_inputs(rows: int, epochs: int, folder: Path, seed: int = 7) -> tuple[Any, str]:
    """q3's shape: a tenth of the rows are new persons, the rest auctions by recent sellers."""
    rng = np.random.default_rng(seed)
    ts = pa.timestamp("ms")
    persons_s = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()), ("state", pa.string()),
                           ("date_time", ts)])
    auctions_s = pa.schema([("id", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()), ("date_time", ts)])
    kernel = UnboundedJoinKernel(auctions_s, persons_s, ["seller"], ["id"], ttl_ms=TTL_MS, left_time="date_time",
                                 right_time="date_time")
    n_p = rows // 10
    next_person = next_auction = 0
    cities = np.array(["Phoenix", "Boise", "Portland", "Kent", "Redmond"])
    states = np.array(["OR", "ID", "CA", "WA", "AZ"])
    for e in range(1, epochs + 1):
        pid = np.arange(next_person, next_person + n_p)
        next_person += n_p
        sellers = np.maximum(0, next_person - 1 - rng.integers(0, 5 * n_p, rows - n_p))
        aid = np.arange(next_auction, next_auction + rows - n_p)
        next_auction += rows - n_p
        t0 = (e - 1) * EPOCH_MS
        persons = pa.table({"id": pid, "name": pa.array([f"p{i}" for i in pid]), "city": cities[pid % 5],
                            "state": states[pid % 5], "date_time": pa.array(t0 + np.sort(rng.integers(0, EPOCH_MS, pid.size)), ts)},
                           schema=persons_s)
        auctions = pa.table({"id": aid, "seller": sellers, "category": rng.integers(0, 20, aid.size),
                             "date_time": pa.array(t0 + np.sort(rng.integers(0, EPOCH_MS, aid.size)), ts)}, schema=auctions_s)
        left = _sided(auctions, kernel, LEFT_PREFIX, 0, persons_s)
        right = _sided(persons, kernel, RIGHT_PREFIX, 1, auctions_s)
        both = pa.concat_tables([left, right])
        pq.write_table(both, folder / f"{e:06d}.parquet")
    return kernel, "__key"


def _sided(table: pa.Table, kernel: Any, prefix: str, side: int, other: pa.Schema) -> pa.Table:
    """One side's rows in the join kernel's input columns, with the join key as ``__key``."""
    cols: dict[str, Any] = {"__key": table.column("seller" if side == 0 else "id"), SIDE: pa.array(np.full(table.num_rows, side, np.int8))}
    for f in kernel.input_schema:
        if f.name in (KG, SIDE):
            continue
        name = f.name.removeprefix(prefix)
        cols[f.name] = table.column(name) if f.name.startswith(prefix) else pa.nulls(table.num_rows, f.type)
    return pa.table(cols)


WORKLOADS = {"dedup": dedup_inputs, "join": join_inputs}


# ----------------------------------------------------------------------------- the run
def run(spark: Any, name: str, rows: int, epochs: int, tmp: Path) -> dict[str, Any]:
    data = tmp / f"{name}-in"
    data.mkdir()
    kernel, key = WORKLOADS[name](rows, epochs, data)
    files = sorted(data.iterdir())
    ckpt, out = str(tmp / f"{name}-ckpt"), str(tmp / f"{name}-out")
    os.makedirs(f"{ckpt}/commits")
    routing = RoutingTable.uniform(KEY_GROUPS, 2)
    t_start = time.perf_counter()
    stage = ResidentStage(spark, steps=[ResidentStep(name, kernel, tuple(int(x) for x in routing.owners()))],
                          checkpoint=ckpt, lanes=2, output=out, attempt=1)
    started_s = time.perf_counter() - t_start
    gate = Gate(ckpt)
    index: dict[int, list] = {}
    watermark = -(2**62)
    ms, phases, lane_ms = [], {"read": [], "route": [], "lanes": [], "commit": []}, []
    lane_phases: dict[str, list[float]] = {}
    try:
        for e, f in enumerate(files, start=1):
            t0 = time.perf_counter()
            table = pq.read_table(f)
            t1 = time.perf_counter()
            kg = np.mod(spark_xxhash64(table.column(key)), KEY_GROUPS).astype(np.int32)
            table = table.append_column(KG, pa.array(kg))
            t2 = time.perf_counter()
            done = stage.run(e, table, watermark)
            t3 = time.perf_counter()
            for d in done:
                index = with_chains(index, d["chains"])
            gate.put(f"{ckpt}/commits/{e:010d}.json", json.dumps(
                {"epoch": e, "index": {str(k): v for k, v in index.items()}, "outputs": [d["output"] for d in done]}).encode())
            t4 = time.perf_counter()
            time_column = "event_time" if "event_time" in table.column_names else f"{LEFT_PREFIX}date_time"
            watermark = pc.max(table.column(time_column).cast(pa.int64())).as_py()
            ms.append((t4 - t0) * 1000)
            for k, a, b in (("read", t0, t1), ("route", t1, t2), ("lanes", t2, t3), ("commit", t3, t4)):
                phases[k].append((b - a) * 1000)
            lane_ms.append(max(sum(d["ms"].values()) for d in done))
            for d in done:
                for k, v in d["ms"].items():
                    lane_phases.setdefault(k, []).append(v)
    finally:
        stage.close()
    return {
        "workload": name, "mode": "resident", "rows": rows, "epochs": len(ms), "stage_start_s": round(started_s, 2),
        "median_ms": round(statistics.median(ms), 2), "p90_ms": round(pct(ms, 0.9), 2), "p99_ms": round(pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "phases_median_ms": {k: round(statistics.median(v), 2) for k, v in phases.items()},
        "lane_work_median_ms": round(statistics.median(lane_ms), 2),
        "lane_phases_median_ms": {k: round(statistics.median(v), 2) for k, v in lane_phases.items()},
        "state_rows_end": sum(d["state_rows"] for d in done),
        "epoch_ms": [round(x, 2) for x in ms],
    }


def run_per_epoch(spark: Any, rows: int, epochs: int, warmup: int, tmp: Path) -> dict[str, Any]:
    """The peer: the same dedup over the same files in today's engine, a Spark job an epoch."""
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    data = tmp / "peer-in"
    data.mkdir()
    dedup_inputs(rows, warmup + epochs, data)
    spec = load_spec({
        "name": "dedup", "trigger": 0, "lanes": 2, "key_groups": KEY_GROUPS,
        "sources": [{"name": "input", "files": {"path": str(data), "format": "parquet", "max_files_per_epoch": 1}}],
        "steps": [{"name": "dedup", "input": "input", "dedup": {"key": "key", "time": "event_time", "ttl": "10s"}}],
        "sinks": [{"name": "out", "input": "dedup", "files": {"path": str(tmp / "peer-out"), "format": "parquet"}}],
    })
    progress = tmp / "peer-progress.jsonl"
    with ProgressReporter(live=False, json_path=str(progress)) as rep:
        Engine(spec, spark, str(tmp / "peer-ckpt"), reporter=rep).run(epochs=warmup + epochs)
    records = [json.loads(x) for x in progress.read_text().splitlines()][warmup:]
    ms = [r["durationMs"]["triggerExecution"] for r in records]
    return {"workload": "dedup", "mode": "per-epoch job", "rows": rows, "epochs": len(ms),
            "median_ms": round(statistics.median(ms), 2), "p90_ms": round(pct(ms, 0.9), 2),
            "p99_ms": round(pct(ms, 0.99), 2), "max_ms": round(max(ms), 2), "epoch_ms": ms}


def table(result: dict[str, Any]) -> str:
    """The results page's table: each workload's runs, side by side with the per-epoch-job peer."""
    runs = result["runs"]
    lines = [
        f"Run {result['when']} · {result['rows']:,} rows an epoch · {result['epochs']:,} resident epochs per run, "
        f"{result['peer_epochs']} per-epoch-job epochs (after 20 unmeasured) · {result['repeat']} runs · "
        f"load average at the start {result['load']}",
        "",
        "| workload | mode | epoch median ms (runs) | p99 ms (runs) | the lanes' own work, median ms | "
        "per-epoch job / resident, median (p99) |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["workload"] for r in runs):
        for mode in ("resident", "per-epoch job"):
            mine = [r for r in runs if r["workload"] == name and r["mode"] == mode]
            if not mine:
                continue
            ratio = "–"
            if mode == "per-epoch job":
                res = [r for r in runs if r["workload"] == name and r["mode"] == "resident"]
                ratio = ", ".join(f"{p['median_ms'] / q['median_ms']:.1f}× ({p['p99_ms'] / q['p99_ms']:.1f}×)"
                                  for p, q in zip(mine, res, strict=False))
            work = ", ".join(f"{r['lane_work_median_ms']:.0f}" for r in mine if "lane_work_median_ms" in r) or "–"
            medians = ", ".join(f"{r['median_ms']:.0f}" for r in mine)
            p99s = ", ".join(f"{r['p99_ms']:.0f}" for r in mine)
            lines.append(f"| {name} | {mode} | {medians} | {p99s} | {work} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16_000)
    ap.add_argument("--epochs", type=int, default=1_000)
    ap.add_argument("--workloads", default="dedup,join")
    ap.add_argument("--peer-epochs", type=int, default=200, help="epochs of the per-epoch-job peer (after 20 unmeasured)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", default=None, help="only rewrite bench/RESULTS.md from this results JSON")
    args = ap.parse_args()
    if args.render:
        write_md(json.loads(Path(args.render).read_text()))
        return
    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]")
    load = round(os.getloadavg()[0], 1)
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.workloads.split(","):
                r = run(spark, name, args.rows, args.epochs, Path(tmp))
                results.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "epoch_ms"}), flush=True)
                if name == "dedup" and args.peer_epochs:
                    peer = run_per_epoch(spark, args.rows, args.peer_epochs, 20, Path(tmp))
                    results.append(peer)
                    print(json.dumps({k: v for k, v in peer.items() if k != "epoch_ms"}), flush=True)
                    print(f"per-epoch job / resident, median: {peer['median_ms'] / r['median_ms']:.2f}x, "
                          f"p99: {peer['p99_ms'] / r['p99_ms']:.2f}x", flush=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    result = {"benchmark": "resident", "when": stamp, "rows": args.rows, "epochs": args.epochs,
              "peer_epochs": args.peer_epochs, "repeat": args.repeat, "load": load, "runs": results}
    print(table(result))
    if not args.no_write:
        results_io.write(HERE / "results" / f"resident-{stamp}.json", result)
        write_md(result)


def write_md(result: dict[str, Any]) -> None:
    write_section(("<!-- resident:start -->", "<!-- resident:end -->"), ("<!-- resident-table:start -->", "<!-- resident-table:end -->"),
                  table(result), "## Resident lanes (`bench/resident.py`, issue #55)\n\n")


if __name__ == "__main__":
    main()
