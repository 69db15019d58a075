"""Upstream backup end to end: bids on a plain core NATS subject (the server keeps nothing) go
through a window aggregate into Parquet. The driver dies after publishing an epoch, before its
commit; the restarted driver replays that epoch from the write-ahead log in the checkpoint, and
the output is DuckDB's over every bid published while a driver was subscribed."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine

from .helpers import T0, Crash, CrashAfterPublish

pytestmark = pytest.mark.slow

CHUNKS, PER_CHUNK = 8, 150


def chunks(seed: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        [{"auction": rng.randint(0, 9), "price": rng.randint(0, 999),
          "ts": (T0 + timedelta(milliseconds=k * 10_000 + i * (10_000 // PER_CHUNK))).isoformat().replace("+00:00", "Z")}
         for i in range(PER_CHUNK)]
        for k in range(CHUNKS)
    ]


def publish(url: str, subject: str, rows: list[dict[str, Any]], bad: bytes | None = None) -> None:
    async def go() -> None:
        import nats

        nc = await nats.connect(url)
        for r in rows:
            await nc.publish(subject, json.dumps(r).encode())
        if bad is not None:
            await nc.publish(subject, bad)
        await nc.flush()
        await nc.close()

    asyncio.run(go())


class Feed:
    """The reporter: after each reported epoch, publishes the next chunk (and waits until the
    driver's log holds it, so that an idle plan does not end the run early)."""

    console = None

    def __init__(self, url: str, subject: str, data: list[list[dict[str, Any]]]):
        self.url, self.subject, self.data = url, subject, data
        self.next = 0
        self.engine: Engine | None = None
        self.records: list[dict[str, Any]] = []
        self.published = 0

    def feed(self) -> None:
        if self.next >= len(self.data):
            return
        chunk = self.data[self.next]
        bad = b'{"auction": "x", "price": 1}' if self.next == 2 else None
        publish(self.url, self.subject, chunk, bad)
        self.next += 1
        self.published += len(chunk) + (bad is not None)
        source = self.engine.sources["bids"]  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while source.available(0.0) < self.published:
            assert time.monotonic() < deadline, "the driver did not receive the chunk"
            time.sleep(0.02)

    def report(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.feed()


def test_a_core_subject_kept_in_the_log_is_replayed_after_a_crash_and_nothing_is_lost_or_doubled(
    spark, nats_server, tmp_path: Path
) -> None:
    """The run that crashes reads the log in Spark's tasks, the one after it in resident lanes
    (each its share of the ranges, from the files the driver keeps writing)."""
    subject = f"core.bids.{uuid.uuid4().hex[:8]}"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    raw = {
        "name": "core-bids", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "bids", "max_rows_per_epoch": PER_CHUNK + 1, "nats_core": {
            "url": nats_server.url, "subject": subject, "schema": "auction long, price long, ts timestamp",
            "segment_size": "16KiB", "max_backlog": "1MiB"}}],
        "steps": [{"name": "per_auction", "input": "bids", "window_aggregate": {
            "key": "auction", "time": "ts", "window": {"size": "10s"},
            "aggregates": {"n": "count(*)", "total": "sum(price)"}, "watermark_delay": "1s"}}],
        "sinks": [{"name": "out", "input": "per_auction", "files": {"path": str(out), "format": "parquet"}}],
    }
    spec = load_spec(raw)
    data = chunks(3)
    feed = Feed(nats_server.url, subject, data)

    first = Engine(spec, spark, str(ckpt), reporter=feed, faults=CrashAfterPublish(3))  # type: ignore[arg-type]
    feed.engine = first
    first.sources["bids"].attach(str(ckpt), 0)  # subscribed before anything is published
    feed.feed()
    with pytest.raises(Crash):
        first.run(until_idle=True)
    assert feed.next == 3  # epochs 1 and 2 reported; epoch 3 published its windows, not committed
    wal = ckpt / "wal" / "bids"
    assert any(wal.iterdir())

    second = Engine(load_spec(raw | {"execution": "resident"}), spark, str(ckpt), reporter=feed)  # type: ignore[arg-type]
    feed.engine = second
    summary = second.run(until_idle=True)
    assert feed.next == CHUNKS
    assert (ckpt / "resident").is_dir()  # (the second run's stage)
    replay = next(r for r in feed.records if r["batchId"] == 3)
    assert replay["replayed"] is True
    assert summary.dead_letters == 1

    # every bid once: the windows equal DuckDB's over everything that was published
    con = duckdb.connect()
    con.register("bids", pa.Table.from_pylist([b for c in data for b in c]))
    expected = con.execute(
        "SELECT auction, epoch_ms(time_bucket(INTERVAL 10 seconds, ts::TIMESTAMP)), count(*), sum(price) "
        "FROM bids GROUP BY ALL ORDER BY ALL").fetchall()
    got = duckdb.connect().execute(
        f"SELECT auction, epoch_ms(window_start), n, total FROM read_parquet('{out}/epoch=*/*.parquet') ORDER BY ALL"
    ).fetchall()
    # the last windows stay open (no later bid moves the watermark past them)
    closed = {w for _, w, _, _ in got}
    assert got == [e for e in expected if e[1] in closed] and len(closed) >= CHUNKS - 2

    # the log is bounded and reported; committed segments went
    last = feed.records[-1]["sources"][0]
    assert last["max_backlog"] == 1 << 20 and last["wal_dropped"] == 0 and last["wal_records"] == 0
    assert last["wal_bytes"] < 3 * 16 * 1024
