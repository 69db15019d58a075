"""The ``nats`` source read by resident lanes, each its share of an epoch's sequences, against a
real ``nats-server -js``: the same records and dead letters Spark's tasks read."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pytest

from eddyline.api.validate import load_spec
from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.engine import Engine

from .test_nats import _publish, _source, _stream

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_shares_of_a_slice_read_here_are_what_spark_tasks_read(spark, nats_server):
    stream = _stream()
    payloads = [json.dumps({"id": i, "name": f"n{i}", "price": i * 1.5}).encode() for i in range(60)]
    payloads[17], payloads[44] = b"not json", json.dumps({"id": "x", "name": "y", "price": 1.0}).encode()
    asyncio.run(_publish(nats_server.url, stream, payloads))
    src = _source(nats_server.url, stream)
    src.min_per_task = 10
    planned = src.plan(5, 0.0)
    frames = src.frames(spark, planned, 3)
    shares = [src.read_arrow(planned, task=i, tasks=3) for i in range(3)]
    assert all(s.data.num_rows for s in shares)  # (each task its own sub-range)
    got = sorted(tuple(r.values()) for s in shares for r in s.data.to_pylist())
    assert got == sorted(tuple(r) for r in frames.data.collect()) and len(got) == 53
    dead = sorted((r["line"], r["reason"]) for s in shares if s.dead_letters is not None
                  for r in s.dead_letters.to_pylist())
    assert dead == sorted((r.line, r.reason) for r in frames.dead_letters.collect()) and [d[0] for d in dead] == [18, 45]
    assert src.read_arrow({"start": 60, "end": 60}).data.schema == pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])


@pytest.mark.timeout(600)
def test_resident_lanes_read_their_own_sequences_of_a_stream(spark, nats_server, tmp_path):
    """Messages of 20 bid records each (``records: lines``): each lane reads its sub-range of an
    epoch's sequences itself, the windows equal DuckDB's, and a bad record's dead letter names the
    stream and the message."""
    stream = _stream()
    bids = [{"auction": i % 25, "price": (i * 37) % 1000,
             "ts": (T0 + timedelta(milliseconds=4 * i)).isoformat().replace("+00:00", "Z")} for i in range(20_000)]
    payloads = ["\n".join(json.dumps(b) for b in bids[i:i + 20]).encode() for i in range(0, len(bids), 20)]
    payloads[300] += b"\n{broken"
    asyncio.run(_publish(nats_server.url, stream, payloads))
    raw = {"name": "nats-resident", "trigger": 0, "lanes": 2, "key_groups": 16, "execution": "resident",
           "sources": [{"name": "bids", "max_rows_per_epoch": 450,
                        "nats": {"url": nats_server.url, "stream": stream, "records": "lines",
                                 "schema": "auction long, price long, ts timestamp"}}],
           "steps": [{"name": "per_auction", "input": "bids", "window_aggregate": {
               "key": "auction", "time": "ts", "window": {"size": "2s"},
               "aggregates": {"n": "count(*)", "top": "max(price)"}, "watermark_delay": "1s"}}],
           "sinks": [{"name": "out", "input": "per_auction", "files": {"path": str(tmp_path / "out"), "format": "parquet"}}]}
    progress: list[dict] = []
    reporter = ProgressReporter(live=False)
    reporter.listeners.append(progress.append)
    with reporter:
        Engine(load_spec(raw), spark, str(tmp_path / "ckpt"), reporter=reporter).run(until_idle=True)
    assert {p["execution"]["mode"] for p in progress} == {"resident"}
    con = duckdb.connect()
    con.register("bid", pa.Table.from_pylist([{**b, "ts": datetime.fromisoformat(b["ts"])} for b in bids]))
    want = con.execute("SELECT auction, epoch_ms(ts) // 2000 * 2000 AS ws, count(*), max(price) FROM bid "
                       "GROUP BY ALL ORDER BY ALL").fetchall()
    got = duckdb.sql(f"SELECT auction, epoch_ms(window_start), n, top FROM read_parquet('{tmp_path}/out/epoch=*/*.parquet') "
                     "ORDER BY ALL").fetchall()
    assert got == want
    by_lane = [s["rowsByLane"] for p in progress for s in p["sources"] if s["numInputRows"]]
    assert min(sum(b[i] for b in by_lane) for i in (0, 1)) > 0, by_lane
    letters = duckdb.sql(f"SELECT file, line FROM read_json_auto('{tmp_path}/ckpt/dead-letters/epoch=*/*.json')").fetchall()
    assert letters == [(stream, 301)]
