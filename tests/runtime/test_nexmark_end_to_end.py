"""A network over the built-in Nexmark generator equals DuckDB over the same events."""

from __future__ import annotations

from pathlib import Path

import duckdb

from eddyline.api.spec import Nexmark
from eddyline.api.validate import load_spec
from eddyline.io.nexmark import nexmark_frame
from eddyline.runtime.engine import Engine

EVENTS = 60_000


def spec(out: Path, lanes: int = 2) -> object:
    return load_spec({
        "name": "hot-auctions", "trigger": 0, "lanes": lanes, "key_groups": 64,
        "sources": [{"name": "bids", "nexmark": {"stream": "bid", "rate": 5_000, "unpaced": True},
                     "max_rows_per_epoch": 12_000, "limit": EVENTS}],
        "steps": [
            {"name": "priced", "input": "bids", "filter": "price > 1000"},
            {"name": "per_auction", "input": "priced", "window_aggregate": {
                "key": "auction", "time": "date_time", "window": {"size": "10s", "slide": "2s"},
                "aggregates": {"bids": "count(*)", "top": "max(price)", "total": "sum(price)"},
                "watermark_delay": "4s"}},
            {"name": "per_channel", "input": "bids", "window_aggregate": {
                "key": "channel", "time": "date_time", "window": {"size": "5s"},
                "aggregates": {"n": "count(*)", "lo": "min(price)"}}},
        ],
        "sinks": [
            {"name": "hot", "input": "per_auction", "files": {"path": str(out / "hot")}},
            {"name": "channels", "input": "per_channel", "files": {"path": str(out / "channels")}},
        ],
    })


def test_nexmark_windows_match_duckdb(spark, tmp_path: Path) -> None:
    s = spec(tmp_path / "out")
    summary = Engine(s, spark, str(tmp_path / "ckpt")).run(until_idle=True)
    assert summary.epochs >= EVENTS // 12_000

    bids = nexmark_frame(spark, Nexmark(stream="bid", rate=5_000, unpaced=True), 0, EVENTS, 2).toArrow()
    assert summary.input_rows == bids.num_rows
    con = duckdb.connect()
    con.register("bids", bids)
    want_hot = con.execute(
        """SELECT auction, ws, count(*), max(price), sum(price) FROM (
             SELECT auction, price, (epoch_us(date_time) // 1000 // 2000) * 2000 - i * 2000 AS ws
             FROM bids, range(5) g(i) WHERE price > 1000)
           GROUP BY ALL ORDER BY ALL"""
    ).fetchall()
    got_hot = con.execute(
        f"SELECT auction, epoch_ms(window_start), bids, top, total FROM read_parquet('{tmp_path}/out/hot/*/*.parquet') ORDER BY ALL"
    ).fetchall()
    assert len(want_hot) > 1000
    assert got_hot == want_hot
    want_ch = con.execute(
        "SELECT channel, (epoch_us(date_time) // 1000 // 5000) * 5000, count(*), min(price) FROM bids GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    got_ch = con.execute(
        f"SELECT channel, epoch_ms(window_start), n, lo FROM read_parquet('{tmp_path}/out/channels/*/*.parquet') ORDER BY ALL"
    ).fetchall()
    assert got_ch == want_ch
