"""Nexmark in Flink SQL (examples/nexmark/sql/) gives the YAML specs' output on the same events.

The queries whose SQL compiles to the YAML's network itself are shown so without Spark
(tests/api/test_sql.py). Each other query runs once: one network holding both the YAML spec's
steps and the SQL's, reading the same sources, with one memory sink each; the two outputs must
be the same rows (a changelog: the same rows once summed).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from eddyline.api.sql import compile_sql
from eddyline.api.validate import load_spec
from eddyline.io.memory import MemorySink
from eddyline.runtime.engine import Engine
from tests.api.test_sql import QUERIES, SAME_NETWORK

NEXMARK = Path(__file__).resolve().parents[3] / "examples" / "nexmark"
EVENTS = 12_000
RATE = 1_000  # events per second of event time: 12 s of auctions, bids and people
PER_EPOCH = 4_000


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


def _rows(table) -> Counter:
    """A table's rows as a multiset; a changelog summed by its weights (_diff)."""
    rows: Counter = Counter()
    names = [n for n in table.column_names if n != "_diff"]
    weights = table.column("_diff").to_pylist() if "_diff" in table.column_names else [1] * table.num_rows
    for row, w in zip(zip(*(table.column(n).to_pylist() for n in names), strict=True), weights, strict=True):
        rows[row] += w
    return +rows  # drops rows whose weights sum to 0


@pytest.mark.parametrize("query", [q for q in QUERIES if q not in SAME_NETWORK])
def test_sql_matches_yaml(spark, tmp_path: Path, query: str) -> None:
    yml = _bounded(yaml.safe_load((NEXMARK / f"{query}.yaml").read_text()), "yaml_")
    sql = _bounded(compile_sql((NEXMARK / "sql" / f"{query}.sql").read_text(), query), "sql_")
    sources = {s["name"]: s for s in yml["sources"]}
    assert {s["name"]: s for s in sql["sources"]} == sources  # the same input, read once
    spec = load_spec({"name": f"sql-{query}", "trigger": 0, "lanes": 2, "sources": list(sources.values()),
                      "steps": yml["steps"] + sql["steps"], "sinks": yml["sinks"] + sql["sinks"]})
    sinks = {s.name: MemorySink(s) for s in spec.sinks}
    Engine(spec, spark, str(tmp_path / "ckpt"), sinks=sinks).run(until_idle=True)
    want, got = sinks["yaml_out"].table(), sinks["sql_out"].table()
    assert want is not None and got is not None
    assert got.column_names == want.column_names
    assert len(_rows(want)) > 0
    assert _rows(got) == _rows(want)
