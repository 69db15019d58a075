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
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.columns import DIFF
from eddyline.eventtime import END_OF_STREAM
from eddyline.operators.keyed import KeyedAggregateKernel
from eddyline.operators.window import (
    REVISION,
    TIMESTAMP,
    WINDOW_START,
    WindowConfig,
    WindowKernel,
    partial_aggregate,
)
from tests.operators.harness import Driver, consolidate
from tests.operators.test_keyed import with_kg

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
        ("k",), size, slide, (("n", "count", None), ("nv", "count", "v"), ("s", "sum", "v"), ("a", "avg", "v")),
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
                drivers = [Driver(kernel) for _ in range(LANES)]
            drivers[lane].step(partials, wm)
    out = pa.concat_tables([d.output for d in drivers])
    got = final_relation(out, ("k", WINDOW_START), drop=("window_end", REVISION))

    con = duckdb.connect()
    con.register("c", changes)
    want_rows = con.execute(
        f"""SELECT k, ws, count(*), count(v), sum(v), avg(v) FROM (
              SELECT *, unnest(generate_series(ms - ms % {slide} - {size - slide}, ms - ms % {slide}, {slide})) AS ws
              FROM (SELECT *, epoch_ms(t) AS ms FROM {net_rows_sql()})) GROUP BY k, ws"""
    ).fetchall()
    want = {(k, ws): (n, nv, s, a) for k, ws, n, nv, s, a in want_rows}
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


def test_min_and_max_refuse_a_revised_input() -> None:
    with pytest.raises(ValueError, match="hi=max\\(\\): min\\(\\) and max\\(\\) cannot take a value back"):
        WindowConfig(("k",), 10, 10, (("hi", "max", "v"),), weighted=True)


# ================================================================== keyed aggregate
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), cuts=st.integers(0, 8))
def test_keyed_aggregate_changelog_equals_the_query_over_the_final_input(seed: int, cuts: int) -> None:
    changes = history(seed).drop_columns(["t"])
    aggs = [("n", "count", None), ("nv", "count", "v"), ("s", "sum", "v"), ("a", "avg", "v")]
    epochs = epochs_of(with_kg(changes, ("k",)), seed, cuts)
    kernel = KeyedAggregateKernel(epochs[0].drop_columns(["_kg"]).schema, ("k",), aggs)
    drivers = [Driver(kernel) for _ in range(LANES)]
    for batch in epochs:
        for lane, rows in enumerate(lanes_of(batch)):
            drivers[lane].step(rows, 0)
    got = final_relation(pa.concat_tables([d.output for d in drivers]), ("k",))

    con = duckdb.connect()
    con.register("c", changes)
    rows = con.execute(
        "SELECT k, count(*), count(v), sum(v), avg(v) FROM "
        "(SELECT k, v, CAST(sum(_diff) AS BIGINT) AS w FROM c GROUP BY ALL HAVING sum(_diff) > 0), range(w) GROUP BY k"
    ).fetchall()
    assert_close(got, {(k,): tuple(rest) for k, *rest in rows})
    # a key whose rows were all taken back leaves the state
    assert sum(d.state.num_rows for d in drivers) == len(rows)


def test_keyed_aggregate_refuses_what_it_cannot_take_back() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), (DIFF, pa.int64())])
    with pytest.raises(ValueError, match="hi=max\\(\\): only count, sum and avg can take a value back"):
        KeyedAggregateKernel(schema, ("k",), [("n", "count", None), ("hi", "max", "v")])
