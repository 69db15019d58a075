"""The top-k kernel against DuckDB (Nexmark q5 / q7 shapes included), and its independence from
arrival order and epoch splits."""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.topk import RANK, SLOT, TopKKernel
from tests.operators.harness import run_epochs
from tests.operators.keyedrows import TS, check_result, cut, multiset, norm, with_kg

WINDOW_MS = 10_000


def make_counts(n: int, seed: int = 0, windows: int = 6) -> pa.Table:
    """Rows shaped like a window aggregate's output: (window_start, window_end, cat, auction,
    num, price, id), with ties in ``num`` and some nulls."""
    rng = np.random.default_rng(seed)
    ws = rng.integers(0, windows, n) * WINDOW_MS
    return pa.table(
        {
            "window_start": pa.array(ws * 1000, TS),
            "window_end": pa.array((ws + WINDOW_MS) * 1000, TS),
            "cat": pa.array(rng.integers(0, 3, n), pa.int64(), mask=rng.random(n) < 0.15),
            "auction": pa.array(rng.integers(0, 50, n), pa.int64()),
            "num": pa.array(rng.integers(0, 6, n), pa.int64(), mask=rng.random(n) < 0.1),
            "price": pa.array(rng.integers(0, 100, n).astype(float), pa.float64()),
            "id": pa.array(rng.permutation(n), pa.int64()),
        }
    )


def duckdb_topk(
    rows: pa.Table,
    partition: tuple[str, ...],
    order: list[tuple[str, str]],
    k: int,
    with_ties: bool,
) -> Counter:
    """SQL's FETCH FIRST k ROWS [WITH TIES] per (partition, window_end), nulls last, ties broken
    by the remaining columns; ``rank`` is dense."""
    group = [*partition, *([] if "window_end" in partition else ["window_end"])]
    used = {*group, *(c for c, _ in order)}
    by = ", ".join(f"{c} {d.upper()} NULLS LAST" for c, d in order)
    rest = ", ".join(f"{c} ASC NULLS LAST" for c in rows.column_names if c not in used)
    part = ", ".join(group)
    cols = ", ".join(rows.column_names)
    con = duckdb.connect()
    con.register("r", rows)
    keep = f"rk <= {k}" if with_ties else f"rn <= {k}"
    return Counter(
        tuple(norm(v) for v in row)
        for row in con.execute(
            f"""SELECT {cols}, dr FROM (SELECT *,
                  row_number() OVER (PARTITION BY {part} ORDER BY {by}, {rest}) AS rn,
                  rank() OVER (PARTITION BY {part} ORDER BY {by}) AS rk,
                  dense_rank() OVER (PARTITION BY {part} ORDER BY {by}) AS dr
                FROM r) WHERE {keep}"""
        ).fetchall()
    )


@pytest.mark.parametrize("k,with_ties", [(1, True), (1, False), (3, True), (3, False)])
@pytest.mark.parametrize("partition", [("window_start",), ("window_start", "cat")])
def test_matches_duckdb(k: int, with_ties: bool, partition: tuple[str, ...]) -> None:
    rows = make_counts(1_200)
    order = [("num", "desc"), ("price", "asc")]
    kernel = TopKKernel(rows.schema, partition, order, k, "window_end", with_ties)
    run = run_epochs(
        kernel, [(with_kg(rows, partition), NO_WATERMARK)], check=check_result, shuffle=1
    )
    out, state, metrics = run.output, run.state, run.metrics
    assert multiset(out) == duckdb_topk(rows, partition, order, k, with_ties)
    assert state.num_rows == 0 and out.schema.names[-1] == RANK
    groups = {tuple(r.values()) for r in rows.select([*partition, "window_end"]).to_pylist()}
    assert metrics["partitions_fired"] == len(groups)


def test_nexmark_q5_hot_items_count_at_least_max_count() -> None:
    """q5: per window, the auctions whose bid count is >= every other's: k=1 with ties."""
    rng = np.random.default_rng(2)
    bids = pa.table({"auction": rng.integers(0, 8, 3_000), "ts": rng.integers(0, 60_000, 3_000)})
    con = duckdb.connect()
    con.register("b", bids)
    counts = con.sql(
        f"""SELECT (ts // {WINDOW_MS}) * {WINDOW_MS} AS ws, (ts // {WINDOW_MS} + 1) * {WINDOW_MS} AS we,
                   auction, count(*) AS num FROM b GROUP BY ALL"""
    ).to_arrow_table()
    con.register("c", counts)
    want = Counter(
        con.execute(
            """SELECT ws, we, auction, num FROM c WHERE num >= (SELECT max(num) FROM c AS m WHERE m.ws = c.ws)"""
        ).fetchall()
    )
    kernel = TopKKernel(counts.schema, ("ws",), [("num", "desc")], 1, "we", with_ties=True)
    batches, _ = cut(with_kg(counts, ("ws",)), [5, 20])
    run = run_epochs(kernel, zip(batches, [NO_WATERMARK] * 3, strict=True), check=check_result)
    out, state = run.output, run.state
    assert multiset(out, ["ws", "we", "auction", "num"]) == want
    assert set(out.column(RANK).to_pylist()) == {1} and state.num_rows == 0


def test_nexmark_q7_highest_bid_per_window() -> None:
    rows = make_counts(500, seed=3)
    kernel = TopKKernel(
        rows.schema, ("window_start",), [("price", "desc")], 1, "window_end", with_ties=True
    )
    out = run_epochs(
        kernel, [(with_kg(rows, ("window_start",)), NO_WATERMARK)], check=check_result
    ).output
    con = duckdb.connect()
    con.register("r", rows)
    want = con.execute(
        "SELECT id FROM r WHERE price = (SELECT max(price) FROM r AS m WHERE m.window_start = r.window_start)"
    ).fetchall()
    assert sorted(out.column("id").to_pylist()) == sorted(i for (i,) in want)


def test_fires_when_watermark_reaches_time_and_drops_stragglers() -> None:
    """A partition fires at watermark >= window_end; a straggler at watermark == window_end finds
    a tombstone (no second emission) and is late; the tombstone leaves once the watermark passes."""
    schema = pa.schema([("w", pa.int64()), ("end", pa.int64()), ("v", pa.int64())])
    kernel = TopKKernel(schema, ("w",), [("v", "desc")], 2, "end")

    def batch(v: list[int], end: int = 100) -> pa.Table:
        return with_kg(
            pa.table({"w": [0] * len(v), "end": [end] * len(v), "v": v}, schema=schema), ("w",)
        )

    s0 = kernel.empty_state()
    r1 = kernel.process(batch([5, 1, 7, 3]), s0, 50)
    check_result(kernel, s0, r1)
    assert r1.output.num_rows == 0 and sorted(r1.state.column("v").to_pylist()) == [
        5,
        7,
    ]  # pruned to k
    r2 = kernel.process(batch([6]), r1.state, 100)  # complete now, batch row included
    check_result(kernel, r1.state, r2)
    assert r2.output.to_pydict() == {"w": [0, 0], "end": [100, 100], "v": [7, 6], RANK: [1, 2]}
    assert r2.state.column(SLOT).to_pylist() == [-1]
    r3 = kernel.process(batch([9]), r2.state, 100)  # straggler at watermark == end
    check_result(kernel, r2.state, r3)
    assert r3.output.num_rows == 0 and r3.metrics["late_rows"] == 1 and r3.upserts.num_rows == 0
    r4 = kernel.process(batch([9]), r3.state, 101)  # before the watermark: late; tombstone leaves
    check_result(kernel, r3.state, r4)
    assert r4.output.num_rows == 0 and r4.metrics["late_rows"] == 1 and r4.state.num_rows == 0
    r5 = kernel.process(batch([1, 2], end=200), r4.state, END_OF_STREAM)  # at end of stream: late
    assert r5.output.num_rows == 0 and r5.state.num_rows == 0 and r5.metrics["late_rows"] == 2


def test_state_keeps_only_candidates_and_ties() -> None:
    schema = pa.schema([("w", pa.int64()), ("v", pa.int64()), ("id", pa.int64())])
    kernel = TopKKernel(schema, (), [("v", "asc")], 2, "w", with_ties=True)
    state = kernel.empty_state()
    for i in range(5):
        rows = with_kg(
            pa.table(
                {"w": [1] * 4, "v": [3, 1, 4, 1], "id": list(range(4 * i, 4 * i + 4))},
                schema=schema,
            ),
            (),
        )
        res = kernel.process(rows, state, 0)
        check_result(kernel, state, res)
        state = res.state
        assert sorted(state.column("v").to_pylist()) == [1] * 2 * (i + 1)  # the ties of the 2nd
    res = kernel.process(rows.slice(0, 0), state, 1)
    assert res.output.column(RANK).to_pylist() == [1] * 10


@settings(max_examples=35, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 300), max_size=6),
    lag=st.lists(st.integers(0, 3 * WINDOW_MS), min_size=7, max_size=7),
    k=st.integers(1, 3),
    with_ties=st.booleans(),
    desc=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_output_does_not_depend_on_arrival_or_split(
    cuts: list[int], lag: list[int], k: int, with_ties: bool, desc: bool, seed: int
) -> None:
    """Rows in any order, cut anywhere, shuffled within epochs, with a watermark that never
    reaches an unseen partition's time unless its rows are all in the current epoch: the output
    is DuckDB's, and the state ends empty."""
    rows = make_counts(300, seed=9)
    ends = rows.column("window_end").to_numpy().astype("datetime64[ms]").astype(np.int64)
    jitter = np.random.default_rng(seed).integers(0, 2 * WINDOW_MS, rows.num_rows)
    rows = rows.take(pa.array(np.argsort(ends + jitter, kind="stable")))  # roughly in time order
    partition = ("window_start", "cat")
    order = [("num", "desc" if desc else "asc")]
    batches, bounds = cut(with_kg(rows, partition), cuts)
    ends = rows.column("window_end").to_numpy().astype("datetime64[ms]").astype(np.int64)
    # epoch i's watermark: behind what earlier epochs saw, never past a row still to come, and
    # at a partition's end only while every row of it is in this epoch or earlier
    watermarks, wm, seen = [], NO_WATERMARK, NO_WATERMARK
    for i, _b in enumerate(batches):
        here = int(ends[bounds[i] : bounds[i + 1]].min())
        later = int(ends[bounds[i + 1] :].min()) - 1 if bounds[i + 1] < rows.num_rows else here
        wm = max(wm, min(seen - lag[i], here, later))
        watermarks.append(wm)
        seen = max(seen, int(ends[bounds[i] : bounds[i + 1]].max()))
    kernel = TopKKernel(rows.schema, partition, order, k, "window_end", with_ties)
    run = run_epochs(
        kernel, zip(batches, watermarks, strict=True), check=check_result, shuffle=seed
    )
    out, state, metrics = run.output, run.state, run.metrics
    assert multiset(out) == duckdb_topk(rows, partition, order, k, with_ties)
    assert state.num_rows == 0 and metrics["late_rows"] == 0
