"""The session window kernel against DuckDB, session merging (bridges), and its independence
from arrival order and epoch splits."""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.session import SESSION_END, SESSION_START, SessionWindowKernel
from tests.operators.harness import run_epochs
from tests.operators.keyedrows import TS, check_result, cut, norm, row_tuples, with_kg

KEYS = ("user", "device")
AGGS = (
    ("n", "count", None),
    ("n_price", "count", "price"),
    ("total", "sum", "price"),
    ("lo", "min", "price"),
    ("hi", "max", "price"),
    ("mean", "avg", "price"),
    ("wmean", "avg", "weight"),
)
GAP = 2_000


def make_clicks(n: int, seed: int = 0, span_ms: int = 60_000) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "user": pa.array(rng.integers(0, 4, n), pa.int64(), mask=rng.random(n) < 0.1),
            "device": pa.array(
                rng.choice(["ios", "web"], n), pa.string(), mask=rng.random(n) < 0.1
            ),
            "ts": pa.array(rng.integers(0, span_ms // 100, n) * 100_000, TS),
            "price": pa.array(rng.integers(0, 100, n), pa.int64(), mask=rng.random(n) < 0.1),
            "weight": pa.array(rng.integers(0, 40, n) / 4, pa.float64()),  # exact sums
        }
    )


def duckdb_sessions(rows: pa.Table, gap: int = GAP, keys: tuple[str, ...] = KEYS) -> Counter:
    k = ", ".join(keys)
    con = duckdb.connect()
    con.register("r", rows)
    return Counter(
        tuple(norm(v) for v in row)
        for row in con.execute(
            f"""WITH x AS (SELECT *, epoch_ms(ts) AS t FROM r),
                y AS (SELECT *, CASE WHEN t - lag(t) OVER (PARTITION BY {k} ORDER BY t) < {gap}
                                     THEN 0 ELSE 1 END AS new FROM x),
                z AS (SELECT *, sum(new) OVER (PARTITION BY {k} ORDER BY t, new DESC
                                               ROWS UNBOUNDED PRECEDING) AS sid FROM y)
            SELECT {k}, min(t), max(t) + {gap}, count(*), count(price), sum(price), min(price),
                   max(price), avg(price), avg(weight)
            FROM z GROUP BY {k}, sid"""
        ).fetchall()
    )


def sessions(out: pa.Table, keys: tuple[str, ...] = KEYS) -> Counter:
    """Kernel output as DuckDB's rows: session bounds in epoch milliseconds."""
    rows = []
    names = [n for n, _, _ in AGGS]
    for key, (start, end), vals in zip(
        row_tuples(out, keys),
        row_tuples(out, [SESSION_START, SESSION_END]),
        row_tuples(out, names),
        strict=True,
    ):
        rows.append((*key, round(start.timestamp() * 1000), round(end.timestamp() * 1000), *vals))
    return Counter(rows)


def kernel_for(rows: pa.Table, keys: tuple[str, ...] = KEYS, gap: int = GAP) -> SessionWindowKernel:
    return SessionWindowKernel(rows.schema, keys, "ts", gap, AGGS)


@pytest.mark.parametrize("gap", [100, GAP, 7_000])
def test_matches_duckdb(gap: int) -> None:
    rows = make_clicks(2_000)
    run = run_epochs(
        kernel_for(rows, gap=gap),
        [(with_kg(rows, KEYS), NO_WATERMARK)],
        check=check_result,
        shuffle=0,
    )
    out, state, metrics = run.output, run.state, run.metrics
    assert sessions(out) == duckdb_sessions(rows, gap)
    assert state.num_rows == 0 and metrics["sessions_fired"] == out.num_rows
    assert out.schema.field(SESSION_START).type == TS


def test_single_key_and_no_key() -> None:
    rows = make_clicks(500, seed=2)
    out = run_epochs(
        kernel_for(rows, ("user",)), [(with_kg(rows, ("user",)), NO_WATERMARK)], check=check_result
    ).output
    assert sessions(out, ("user",)) == duckdb_sessions(rows, GAP, ("user",))
    kernel = SessionWindowKernel(rows.schema, (), "ts", 200, (("n", "count", None),))
    out = run_epochs(kernel, [(with_kg(rows, ()), NO_WATERMARK)], check=check_result).output
    assert sum(out.column("n").to_pylist()) == 500 and out.num_rows > 1


def _batch(schema: pa.Schema, ms: list[int], key: int = 1) -> pa.Table:
    return with_kg(
        pa.table(
            {
                "user": [key] * len(ms),
                "device": ["web"] * len(ms),
                "ts": [m * 1000 for m in ms],
                "price": [1] * len(ms),
                "weight": [0.5] * len(ms),
            },
            schema=schema,
        ),
        KEYS,
    )


def test_out_of_order_row_bridges_two_state_sessions() -> None:
    schema = make_clicks(1).schema
    kernel = kernel_for(make_clicks(1))
    s0 = kernel.empty_state()
    r1 = kernel.process(_batch(schema, [1_000, 2_000, 6_000, 7_000]), s0, 0)
    check_result(kernel, s0, r1)
    assert sorted(r1.state.column(SESSION_START).to_pylist()) == [1_000, 6_000]
    r2 = kernel.process(_batch(schema, [3_900, 9_000]), r1.state, 500)
    check_result(kernel, r1.state, r2)
    # 3900 extends the first session (6000 - 3900 >= gap); 9000 is exactly gap after 7000: apart
    assert sorted(r2.state.column(SESSION_START).to_pylist()) == [1_000, 6_000, 9_000]
    r3 = kernel.process(
        _batch(schema, [5_000, 500]), r2.state, 500
    )  # bridges, and extends backwards
    check_result(kernel, r2.state, r3)
    assert sorted(
        zip(
            r3.state.column(SESSION_START).to_pylist(),
            r3.state.column("n").to_pylist(),
            strict=True,
        )
    ) == [
        (500, 7),
        (9_000, 1),
    ]
    assert sorted(r3.deletes.column(SESSION_START).to_pylist()) == [1_000, 6_000]
    assert r3.upserts.num_rows == 1 and r3.output.num_rows == 0
    r4 = kernel.process(_batch(schema, []), r3.state, 8_999)  # the first ends at 7000 + gap = 9000
    assert r4.output.num_rows == 0
    r5 = kernel.process(_batch(schema, []), r4.state, 9_000)
    check_result(kernel, r4.state, r5)
    assert sessions(r5.output) == Counter([(1, "web", 500, 9_000, 7, 7, 7, 1, 1, 1.0, 0.5)])
    assert r5.state.num_rows == 1 and r5.deletes.num_rows == 1
    r6 = kernel.process(_batch(schema, []), r5.state, END_OF_STREAM)
    assert sessions(r6.output) == Counter([(1, "web", 9_000, 11_000, 1, 1, 1, 1, 1, 1.0, 0.5)])
    assert r6.state.num_rows == 0


def test_late_rows_are_dropped_and_counted() -> None:
    schema = make_clicks(1).schema
    kernel = kernel_for(make_clicks(1))
    r1 = kernel.process(_batch(schema, [1_000, 5_000]), kernel.empty_state(), 3_000)
    assert r1.metrics["late_rows"] == 1 and r1.state.to_pydict()[SESSION_START] == [5_000]
    no_time = _batch(schema, [6_000]).set_column(2, "ts", pa.nulls(1, TS))
    r2 = kernel.process(no_time, r1.state, 3_000)
    assert r2.metrics["late_rows"] == 1 and r2.upserts.num_rows == 0
    r3 = kernel.process(_batch(schema, [9_000]), r2.state, END_OF_STREAM)
    assert r3.metrics["late_rows"] == 1 and r3.output.num_rows == 1 and r3.state.num_rows == 0


@settings(max_examples=35, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 400), max_size=7),
    lag=st.lists(st.integers(0, 10_000), min_size=8, max_size=8),
    disorder=st.sampled_from([0, 3_000, 20_000]),
    seed=st.integers(0, 2**16),
)
def test_sessions_do_not_depend_on_arrival_or_split(
    cuts: list[int], lag: list[int], disorder: int, seed: int
) -> None:
    """Rows out of order (up to ``disorder`` ms), cut anywhere, shuffled within epochs, with a
    watermark behind what was seen and never past a row still to come: the sessions are
    DuckDB's, and the state ends empty."""
    rows = make_clicks(400, seed=5)
    t = rows.column("ts").to_numpy().astype("datetime64[ms]").astype(np.int64)
    jitter = np.random.default_rng(seed).integers(0, disorder + 1, rows.num_rows)
    rows = rows.take(pa.array(np.argsort(t + jitter, kind="stable")))
    t = rows.column("ts").to_numpy().astype("datetime64[ms]").astype(np.int64)
    batches, bounds = cut(with_kg(rows, KEYS), cuts)
    watermarks, wm, seen = [], NO_WATERMARK, NO_WATERMARK
    for i, _b in enumerate(batches):
        wm = max(wm, min(seen - lag[i], int(t[bounds[i] :].min())))
        watermarks.append(wm)
        seen = max(seen, int(t[bounds[i] : bounds[i + 1]].max()))
    run = run_epochs(
        kernel_for(rows), zip(batches, watermarks, strict=True), check=check_result, shuffle=seed
    )
    out, state, metrics = run.output, run.state, run.metrics
    assert sessions(out) == duckdb_sessions(rows)
    assert state.num_rows == 0 and metrics["late_rows"] == 0
