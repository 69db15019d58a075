"""A windowed query from a Kafka topic to a Kafka topic, in this process, against the real broker
(Tansu): its output, read back with ``read_committed``, equals DuckDB's over the same records."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.engine import Engine

from ..kafkaref import create_topic, produce, read_committed, topic_name

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROWS = 6_000


def bids(n: int, seed: int = 5) -> list[dict]:
    """Bids whose times advance 5 ms a record, so that partitions read evenly stay together."""
    rng = random.Random(seed)
    return [{"auction": rng.randint(0, 40), "price": rng.randint(0, 999),
             "ts": (T0 + timedelta(milliseconds=5 * i)).isoformat().replace("+00:00", "Z")} for i in range(n)]


def network(bootstrap: str, topic: str, out: str, per_epoch: int = 1_200) -> dict:
    return {
        "name": "kafka-windows", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "bids", "max_rows_per_epoch": per_epoch,
                     "kafka": {"brokers": bootstrap, "topics": [topic], "schema": "auction long, price long, ts timestamp",
                               "wait": "20s"}}],
        "steps": [{"name": "per_auction", "input": "bids", "window_aggregate": {
            "key": "auction", "time": "ts", "window": {"size": "4s", "slide": "2s"},
            "aggregates": {"n": "count(*)", "top": "max(price)"}, "watermark_delay": "3s"}}],
        "sinks": [{"name": "out", "input": "per_auction",
                   "kafka": {"brokers": bootstrap, "topic": out, "key": ["auction"], "partitions": 2, "wait": "20s"}}],
    }


def produce_bids(bootstrap: str, topic: str, rows: list[dict], bad: list[bytes] = ()) -> None:
    create_topic(bootstrap, topic, partitions=2)
    # keyed by auction: both partitions get records of every stretch of time
    produce(bootstrap, topic, [json.dumps(r).encode() for r in rows], keys=[str(r["auction"]).encode() for r in rows])
    if bad:
        produce(bootstrap, topic, list(bad), partition=1)


def reference(rows: list[dict]) -> list[tuple]:
    """(auction, window start in ms, count, max price) of every 4 s window sliding by 2 s."""
    con = duckdb.connect()
    con.execute("CREATE TABLE bid (auction BIGINT, price BIGINT, ts TIMESTAMPTZ)")
    con.executemany("INSERT INTO bid VALUES (?, ?, ?)", [(r["auction"], r["price"], r["ts"]) for r in rows])
    return con.execute("""
        SELECT auction, (epoch_ms(ts) // 2000) * 2000 - i * 2000 AS ws, count(*), max(price)
        FROM bid, range(2) g(i) GROUP BY ALL ORDER BY ALL""").fetchall()


def output(bootstrap: str, topic: str) -> list[tuple]:
    """The sink's records as (auction, window start in ms, count, max price), sorted; duplicates stay."""
    got = []
    for _, _, key, value, _ in read_committed(bootstrap, topic):
        r = json.loads(value)
        assert key == str(r["auction"]).encode()
        start = datetime.fromisoformat(r["window_start"].replace("Z", "+00:00"))
        got.append((r["auction"], int(start.timestamp() * 1000), r["n"], r["top"]))
    return sorted(got)


@pytest.mark.timeout(900)
def test_a_windowed_query_from_kafka_to_kafka_equals_duckdb(spark, tansu, tmp_path):
    rows = bids(ROWS)
    topic, out = topic_name("bids"), topic_name("windows")
    produce_bids(tansu.bootstrap, topic, rows, bad=[b"{broken", b'{"auction": "x", "price": 1, "ts": "2026-01-01T00:00:00Z"}'])
    progress: list[dict] = []
    reporter = ProgressReporter(live=False)
    reporter.listeners.append(progress.append)
    with reporter:
        Engine(load_spec(network(tansu.bootstrap, topic, out)), spark, str(tmp_path / "ckpt"),
               reporter=reporter).run(until_idle=True)
    assert output(tansu.bootstrap, out) == reference(rows)
    sources = [s for p in progress for s in p["sources"]]
    assert sum(s["numInputRows"] for s in sources) == ROWS
    assert len([s for s in sources if s["numInputRows"]]) >= 4  # max_rows_per_epoch cut the input
    assert sum(p["deadLetters"] for p in progress) == 2
    assert any(s.get("lag") for s in sources) and set(sources[0]["lag"]) == {f"{topic}/0", f"{topic}/1"}
    # the consumer group's offsets, committed after the checkpoint's commits, reach the end
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": "eddyline.bids"})
    committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed) == ROWS + 2


@pytest.mark.timeout(600)
def test_resident_lanes_read_their_own_partitions_of_a_topic(spark, tansu, tmp_path):
    """``execution: resident`` with a Kafka source: each lane reads its pieces of the epoch's
    offset ranges itself (no row through the driver), the bad records go to the dead letters with
    their partition and offset, and the windows equal DuckDB's."""
    rows = bids(2_000, seed=9)
    topic = topic_name("bids")
    produce_bids(tansu.bootstrap, topic, rows, bad=[b"{broken"])
    raw = {**network(tansu.bootstrap, topic, "unused", per_epoch=700), "execution": "resident",
           "sinks": [{"name": "out", "input": "per_auction", "files": {"path": str(tmp_path / "out"), "format": "parquet"}}]}
    progress: list[dict] = []
    reporter = ProgressReporter(live=False)
    reporter.listeners.append(progress.append)
    with reporter:
        engine = Engine(load_spec(raw), spark, str(tmp_path / "ckpt"), reporter=reporter)
        engine.run(until_idle=True)
    assert {p["execution"]["mode"] for p in progress} == {"resident"} and engine.executor.stages_started == 1
    got = duckdb.sql(f"SELECT auction, epoch_ms(window_start), n, top FROM read_parquet('{tmp_path}/out/epoch=*/*.parquet') "
                     "ORDER BY ALL").fetchall()
    assert got == reference(rows)
    by_lane = [s["rowsByLane"] for p in progress for s in p["sources"] if s["numInputRows"]]
    assert all(len(b) == 2 for b in by_lane) and min(sum(b[i] for b in by_lane) for i in (0, 1)) > 0, by_lane
    letters = duckdb.sql(f"SELECT reason FROM read_json_auto('{tmp_path}/ckpt/dead-letters/epoch=*/*.json')").fetchall()
    assert len(letters) == 1 and f"topic {topic}, partition 1, offset" in letters[0][0]
