"""Nexmark in Flink SQL (examples/nexmark/sql/) gives the YAML specs' output on the same events.

The queries whose SQL compiles to the YAML's network itself are shown so without Spark
(tests/api/test_sql.py). Each other query runs once: one network holding the YAML spec's steps
and those of every SQL file of the query (nexmark's text, qN.sql, and its other forms, e.g.
q5_topn.sql), reading the same sources, with one memory sink each. Each SQL output must be the
YAML's rows (a changelog: the same rows once summed), or those of its columns the SQL outputs
(nexmark's q5 leaves out the window's bounds); nexmark's q7, which differs from the YAML's by
the bids at a window's end, must be DuckDB's answer to the same query over the events the run
read (a memory sink on the source), on the generated bids and, in the same run, on a few bids
placed at its windows' ends (which the generated ones never are).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import yaml

from eddyline.api.sql import compile_sql
from eddyline.api.validate import load_spec
from eddyline.io.memory import MemorySink
from eddyline.runtime.engine import Engine
from tests.api.sqlcases import QUERIES, SAME_NETWORK, VARIANTS

NEXMARK = Path(__file__).resolve().parents[3] / "examples" / "nexmark"
EVENTS = 12_000
RATE = 1_000  # events per second of event time: 12 s of auctions, bids and people
PER_EPOCH = 4_000

#: the SQL files run beside each YAML spec: the query's own and its other forms
FILES = {q: [q, *sorted(v for v, of in VARIANTS.items() if of == q)] for q in QUERIES if q not in SAME_NETWORK}
#: SQL files that output fewer columns than the YAML spec: those columns of its rows
PROJECTED = {"q5": ["auction", "num"]}
#: SQL files checked against DuckDB instead: (its source, the query over that source's events as
#: DuckDB tables, the same columns read from the SQL's output ``got``); times compared in µs,
#: windows on whole milliseconds as Eddyline's
DUCKDB = {
    "q7": ("bid", """
        WITH b AS (SELECT *, epoch_us(date_time) AS t FROM bid)
        SELECT B.auction, B.price, B.bidder, B.t, B.extra
        FROM b B
        JOIN (SELECT max(price) AS maxprice, t // 10000000 * 10000000 + 10000000 AS t  -- window_end
              FROM b GROUP BY t // 10000000) B1
        ON B.price = B1.maxprice
        WHERE B.t BETWEEN B1.t - 10000000 AND B1.t""",
           "SELECT auction, price, bidder, epoch_us(date_time), extra FROM got"),
}
#: q7 again over a few bids at its windows' edges (ms after a 10 s boundary, price): one exactly
#: at the end of window 0 with window 0's top price (BETWEEN, inclusive, joins it to window 0's
#: maximum; a Window Top-N would not keep it), one at the end of window 1 with the top price of
#: windows 1 and 2 (joined to both). The generated events have no bid at a window's end.
EDGE_BIDS = [(1_000, 50), (3_000, 70), (10_000, 70), (15_000, 90), (20_000, 90), (25_000, 10)]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _bounded(raw: dict, prefix: str) -> dict:
    """The spec's nodes with a bounded, unpaced input, a memory sink, and names under ``prefix``."""
    steps = {s["name"] for s in raw["steps"]}
    rename = lambda n: f"{prefix}{n}" if n in steps else n  # noqa: E731
    out = {"sources": [], "steps": [], "sinks": []}
    for src in raw["sources"]:
        src["nexmark"].update(rate=RATE, unpaced=True)
        out["sources"].append({**src, "limit": EVENTS, "max_rows_per_epoch": PER_EPOCH})
    for step in raw["steps"]:
        step = {**step, "name": rename(step["name"])}
        if "input" in step:
            step["input"] = rename(step["input"])
        if "join" in step:
            step["join"] = {**step["join"], "left": rename(step["join"]["left"]), "right": rename(step["join"]["right"])}
        out["steps"].append(step)
    (sink,) = raw["sinks"]
    out["sinks"].append({"name": f"{prefix}out", "input": rename(sink["input"]), "memory": {}})
    return out


def _edge_q7(directory: Path) -> dict:
    """q7.sql over EDGE_BIDS: its bid table read from JSON files as ``edge_bid``."""
    directory.mkdir(parents=True)
    with open(directory / "bids.json", "w", encoding="utf-8") as out:
        for i, (ms, price) in enumerate(EDGE_BIDS):
            at = (T0 + timedelta(milliseconds=ms)).isoformat().replace("+00:00", "Z")
            out.write(json.dumps({"auction": i, "bidder": 100 + i, "price": price, "channel": "c", "url": "u",
                                  "date_time": at, "extra": ""}) + "\n")
    text = re.sub(r"WITH \('connector' = 'nexmark'[^)]*\)",
                  f"WITH ('connector' = 'filesystem', 'path' = '{directory}', 'format' = 'json')",
                  (NEXMARK / "sql" / "q7.sql").read_text())
    raw = compile_sql(re.sub(r"\bbid\b", "edge_bid", text), "q7")
    out = _bounded({**raw, "sources": []}, "sql_q7_edge_")
    return out | {"sources": raw["sources"], "sinks": [*out["sinks"], {"name": "events_edge_bid", "input": "edge_bid", "memory": {}}]}


def _duckdb(query: str, events: pa.Table, got: pa.Table) -> tuple[Counter, Counter]:
    """DuckDB's answer to DUCKDB[query] over ``events``, and the same columns of ``got``."""
    source, reference, read = DUCKDB[query]
    con = duckdb.connect()
    con.register(source, events)
    con.register("got", got)
    return Counter(con.execute(reference).fetchall()), Counter(con.execute(read).fetchall())


def _rows(table) -> Counter:
    """A table's rows as a multiset; a changelog summed by its weights (_diff)."""
    rows: Counter = Counter()
    names = [n for n in table.column_names if n != "_diff"]
    weights = table.column("_diff").to_pylist() if "_diff" in table.column_names else [1] * table.num_rows
    for row, w in zip(zip(*(table.column(n).to_pylist() for n in names), strict=True), weights, strict=True):
        rows[row] += w
    return +rows  # drops rows whose weights sum to 0


@pytest.mark.parametrize("query", list(FILES))
def test_sql_matches_yaml(spark, tmp_path: Path, query: str) -> None:
    yml = _bounded(yaml.safe_load((NEXMARK / f"{query}.yaml").read_text()), "yaml_")
    sqls = [_bounded(compile_sql((NEXMARK / "sql" / f"{f}.sql").read_text(), f), f"sql_{f}_") for f in FILES[query]]
    sources = {s["name"]: s for s in yml["sources"]}
    for sql in sqls:
        assert {s["name"]: s for s in sql["sources"]} == sources  # the same input, read once
    events = [{"name": f"events_{src}", "input": src, "memory": {}} for f in FILES[query] if f in DUCKDB
              for src in [DUCKDB[f][0]]]
    edge = _edge_q7(tmp_path / "edge_bid") if query == "q7" else {"sources": [], "steps": [], "sinks": []}
    spec = load_spec({"name": f"sql-{query}", "trigger": 0, "lanes": 2, "sources": list(sources.values()) + edge["sources"],
                      "steps": yml["steps"] + [s for sql in sqls for s in sql["steps"]] + edge["steps"],
                      "sinks": yml["sinks"] + [s for sql in sqls for s in sql["sinks"]] + events + edge["sinks"]})
    sinks = {s.name: MemorySink(s) for s in spec.sinks}
    Engine(spec, spark, str(tmp_path / "ckpt"), sinks=sinks).run(until_idle=True)
    want = sinks["yaml_out"].table()
    assert want is not None and len(_rows(want)) > 0
    for f in FILES[query]:
        got = sinks[f"sql_{f}_out"].table()
        assert got is not None, f
        if f in DUCKDB:
            expected, have = _duckdb(f, sinks[f"events_{DUCKDB[f][0]}"].table(), got)
            assert len(expected) > 0
            assert have == expected, f
        elif f in PROJECTED:
            assert got.column_names == PROJECTED[f], f
            assert _rows(got) == _rows(want.select(PROJECTED[f])), f
        else:
            assert got.column_names == want.column_names, f
            assert _rows(got) == _rows(want), f
    if query == "q7":
        expected, have = _duckdb("q7", sinks["events_edge_bid"].table(), sinks["sql_q7_edge_out"].table())
        # window 0's top bid, the bid at its end, window 1's top bid, and the bid at its end twice
        assert sorted(EDGE_BIDS[i][0] for i, *_ in expected.elements()) == [3_000, 10_000, 15_000, 20_000, 20_000]
        assert have == expected
