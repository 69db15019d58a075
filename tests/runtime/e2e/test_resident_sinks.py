"""The ``kafka``, ``nats`` and ``postgres`` sinks in resident epochs, against the real servers:
the rows come back from the lanes as Arrow and the driver's sink sends them, as the very records
per-epoch jobs send (made by Spark there): a checkpoint may change mode between runs, and an
``auto`` network may run either way, without its consumers seeing two kinds of record."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eddyline.api.validate import load_spec
from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.engine import Engine

from ...kafkaref import read_committed, topic_name
from ...natsref import read_stream

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FILES, PER_FILE = 4, 900


def bids(folder) -> pa.Table:
    """Bids in ``FILES`` Parquet files, 7 ms apart, over 30 auctions (prices give averages with
    long fractions: doubles in the records)."""
    rng = np.random.default_rng(3)
    n = FILES * PER_FILE
    ts = pa.array([T0 + timedelta(milliseconds=7 * i) for i in range(n)], pa.timestamp("us", tz="UTC"))
    table = pa.table({"auction": rng.integers(0, 30, n), "price": rng.integers(1, 1000, n), "ts": ts})
    folder.mkdir()
    for f in range(FILES):
        pq.write_table(table.slice(f * PER_FILE, PER_FILE), folder / f"{f:04d}.parquet")
    return table


def network(folder, execution: str, tansu, nats_server, postgres, name: str) -> dict:
    return {
        "name": "resident-sinks", "trigger": 0, "lanes": 2, "key_groups": 16, "execution": execution,
        "sources": [{"name": "bids", "files": {"path": str(folder), "format": "parquet", "max_files_per_epoch": 1}}],
        "steps": [{"name": "per_auction", "input": "bids", "window_aggregate": {
            "key": "auction", "time": "ts", "window": {"size": "4s", "slide": "2s"},
            "aggregates": {"n": "count(*)", "top": "max(price)", "mean": "avg(price)"}, "watermark_delay": "3s"}},
                  # (text made by DuckDB in a lane, by Spark in a job)
                  {"name": "labelled", "input": "per_auction",
                   "select": ["*", "concat('auction \"', CAST(auction AS STRING), '\" ✓') AS label"]}],
        "sinks": [
            {"name": "topic", "input": "labelled",
             "kafka": {"brokers": tansu.bootstrap, "topic": name, "key": ["auction"], "partitions": 2, "wait": "20s"}},
            {"name": "stream", "input": "labelled",
             "nats": {"url": nats_server.url, "stream": name.upper().replace("-", ""), "subject": f"{name}.windows"}},
            {"name": "table", "input": "labelled",
             "postgres": {"url": postgres.url, "table": name.replace("-", "_")}},
        ],
    }


def run(spark, folder, execution: str, tansu, nats_server, postgres, tmp_path) -> str:
    name = topic_name(f"w{execution[0]}")
    progress: list[dict] = []
    reporter = ProgressReporter(live=False)
    reporter.listeners.append(progress.append)
    with reporter:
        Engine(load_spec(network(folder, execution, tansu, nats_server, postgres, name)), spark,
               str(tmp_path / f"ckpt-{execution}"), reporter=reporter).run(until_idle=True)
    assert {p["execution"]["mode"] for p in progress} == {"job" if execution == "job" else "resident"}
    return name


def _rows(url: str, table: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return sorted(conn.execute(f"SELECT auction, window_start, window_end, n, top, mean, label FROM {table}").fetchall())


@pytest.mark.timeout(900)
def test_resident_epochs_send_the_records_per_epoch_jobs_send(spark, tansu, nats_server, postgres, tmp_path):
    table = bids(tmp_path / "in")
    job = run(spark, tmp_path / "in", "job", tansu, nats_server, postgres, tmp_path)
    resident = run(spark, tmp_path / "in", "resident", tansu, nats_server, postgres, tmp_path)

    # Kafka: the same keys and values, byte for byte, and the windows DuckDB computes
    records = {name: Counter((key, value) for _, _, key, value, _ in read_committed(tansu.bootstrap, name))
               for name in (job, resident)}
    assert records[resident] == records[job]
    con = duckdb.connect()
    con.register("bid", table)
    want = con.execute("""
        SELECT auction, (epoch_ms(ts) // 2000) * 2000 - i * 2000 AS ws, count(*), max(price)
        FROM bid, range(2) g(i) GROUP BY ALL ORDER BY ALL""").fetchall()
    got = sorted((r["auction"], int(datetime.fromisoformat(r["window_start"]).timestamp() * 1000), r["n"], r["top"])
                 for r in (json.loads(v) for _, v in records[resident].elements()))
    assert len(want) > 100 and got == want
    assert any("." in json.loads(v)["window_start"] for _, v in records[resident])  # (microseconds written)
    assert all(json.loads(v)["label"] == f'auction "{int(k)}" ✓' for k, v in records[resident])

    # NATS JetStream: the same payloads
    payloads = {name: Counter(p for _, p, _ in read_stream(nats_server.url, name.upper().replace("-", "")))
                for name in (job, resident)}
    assert sum(payloads[job].values()) == len(want) and payloads[resident] == payloads[job]

    # PostgreSQL: the same rows, of the same column types
    assert _rows(postgres.url, resident.replace("-", "_")) == _rows(postgres.url, job.replace("-", "_"))


def test_spark_json_text_is_made_alike_from_arrow(spark):
    """:mod:`eddyline.io.sparkjson` against Spark's own ``to_json`` and casts, over the types a
    step's rows have (nulls, escapes, instants to the microsecond, doubles of every magnitude)."""
    from eddyline.io.records import to_json_column
    from eddyline.io.sparkjson import json_records, key_texts

    doubles = [0.0, -0.0, 1.5, 1e7, 9999999.0, 12345678.9, 1e-3, 9.99e-4, 1.0e-4, 123.456, 1 / 3, 2.5e-300,
               1.7976931348623157e308, float("nan"), float("inf"), -float("inf"), -42.0, 100.0, 1e21, 0.1]
    n = len(doubles)
    texts = ["plain", 'quote " and \\ back', "line\nbreak\ttab", "ünïcödé ✓", "\x01ctl", "", None, "/slash"]
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "small": pa.array([i % 3 - 1 for i in range(n)], pa.int32()),
        "d": pa.array(doubles, pa.float64()),
        "s": pa.array([texts[i % len(texts)] for i in range(n)], pa.string()),
        "b": pa.array([None if i % 5 == 0 else i % 2 == 0 for i in range(n)], pa.bool_()),
        "t": pa.array([None if i == 3 else T0 + timedelta(microseconds=123_457 * i ** 3) for i in range(n)],
                      pa.timestamp("us", tz="UTC")),
        "day": pa.array([(T0 + timedelta(days=400 * i)).date() for i in range(n)], pa.date32()),
        "xs": pa.array([[i, None, -i] if i % 4 else [] for i in range(n)], pa.list_(pa.int64())),
    })
    df = spark.createDataFrame(table)
    assert json_records(table) == [r["v"] for r in to_json_column(df).collect()]
    for key in ("id", "s", "t", "d", "b", "day"):
        want = [r["k"] for r in df.selectExpr(f"CAST(`{key}` AS STRING) AS k").collect()]
        assert key_texts(table, [key]) == want, key
    want = [r["k"] for r in df.selectExpr("to_json(array(id, CAST(small AS BIGINT))) AS k").collect()]
    assert key_texts(table.set_column(1, "small", table.column("small").cast(pa.int64())), ["id", "small"]) == want


def test_a_record_key_spark_would_coerce_is_refused_before_a_resident_run_starts(spark, tmp_path):
    """Spark's ``array()`` brings key columns of different types to one type; a resident epoch
    would not make the same key, so such a network is refused as it starts (``auto`` runs it in
    per-epoch jobs), before the checkpoint or the topic is touched."""
    from eddyline.errors import SpecError

    bids(tmp_path / "in")
    raw = {"name": "mixed-key", "trigger": 0, "lanes": 2, "execution": "resident",
           "sources": [{"name": "bids", "files": {"path": str(tmp_path / "in"), "format": "parquet"}}],
           "steps": [{"name": "first", "input": "bids", "dedup": {"key": "auction", "time": "ts", "ttl": "1m"}}],
           "sinks": [{"name": "topic", "input": "first",
                      "kafka": {"brokers": "127.0.0.1:9", "topic": "never", "key": ["auction", "ts"]}}]}
    with pytest.raises(SpecError, match=r"execution: resident: sink 'topic': key columns \['auction', 'ts'\] are of "
                                        "different types"):
        Engine(load_spec(raw), spark, str(tmp_path / "ckpt")).run(until_idle=True)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("commits/*"))
