"""The OVER (ROWS BETWEEN n PRECEDING AND CURRENT ROW) kernel against DuckDB's window functions,
its buffering behind the watermark, late rows, and independence from epoch cuts and row order.

Every epoch goes through ``check_result`` (via ``run_kernel``): exact upserts/deletes and
changed key groups.
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Sequence
from functools import cache

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.columns import KG
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import Kernel
from eddyline.operators.over import BUFFERED, HISTORY, KIND, SEQ, OverAggregateKernel
from tests.operators.harness import Driver, run_epochs
from tests.operators.keyedrows import check_result, cut, multiset, row_tuples, with_kg

TS = pa.timestamp("us", tz="UTC")
AGGS: tuple = (
    ("n", "count", None),
    ("n_price", "count", "price"),
    ("total", "sum", "price"),
    ("lo", "min", "price"),
    ("hi", "max", "price"),
    ("mean", "avg", "price"),
    ("wmean", "avg", "weight"),
    ("wsum", "sum", "weight"),
    ("first_name", "min", "name"),
    ("latest", "max", "ts"),
    ("any_ok", "max", "ok"),
)
SQL_AGGS = """count(*) OVER w, count(price) OVER w, sum(price) OVER w, min(price) OVER w,
    max(price) OVER w, avg(price) OVER w, avg(weight) OVER w, sum(weight) OVER w,
    min(name) OVER w, max(ts) OVER w, max(ok) OVER w"""


def make_rows(n: int, seed: int = 0, disorder: int = 3, keys: int = 4) -> pa.Table:
    """``n`` rows in arrival order: event time grows with the arrival index, give or take
    ``disorder`` seconds, on a coarse grid (ties); weights are multiples of 1/4, so float sums
    are exact whatever their order."""
    rng = np.random.default_rng(seed)
    base = np.arange(n) // 3 + rng.integers(-disorder, disorder + 1, n)
    return pa.table(
        {
            "k": pa.array(rng.integers(0, keys, n), pa.int64(), mask=rng.random(n) < 0.1),
            "region": pa.array(rng.choice(["eu", "us"], n), pa.string(), mask=rng.random(n) < 0.1),
            "price": pa.array(rng.integers(0, 40, n), pa.int64(), mask=rng.random(n) < 0.15),
            "weight": pa.array(
                rng.integers(-20, 20, n) / 4, pa.float64(), mask=rng.random(n) < 0.1
            ),
            "name": pa.array(
                rng.choice(["ann", "bob", "cy"], n), pa.string(), mask=rng.random(n) < 0.1
            ),
            "ok": pa.array(rng.random(n) < 0.3, pa.bool_()),
            "ts": pa.array((base + 100) * 1000 * 1000, TS),  # whole seconds, in microseconds
        }
    )


def duckdb_over(rows: pa.Table, keys: Sequence[str], preceding: int, schema: pa.Schema) -> pa.Table:
    """DuckDB's answer, cast to the kernel's output schema; ties ordered by every column."""
    con = duckdb.connect()
    con.register("r", rows)
    part = f"PARTITION BY {', '.join(keys)}" if keys else ""
    ties = [c for c in rows.schema.names if c not in keys]  # in schema order, as the kernel
    order = ", ".join(f"{c} ASC NULLS LAST" for c in ("ts", *ties))
    frame = f"ROWS BETWEEN {preceding} PRECEDING AND CURRENT ROW"
    sql = f"SELECT *, {SQL_AGGS} FROM r WINDOW w AS ({part} ORDER BY {order} {frame})"
    got = con.sql(sql).to_arrow_table()
    return pa.table(got.columns, names=schema.names).cast(schema)


def kernel_for(rows: pa.Table, keys: Sequence[str], preceding: int) -> OverAggregateKernel:
    return OverAggregateKernel(rows.schema, keys, "ts", preceding, AGGS)


def ts_ms(table: pa.Table) -> np.ndarray:
    return table.column("ts").cast(pa.int64()).to_numpy() // 1000


def assert_final_state(kernel: OverAggregateKernel, state: pa.Table, rows: pa.Table) -> None:
    """After END_OF_STREAM: no buffered row; per key the last max(preceding, 1) rows."""
    kinds = state.column(KIND).to_pylist()
    assert BUFFERED not in kinds and set(kinds) <= {HISTORY}
    per_key, processed = key_counts(state, kernel.keys), key_counts(rows, kernel.keys)
    keep = max(kernel.preceding, 1)
    assert per_key == {k: min(n, keep) for k, n in processed.items()}
    for _, seqs in _seqs_by_key(state, kernel.keys).items():  # the newest ordinals
        assert seqs == list(range(seqs[-1] - len(seqs) + 1, seqs[-1] + 1))


def key_counts(table: pa.Table, keys: Sequence[str]) -> Counter:
    """Rows per key (``multiset`` would take an empty column list for all columns)."""
    return multiset(table, list(keys)) if keys else Counter({(): table.num_rows})


def _seqs_by_key(state: pa.Table, keys: Sequence[str]) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    key_rows = row_tuples(state, keys) if keys else [()] * state.num_rows
    for key, (s,) in zip(key_rows, row_tuples(state, [SEQ]), strict=True):
        out.setdefault(key, []).append(s)
    return {k: sorted(v) for k, v in out.items()}


# ===================================================================================== tests
def test_schemas_and_validation() -> None:
    rows = make_rows(10)
    kernel = kernel_for(rows, ("k", "region"), 10)
    assert kernel.output_schema.names == [*rows.schema.names, *(a[0] for a in AGGS)]
    types = dict(zip(kernel.output_schema.names, kernel.output_schema.types, strict=True))
    assert types["n"] == types["total"] == pa.int64() and types["mean"] == pa.float64()
    assert types["lo"] == pa.int64() and types["latest"] == TS and types["any_ok"] == pa.bool_()
    assert kernel.primary_key == (KG, "k", "region", KIND, SEQ)
    assert kernel.input_schema.field(KG).type == pa.int32()
    assert not any(pa.types.is_nested(f.type) for f in kernel.state_schema)
    assert all(f.nullable for f in kernel.state_schema)
    schema = rows.schema
    bad: list[tuple[dict, str]] = [
        ({"keys": ("nope",)}, "unknown column"),
        ({"time": "ts", "keys": ("ts",)}, "must not be a key"),
        ({"time": "name"}, "timestamp or integer"),
        ({"preceding": -1}, "preceding"),
        ({"aggregates": [("x", "median", "price")]}, "unknown function"),
        ({"aggregates": [("x", "sum", "name")]}, "numeric"),
        ({"aggregates": [("price", "sum", "price")]}, "input column"),
        ({"aggregates": [("x", "sum", "price"), ("x", "max", "price")]}, "used twice"),
        ({"aggregates": []}, "at least one"),
        ({"keys": ("_kind",), "schema": schema.append(pa.field("_kind", pa.int8()))}, "reserved"),
        ({"schema": schema.append(pa.field("tags", pa.list_(pa.string())))}, "nested"),
    ]
    for kwargs, match in bad:
        args = {"keys": ("k",), "time": "ts", "preceding": 2, "aggregates": AGGS, "schema": schema}
        args |= kwargs
        with pytest.raises(ValueError, match=match):
            OverAggregateKernel(
                args["schema"], args["keys"], args["time"], args["preceding"], args["aggregates"]
            )


@pytest.mark.parametrize("keys", [("k", "region"), ("k",), ()])
def test_matches_duckdb_with_lagging_watermarks_and_late_rows(keys: tuple[str, ...]) -> None:
    """Arrival-order batches; each epoch's watermark is the largest time of the earlier epochs
    minus a delay shorter than the disorder, so some rows are late. The output is DuckDB's
    over the rows that were not late (null keys partition together)."""
    rows = make_rows(900, seed=1, disorder=6)
    kernel = kernel_for(rows, keys, 10)
    batches, _ = cut(with_kg(rows, keys), list(range(0, 900, 100)))
    watermarks, seen, delay_ms = [], NO_WATERMARK, 4_000
    for b in batches:
        watermarks.append(seen - delay_ms if seen > NO_WATERMARK else NO_WATERMARK)
        seen = max(seen, int(ts_ms(b).max()))
    late = np.concatenate([ts_ms(b) < w for b, w in zip(batches, watermarks, strict=True)])
    assert 0 < late.sum() < 100
    run = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_result)
    out, state, metrics, outputs = run.output, run.state, run.metrics, run.outputs
    kept = rows.filter(pa.array(~late))
    want = duckdb_over(kept, keys, 10, kernel.output_schema)
    assert metrics["late_rows"] == late.sum()
    assert out.num_rows == metrics["rows_emitted"] == kept.num_rows
    assert multiset(out) == multiset(want)
    assert outputs[0].num_rows == 0 and outputs[-1].num_rows > 0  # buffered, then flushed
    assert_final_state(kernel, state, kept)
    if "k" in keys:
        assert None in out.column("k").to_pylist()


def test_buffering_lateness_and_end_of_stream() -> None:
    schema = pa.schema([("k", pa.int64()), ("t", TS), ("v", pa.int64())])
    kernel = OverAggregateKernel(schema, ("k",), "t", 2, [("s", "sum", "v"), ("n", "count", None)])

    def batch(*rows: tuple[int, int, int]) -> pa.Table:
        k, t, v = zip(*rows, strict=True) if rows else ((), (), ())
        table = pa.table({"k": list(k), "t": [x * 1000 for x in t], "v": list(v)}, schema=schema)
        return with_kg(table, ("k",))

    lane = Driver(kernel, check=check_result)

    def step(rows: pa.Table, wm: int) -> tuple[list[tuple], dict]:
        res = lane.step(rows, wm)
        got = sorted((k, t.timestamp() * 1000, v, s, n) for k, t, v, s, n in row_tuples(res.output))
        return got, res.metrics

    got, m = step(batch((1, 10, 1), (1, 30, 2), (2, 5, 3)), NO_WATERMARK)
    assert got == [] and m == {"late_rows": 0, "rows_emitted": 0, "buffered_rows": 3}
    got, m = step(batch((1, 15, 4), (1, 25, 5)), 20)  # t=15 < W: late
    assert got == [(1, 10, 1, 1, 1), (2, 5, 3, 3, 1)]
    assert m == {"late_rows": 1, "rows_emitted": 2, "buffered_rows": 2}
    got, m = step(batch(), 26)  # an empty batch releases buffered rows too
    assert got == [(1, 25, 5, 6, 2)] and m["buffered_rows"] == 1
    # end of stream: t <= last processed time (25) is late, even without a watermark rule
    got, m = step(batch((1, 25, 6), (1, 24, 7), (1, 40, 8), (3, 1, 9)), END_OF_STREAM)
    assert got == [(1, 30, 2, 8, 3), (1, 40, 8, 15, 3), (3, 1, 9, 9, 1)]
    assert m == {"late_rows": 2, "rows_emitted": 3, "buffered_rows": 0}
    # the state is not empty: the last max(preceding, 1) rows per key, keyed by ordinal
    assert sorted(row_tuples(lane.state, ["k", KIND, SEQ, "_row.v"])) == [
        (1, HISTORY, 2, 2),
        (1, HISTORY, 3, 8),
        (2, HISTORY, 0, 3),
        (3, HISTORY, 0, 9),
    ]


def test_preceding_zero_is_the_row_itself() -> None:
    rows = make_rows(200, seed=3)
    kernel = kernel_for(rows, ("k",), 0)
    batches, _ = cut(with_kg(rows, ("k",)), [50, 120])
    run = run_epochs(kernel, zip(batches, [NO_WATERMARK] * 3, strict=True), check=check_result)
    out, state = run.output, run.state
    assert out.column("n").to_pylist() == [1] * 200
    assert out.column("total").to_pylist() == out.column("price").to_pylist()
    assert out.column("latest").to_pylist() == out.column("ts").to_pylist()
    assert multiset(out) == multiset(duckdb_over(rows, ("k",), 0, kernel.output_schema))
    assert_final_state(kernel, state, rows)  # one row per key: its last processed time


@cache
def _reference(keys: tuple[str, ...], preceding: int) -> tuple[pa.Table, Counter]:
    rows = make_rows(300, seed=7, disorder=4)
    kernel = kernel_for(rows, keys, preceding)
    return rows, multiset(duckdb_over(rows, keys, preceding, kernel.output_schema))


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 300), max_size=6),
    lags=st.lists(st.integers(0, 5_000), min_size=7, max_size=7),
    blind=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    keys=st.sampled_from([("k",), ("k", "region"), ()]),
    preceding=st.sampled_from([0, 1, 3, 10]),
    permute=st.booleans(),
)
def test_output_does_not_depend_on_epoch_cuts_or_row_order(
    cuts: list[int],
    lags: list[int],
    blind: int,
    seed: int,
    keys: tuple[str, ...],
    preceding: int,
    permute: bool,
) -> None:
    """Any arrival order, any cuts, any shuffle within batches, watermarks lagging by any amount
    (yet never passing a row still to come): the output multiset is DuckDB's."""
    rows, want = _reference(keys, preceding)
    if permute:  # else nearly in time order: watermarks then release rows epoch by epoch
        rows = rows.take(pa.array(np.random.default_rng(seed).permutation(rows.num_rows)))
    batches, _ = cut(with_kg(rows, keys), cuts)
    # a watermark never passes a row of its own or a later batch; non-decreasing
    suffix_min = np.minimum.accumulate([int(ts_ms(b).min()) for b in batches][::-1])[::-1]
    wms = np.maximum.accumulate(suffix_min - np.array(lags[: len(batches)]))
    watermarks = [NO_WATERMARK if i < blind else int(w) for i, w in enumerate(wms)]
    kernel = kernel_for(rows, keys, preceding)
    run = run_epochs(
        kernel, zip(batches, watermarks, strict=True), check=check_result, shuffle=seed
    )
    out, state, metrics, outputs = run.output, run.state, run.metrics, run.outputs
    assert metrics["late_rows"] == 0
    if not permute and len(batches) > 2 and blind == 0 and max(lags) < 1_000:
        assert sum(o.num_rows for o in outputs[:-1]) > 0  # not everything waits for the end
    assert multiset(out) == want
    assert_final_state(kernel, state, rows)


def test_pickles_and_accepts_non_nullable_input() -> None:
    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), pa.field("t", pa.int64(), nullable=False)]
    )
    kernel: Kernel = pickle.loads(
        pickle.dumps(OverAggregateKernel(schema, ("k",), "t", 1, [("m", "max", "t")]))
    )
    assert isinstance(kernel, Kernel)
    rows = with_kg(pa.table({"k": [1, 1, 2, 1], "t": [3, 4, 9, 7]}, schema=schema), ("k",))
    out = run_epochs(kernel, [(rows.slice(0, 2), 0), (rows.slice(2), 5)], check=check_result).output
    assert sorted(row_tuples(out)) == [(1, 3, 3), (1, 4, 4), (1, 7, 7), (2, 9, 9)]
