"""Every Nexmark query in examples/nexmark/ against a DuckDB reference over the same events.

The specs are the user-facing files; the test only bounds their Nexmark sources to a fixed data
set (``limit``), runs them unpaced in a few epochs, and collects the sinks in memory.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import yaml

from eddyline.api.spec import Nexmark
from eddyline.api.validate import load_spec
from eddyline.io.nexmark import nexmark_frame
from eddyline.io.sinks import MemorySink
from eddyline.runtime.engine import Engine

SPECS = Path(__file__).resolve().parents[2] / "examples" / "nexmark"
EVENTS = 30_000
RATE = 1_000  # events per second of event time: 30 s of auctions, bids and people
PER_EPOCH = 6_000

#: The reference: each query in DuckDB SQL over tables person, auction, bid (Flink nexmark's
#: definitions, with DuckDB's functions); event times truncated to ms like Eddyline's windows.
REFERENCE = {
    "q0": "SELECT auction, bidder, price, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
}


@pytest.fixture(scope="module")
def events(spark) -> dict[str, pa.Table]:
    return {
        s: nexmark_frame(spark, Nexmark(stream=s, rate=RATE, unpaced=True), 0, EVENTS, 2).toArrow()
        for s in ("person", "auction", "bid")
    }


def run_query(spark, name: str, tmp: Path) -> pa.Table:
    raw = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    raw["trigger"] = 0
    raw["lanes"] = 2
    for src in raw["sources"]:
        src["nexmark"].update(rate=RATE, unpaced=True)
        src.update(limit=EVENTS, max_rows_per_epoch=PER_EPOCH)
    for sink in raw["sinks"]:
        sink.pop("files", None)
        sink["memory"] = {}
    spec = load_spec(raw)
    sinks = {s.name: MemorySink(s) for s in spec.sinks}
    Engine(spec, spark, str(tmp / "ckpt"), sinks=sinks).run(until_idle=True)
    table = sinks["out"].table()
    assert table is not None
    return table


def canonical(con: duckdb.DuckDBPyConnection, relation: str) -> list[tuple]:
    rows = con.execute(f"SELECT * FROM {relation}").fetchall()
    return sorted(rows, key=lambda r: tuple((x is None, str(x)) for x in r))


@pytest.mark.parametrize("query", sorted(REFERENCE))
def test_query_matches_duckdb(spark, events, tmp_path: Path, query: str) -> None:
    got = run_query(spark, query, tmp_path)
    con = duckdb.connect()
    for name, table in events.items():
        con.register(name, table)
    con.register("got", got)
    want = canonical(con, f"({REFERENCE[query]})")
    have = canonical(con, "got")
    assert len(want) > 0
    assert have == want
