"""The streaming SQL front end (eddyline/api/sql.py) without Spark: what the Nexmark queries
compile to, ``sql:`` in YAML, the ``eddyline sql`` command, and the SQL it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import eddyline  # noqa: F401  (registers the kinds)
from eddyline.api.network import NetworkSpec
from eddyline.api.sql import compile_sql
from eddyline.api.validate import load_spec, spec_from_raw
from eddyline.cli import app
from eddyline.errors import SpecError

NEXMARK = Path(__file__).resolve().parents[2] / "examples" / "nexmark"
QUERIES = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q11"]
#: queries whose SQL compiles to exactly the YAML spec's network (up to the steps' names); the
#: others are run on Spark against their YAML spec (tests/runtime/e2e/test_sql_nexmark.py)
SAME_NETWORK = {"q0", "q1", "q2", "q9", "q11"}


def structure(spec: NetworkSpec) -> list[str]:
    """Each sink as the tree of nodes feeding it, nodes named by what they are, not their names."""
    raw = spec.as_dict()
    nodes = {n["name"]: n for section in ("sources", "steps", "sinks") for n in raw.get(section, [])}

    def tree(name: str) -> Any:
        node = {k: v for k, v in nodes[name].items() if k != "name"}
        if "input" in node:
            node["input"] = tree(node["input"])
        if "join" in node:
            node["join"] = {**node["join"], "left": tree(node["join"]["left"]), "right": tree(node["join"]["right"])}
        if "union" in node:
            node["union"] = [tree(i) for i in node["union"]]
        return node

    return sorted(json.dumps(tree(s["name"]), sort_keys=True) for s in raw["sinks"])


@pytest.mark.parametrize("query", QUERIES)
def test_nexmark_sql_compiles(query: str) -> None:
    sql = load_spec(NEXMARK / "sql" / f"{query}.sql")
    yml = load_spec(NEXMARK / f"{query}.yaml")
    assert sql.name == yml.name
    assert [(s.name, s.kind) for s in sql.sources] == [(s.name, s.kind) for s in yml.sources]
    if query in SAME_NETWORK:
        assert structure(sql) == structure(yml)


def test_the_compiled_steps() -> None:
    """The kinds and parameters the mapping promises, on the queries that differ from YAML."""
    q5 = {s.kind: s.params for s in load_spec(NEXMARK / "sql" / "q5.sql").steps}
    assert q5["window_aggregate"].window.size == 10_000 and q5["window_aggregate"].window.slide == 2_000
    assert q5["top_k"].with_ties and q5["top_k"].time == "window_end" and q5["top_k"].watermark_delay == 0
    q7 = {s.kind: s.params for s in load_spec(NEXMARK / "sql" / "q7.sql").steps}
    # rows of a window table: window_end runs a window ahead of the bids' time
    assert q7["top_k"].watermark_delay == 10_000
    q8 = load_spec(NEXMARK / "sql" / "q8.sql")
    join, dedup = (s.params for s in q8.steps if s.stateful)
    assert (join.kind, join.size, join.left_key, join.right_key) == ("window", 10_000, "id", "seller")
    assert dedup.key == ("id", "name", "window_start") and dedup.ttl == 10_000
    q3 = load_spec(NEXMARK / "sql" / "q3.sql")
    join = next(s for s in q3.steps if s.kind == "join")
    # the conditions on one table run before the join, on that table
    assert [q3.step(i).kind for i in join.inputs] == ["filter", "filter"]
    assert q3.step(join.params.left).input == "auction" and q3.step(join.params.right).input == "person"


BID = """CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3),
           WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
         WITH ('connector' = 'nexmark', 'stream' = 'bid');
         CREATE TABLE out WITH ('connector' = 'blackhole');"""


def compile_net(sql: str) -> NetworkSpec:
    return spec_from_raw(compile_sql(BID + sql, "t"))


def test_declared_columns_and_watermark() -> None:
    net = compile_net("""INSERT INTO out SELECT auction, count(*) AS n, window_start
                         FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
                         GROUP BY auction, window_start, window_end;""")
    window, last = net.steps
    assert window.input == "bid" and window.params.watermark_delay == 4_000 and window.params.window.slide is None
    assert last.params == ("auction", "n", "window_start")
    assert [s.kind for s in net.sinks] == ["discard"]
    # bid declares 4 of the stream's 7 columns: a query sees those only
    (narrowed,) = compile_net("INSERT INTO out SELECT * FROM bid;").steps
    assert narrowed.params == ("auction", "bidder", "price", "date_time")


def test_sql_in_yaml_for_a_network_and_a_step() -> None:
    whole = load_spec(yaml.safe_dump({"name": "nexmark-q2", "sql": (NEXMARK / "sql" / "q2.sql").read_text()}))
    assert structure(whole) == structure(load_spec(NEXMARK / "q2.yaml"))
    raw = yaml.safe_load((NEXMARK / "q5.yaml").read_text())
    raw["steps"][1:] = [{"name": "q5", "sql": """
        SELECT auction, num, window_start, window_end
        FROM (SELECT *, RANK() OVER (PARTITION BY window_start ORDER BY num DESC) AS r FROM counts)
        WHERE r <= 1"""}]
    stepwise = load_spec(raw)
    assert structure(stepwise) == structure(load_spec(NEXMARK / "q5.yaml"))
    # a step's query reads the network's sources by name, with their real columns
    net = load_spec({"name": "t", "sources": [{"name": "bids", "nexmark": {"stream": "bid"}}],
                     "steps": [{"name": "cheap", "sql": "SELECT auction, price * 2 AS p FROM bids WHERE price < 10"}],
                     "sinks": [{"name": "out", "input": "cheap", "console": {}}]})
    assert [(s.name, s.kind, s.params) for s in net.steps] == [
        ("cheap_filter", "filter", "price < 10"), ("cheap", "select", ("auction", "price * 2 AS p"))]


def test_cli_explain_and_refusal(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["sql", str(NEXMARK / "sql" / "q9.sql"), "--explain"])
    assert shown.exit_code == 0, shown.output
    assert structure(spec_from_raw(yaml.safe_load(shown.output))) == structure(load_spec(NEXMARK / "q9.yaml"))
    bad = tmp_path / "bad.sql"
    bad.write_text(BID + "INSERT INTO out SELECT * FROM bidz;")
    ran = runner.invoke(app, ["sql", str(bad), "--checkpoint", str(tmp_path / "ckpt"), "--epochs", "1"])
    assert ran.exit_code == 2
    assert "sql: unknown table 'bidz' in FROM" in ran.output
    assert not (tmp_path / "ckpt").exists()  # refused before anything ran


REFUSED = {
    "ORDER BY": ("INSERT INTO out SELECT auction FROM bid ORDER BY price;",
                 "sql: ORDER BY without ROW_NUMBER() is not supported in a streaming query"),
    "unknown table": ("INSERT INTO out SELECT auction FROM bidz;", "sql: unknown table 'bidz' in FROM"),
    "syntax": ("INSERT INTO out\nSELECT auction FROM bid WHERE (price >;",
               "sql: syntax error at line 5, column 38"),  # line 5 of the script, BID's 4 lines first
    "outer join": ("INSERT INTO out SELECT a.auction FROM bid a LEFT JOIN bid b ON a.auction = b.auction;",
                   "sql: LEFT JOIN is not supported; expected an inner join"),
    "CUMULATE step": ("""INSERT INTO out SELECT count(*) AS n, window_start FROM TABLE(CUMULATE(TABLE bid,
                    DESCRIPTOR(date_time), INTERVAL '3' SECOND, INTERVAL '10' SECOND)) GROUP BY window_start, window_end;""",
                      "sql: CUMULATE: the step (3000 ms) must divide the size (10000 ms)"),
    "ROW_NUMBER unbounded": ("""INSERT INTO out SELECT auction FROM (SELECT *, ROW_NUMBER() OVER
                                (PARTITION BY bidder ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 3;""",
                             "sql: ROW_NUMBER() OVER (PARTITION BY …): a streaming top-k needs partitions that end in event time"),
    "ROW_NUMBER unfiltered": ("""INSERT INTO out SELECT auction FROM (SELECT *, ROW_NUMBER() OVER
                                 (PARTITION BY bidder ORDER BY price DESC) AS rn FROM bid);""",
                              "sql: ROW_NUMBER() AS rn: expected WHERE rn <= k in the enclosing query"),
    "LIMIT": ("INSERT INTO out SELECT auction FROM bid LIMIT 10;", "sql: LIMIT is not supported in a streaming query"),
    "theta join": ("INSERT INTO out SELECT a.auction FROM bid a JOIN bid b ON a.price < b.price;",
                   "sql: JOIN: expected an equality between a column of each table"),
    "unknown column": ("INSERT INTO out SELECT auctoin FROM bid;", "sql: SELECT: unknown column 'auctoin'"),
    "column count": ("CREATE TABLE o2 (a BIGINT) WITH ('connector' = 'blackhole'); INSERT INTO o2 SELECT auction, price FROM bid;",
                     "sql: INSERT INTO o2: the query has 2 columns (auction, price), the table declares 1 (a)"),
    "unbounded distinct": ("INSERT INTO out SELECT DISTINCT auction FROM bid;",
                           "sql: GROUP BY without aggregates and without a window is not supported"),
    "no insert": ("SELECT auction FROM bid;", "sql: a SELECT without INSERT INTO"),
    "count distinct": ("INSERT INTO out SELECT auction, count(DISTINCT bidder) AS n FROM bid GROUP BY auction;",
                       "sql: SELECT: COUNT(DISTINCT bidder): DISTINCT aggregates are not supported"),
    "column not in stream": ("CREATE TABLE person (id BIGINT, nickname VARCHAR) WITH ('connector' = 'nexmark', 'stream' = 'person');"
                             "INSERT INTO out SELECT nickname FROM person;",
                             "sql: CREATE TABLE person: column 'nickname' is not in the nexmark source"),
    "UNION": ("INSERT INTO out SELECT auction FROM bid UNION SELECT bidder FROM bid;", "sql: UNION without ALL is not supported"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_naming_the_clause(case: str) -> None:
    sql, message = REFUSED[case]
    with pytest.raises(SpecError) as e:
        compile_net(sql)
    assert message in str(e.value)


ACCEPTED = {
    "CTE": ("INSERT INTO out WITH c AS (SELECT auction FROM bid WHERE price > 5) SELECT auction FROM c;",
            ["filter", "select"]),
    "view": ("CREATE VIEW c AS SELECT auction, price FROM bid WHERE price < 9; INSERT INTO out SELECT auction FROM c;",
             ["filter", "select"]),
    "HAVING": ("""INSERT INTO out SELECT auction, count(*) AS n FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time),
                  INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end HAVING count(*) > 2;""",
               ["window_aggregate", "filter", "select"]),
    "SESSION table": ("""INSERT INTO out SELECT auction, count(*) AS n, window_start FROM TABLE(SESSION(TABLE bid
                         PARTITION BY auction, DESCRIPTOR(date_time), INTERVAL '5' SECOND)) GROUP BY auction, window_start, window_end;""",
                      ["session_window", "select"]),
    "UNION ALL": ("INSERT INTO out SELECT auction FROM bid UNION ALL SELECT bidder AS auction FROM bid;",
                  ["select", "select", "union"]),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepted(case: str) -> None:
    sql, kinds = ACCEPTED[case]
    assert [s.kind for s in compile_net(sql).steps] == kinds


def test_cumulate_becomes_a_cumulative_window() -> None:
    net = compile_net("""INSERT INTO out SELECT auction, sum(price) AS total, window_start, window_end FROM TABLE(
        CUMULATE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
        GROUP BY auction, window_start, window_end;""")
    (window,) = [s for s in net.steps if s.kind == "window_aggregate"]
    assert window.params.window.size == 10_000 and window.params.window.step == 2_000
    assert window.params.window.slide is None and window.params.keys == ("auction",)
