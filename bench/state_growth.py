"""How an epoch's cost grows with the state behind it (issue #55, item 5), resident lanes beside
today's per-epoch Spark job.

The workload is ``bench/resident.py``'s dedup (the first row per key), with a TTL of a day so
that every key seen stays in the state. For each state size N (``--keys``) a first epoch brings
N distinct keys (not measured), then ``--epochs`` epochs of ``--rows`` rows whose keys are drawn
from those N; the epoch time is measured as in ``bench/resident.py`` (resident: the driver's whole
epoch; per-epoch job: the engine's ``triggerExecution``), and memory as the lanes' Python
processes' resident set at the end (resident: read from ``/proc`` of the two lane processes;
per-epoch job: the largest peak the lanes' manifests report). Two lanes, ``local[2]``.

Usage: ``python bench/state_growth.py [--keys 10000,100000,1000000,10000000] [--epochs 60]``.
Writes ``bench/results/state-growth-<timestamp>.json``, a plot beside it and the results page's
section.
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
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import results_io  # noqa: E402
from resident import KEY_GROUPS, pct  # noqa: E402
from run_bench import write_section  # noqa: E402

from eddyline.columns import KG  # noqa: E402
from eddyline.hashing import spark_xxhash64  # noqa: E402
from eddyline.operators.dedup import DedupKernel  # noqa: E402
from eddyline.plan.keygroups import RoutingTable  # noqa: E402
from eddyline.runtime.resident import ResidentStage, ResidentStep, next_attempt  # noqa: E402
from eddyline.state.store import with_chains  # noqa: E402
from eddyline.storage import Gate  # noqa: E402

SCHEMA = pa.schema([("key", pa.int64()), ("event_time", pa.timestamp("ms")), ("value", pa.int64())])
TTL = "1d"
EPOCH_MS = 2_000


def inputs(keys: int, rows: int, epochs: int, folder: Path, seed: int = 11) -> None:
    """File 1: every key once; then ``epochs`` files of ``rows`` rows over the same keys."""
    rng = np.random.default_rng(seed)
    first = np.arange(keys, dtype=np.int64)
    pq.write_table(pa.table({"key": first, "event_time": pa.array(np.zeros(keys, np.int64), pa.timestamp("ms")),
                             "value": np.zeros(keys, np.int64)}, schema=SCHEMA), folder / f"{1:06d}.parquet")
    for e in range(2, epochs + 2):
        t = (e - 1) * EPOCH_MS + np.sort(rng.integers(0, EPOCH_MS, rows))
        pq.write_table(pa.table({"key": rng.integers(0, keys, rows), "event_time": pa.array(t, pa.timestamp("ms")),
                                 "value": rng.integers(0, 1_000, rows)}, schema=SCHEMA), folder / f"{e:06d}.parquet")


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def resident(spark: Any, data: Path, tmp: Path) -> dict[str, Any]:
    kernel = DedupKernel(SCHEMA, ["key"], "event_time", 86_400_000)
    ckpt = str(tmp / "res-ckpt")
    routing = tuple(int(x) for x in RoutingTable.uniform(KEY_GROUPS, 2).owners())
    stage = ResidentStage(spark, steps=[ResidentStep("dedup", kernel, routing)], checkpoint=ckpt, lanes=2,
                          output=str(tmp / "res-out"), attempt=next_attempt(ckpt))
    ms: list[float] = []
    watermark = -(2**62)
    index: dict[int, list] = {}
    gate = Gate(ckpt)
    os.makedirs(f"{ckpt}/commits", exist_ok=True)
    try:
        for e, f in enumerate(sorted(data.iterdir()), start=1):
            t0 = time.perf_counter()
            table = pq.read_table(f)
            table = table.append_column(KG, pa.array(np.mod(spark_xxhash64(table.column("key")), KEY_GROUPS).astype(np.int32)))
            for d in stage.run(e, table, watermark):
                index = with_chains(index, d["chains"])
            gate.put(f"{ckpt}/commits/{e:010d}.json", json.dumps({"epoch": e, "index": {str(k): v for k, v in index.items()}}).encode())
            if e > 1:
                ms.append((time.perf_counter() - t0) * 1000)
            watermark = int(table.column("event_time").cast(pa.int64()).to_numpy().max())
        memory = max(rss(pid) for pid in stage.pids.values())
    finally:
        stage.close()
    return {"mode": "resident", "median_ms": statistics.median(ms), "p99_ms": pct(ms, 0.99), "lane_rss_bytes": memory,
            "epochs": len(ms)}


def per_epoch(spark: Any, data: Path, tmp: Path) -> dict[str, Any]:
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    spec = load_spec({
        "name": "growth", "trigger": 0, "lanes": 2, "key_groups": KEY_GROUPS,
        "sources": [{"name": "input", "files": {"path": str(data), "format": "parquet", "max_files_per_epoch": 1}}],
        "steps": [{"name": "dedup", "input": "input", "dedup": {"key": "key", "time": "event_time", "ttl": TTL}}],
        "sinks": [{"name": "out", "input": "dedup", "files": {"path": str(tmp / "pe-out"), "format": "parquet"}}],
    })
    progress = tmp / "pe-progress.jsonl"
    with ProgressReporter(live=False, json_path=str(progress)) as rep:
        Engine(spec, spark, str(tmp / "pe-ckpt"), reporter=rep).run(until_idle=True)
    records = [json.loads(x) for x in progress.read_text().splitlines()]
    data_epochs = [r for r in records[1:] if r.get("numInputRows")]
    ms = [r["durationMs"]["triggerExecution"] for r in data_epochs]
    memory = max((op["customMetrics"].get("workerPeakRssBytes", 0) for r in data_epochs for op in r["stateOperators"]),
                 default=0)
    return {"mode": "per-epoch job", "median_ms": statistics.median(ms), "p99_ms": pct(ms, 0.99),
            "lane_rss_bytes": memory, "epochs": len(ms)}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['when']} · {result['rows']:,} rows an epoch, {result['epochs']} epochs per size after the "
        f"one that brings every key · load average at the start {result['load']}",
        "",
        "| state (keys) | resident median / p99 ms | resident lane RSS MB | per-epoch job median / p99 ms "
        "| per-epoch lane peak RSS MB | per-epoch / resident, median |",
        "|---:|---|---:|---|---:|---:|",
    ]
    def cell(x: dict[str, Any] | None) -> str:
        return f"{x['median_ms']:.0f} / {x['p99_ms']:.0f}" if x else "–"

    def mb(x: dict[str, Any] | None) -> str:
        return f"{x['lane_rss_bytes'] / 2**20:,.0f}" if x else "–"

    for keys, runs in result["sizes"].items():
        r, p = runs.get("resident"), runs.get("per-epoch job")
        ratio = f"{p['median_ms'] / r['median_ms']:.1f}×" if r and p else "–"
        lines.append(f"| {int(keys):,} | {cell(r)} | {mb(r)} | {cell(p)} | {mb(p)} | {ratio} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for mode, style in (("resident", "o-"), ("per-epoch job", "s--")):
        keys = [int(k) for k, v in result["sizes"].items() if mode in v]
        runs = [v[mode] for v in result["sizes"].values() if mode in v]
        a.plot(keys, [r["median_ms"] for r in runs], style, label=f"{mode}, median")
        a.plot(keys, [r["p99_ms"] for r in runs], style, alpha=0.4, label=f"{mode}, p99")
        b.plot(keys, [r["lane_rss_bytes"] / 2**20 for r in runs], style, label=mode)
    for ax, label in ((a, "epoch ms"), (b, "a lane's memory, MB")):
        ax.set_xscale("log")
        ax.set_xlabel("keys in the state")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="10000,100000,1000000,10000000")
    ap.add_argument("--rows", type=int, default=16_000)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--modes", default="resident,per-epoch job")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", default=None, help="only rewrite bench/RESULTS.md (and the plot) from this results JSON")
    args = ap.parse_args()
    if args.render:
        path = Path(args.render)
        write_md(json.loads(path.read_text()), path)
        return
    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]")
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    result: dict[str, Any] = {"benchmark": "state-growth", "when": stamp, "rows": args.rows, "epochs": args.epochs,
                              "load": round(os.getloadavg()[0], 1), "sizes": {}}
    runners = {"resident": resident, "per-epoch job": per_epoch}
    for keys in (int(k) for k in args.keys.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "in"
            data.mkdir()
            inputs(keys, args.rows, args.epochs, data)
            for mode in args.modes.split(","):
                r = runners[mode](spark, data, Path(tmp))
                result["sizes"].setdefault(str(keys), {})[mode] = r
                print(json.dumps({"keys": keys, **r}), flush=True)
    print(table(result))
    if not args.no_write:
        write_md(result, results_io.write(HERE / "results" / f"state-growth-{stamp}.json", result))


def write_md(result: dict[str, Any], path: Path) -> None:
    """The plot beside the results JSON at ``path``, and the results page's section."""
    plot(result, path.with_suffix(".svg"))
    write_section(("<!-- state-growth:start -->", "<!-- state-growth:end -->"),
                  ("<!-- state-growth-table:start -->", "<!-- state-growth-table:end -->"),
                  f"{table(result)}\n\n![epoch time and lane memory against state size](results/{path.with_suffix('.svg').name})",
                  "## How an epoch's cost grows with its state (`bench/state_growth.py`, issue #55)\n\n")


if __name__ == "__main__":
    main()
