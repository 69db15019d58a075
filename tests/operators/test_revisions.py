"""Revisions through the kernels (docs/revisions.md), checked against DuckDB.

The property every kernel that takes rows back must have: its output changelog, summed per row,
equals the query over the *final* input (every revision applied), however the revisions are
split into epochs, ordered within them and spread over lanes. A history here is a set of
inserted rows followed by revisions of them (deletions, value changes as a deletion plus an
insertion, re-insertions), shuffled, so that a retraction may even reach a kernel before the
row it takes back.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.columns import DIFF
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.join import UnboundedJoinKernel
from eddyline.operators.keyed import KeyedAggregateKernel
from eddyline.operators.rows import TIMESTAMP
from eddyline.operators.window import (
    REVISION,
    WINDOW_START,
    WindowConfig,
    WindowKernel,
    partial_aggregate,
)
from tests.operators.harness import Driver, consolidate, exact_delta
from tests.operators.joinrows import pack
from tests.operators.keyedrows import with_kg

LANES = 2


def history(seed: int, n: int = 120, revisions: int = 80) -> pa.Table:
    """Rows (k, t, v) with weight +1, then revisions of them: a deletion (−1), a value change
    (−1 old, +1 new) or a re-insertion of a deleted row; the final weight of every row ≥ 0."""
    rng = np.random.default_rng(seed)
    rows = [
        (
            None if rng.random() < 0.05 else int(rng.integers(0, 6)),
            int(rng.integers(0, 60_000)),
            None if rng.random() < 0.1 else int(rng.integers(-50, 100)),
        )
        for _ in range(n)
    ]
    live: Counter[tuple] = Counter(rows)
    changes = [(*r, 1) for r in rows]
    for _ in range(revisions):
        present = sorted((r for r, w in live.items() if w > 0), key=repr)
        r = present[int(rng.integers(len(present)))]
        kind = rng.random()
        changes.append((*r, -1))
        live[r] -= 1
        if kind < 0.5:  # a changed value (a price correction)
            new = (r[0], r[1], int(rng.integers(-50, 100)))
            changes.append((*new, 1))
            live[new] += 1
        elif kind < 0.6:  # deleted, then inserted again
            changes.append((*r, 1))
            live[r] += 1
    k, t, v, d = zip(*changes, strict=True)
    return pa.table({
        "k": pa.array(k, pa.int64()),
        "t": pa.array([x * 1000 for x in t], TIMESTAMP),
        "v": pa.array(v, pa.int64()),
        DIFF: pa.array(d, pa.int64()),
    })


def epochs_of(changes: pa.Table, seed: int, cuts: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    shuffled = changes.take(pa.array(rng.permutation(changes.num_rows)))
    bounds = sorted({0, shuffled.num_rows, *rng.integers(0, shuffled.num_rows, cuts).tolist()})
    return [shuffled.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


def lanes_of(batch: pa.Table) -> list[pa.Table]:
    """The batch's rows per lane (key groups dealt round robin)."""
    kg = batch.column("_kg").to_numpy()
    return [batch.filter(pa.array(kg % LANES == lane)) for lane in range(LANES)]


def final_relation(changelog: pa.Table, key: Sequence[str], drop: Sequence[str] = ()) -> dict[tuple, tuple]:
    """The changelog summed: exactly one row of weight 1 per key (else the test fails), its
    other values (without ``drop``)."""
    out: dict[tuple, tuple] = {}
    names = [c for c in changelog.column_names if c != DIFF]
    for row, weight in consolidate(changelog).items():
        assert weight == 1, f"row {row} has weight {weight} once the changelog is summed"
        values = dict(zip(names, row, strict=True))
        k = tuple(values[c] for c in key)
        assert k not in out, f"{k} has two rows once the changelog is summed"
        out[k] = tuple(v for c, v in values.items() if c not in (*key, *drop))
    return out


def assert_close(got: dict[tuple, tuple], want: dict[tuple, tuple]) -> None:
    assert sorted(got, key=repr) == sorted(want, key=repr)
    for k, row in want.items():
        for a, b in zip(got[k], row, strict=True):
            assert (a is None and b is None) or (
                a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
            ), f"{k}: {got[k]} != {row}"


def net_rows_sql() -> str:
    """DuckDB: the final input, each row as many times as its summed weight."""
    return "(SELECT k, t, v FROM (SELECT k, t, v, CAST(sum(_diff) AS BIGINT) AS w FROM c GROUP BY ALL HAVING sum(_diff) > 0), range(w))"


# ================================================================== window aggregates
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cuts=st.integers(0, 8), sliding=st.booleans())
def test_window_changelog_equals_the_query_over_the_final_input(seed: int, cuts: int, sliding: bool) -> None:
    changes = history(seed)
    size, slide = (20_000, 10_000) if sliding else (10_000, 10_000)
    cfg = WindowConfig(
        ("k",), size, slide, (("n", "count", None), ("nv", "count", "v"), ("s", "sum", "v"), ("a", "avg", "v"),
                              ("lo", "min", "v"), ("hi", "max", "v")),
        allowed_lateness_ms=10**9,  # every revision arrives in time: the property is about splits
        weighted=True,
    )
    epochs = epochs_of(with_kg(changes, ("k",)), seed, cuts)
    kernel = None
    drivers: list[Driver] = []
    marks = np.linspace(0, 70_000, len(epochs)).astype(np.int64).tolist()
    for (batch, wm) in [*zip(epochs, marks, strict=True), (epochs[0].slice(0, 0), END_OF_STREAM)]:
        for lane, rows in enumerate(lanes_of(batch)):
            partials, late = partial_aggregate(cfg, rows, "t", wm, rows.column("_kg").to_numpy())
            assert late.num_rows == 0
            if kernel is None:
                kernel = WindowKernel(cfg, partials.schema)
                drivers = [Driver(kernel, check=exact_delta) for _ in range(LANES)]
            drivers[lane].step(partials, wm)
    out = pa.concat_tables([d.output for d in drivers])
    got = final_relation(out, ("k", WINDOW_START), drop=("window_end", REVISION))

    con = duckdb.connect()
    con.register("c", changes)
    want_rows = con.execute(
        f"""SELECT k, ws, count(*), count(v), sum(v), avg(v), min(v), max(v) FROM (
              SELECT *, unnest(generate_series(ms - ms % {slide} - {size - slide}, ms - ms % {slide}, {slide})) AS ws
              FROM (SELECT *, epoch_ms(t) AS ms FROM {net_rows_sql()})) GROUP BY k, ws"""
    ).fetchall()
    want = {(k, ws): tuple(rest) for k, ws, *rest in want_rows}
    got_ms = {(k, int(w.timestamp() * 1000)): v for (k, w), v in got.items()}
    assert_close(got_ms, want)


def test_a_window_emits_at_most_one_retraction_and_one_row_per_epoch() -> None:
    """Revision proliferation is bounded: however many revisions of one window an epoch
    carries, its output is the old row out and the new row in; revisions that cancel emit
    nothing; a window whose rows are all taken back is retracted only."""
    cfg = WindowConfig(("k",), 10_000, 10_000, (("n", "count", None), ("s", "sum", "v")),
                       allowed_lateness_ms=60_000, weighted=True)

    def batch(rows: list[tuple[int, int, int]]) -> pa.Table:
        k, v, d = zip(*rows, strict=True)
        t = pa.table({"k": pa.array(k, pa.int64()), "t": pa.array([1_000_000] * len(k), TIMESTAMP),
                      "v": pa.array(v, pa.int64()), DIFF: pa.array(d, pa.int64())})
        return partial_aggregate(cfg, t, "t", 0)[0]

    first = batch([(1, 10, 1), (1, 20, 1)])
    kernel = WindowKernel(cfg, first.schema)
    lane = Driver(kernel)
    assert lane.step(first, 20_000).output.num_rows == 1
    churn = [(1, v, d) for v in range(100) for d in (1, -1)] + [(1, 20, -1), (1, 25, 1)]
    out = lane.step(batch(churn), 20_000).output
    assert [(r["n"], r["s"], r[DIFF]) for r in out.to_pylist()] == [(2, 30, -1), (2, 35, 1)]
    assert lane.step(batch([(1, 7, 1), (1, 7, -1)]), 20_000).output.num_rows == 0
    gone = lane.step(batch([(1, 10, -1), (1, 25, -1)]), 20_000).output
    assert [(r["n"], r["s"], r[DIFF]) for r in gone.to_pylist()] == [(2, 35, -1)]


def test_a_windows_min_and_max_count_only_the_values_present() -> None:
    """A retraction may come before its insertion (the value is not there until they cancel);
    taking back the maximum leaves the next value; a window's values leave the state with it."""
    cfg = WindowConfig(("k",), 10_000, 10_000, (("n", "count", None), ("lo", "min", "v"), ("hi", "max", "v")),
                       allowed_lateness_ms=5_000, weighted=True)

    def batch(rows: list[tuple[int, int, int]]) -> pa.Table:
        k, v, d = zip(*rows, strict=True)
        t = pa.table({"k": pa.array(k, pa.int64()), "t": pa.array([1_000_000] * len(k), TIMESTAMP),
                      "v": pa.array(v, pa.int64()), DIFF: pa.array(d, pa.int64())})
        return partial_aggregate(cfg, t, "t", 0)[0]

    first = batch([(1, 3, 1), (1, 5, 1), (1, 9, -1)])  # 9 is taken back before it comes
    lane = Driver(WindowKernel(cfg, first.schema), check=exact_delta)
    out = lane.step(first, 12_000).output
    assert [(r["n"], r["lo"], r["hi"], r[DIFF]) for r in out.to_pylist()] == [(1, 3, 5, 1)]
    out = lane.step(batch([(1, 9, 1), (1, 1, 1)]), 12_000).output  # 9 cancels; 1 is the new minimum
    assert [(r["n"], r["lo"], r["hi"], r[DIFF]) for r in out.to_pylist()] == [(1, 3, 5, -1), (3, 1, 5, 1)]
    out = lane.step(batch([(1, 5, -1)]), 12_000).output  # the maximum goes: 3 is left on top
    assert [(r["n"], r["lo"], r["hi"], r[DIFF]) for r in out.to_pylist()] == [(3, 1, 5, -1), (2, 1, 3, 1)]
    values = lane.state.filter(pc.not_equal(lane.state.column("_slot"), 0))
    assert sorted(values.column("_w").to_pylist()) == [1, 1, 1, 1]  # 1 and 3, once per aggregate
    assert lane.step(first.slice(0, 0), 10**9).output.num_rows == 0  # past the lateness: all goes
    assert lane.state.num_rows == 0


# ================================================================== keyed aggregate
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cuts=st.integers(0, 8))
def test_keyed_aggregate_changelog_equals_the_query_over_the_final_input(seed: int, cuts: int) -> None:
    changes = history(seed).drop_columns(["t"])
    aggs = [("n", "count", None), ("nv", "count", "v"), ("s", "sum", "v"), ("a", "avg", "v"), ("lo", "min", "v"), ("hi", "max", "v")]
    epochs = epochs_of(with_kg(changes, ("k",)), seed, cuts)
    kernel = KeyedAggregateKernel(epochs[0].drop_columns(["_kg"]).schema, ("k",), aggs)
    drivers = [Driver(kernel, check=exact_delta) for _ in range(LANES)]
    for batch in epochs:
        for lane, rows in enumerate(lanes_of(batch)):
            drivers[lane].step(rows, 0)
    got = final_relation(pa.concat_tables([d.output for d in drivers]), ("k",))

    con = duckdb.connect()
    con.register("c", changes)
    rows = con.execute(
        "SELECT k, count(*), count(v), sum(v), avg(v), min(v), max(v) FROM "
        "(SELECT k, v, CAST(sum(_diff) AS BIGINT) AS w FROM c GROUP BY ALL HAVING sum(_diff) > 0), range(w) GROUP BY k"
    ).fetchall()
    assert_close(got, {(k,): tuple(rest) for k, *rest in rows})
    # a key whose rows were all taken back leaves the state; a min/max keeps a row per value present
    values = con.execute("SELECT count(*) FROM (SELECT k, v FROM c WHERE v IS NOT NULL GROUP BY ALL HAVING sum(_diff) > 0)").fetchone()
    assert sum(d.state.num_rows for d in drivers) == len(rows) + 2 * values[0]


def test_keyed_min_max_count_only_the_values_present() -> None:
    """A retraction that arrives before its insertion leaves a value of weight -1 in the state:
    it is not part of the maximum until the insertion cancels it; taking back the maximum
    brings back the next value."""
    def rows(*r: tuple[int, int, int]) -> pa.Table:
        return with_kg(pa.table({n: pa.array(c, pa.int64()) for n, c in zip(("k", "v", DIFF), zip(*r, strict=True), strict=True)}), ("k",))

    kernel = KeyedAggregateKernel(pa.schema([("k", pa.int64()), ("v", pa.int64()), (DIFF, pa.int64())]), ("k",),
                                  [("hi", "max", "v"), ("lo", "min", "v")])
    lane = Driver(kernel, check=exact_delta)
    out = [lane.step(b, 0).output.to_pylist() for b in (
        rows((1, 9, -1), (1, 3, 1), (1, 5, 1)),  # 9 taken back before it came
        rows((1, 9, 1)),  # now it cancels: still 3..5
        rows((1, 5, -1)),  # the maximum goes: 3 is left
    )]
    assert out[0] == [{"k": 1, "hi": 5, "lo": 3, DIFF: 1}]
    assert out[1] == []
    assert sorted(out[2], key=lambda r: r[DIFF]) == [{"k": 1, "hi": 5, "lo": 3, DIFF: -1}, {"k": 1, "hi": 3, "lo": 3, DIFF: 1}]


def test_keyed_aggregate_refuses_what_it_cannot_take_back() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), (DIFF, pa.int64())])
    with pytest.raises(ValueError, match="hi=max_by\\(\\): only count, sum, avg, min and max can take a value back"):
        KeyedAggregateKernel(schema, ("k",), [("n", "count", None), ("hi", "max_by", "v", "k")])


# ================================================================== joins
def revised(rows: list[tuple], names: list[str], rng: np.random.Generator, changes: int) -> pa.Table:
    """``rows`` inserted, then ``changes`` revisions of them (deletions and value changes of the
    last column); final weights ≥ 0."""
    live: Counter[tuple] = Counter(rows)
    out = [(*r, 1) for r in rows]
    for _ in range(changes):
        present = sorted((r for r, w in live.items() if w > 0), key=repr)
        r = present[int(rng.integers(len(present)))]
        out.append((*r, -1))
        live[r] -= 1
        if rng.random() < 0.5:
            new = (*r[:-1], int(rng.integers(0, 50)))
            out.append((*new, 1))
            live[new] += 1
    cols = list(zip(*out, strict=True))
    return pa.table({n: pa.array(c, pa.int64()) for n, c in zip([*names, DIFF], cols, strict=True)})


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cuts=st.integers(0, 6), both_revised=st.booleans())
def test_join_changelog_equals_the_join_of_the_final_inputs(seed: int, cuts: int, both_revised: bool) -> None:
    rng = np.random.default_rng(seed)
    left = revised([(int(rng.integers(0, 8)), int(rng.integers(0, 50))) for _ in range(40)], ["id", "seller"], rng, 25)
    right = revised([(int(rng.integers(0, 8)), int(rng.integers(0, 50))) for _ in range(60)], ["auction", "price"], rng, 40)
    if not both_revised:
        right = right.filter(pc.equal(right.column(DIFF), 1)).drop_columns([DIFF])
    kernel = UnboundedJoinKernel(left.schema, right.schema, ("id",), ("auction",))
    packed = pack(kernel, left, right)
    drivers = [Driver(kernel) for _ in range(LANES)]
    for batch in epochs_of(packed, seed, cuts):
        for lane, rows in enumerate(lanes_of(batch)):
            drivers[lane].step(rows, NO_WATERMARK)
    got = consolidate(pa.concat_tables([d.output for d in drivers]))

    con = duckdb.connect()
    con.register("l", left)
    con.register("r", right)
    net = "(SELECT {c} FROM (SELECT {c}, CAST(sum({w}) AS BIGINT) AS n FROM {t} GROUP BY ALL HAVING sum({w}) > 0), range(n))"
    want = Counter(con.execute(
        f"SELECT l.id, l.seller, r.auction, r.price FROM {net.format(c='id, seller', w=DIFF, t='l')} l "
        f"JOIN {net.format(c='auction, price', w=DIFF if both_revised else '1', t='r')} r ON l.id = r.auction"
    ).fetchall())
    assert got == want


# ================================================================== top-k
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cuts=st.integers(0, 6), k=st.integers(1, 3))
def test_top_k_of_the_final_input_once_a_group_completes(seed: int, cuts: int, k: int) -> None:
    """Revisions arrive while the groups are open; each completes at the end: its top k (with
    ties) over the summed rows is DuckDB's, emitted once."""
    from eddyline.operators.topk import WeightedTopKKernel

    rng = np.random.default_rng(seed)
    changes = revised([(int(rng.integers(0, 4)), int(rng.integers(0, 3)), int(rng.integers(0, 12))) for _ in range(50)],
                      ["p", "x", "v"], rng, 40)
    changes = changes.append_column("t", pc.cast(pc.multiply(changes.column("p"), 1000), pa.int64()).cast(TIMESTAMP))
    kernel = WeightedTopKKernel(changes.schema, ("p",), [("v", "desc")], k, "t", with_ties=True)
    drivers = [Driver(kernel) for _ in range(LANES)]
    epochs = epochs_of(with_kg(changes, ("p",)), seed, cuts)
    for batch in [*epochs, epochs[0].slice(0, 0)]:
        wm = NO_WATERMARK if batch.num_rows else END_OF_STREAM
        for lane, rows in enumerate(lanes_of(batch)):
            drivers[lane].step(rows, wm)
    out = pa.concat_tables([d.output for d in drivers])
    assert set(out.column(DIFF).to_pylist()) <= {1}
    got = Counter(zip(*(out.column(c).to_pylist() for c in ("p", "x", "v", "rank")), strict=True))
    assert all(d.state.num_rows == 0 for d in drivers)

    con = duckdb.connect()
    con.register("c", changes)
    want = Counter(con.execute(
        f"""SELECT p, x, v, dense_rank() OVER w FROM (
              SELECT *, rank() OVER w AS rk FROM (SELECT p, x, v FROM (SELECT p, x, v, CAST(sum(_diff) AS BIGINT) AS n
                FROM c GROUP BY ALL HAVING sum(_diff) > 0), range(n)) WINDOW w AS (PARTITION BY p ORDER BY v DESC))
            WHERE rk <= {k} WINDOW w AS (PARTITION BY p ORDER BY v DESC)"""
    ).fetchall())
    assert got == want


def test_a_revision_after_its_top_k_group_fired_is_late() -> None:
    from eddyline.operators.topk import WeightedTopKKernel

    def batch(rows: list[tuple[int, int, int]]) -> pa.Table:
        p, v, d = zip(*rows, strict=True)
        t = pa.table({"p": pa.array(p, pa.int64()), "v": pa.array(v, pa.int64()), DIFF: pa.array(d, pa.int64()),
                      "t": pa.array([x * 1_000_000 for x in p], pa.int64()).cast(TIMESTAMP)})
        return with_kg(t, ("p",))

    first = batch([(1, 10, 1), (1, 20, 1), (1, 20, -1), (2, 5, 1)])
    kernel = WeightedTopKKernel(first.drop_columns(["_kg"]).schema, ("p",), [("v", "desc")], 1, "t")
    lane = Driver(kernel)
    assert lane.step(first, 0).output.num_rows == 0
    fired = lane.step(batch([(2, 7, 1)]), 1_000).output  # group p=1 completes: 20 was taken back
    assert [(r["p"], r["v"], r["rank"], r[DIFF]) for r in fired.to_pylist()] == [(1, 10, 1, 1)]
    late = lane.step(batch([(1, 10, -1)]), 1_000)
    assert late.output.num_rows == 0 and late.metrics["late_rows"] == 1
    end = lane.step(batch([(2, 5, -1)]), END_OF_STREAM).output
    assert [(r["p"], r["v"]) for r in end.to_pylist()] == [(2, 7)]
