"""The streaming SQL front end (eddyline/api/sql/) without Spark: what the Nexmark queries
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
from tests.api.sqlcases import QUERIES, SAME_NETWORK, VARIANTS

NEXMARK = Path(__file__).resolve().parents[2] / "examples" / "nexmark"


def tree(spec: NetworkSpec, name: str) -> Any:
    """The node ``name`` and the nodes feeding it, named by what they are, not their names."""
    raw = spec.as_dict()
    nodes = {n["name"]: n for section in ("sources", "steps", "sinks") for n in raw.get(section, [])}

    def of(name: str) -> Any:
        node = {k: v for k, v in nodes[name].items() if k != "name"}
        if "input" in node:
            node["input"] = of(node["input"])
        if "join" in node:
            node["join"] = {**node["join"], "left": of(node["join"]["left"]), "right": of(node["join"]["right"])}
        if "union" in node:
            node["union"] = [of(i) for i in node["union"]]
        return node

    return of(name)


def structure(spec: NetworkSpec) -> list[str]:
    """Each sink as the tree of nodes feeding it (:func:`tree`)."""
    return sorted(json.dumps(tree(spec, s.name), sort_keys=True) for s in spec.sinks)


@pytest.mark.parametrize("query", QUERIES + list(VARIANTS))
def test_nexmark_sql_compiles(query: str) -> None:
    sql = load_spec(NEXMARK / "sql" / f"{query}.sql")
    yml = load_spec(NEXMARK / f"{VARIANTS.get(query, query)}.yaml")
    assert sql.name == yml.name if query in QUERIES else sql.name.startswith(f"{yml.name}-")
    assert [(s.name, s.kind) for s in sql.sources] == [(s.name, s.kind) for s in yml.sources]
    if query in SAME_NETWORK:
        assert structure(sql) == structure(yml)


def test_every_sql_file_is_tested() -> None:
    assert sorted(p.stem for p in (NEXMARK / "sql").glob("*.sql")) == sorted(QUERIES + list(VARIANTS))


def test_the_compiled_steps() -> None:
    """The kinds and parameters the mapping promises, on the queries that differ from YAML."""
    q5 = {s.kind: s.params for s in load_spec(NEXMARK / "sql" / "q5_topn.sql").steps}
    assert q5["window_aggregate"].window.size == 10_000 and q5["window_aggregate"].window.slide == 2_000
    assert q5["top_k"].with_ties and q5["top_k"].time == "window_end" and q5["top_k"].watermark_delay == 0
    q7 = {s.kind: s.params for s in load_spec(NEXMARK / "sql" / "q7_topn.sql").steps}
    # rows of a window table: window_end runs a window ahead of the bids' time
    assert q7["top_k"].watermark_delay == 10_000
    q8 = load_spec(NEXMARK / "sql" / "q8_window_join.sql")
    join, dedup = (s.params for s in q8.steps if s.stateful)
    assert (join.kind, join.size, join.left_key, join.right_key) == ("window", 10_000, "id", "seller")
    assert dedup.key == ("id", "name", "window_start") and dedup.ttl == 10_000
    q3 = load_spec(NEXMARK / "sql" / "q3.sql")
    join = next(s for s in q3.steps if s.kind == "join")
    # the conditions on one table run before the join, on that table
    assert [q3.step(i).kind for i in join.inputs] == ["filter", "filter"]
    assert q3.step(join.params.left).input == "auction" and q3.step(join.params.right).input == "person"


# --------------------------------------------------------------------------- nexmark's q5, q7, q8 as written


def nexmark(query: str, *edits: tuple[str, str]) -> NetworkSpec:
    """examples/nexmark/sql/<query>.sql compiled, after replacing each ``(old, new)`` once."""
    text = (NEXMARK / "sql" / f"{query}.sql").read_text()
    for old, new in edits:
        assert text.count(old) >= 1, old
        text = text.replace(old, new, 1)
    return spec_from_raw(compile_sql(text, query))


def test_nexmark_q5_is_its_window_top_n() -> None:
    """The counts joined with their per-window maximum ON the bounds AND num >= maxn: one window
    aggregate (the copy in MaxBids dropped) ranked by a top_k with ties, as q5_topn.sql."""
    literal, topn = nexmark("q5"), load_spec(NEXMARK / "sql" / "q5_topn.sql")
    assert [s.kind for s in literal.steps] == ["window_aggregate", "top_k", "select"]
    top = next(s for s in literal.steps if s.kind == "top_k")
    assert tree(literal, top.name) == tree(topn, next(s.name for s in topn.steps if s.kind == "top_k"))
    assert (top.params.k, top.params.with_ties, top.params.order_by) == (1, True, ("num DESC",))
    assert literal.steps[-1].params == ("auction", "num")


def test_nexmark_q7_is_an_interval_join_with_the_window_maxima() -> None:
    """Each bid is the interval [date_time, date_time + 10 s] of an interval join on price whose
    points are the window maxima at their window's end (B.date_time BETWEEN B1.date_time - 10 s
    AND B1.date_time, sides exchanged: rows of a window aggregate come out at the window's end)."""
    net = nexmark("q7")
    assert [s.kind for s in net.steps] == ["window_aggregate", "select", "join", "select"]
    window, bids, join, _ = net.steps
    assert window.input == "bid" and window.params.keys == () and dict(window.params.aggregates) == {"maxprice": "max(price)"}
    assert window.params.window.size == 10_000 and window.params.window.slide is None
    assert bids.input == "bid" and bids.params[-1] == "date_time + INTERVAL '10' SECOND AS _e1"
    j = join.params
    assert (j.kind, j.left, j.right, j.left_key, j.right_key) == ("interval", bids.name, window.name, "price", "maxprice")
    assert (j.left_time, j.left_end, j.right_time) == ("date_time", "_e1", "window_end")
    # the interval between the window's bounds is the same join
    same = nexmark("q7", ("B1.date_time  - INTERVAL '10' SECOND AND B1.date_time", "B1.s AND B1.e"),
                   ("window_end as date_time", "window_start AS s, window_end AS e"))
    assert structure(same) == structure(net)


def test_nexmark_q8_joins_two_distincts_per_window() -> None:
    """Each side's GROUP BY without aggregates is a dedup per window; the two are joined on
    id = seller and equal bounds: a window join on each side's window_start."""
    net = nexmark("q8")
    dedups = [s for s in net.steps if s.kind == "dedup"]
    assert [d.params.key for d in dedups] == [("id", "name", "window_start"), ("seller", "window_start")]
    (join,) = [s for s in net.steps if s.kind == "join"]
    j = join.params
    assert (j.kind, j.size, j.left_key, j.right_key, j.left_time, j.right_time) == (
        "window", 10_000, "id", "seller", "starttime", "starttime")
    assert [net.step(n).params for n in join.inputs] == [("id", "name", "window_start AS starttime", "window_end AS endtime"),
                                                          ("seller", "window_start AS starttime", "window_end AS endtime")]
    assert [net.step(net.step(n).input).kind for n in join.inputs] == ["dedup", "dedup"]
    assert net.steps[-1].params == ("id", "name", "starttime")


SECOND_HOP = "HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))\n     GROUP BY auction"
Q5_ON = "AuctionBids.num >= MaxBids.maxn"
Q5_MAX = "max(CountBids.num) AS maxn"
Q5_WAS = "JOIN with MAX(num) … GROUP BY CountBids.starttime, CountBids.endtime"

#: q5 as written, changed so that the join is no longer the top rows per window: refused, naming the clause
Q5_REFUSED = {
    "another window": ([(SECOND_HOP, SECOND_HOP.replace("'2'", "'5'"))],
                       f"sql: {Q5_WAS}: the MAX is over another window aggregate than the rows it is joined to "
                       "(window 10 s every 5 s vs 10 s every 2 s)"),
    "another key": ([("GROUP BY auction, window_start, window_end\n   ) AS CountBids",
                      "GROUP BY bidder, window_start, window_end\n   ) AS CountBids")],
                    f"sql: {Q5_WAS}: the MAX is over another window aggregate than the rows it is joined to (key bidder vs auction)"),
    "another input": ([(SECOND_HOP, SECOND_HOP.replace("))\n     GROUP BY", "))\n     WHERE price > 10 GROUP BY"))],
                      f"sql: {Q5_WAS}: the MAX is over another window aggregate than the rows it is joined to (another input"),
    ">": ([(Q5_ON, "AuctionBids.num > MaxBids.maxn")],
          "sql: JOIN ON AuctionBids.num > MaxBids.maxn: expected AuctionBids.num >= MaxBids.maxn (the rows whose num is "
          "the window's maximum, ties included) or AuctionBids.num = MaxBids.maxn; > is not a top-1"),
    "<=": ([(Q5_ON, "AuctionBids.num <= MaxBids.maxn")], "sql: JOIN ON AuctionBids.num <= MaxBids.maxn: expected"),
    "max of another column": ([("count(*) AS num, window_start AS starttime, window_end AS endtime\n     FROM",
                                "count(*) AS num, max(price) AS top, window_start AS starttime, window_end AS endtime\n     FROM"),
                               (Q5_MAX, "max(CountBids.top) AS maxn")],
                              "sql: JOIN ON AuctionBids.num >= MaxBids.maxn: num is count(*) but maxn is the MAX of max(price); "
                              "expected the same aggregate"),
    "compared to another column": ([(Q5_ON, "AuctionBids.auction >= MaxBids.maxn")],
                                   "sql: JOIN ON AuctionBids.auction >= MaxBids.maxn: auction is not an aggregate of the "
                                   "window aggregate; expected the aggregate the MAX is over (count(*))"),
    "one bound": ([("AuctionBids.endtime = MaxBids.endtime AND ", "")],
                  f"sql: {Q5_WAS}: expected ON both window bounds, a.window_start = w.window_start AND "
                  "a.window_end = w.window_end; got only window_start"),
    "no comparison": ([(f" AND {Q5_ON}", "")], f"sql: {Q5_WAS}: expected ON … AND AuctionBids.num >= MaxBids.maxn (the rows whose count(*) is "
                                        "the window's maximum, ties included)"),
    "another aggregate per window": ([(Q5_MAX, "sum(CountBids.num) AS maxn")],
                                     "sql: GROUP BY CountBids.starttime, CountBids.endtime: aggregates over rows already "
                                     "grouped per window (a window over a window) are not supported"),
    "one bound in GROUP BY": ([("GROUP BY CountBids.starttime, CountBids.endtime", "GROUP BY CountBids.starttime"),
                               (f"{Q5_MAX}, CountBids.starttime, CountBids.endtime", f"{Q5_MAX}, CountBids.starttime")],
                              "sql: GROUP BY CountBids.starttime: aggregates over rows already grouped per window"),
}


@pytest.mark.parametrize("case", sorted(Q5_REFUSED))
def test_nexmark_q5_variations_refused(case: str) -> None:
    edits, message = Q5_REFUSED[case]
    with pytest.raises(SpecError) as e:
        nexmark("q5", *edits)
    assert message in str(e.value)


#: q5 as written, changed in ways that keep it the top rows per window
Q5_ACCEPTED = {
    "=": [(Q5_ON, "AuctionBids.num = MaxBids.maxn")],
    "written the other way round": [(Q5_ON, "MaxBids.maxn <= AuctionBids.num"),
                                    ("AuctionBids.starttime = MaxBids.starttime", "MaxBids.starttime = AuctionBids.starttime")],
    "with the maximum's columns": [("SELECT AuctionBids.auction, AuctionBids.num", "SELECT AuctionBids.auction, MaxBids.maxn")],
}


@pytest.mark.parametrize("case", sorted(Q5_ACCEPTED))
def test_nexmark_q5_variations_accepted(case: str) -> None:
    assert structure(nexmark("q5", *Q5_ACCEPTED[case])) == structure(nexmark("q5"))


def test_top_rows_join_more_forms() -> None:
    """The same rule where the windowed counts are a view read twice, the maximum's table comes
    first, further conditions (which filter the top rows, the maximum's columns being the top
    row's), and MIN with <= (the bottom rows)."""
    view = """CREATE VIEW counts AS SELECT auction, count(*) AS num, window_start, window_end
              FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end;
              INSERT INTO out SELECT c.auction, c.num, c.window_start
              FROM (SELECT {f}(num) AS m, window_start, window_end FROM counts GROUP BY window_start, window_end) w
              JOIN counts c ON c.window_start = w.window_start AND c.window_end = w.window_end AND c.num {op} w.m
              WHERE c.auction > 5 AND w.m > 2;"""
    net = compile_net(view.format(f="max", op=">="))
    assert [s.kind for s in net.steps] == ["window_aggregate", "top_k", "filter", "select"]
    window, top, after, _ = net.steps
    assert window.params.watermark_delay == 4_000 and top.params.order_by == ("num DESC",)
    assert after.params == "auction > 5 AND num > 2"
    low = compile_net(view.format(f="min", op="<="))
    assert [s.params.order_by for s in low.steps if s.kind == "top_k"] == [("num ASC",)]
    with pytest.raises(SpecError, match="expected c.num <= w.m"):
        compile_net(view.format(f="min", op=">="))


def test_per_window_maximum_alone_refused() -> None:
    """The per-window maximum of a window aggregate is a window over a window: compiled only as
    the join that makes it a top-1, refused anywhere else (inserted, read, joined otherwise)."""
    counts = """(SELECT auction, count(*) AS num, window_start, window_end FROM TABLE(TUMBLE(TABLE bid,
                 DESCRIPTOR(date_time), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end)"""
    top = f"(SELECT max(num) AS m, window_start, window_end FROM {counts} GROUP BY window_start, window_end)"
    message = ("sql: MAX(num) … GROUP BY window_start, window_end: the MAX per window of a window aggregate's rows "
               "(a window over a window) is supported only joined back to those rows ON a.window_start = w.window_start "
               "AND a.window_end = w.window_end AND a.num >= w.<the MAX>")
    joined = ("sql: JOIN with MAX(num) … GROUP BY window_start, window_end: expected the other table to be the rows "
              "of the window aggregate the MAX is over")
    for sql, said in ((f"INSERT INTO out {top[1:-1]};", message), (f"INSERT INTO out SELECT m FROM {top} w;", message),
                      (f"INSERT INTO out SELECT m, count(*) AS n FROM {top} w GROUP BY m;", message),
                      (f"CREATE VIEW top AS {top[1:-1]}; INSERT INTO out SELECT m FROM top;", message),
                      (f"INSERT INTO out SELECT w.m FROM {top} w JOIN bid b ON b.price = w.m;", joined)):
        with pytest.raises(SpecError) as e:
            compile_net(sql)
        assert said in str(e.value), sql


Q8_REFUSED = {
    "HOP": ([("TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)",
              "HOP(TABLE person, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)")],
            "sql: GROUP BY without aggregates over a window: expected a TUMBLE window"),
    "two sizes": ([("TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)",
                    "TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '5' SECOND)")],
                  "sql: JOIN ON P.starttime = A.starttime AND P.endtime = A.endtime: expected two TUMBLE windows of one size; "
                  "got TUMBLE 5 s and TUMBLE 10 s"),
    "one bound": ([(" AND P.endtime = A.endtime", "")],
                  "sql: JOIN ON P.starttime = A.starttime: expected both bounds equal"),
    "a window table": ([("FROM (\n  SELECT id, name, window_start AS starttime, window_end AS endtime\n  FROM TABLE(TUMBLE(TABLE "
                         "person, DESCRIPTOR(date_time), INTERVAL '10' SECOND))\n  GROUP BY id, name, window_start, window_end\n) P",
                         "FROM (SELECT id, name, window_start AS starttime, window_end AS endtime FROM TABLE(TUMBLE(TABLE "
                         "person, DESCRIPTOR(date_time), INTERVAL '10' SECOND))) P")],
                       "sql: JOIN of window tables: expected two TUMBLE tables of one size"),
}


@pytest.mark.parametrize("case", sorted(Q8_REFUSED))
def test_nexmark_q8_variations_refused(case: str) -> None:
    edits, message = Q8_REFUSED[case]
    with pytest.raises(SpecError) as e:
        nexmark("q8", *edits)
    assert message in str(e.value)


def test_join_of_two_window_aggregates() -> None:
    """Two queries grouped per TUMBLE window, joined on a key and their bounds: a window join on
    each side's window_start, the sides' bound columns renamed out of the way of the join's."""
    two = """INSERT INTO out SELECT a.auction, a.n, b.total, a.window_end
             FROM (SELECT auction, count(*) AS n, window_start, window_end FROM TABLE({w}) GROUP BY auction, window_start, window_end) a
             JOIN (SELECT auction, sum(price) AS total, window_start, window_end FROM TABLE({w}) GROUP BY auction, window_start, window_end) b
             ON a.auction = b.auction AND a.window_start = b.window_start AND a.window_end = b.window_end;"""
    net = compile_net(two.format(w="TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)"))
    (join,) = [s for s in net.steps if s.kind == "join"]
    assert (join.params.kind, join.params.size, join.params.left_time, join.params.right_time) == (
        "window", 10_000, "_l_window_start", "_r_window_start")
    assert [net.step(n).params for n in join.inputs] == [
        ("auction", "n", "window_start AS _l_window_start", "window_end AS _l_window_end"),
        ("auction", "total", "window_start AS _r_window_start", "window_end AS _r_window_end")]
    assert net.steps[-1].params == ("auction", "n", "total", "_l_window_end AS window_end")
    with pytest.raises(SpecError, match="expected two TUMBLE windows of one size; got HOP 10 s every 2 s and HOP 10 s every 2 s"):
        compile_net(two.format(w="HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)"))


def test_nexmark_q7_variations_refused() -> None:
    """An interval over a window aggregate's rows that is not [t - w, t] (nor its bounds) would
    start behind the watermark the join inherits: refused, not run inexactly."""
    with pytest.raises(SpecError) as e:
        nexmark("q7", ("AND B1.date_time;", "AND B1.date_time + INTERVAL '1' SECOND;"))
    assert "sql: JOIN … B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time + INTERVAL '1' SECOND: " \
           "an interval over the rows of a grouped query" in str(e.value)


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
