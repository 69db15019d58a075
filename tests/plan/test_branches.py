"""Folding a chain of filters and selects into SQL over the node it starts from
(:mod:`eddyline.plan.branches`), checked against DuckDB running the chain step by step."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.api.validate import load_spec
from eddyline.plan.branches import fold, shared_node, split_name, substitute

BASE = ["a", "b", "c"]
ROWS = [(i, (i * 7) % 11 - 3, None if i % 5 == 0 else i % 4) for i in range(40)]


class _Step:
    """What :func:`fold` reads of a step: its kind and its SQL."""

    def __init__(self, kind: str, params):
        self.kind, self.params = kind, params


def _duck(sql: str) -> str:
    return sql.replace("`", '"')  # DuckDB quotes names the standard way


def _chain_query(chain: list[_Step]) -> str:
    """The chain as one query whose steps run one after the other, each over the one before."""
    query = "SELECT * FROM t"
    for s in chain:
        if s.kind == "filter":
            query = f"SELECT * FROM ({query}) WHERE {_duck(s.params)}"
        else:
            query = f"SELECT {', '.join(_duck(e) for e in s.params)} FROM ({query})"
    return query


def _folded(branch) -> list[tuple]:
    cols = ", ".join(f"{_duck(sql)} AS \"{name}\"" for name, sql in branch.columns)
    where = f" WHERE {_duck(branch.condition)}" if branch.condition else ""
    return _run(f"SELECT {cols} FROM t{where}")


def _run(query: str) -> list[tuple]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a BIGINT, b BIGINT, c BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    return sorted(con.execute(query).fetchall(), key=repr)


def _names(query: str) -> list[str]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a BIGINT, b BIGINT, c BIGINT)")
    return [d[0] for d in con.execute(query).description]


@st.composite
def chains(draw) -> list[_Step]:
    """Filters and selects over columns a, b, c: renames, expressions of earlier columns,
    names written in another case or quoted, a name given to the column it replaces."""
    names = list(BASE)
    chain = []
    for _ in range(draw(st.integers(1, 5))):
        def ref(names: list[str] = names) -> str:
            n = draw(st.sampled_from(names))
            return draw(st.sampled_from([n, n.upper(), f"`{n}`"]))

        if draw(st.booleans()):
            k = draw(st.integers(-3, 6))
            chain.append(_Step("filter", draw(st.sampled_from([
                f"{ref()} > {k}", f"{ref()} % 2 = 0", f"{ref()} IS NOT NULL", f"({ref()} + {ref()}) <= {k} OR {ref()} = {k}",
            ]))))
            continue
        out, made = [], []
        for _ in range(draw(st.integers(1, 3))):
            new = draw(st.sampled_from(["a", "b", "c", "x", "y", "total"]).filter(lambda n, made=made: n not in made))
            k = draw(st.integers(1, 5))
            expr = draw(st.sampled_from([
                ref(), f"{ref()} + {k}", f"{ref()} * {ref()}", f"CASE WHEN {ref()} > {k} THEN {ref()} ELSE -{k} END",
                f"coalesce({ref()}, {k})",
            ]))
            out.append(expr if expr.strip("`").lower() == new else f"{expr} AS {new}")
            made.append(new if expr.strip("`").lower() != new else expr.strip("`").lower())
        if len({m.lower() for m in made}) != len(made):
            continue
        chain.append(_Step("select", tuple(out)))
        names = made
    return chain


@settings(max_examples=60, deadline=None)
@given(chains())
def test_a_folded_chain_gives_the_rows_and_columns_of_the_chain_run_step_by_step(chain) -> None:
    branch = fold(BASE, chain)
    assert branch is not None, [s.params for s in chain]
    assert [name.lower() for name, _ in branch.columns] == [n.lower() for n in _names(_chain_query(chain))]
    assert _folded(branch) == _run(_chain_query(chain))


def test_a_column_is_replaced_where_it_is_read_and_nowhere_else() -> None:
    scope = {"produced_us": "`p`", "kind": "`k`", "seconds": "`s`", "id": "`auction`"}
    assert substitute("timestamp_micros(produced_us) + INTERVAL 10 SECONDS", scope) == \
        "timestamp_micros((`p`)) + INTERVAL 10 SECONDS"
    assert substitute("Kind = 'kind'", scope) == "(`k`) = 'kind'"
    assert substitute("CAST(pmod(xxhash64(`id`), 8) AS INT)", scope) == "CAST(pmod(xxhash64((`auction`)), 8) AS INT)"
    assert substitute("CAST(NULL AS bigint)", scope) == "CAST(NULL AS bigint)"


@pytest.mark.parametrize("text", [
    "*",  # every column
    "transform(xs, x -> x + 1)",  # a lambda's own names
    "kind.name",  # a struct's field, or a qualified name
    "seconds + INTERVAL 1 SECONDS",  # a column's name that is also a unit
    "rand() > 0.5",  # a second evaluation would differ
    "uuid()",
    "monotonically_increasing_id()",
    "count(*)",  # an aggregate
    "sum(id) OVER (PARTITION BY kind)",  # a window
    "id IN (SELECT id FROM t)",  # a subquery
    "missing + 1",  # a column the node does not have
    "((",  # not SQL
])
def test_what_folding_cannot_be_sure_of_is_refused(text: str) -> None:
    scope = {"produced_us": "`p`", "kind": "`k`", "seconds": "`s`", "id": "`auction`", "xs": "`xs`"}
    assert substitute(text, scope) is None


def test_a_select_column_s_name_is_the_one_spark_gives_it() -> None:
    assert split_name("a") == ("a", "a")
    assert split_name("`a b`") == ("a b", "`a b`")
    assert split_name("b * 2 AS c") == ("c", "b * 2")
    assert split_name("CAST(x AS INT) AS y") == ("y", "CAST(x AS INT)")
    assert split_name("`a b` AS `c d`") == ("c d", "`a b`")
    assert split_name("CAST(x AS INT)") is None  # Spark would make its name up
    assert split_name("x y") is None  # a name without AS
    assert split_name("*") is None


def test_a_select_that_names_two_columns_alike_is_not_folded() -> None:
    assert fold(BASE, [_Step("select", ("a", "b AS A"))]) is None


def _net(steps: list[dict], inputs: tuple[str, str]) -> dict:
    return {
        "name": "n", "lanes": 2,
        "sources": [{"name": n, "files": {"path": f"/nonexistent/{n}", "format": "json", "schema": "k long, v long, t timestamp"}}
                    for n in ("ev", "other")],
        "steps": [*steps, {"name": "j", "join": {"left": inputs[0], "right": inputs[1], "left_key": "k", "right_key": "k"}}],
        "sinks": [{"name": f"to_{n}", "input": n, "discard": {}} for n in ["j", "other", *(s["name"] for s in steps)]],
    }


def test_the_node_a_join_s_inputs_branch_off() -> None:
    steps = [{"name": "f", "input": "ev", "filter": "v > 1"}, {"name": "s", "input": "f", "select": ["k", "v"]},
             {"name": "g", "input": "ev", "filter": "v < 1"}, {"name": "o", "input": "other", "filter": "v < 1"},
             {"name": "d", "input": "ev", "dedup": {"key": "k", "time": "t", "ttl": "1m"}}, {"name": "dk", "input": "d", "select": ["k", "v"]}]
    spec = load_spec(_net(steps, ("s", "g")))
    node, chain = shared_node(spec, spec.step("j"))
    assert node == "ev" and [[s.name for s in c] for c in chain] == [["f", "s"], ["g"]]
    spec = load_spec(_net(steps, ("s", "ev")))  # an input may be the node itself
    assert shared_node(spec, spec.step("j"))[1][1] == []
    spec = load_spec(_net(steps, ("s", "o")))  # two sources
    assert shared_node(spec, spec.step("j")) is None
    spec = load_spec(_net(steps, ("dk", "d")))  # a stateful step is a node of its own
    node, chain = shared_node(spec, spec.step("j"))
    assert node == "d" and [[s.name for s in c] for c in chain] == [["dk"], []]
