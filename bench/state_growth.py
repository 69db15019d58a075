"""How an epoch's cost grows with the state behind it (issue #55, item 5), resident lanes beside
today's per-epoch Spark job.

The workload is ``bench/resident.py``'s dedup (the first row per key), with a TTL of a day so
that every key seen stays in the state. For each state size N (``--keys``) a first epoch brings
N distinct keys (not measured), then ``--epochs`` epochs of ``--rows`` rows whose keys are drawn
from those N; the epoch time is measured as in ``bench/resident.py`` (resident: the driver's whole
epoch; per-epoch job: the engine's ``triggerExecution``), and memory as the lanes' Python
processes' resident set at the end (resident: read from ``/proc`` of the two lane processes;
per-epoch job: the largest peak the lanes' manifests report). Two lanes, ``local[2]``.

PyFlink (``bench/state_growth_flink.py``, when its virtualenv exists) runs the same deduplication
on the same rows as CSV files; Flink has no epochs, so its figure for an "epoch" is the time it
took to read all the measured files, divided by their number (no p99), and its memory the JVM's
peak resident set (both task slots; sampled every half second).

A second axis: at ``--rows-keys`` keys, the epoch time as the rows per epoch grow
(``--rows-axis``).

Usage: ``python bench/state_growth.py [--keys 10000,100000,1000000,10000000] [--epochs 60]
[--rows-axis 2000,16000,64000,256000] [--modes resident,per-epoch job,pyflink]``.
Writes ``bench/results/state-growth-<timestamp>.json``, a plot beside it and the results page's
section.
"""

from __future__ import annotations

import argparse
import contextlib
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


def flink(spark: Any, data: Path, tmp: Path) -> dict[str, Any]:
    """The same files as CSV (each ending with its marker row) for ``bench/state_growth_flink.py``;
    see the module's docstring for what is measured."""
    import threading

    import pyarrow.csv as pacsv
    from latency_flink import _stop, start_job, unavailable
    from state_growth_flink import MARKER_BASE

    if why := unavailable():
        return {"mode": "pyflink", "error": why}
    indir, staged, printed = tmp / "flink-in", tmp / "flink-staged", tmp / "flink.out"
    indir.mkdir()
    staged.mkdir()
    files = sorted(data.iterdir())
    for i, f in enumerate(files):
        t = pq.read_table(f)
        last = t.column("event_time").cast(pa.int64())[-1].as_py()
        rows = pa.table({"key": t.column("key"), "event_time": t.column("event_time").cast(pa.int64()),
                         "value": t.column("value")})
        marker = pa.table({"key": [MARKER_BASE + i], "event_time": [last], "value": [-1]}, schema=rows.schema)
        pacsv.write_csv(pa.concat_tables([rows, marker]), staged / f"{i:06d}.csv",
                        write_options=pacsv.WriteOptions(include_header=False))
    job = start_job(HERE / "state_growth_flink.py", ["--dir", str(indir)], tmp)
    peak, done = [0], threading.Event()

    def sample() -> None:  # the largest process of the job's session: its JVM
        while not done.wait(0.5):
            with contextlib.suppress(OSError, ValueError):  # (a process that ended meanwhile)
                peak[0] = max(peak[0], max(rss(p) for p in session(job.pid)))

    def markers() -> dict[int, float]:
        got = {}
        for line in printed.read_text(errors="replace").splitlines():
            if "+I[" in line:
                key, emitted = line[line.index("[") + 1: line.rindex("]")].split(", ")
                got[int(key) - MARKER_BASE] = datetime.strptime(emitted, "%Y-%m-%d %H:%M:%S.%f").replace(
                    tzinfo=UTC).timestamp()
        return got

    def wait_for(count: int, what: str) -> dict[int, float]:
        deadline = time.monotonic() + 3600
        while len(got := markers()) < count:
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PyFlink: {what}: {(tmp / 'flink.log').read_text()[-1500:]}")
            time.sleep(0.05)
        return got

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        sampler.start()
        os.rename(staged / f"{0:06d}.csv", indir / f"{0:06d}.csv")
        wait_for(1, "the file of every key was not read")
        time.sleep(1.0)  # (the other subtask's last rows of it)
        t0 = time.time()
        for i in range(1, len(files)):
            os.rename(staged / f"{i:06d}.csv", indir / f"{i:06d}.csv")
        got = wait_for(len(files), "the measured files were not all read")
    finally:
        done.set()
        _stop(job)
    per_file = (max(got[i] for i in range(1, len(files))) - t0) * 1000 / (len(files) - 1)
    return {"mode": "pyflink", "median_ms": per_file, "p99_ms": None, "jvm_rss_bytes": peak[0],
            "epochs": len(files) - 1}


def session(leader: int) -> list[int]:
    """The processes of the session ``leader`` leads (a job started with ``start_new_session``)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == leader:  # (after the name: state, ppid, pgrp, session)
                out.append(int(entry))
    return out


MODES = ("resident", "per-epoch job", "pyflink")


def _cell(x: dict[str, Any] | None) -> str:
    if not x:
        return "–"
    if x.get("error"):
        return "not run"
    return f"{x['median_ms']:.0f}" + (f" / {x['p99_ms']:.0f}" if x.get("p99_ms") is not None else "")


def _mb(x: dict[str, Any] | None) -> str:
    b = (x or {}).get("lane_rss_bytes") or (x or {}).get("jvm_rss_bytes")
    return f"{b / 2**20:,.0f}" if b else "–"


def _ratio(x: dict[str, Any] | None, r: dict[str, Any] | None) -> str:
    ok = x and r and not x.get("error") and not r.get("error")
    return f"{x['median_ms'] / r['median_ms']:.1f}×" if ok else "–"  # type: ignore[index]


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['when']} · {result['rows']:,} rows an epoch, {result['epochs']} epochs per size after the "
        f"one that brings every key · load average at the start {result['load']}",
        "",
        "| state (keys) | resident median / p99 ms | resident lane RSS MB | per-epoch job median / p99 ms "
        "| per-epoch lane peak RSS MB | PyFlink ms per file of the rows | PyFlink JVM RSS MB "
        "| per-epoch / resident | PyFlink / resident |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for keys, runs in result["sizes"].items():
        r, p, f = (runs.get(m) for m in MODES)
        lines.append(f"| {int(keys):,} | {_cell(r)} | {_mb(r)} | {_cell(p)} | {_mb(p)} | {_cell(f)} | {_mb(f)} "
                     f"| {_ratio(p, r)} | {_ratio(f, r)} |")
    axis = result.get("rows_axis")
    if axis:
        lines += [
            "",
            f"As the rows an epoch grow, at {axis['keys']:,} keys (same epochs):",
            "",
            "| rows an epoch | resident median / p99 ms | per-epoch job median / p99 ms | PyFlink ms per file "
            "| resident µs a row | per-epoch / resident | PyFlink / resident |",
            "|---:|---|---|---:|---:|---:|---:|",
        ]
        for rows, runs in axis["runs"].items():
            r, p, f = (runs.get(m) for m in MODES)
            per_row = f"{r['median_ms'] * 1000 / int(rows):.1f}" if r and not r.get("error") else "–"
            lines.append(f"| {int(rows):,} | {_cell(r)} | {_cell(p)} | {_cell(f)} | {per_row} | {_ratio(p, r)} "
                         f"| {_ratio(f, r)} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = result.get("rows_axis")
    fig, panels = plt.subplots(1, 3 if axis else 2, figsize=(13 if axis else 9, 3.4))
    a, b = panels[0], panels[1]
    styles = {"resident": "o-", "per-epoch job": "s--", "pyflink": "^:"}

    def measured(by: dict[str, Any], mode: str) -> tuple[list[int], list[dict[str, Any]]]:
        pairs = [(int(k), v[mode]) for k, v in by.items() if mode in v and not v[mode].get("error")]
        return [k for k, _ in pairs], [v for _, v in pairs]

    for mode in MODES:
        keys, runs = measured(result["sizes"], mode)
        if not runs:
            continue
        label = f"{mode}, median" if mode != "pyflink" else "pyflink, all files / their number"
        a.plot(keys, [r["median_ms"] for r in runs], styles[mode], label=label)
        if runs[0].get("p99_ms") is not None:
            a.plot(keys, [r["p99_ms"] for r in runs], styles[mode], alpha=0.4, label=f"{mode}, p99")
        b.plot(keys, [(r.get("lane_rss_bytes") or r.get("jvm_rss_bytes") or 0) / 2**20 for r in runs], styles[mode],
               label=mode + (" (its JVM)" if mode == "pyflink" else " (a lane)"))
    labels = [(a, "keys in the state", "epoch ms"), (b, "keys in the state", "memory, MB")]
    if axis:
        c = panels[2]
        for mode in MODES:
            rows, runs = measured(axis["runs"], mode)
            if runs:
                c.plot(rows, [r["median_ms"] for r in runs], styles[mode],
                       label=f"{mode}, median" if mode != "pyflink" else "pyflink, all files / their number")
        labels.append((c, f"rows an epoch ({axis['keys']:,} keys)", "epoch ms"))
    for ax, x, y in labels:
        ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="10000,100000,1000000,10000000")
    ap.add_argument("--rows", type=int, default=16_000)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--rows-axis", default="2000,16000,64000,256000", help="rows an epoch for the second axis ('' skips it)")
    ap.add_argument("--rows-keys", type=int, default=100_000, help="the state size of the second axis")
    ap.add_argument("--modes", default=",".join(MODES))
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
    runners = {"resident": resident, "per-epoch job": per_epoch, "pyflink": flink}

    def measure(keys: int, rows: int, into: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "in"
            data.mkdir()
            inputs(keys, rows, args.epochs, data)
            for mode in args.modes.split(","):
                r = runners[mode](spark, data, Path(tmp))
                into[mode] = r
                print(json.dumps({"keys": keys, "rows": rows, **r}), flush=True)

    for keys in (int(k) for k in args.keys.split(",") if k):
        measure(keys, args.rows, result["sizes"].setdefault(str(keys), {}))
    if args.rows_axis:
        result["rows_axis"] = {"keys": args.rows_keys, "runs": {}}
        for rows in (int(r) for r in args.rows_axis.split(",")):
            measure(args.rows_keys, rows, result["rows_axis"]["runs"].setdefault(str(rows), {}))
    print(table(result))
    if not args.no_write:
        write_md(result, results_io.write(HERE / "results" / f"state-growth-{stamp}.json", result))


def write_md(result: dict[str, Any], path: Path) -> None:
    """The plot beside the results JSON at ``path``, and the results page's section."""
    plot(result, path.with_suffix(".svg"))
    write_section(("<!-- state-growth:start -->", "<!-- state-growth:end -->"),
                  ("<!-- state-growth-table:start -->", "<!-- state-growth-table:end -->"),
                  f"{table(result)}\n\n![epoch time and memory against state size, and epoch time against rows an epoch](results/{path.with_suffix('.svg').name})",
                  "## How an epoch's cost grows with its state (`bench/state_growth.py`, issue #55)\n\n")


if __name__ == "__main__":
    main()
