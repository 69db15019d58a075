"""Shared builders for end-to-end tests: input files, specs, reading output back."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from eddyline.api.network import NetworkSpec
from eddyline.api.validate import load_spec
from eddyline.runtime.faults import FaultPoint

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BIDS_DDL = "auction long, price long, ts timestamp"


def write_bid_files(directory: Path, files: int, rows: int, *, seed: int = 7, bad_every: int = 0,
                    disorder_ms: int = 3_000) -> int:
    """JSON-lines bid files, time advancing ~file by file with some disorder; returns bad lines."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    bad = 0
    for f in range(files):
        with open(directory / f"bids-{f:04d}.json", "w", encoding="utf-8") as out:
            for i in range(rows):
                t = T0 + timedelta(milliseconds=f * 20_000 + i * (20_000 // rows) + rng.randint(-disorder_ms, 0))
                out.write(json.dumps({"auction": rng.randint(0, 30), "price": rng.randint(0, 999),
                                      "ts": t.isoformat().replace("+00:00", "Z")}) + "\n")
                if bad_every and i % bad_every == bad_every - 1:
                    out.write(rng.choice(['{"auction": 1, "price": "cheap", "ts": "2026-01-01T00:00:00Z"}',
                                          "{broken", '{"auction": [1], "price": 5, "ts": "2026-01-01T00:00:01Z"}']) + "\n")
                    bad += 1
    return bad


def bids_window_spec(input_dir: Path, out_dir: Path, *, lanes: int = 2, files_per_epoch: int = 1,
                     slide: str = "5s", late_dir: Path | None = None, lateness: str = "0s",
                     execution: str = "job") -> NetworkSpec:
    wa = {
        "key": "auction", "time": "ts", "window": {"size": "10s", "slide": slide},
        "aggregates": {"n": "count(*)", "total": "sum(price)", "hi": "max(price)", "mean": "avg(price)"},
        "watermark_delay": "2s", "allowed_lateness": lateness,
    }
    if late_dir is not None:
        wa["late"] = {"path": str(late_dir), "format": "parquet"}
    return load_spec({
        "name": "bids-windows", "trigger": 0, "lanes": lanes, "key_groups": 32, "execution": execution,
        "sources": [{"name": "bids", "files": {"path": str(input_dir), "format": "json", "schema": BIDS_DDL,
                                                "max_files_per_epoch": files_per_epoch}}],
        "steps": [
            {"name": "expensive", "input": "bids", "filter": "price >= 100"},
            {"name": "per_auction", "input": "expensive", "window_aggregate": wa},
        ],
        "sinks": [{"name": "out", "input": "per_auction", "files": {"path": str(out_dir), "format": "parquet"}}],
    })


def read_windows(out_dir: Path) -> list[tuple]:
    con = duckdb.connect()
    return con.execute(
        f"SELECT auction, epoch_ms(window_start), n, total, hi, round(mean, 6), revision "
        f"FROM read_parquet('{out_dir}/epoch=*/*.parquet') ORDER BY ALL"
    ).fetchall()


def duckdb_windows(input_dir: Path, slide_ms: int = 5_000) -> list[tuple]:
    """The reference: every window over every well-formed row, computed by DuckDB."""
    con = duckdb.connect()
    k = 10_000 // slide_ms
    return con.execute(
        f"""
        WITH r AS (SELECT * FROM read_json('{input_dir}/*.json', format='newline_delimited',
                     columns={{auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP'}}, ignore_errors=true)
                   WHERE auction IS NOT NULL AND price IS NOT NULL AND price >= 100),
        w AS (SELECT auction, price, (epoch_ms(ts) // {slide_ms}) * {slide_ms} - i * {slide_ms} AS ws
              FROM r, range({k}) g(i))
        SELECT auction, ws, count(*), sum(price), max(price), round(avg(price), 6), 0
        FROM w GROUP BY auction, ws ORDER BY ALL
        """
    ).fetchall()


class Crash(Exception):
    pass


class CrashAt:
    """Stops the driver (an exception out of the run) at ``point`` of ``epoch``."""

    def __init__(self, epoch: int, point: FaultPoint):
        self.epoch, self.point = epoch, point

    def reached(self, point: FaultPoint, epoch: int) -> None:
        if point == self.point and epoch == self.epoch:
            raise Crash(f"crashed at {point} of epoch {epoch}")


class CrashAfterPublish(CrashAt):
    """Stops the driver once ``epoch`` published, before its commit."""

    def __init__(self, epoch: int):
        super().__init__(epoch, FaultPoint.AFTER_PUBLISH)


#: the measures of the stateful tests' pattern step
MEASURES = {"a_price": ["A", "value", "first"], "b_len": ["B", None, "count"], "d_peak": ["D", "value", "max"]}


def normal(rows: list[tuple]) -> list[tuple]:
    """Timestamps as UTC microseconds (Parquet from Spark reads back naive, Arrow's are aware)."""
    def fix(v: object) -> object:
        if isinstance(v, datetime):
            return int((v.replace(tzinfo=UTC) if v.tzinfo is None else v).timestamp() * 1_000_000)
        return v
    return sorted(tuple(fix(v) for v in r) for r in rows)


def read(out: Path, what: str) -> list[tuple]:
    """The rows of a Parquet files sink's ``what`` output, normalised and sorted."""
    return normal(duckdb.connect().execute(
        f"SELECT * FROM read_parquet('{out}/{what}/epoch=*/*.parquet', hive_partitioning = false)"
    ).fetchall())
