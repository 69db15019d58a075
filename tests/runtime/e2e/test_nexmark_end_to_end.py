"""A network over the built-in Nexmark generator equals DuckDB over the same events."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.io.nexmark import Nexmark, nexmark_frame
from eddyline.runtime.engine import Engine

EVENTS = 60_000


def spec(out: Path, lanes: int = 2, execution: str = "job") -> object:
    return load_spec({
        "name": "hot-auctions", "trigger": 0, "lanes": lanes, "key_groups": 64, "execution": execution,
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


@pytest.mark.parametrize("execution", ["job", "resident"])
def test_nexmark_windows_match_duckdb(spark, tmp_path: Path, execution: str) -> None:
    """Per-epoch jobs, and resident lanes that compute their shares of the events themselves."""
    s = spec(tmp_path / "out", execution=execution)
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


def test_window_over_a_windows_output(spark, tmp_path: Path) -> None:
    """Chained windows: bids per auction per 2 s, then per 10 s the busiest auction's 2 s count."""
    s = load_spec({
        "name": "chained", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "bids", "nexmark": {"stream": "bid", "rate": 2_000, "unpaced": True},
                     "max_rows_per_epoch": 8_000, "limit": 40_000}],
        "steps": [
            {"name": "per_2s", "input": "bids", "window_aggregate": {
                "key": "auction", "time": "date_time", "window": {"size": "2s"}, "aggregates": {"n": "count(*)"}}},
            {"name": "per_10s", "input": "per_2s", "window_aggregate": {
                "time": "window_start", "window": {"size": "10s"}, "aggregates": {"busiest": "max(n)", "total": "sum(n)"}}},
        ],
        "sinks": [{"name": "out", "input": "per_10s", "files": {"path": str(tmp_path / "out")}}],
    })
    Engine(s, spark, str(tmp_path / "ckpt")).run(until_idle=True)
    bids = nexmark_frame(spark, Nexmark(stream="bid", rate=2_000, unpaced=True), 0, 40_000, 2).toArrow()
    con = duckdb.connect()
    con.register("bids", bids)
    want = con.execute(
        """WITH c AS (SELECT auction, (epoch_us(date_time) // 1000 // 2000) * 2000 AS ws, count(*) AS n FROM bids GROUP BY ALL)
           SELECT (ws // 10000) * 10000, max(n), sum(n) FROM c GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    got = con.execute(
        f"SELECT epoch_ms(window_start), busiest, total FROM read_parquet('{tmp_path}/out/*/*.parquet') ORDER BY 1"
    ).fetchall()
    assert len(want) == 2 and got == want  # 40,000 events at 2,000 per second: 20 s
