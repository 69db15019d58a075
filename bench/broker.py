"""The broker path against the file path, in one run: the same Nexmark bids, the same window
aggregate (count and top price per auction over sliding 10 s / 2 s windows), read from a NATS
JetStream stream and written to NATS (and PostgreSQL), or read from Parquet files and written to
Parquet.

It reports, per path, input rows per second of wall time over the whole run and the time per
row relative to the file path, and where the broker path's time goes: fetching the messages
(a Spark job that only reads them), decoding them (reading and parsing), and publishing (the
epochs' publish stage). Local NATS and PostgreSQL servers are started from the installed packages.

Usage: ``./dev.sh bench bench/broker.py`` or ``python bench/broker.py --events 400000 --runs 3``.
Writes ``bench/results/broker-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STREAM = "BIDS"


def window_step() -> dict[str, Any]:
    return {"name": "per_auction", "input": "bids", "window_aggregate": {
        "key": "auction", "time": "date_time", "window": {"size": "10s", "slide": "2s"},
        "aggregates": {"bids": "count(*)", "top": "max(price)"}, "watermark_delay": "4s"}}


def network(source: dict[str, Any], sinks: list[dict[str, Any]], per_epoch: int) -> dict[str, Any]:
    return {"name": "broker-bench", "trigger": 0, "lanes": 2, "key_groups": 64,
            "sources": [{"name": "bids", "max_rows_per_epoch": per_epoch, **source}],
            "steps": [window_step()], "sinks": sinks}


def timed_run(spark: Any, raw: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    progress = ckpt.with_suffix(".jsonl")
    t0 = time.perf_counter()
    with ProgressReporter(live=False, json_path=str(progress)) as reporter:
        summary = Engine(load_spec(raw), spark, str(ckpt), reporter=reporter).run(until_idle=True)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    return {
        "wall_s": wall, "rows": summary.input_rows, "epochs": summary.epochs,
        "rows_per_s": summary.input_rows / wall,
        "publish_s": sum(r["durationMs"]["publish"] for r in records) / 1000,
        "execution_s": sum(r["durationMs"]["execution"] for r in records) / 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=400_000, help="Nexmark events (bids are 46 of 50)")
    ap.add_argument("--per-epoch", type=int, default=100_000, help="stream sequences / file rows per epoch")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from eddyline.api.sources import SourceSpec
    from eddyline.io.jetstream import NatsSource
    from eddyline.io.local import LocalNats, LocalPostgres
    from eddyline.io.nexmark import Nexmark, nexmark_frame, nexmark_schema
    from eddyline.io.produce import Feed, produce
    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    tmp = Path(tempfile.mkdtemp(prefix="eddyline-broker-bench-"))
    bid_params = {"stream": "bid", "rate": 10_000, "unpaced": True}
    out: dict[str, Any] = {"events": args.events, "per_epoch": args.per_epoch, "runs": []}
    with LocalNats() as nats, LocalPostgres() as pg:
        t0 = time.perf_counter()
        produce(spark, nats.url, STREAM,
                [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": bid_params}), "bids.bid")],
                end=args.events)
        produced_s = time.perf_counter() - t0
        bids = nexmark_frame(spark, Nexmark(**bid_params), 0, args.events, 2)
        rows = bids.count()
        out["produce_rows_per_s"] = rows / produced_s
        files = tmp / "parquet"
        bids.repartition(max(1, rows // args.per_epoch)).write.parquet(str(files))
        nats_in = {"nats": {"url": nats.url, "stream": STREAM, "schema": nexmark_schema("bid")}}

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
            for path in ("files", "nats", "nats+postgres"):
                if path == "files":
                    raw = network({"files": {"path": str(files), "format": "parquet", "max_files_per_epoch": 1}},
                                  [{"name": "out", "input": "per_auction", "files": {"path": str(tmp / f"o{i}")}}],
                                  args.per_epoch)
                    raw["sources"][0].pop("max_rows_per_epoch")
                else:
                    sinks = [{"name": "out", "input": "per_auction",
                              "nats": {"url": nats.url, "stream": f"OUT{i}{len(path)}", "subject": f"out{i}{len(path)}"}}]
                    if path == "nats+postgres":
                        sinks.append({"name": "db", "input": "per_auction", "postgres": {
                            "url": pg.url, "table": f"hot_{i}", "mode": "upsert", "key": ["auction", "window_start"]}})
                    raw = network(nats_in, sinks, args.per_epoch)
                r = timed_run(spark, raw, tmp / f"ckpt-{path.replace('+', '-')}-{i}")
                r |= {"path": path, "run": i}
                out["runs"].append(r)
                print(f"run {i} {path:>14}: {r['rows']:,} rows in {r['wall_s']:.2f} s = {r['rows_per_s']:,.0f} rows/s "
                      f"(publish {r['publish_s']:.2f} s)", flush=True)

    def per_row(path: str) -> list[float]:
        return [r["wall_s"] / r["rows"] for r in out["runs"] if r["path"] == path]

    print(f"\nproduce (Spark → NATS): {out['produce_rows_per_s']:,.0f} rows/s; fetch alone (NATS → raw "
          f"records in Spark): {out['fetch_rows_per_s']:,.0f} rows/s; fetch + decode: "
          f"{out['fetch_and_decode_rows_per_s']:,.0f} rows/s")
    files_t = per_row("files")
    for path in ("files", "nats", "nats+postgres"):
        rates = [r["rows_per_s"] for r in out["runs"] if r["path"] == path]
        ratios = [t / f for t, f in zip(per_row(path), files_t, strict=True)]
        print(f"{path:>14}: rows/s median {statistics.median(rates):,.0f} (runs {', '.join(f'{x:,.0f}' for x in rates)}); "
              f"time per row vs files {', '.join(f'{x:.2f}' for x in ratios)}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    (RESULTS / f"broker-{stamp}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
