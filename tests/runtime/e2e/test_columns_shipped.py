"""A JSON source hands Spark only the columns its network reads, and still checks every column:
a bad value in a column nobody reads is a dead letter, as it is when every column is read."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from eddyline.api.validate import load_spec
from eddyline.io.sources import make_source
from eddyline.runtime.compile import EpochCompiler

from .drivers import run

DDL = "auction long, bidder long, price long, channel string, ts timestamp"


def _write(directory: Path) -> int:
    directory.mkdir(parents=True)
    bad = 0
    for f in range(3):
        with open(directory / f"bids-{f}.json", "w", encoding="utf-8") as out:
            for i in range(200):
                row = {"auction": i % 40, "bidder": i, "price": (i * 37) % 1000, "channel": f"c{i % 3}",
                       "ts": f"2026-01-01T00:0{f}:{i % 60:02d}Z"}
                if i % 50 == 7:  # a bad value in columns the network does not read
                    row["bidder" if i % 100 == 7 else "ts"] = "soon"
                    bad += 1
                out.write(json.dumps(row) + "\n")
    return bad


def _spec(src: Path, out: Path):
    return load_spec({
        "name": "q2-like", "trigger": 0, "lanes": 2,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": DDL}}],
        "steps": [{"name": "some", "input": "bids", "filter": "auction % 7 = 0"},
                  {"name": "cols", "input": "some", "select": ["auction", "price"]}],
        "sinks": [{"name": "out", "input": "cols", "files": {"path": str(out), "format": "parquet"}}],
    })


def test_only_read_columns_reach_spark_and_bad_values_elsewhere_are_still_dead_letters(spark, tmp_path: Path) -> None:
    bad = _write(tmp_path / "in")
    spec = _spec(tmp_path / "in", tmp_path / "out")
    sources = {s.name: make_source(s) for s in spec.sources}
    frames = EpochCompiler(spark, spec, sources, str(tmp_path / "probe")).build(
        1, {"bids": sources["bids"].plan(0, 0.0)}, {}, 2, observe=False)
    assert frames.nodes["bids"].columns == ["auction", "price"]

    summary = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert summary.dead_letters == bad == 12
    con = duckdb.connect()
    reasons = con.execute(f"SELECT reason, count(*) FROM read_json('{tmp_path}/ckpt/dead-letters/epoch=*/*.json') "
                          "GROUP BY reason ORDER BY reason").fetchall()
    assert reasons == [("field 'bidder': expected bigint, got soon", 6), ("field 'ts': expected timestamp, got soon", 6)]
    got = con.execute(f"SELECT auction, price FROM read_parquet('{tmp_path}/out/epoch=*/*.parquet') ORDER BY ALL").fetchall()
    want = con.execute(f"""SELECT auction, price FROM read_json('{tmp_path}/in/*.json', columns={{auction: 'BIGINT',
        bidder: 'VARCHAR', price: 'BIGINT', ts: 'VARCHAR'}}) WHERE auction % 7 = 0 AND bidder != 'soon' AND ts != 'soon'
        ORDER BY ALL""").fetchall()
    assert len(want) > 50 and got == want
