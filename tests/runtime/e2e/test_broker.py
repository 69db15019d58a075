"""Through a real broker: Nexmark events produced into NATS JetStream, networks reading them from
the stream and writing to NATS (and PostgreSQL), compared with DuckDB over the same events."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import duckdb
import pytest
import yaml

from eddyline.api.sources import SourceSpec
from eddyline.api.validate import load_spec
from eddyline.io.memory import MemorySink
from eddyline.io.nexmark import Nexmark, nexmark_frame, nexmark_schema
from eddyline.io.produce import Feed, produce
from eddyline.io.sinks import make_sink
from eddyline.runtime.engine import Engine

from ...natsref import read_stream
from .nexmark_ref import REFERENCE, canonical

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "nexmark"
EVENTS = 30_000
RATE = 1_000


@pytest.fixture(scope="module")
def nexmark_stream(spark, nats_server) -> str:
    """Every Nexmark event of [0, EVENTS) in one stream, on subjects nexmark.person / .auction / .bid."""
    stream = f"NX{uuid.uuid4().hex[:8]}"
    feeds = [
        Feed(SourceSpec.model_validate({"name": k, "nexmark": {"stream": k, "rate": RATE, "unpaced": True}}),
             f"{stream}.{k}")
        for k in ("person", "auction", "bid")
    ]
    assert produce(spark, nats_server.url, stream, feeds, end=EVENTS) == EVENTS
    return stream


def from_nats(raw: dict, url: str, stream: str, per_epoch: int) -> dict:
    """A Nexmark query spec whose nexmark sources read the same events from the stream."""
    for src in raw["sources"]:
        kind = src.pop("nexmark")["stream"]
        src["nats"] = {"url": url, "stream": stream, "subject": f"{stream}.{kind}", "schema": nexmark_schema(kind)}
        src["max_rows_per_epoch"] = per_epoch
    raw["trigger"], raw["lanes"] = 0, 2
    return raw


def test_q5_from_nats_to_nats_and_postgres_equals_duckdb_over_the_same_events(
    spark, nats_server, postgres, nexmark_stream, tmp_path
):
    raw = from_nats(yaml.safe_load((EXAMPLES / "q5.yaml").read_text()), nats_server.url, nexmark_stream, 6_000)
    out_stream = f"Q5{uuid.uuid4().hex[:8]}"
    raw["sinks"] = [
        {"name": "out", "input": "q5", "memory": {}},
        {"name": "published", "input": "q5",
         "nats": {"url": nats_server.url, "stream": out_stream, "subject": f"{out_stream}.q5"}},
        {"name": "db", "input": "q5", "postgres": {"url": postgres.url, "table": out_stream.lower()}},
    ]
    spec = load_spec(raw)
    memory = MemorySink(spec.sinks[0])
    sinks = {"out": memory, **{s.name: make_sink(s) for s in spec.sinks[1:]}}
    summary = Engine(spec, spark, str(tmp_path / "ckpt"), sinks=sinks).run(until_idle=True)
    bids = nexmark_frame(spark, Nexmark(stream="bid", rate=RATE, unpaced=True), 0, EVENTS, 2).toArrow()
    assert summary.input_rows == bids.num_rows

    con = duckdb.connect()
    con.register("bid", bids)
    got = memory.table()
    assert got is not None
    con.register("got", got)
    want_sql, got_sql = REFERENCE["q5"]
    want = canonical(con, f"({want_sql})")
    assert len(want) > 10 and canonical(con, f"({got_sql})") == want

    # the NATS output stream holds the same rows, once each, with the epoch in the message id
    published = [(p, mid) for _, p, mid in read_stream(nats_server.url, out_stream)]
    rows = [json.loads(p) for p, _ in published]
    assert sorted(_key(r["auction"], r["num"], datetime.fromisoformat(r["window_start"])) for r in rows) == sorted(
        _key(r["auction"], r["num"], r["window_start"]) for r in got.to_pylist())
    assert len({mid for _, mid in published}) == len(published)
    assert all(mid.split("/")[0] == "nexmark-q5" and mid.split("/")[2] == "published" for _, mid in published)

    # and the PostgreSQL table too
    db = _query(postgres.url, f"SELECT auction, num, window_start FROM {out_stream.lower()}")
    assert sorted(_key(*r) for r in db) == sorted(_key(r["auction"], r["num"], r["window_start"]) for r in got.to_pylist())


@pytest.mark.parametrize("execution", ["job", "resident"])
def test_the_demo_network_from_nats_upserts_its_windows_into_postgres_as_duckdb_computes_them(
    spark, nats_server, postgres, nexmark_stream, tmp_path, execution
):
    raw = yaml.safe_load(resources.files("eddyline").joinpath("examples/demo-broker.yaml").read_text())
    table = f"hot_{uuid.uuid4().hex[:8]}"
    raw["trigger"], raw["lanes"], raw["execution"] = 0, 2, execution
    raw["sources"][0]["nats"] |= {"url": nats_server.url, "stream": nexmark_stream, "subject": f"{nexmark_stream}.bid"}
    raw["sources"][0]["max_rows_per_epoch"] = 5_000
    raw["sinks"] = [{"name": "hot_db", "input": "per_auction",
                     "postgres": {"url": postgres.url, "table": table, "mode": "upsert", "key": ["auction", "window_start"]}}]
    Engine(load_spec(raw), spark, str(tmp_path / "ckpt")).run(until_idle=True)

    con = duckdb.connect()
    con.register("bid", nexmark_frame(spark, Nexmark(stream="bid", rate=RATE, unpaced=True), 0, EVENTS, 2).toArrow())
    want = con.execute(
        """SELECT auction, ws, count(*), max(price), round(avg(price), 6) FROM (
             SELECT auction, price, (epoch_us(date_time) // 1000 // 2000) * 2000 - i * 2000 AS ws
             FROM bid, range(5) g(i) WHERE price > 100)
           GROUP BY ALL ORDER BY ALL"""
    ).fetchall()
    got = sorted(
        (a, int(ws.timestamp() * 1000), n, top, round(mean, 6))
        for a, ws, n, top, mean in _query(postgres.url, f"SELECT auction, window_start, bids, top, mean FROM {table}")
    )
    assert len(want) > 500 and got == want


def _query(url: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def _key(auction: int, num: int, start: datetime) -> tuple[int, int, int]:
    return auction, num, int(start.replace(tzinfo=start.tzinfo or UTC).timestamp() * 1000)
