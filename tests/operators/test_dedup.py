"""The dedup kernel against DuckDB and a plain-Python reference, and its independence from how
in-order input is cut into epochs."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators import dedup
from eddyline.operators.dedup import FIRST, LAST, DedupKernel, chain_heads
from eddyline.operators.rows import split_by_key_groups
from tests.operators.harness import run_epochs
from tests.operators.keyedrows import (
    TS,
    check_result,
    cut,
    multiset,
    row_tuples,
    with_kg,
)

KEYS = ("k1", "k2")


def make_events(n: int, seed: int = 0, span_ms: int = 20_000) -> pa.Table:
    """Events sorted by (ts, price nulls last, id): the kernel's total order for ties."""
    rng = np.random.default_rng(seed)
    t = rng.integers(0, span_ms // 100, n) * 100  # coarse: many equal times
    rows = pa.table(
        {
            "k1": pa.array(rng.integers(0, 4, n), pa.int64(), mask=rng.random(n) < 0.15),
            "k2": pa.array(rng.choice(["a", "b"], n), pa.string(), mask=rng.random(n) < 0.15),
            "ts": pa.array(t * 1000, TS),
            "price": pa.array(rng.integers(0, 5, n), pa.int64(), mask=rng.random(n) < 0.2),
            "id": pa.array(rng.permutation(n), pa.int64()),
        }
    )
    return rows.sort_by([("ts", "ascending"), ("price", "ascending"), ("id", "ascending")])


def reference(rows: pa.Table, ttl_ms: int) -> Counter:
    """The greedy rule on the whole stream: per key, in (time, total order), a row passes when it
    is the first or later than the last passing row plus ttl."""
    last: dict[tuple, int] = {}
    passed = []
    for row in row_tuples(rows):  # rows are already in (time, total order)
        key, t = row[:2], int(row[2].timestamp() * 1000)
        if key not in last or t > last[key] + ttl_ms:
            last[key] = t
            passed.append(row)
    return Counter(passed)


def kernel_for(rows: pa.Table, ttl_ms: int, keys: tuple[str, ...] = KEYS) -> DedupKernel:
    return DedupKernel(rows.schema, keys, "ts", ttl_ms)


def test_first_row_per_key_matches_duckdb() -> None:
    """With a ttl longer than the stream, dedup is "the first row per key" (nulls are a key)."""
    rows = make_events(2_000)
    run = run_epochs(
        kernel_for(rows, 10**9), [(with_kg(rows, KEYS), NO_WATERMARK)], check=check_result
    )
    out, state, metrics = run.output, run.state, run.metrics
    con = duckdb.connect()
    con.register("r", rows)
    want = con.execute(
        """SELECT k1, k2, ts, price, id FROM (SELECT *, row_number() OVER (PARTITION BY k1, k2
           ORDER BY ts, price NULLS LAST, id) AS rn FROM r) WHERE rn = 1"""
    ).fetchall()
    assert multiset(out) == Counter(want)
    assert out.num_rows == 15 and state.num_rows == 0  # 5 k1 values (null incl.) x 3 k2 values
    assert metrics["duplicates_dropped"] == 2_000 - 15


@pytest.mark.parametrize("ttl", [0, 300, 2_500])
def test_ttl_chain_matches_reference_in_one_epoch(ttl: int) -> None:
    rows = make_events(1_500, seed=1)
    out = run_epochs(
        kernel_for(rows, ttl), [(with_kg(rows, KEYS), NO_WATERMARK)], check=check_result, shuffle=3
    ).output
    assert multiset(out) == reference(rows, ttl)


def test_chain_heads_follows_long_chains() -> None:
    t = np.arange(0, 10_000, dtype=np.int64)
    seg = np.zeros(t.size, dtype=np.int64)
    passing = chain_heads(seg, t, np.array([0]), 9)
    assert np.flatnonzero(passing).tolist() == list(range(0, 10_000, 10))
    seg[5_000:] = 1
    passing = chain_heads(seg, t, np.array([0, 5_000]), 2_999)
    assert np.flatnonzero(passing).tolist() == [0, 3_000, 5_000, 8_000]


def test_late_rows_are_dropped_and_counted() -> None:
    schema = pa.schema([("k", pa.int64()), ("ts", TS)])
    kernel = DedupKernel(schema, ("k",), "ts", 1_000)
    rows = with_kg(
        pa.table({"k": [1, 2, 3, 3], "ts": [4_000_000, 5_000_000, None, 6_000_000]}, schema=schema),
        ("k",),
    )
    res = kernel.process(rows, kernel.empty_state(), 5_000)
    check_result(kernel, kernel.empty_state(), res)
    assert sorted(row_tuples(res.output, ["k"])) == [(2,), (3,)]
    assert res.metrics["late_rows"] == 2  # before the watermark, and without a time


def test_key_is_forgotten_after_ttl_and_passes_again() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", TS)])
    kernel = DedupKernel(schema, ("k",), "ts", 1_000)

    def batch(keys: list, ms: list[int]) -> pa.Table:
        return with_kg(pa.table({"k": keys, "ts": [m * 1000 for m in ms]}, schema=schema), ("k",))

    r1 = kernel.process(batch(["x", None, "x"], [100, 100, 900]), kernel.empty_state(), 0)
    passed = {k: round(ts.timestamp() * 1000) for k, ts in row_tuples(r1.output)}
    assert passed == {"x": 100, None: 100}  # 900 is a duplicate of 100
    r2 = kernel.process(batch(["x"], [1_100]), r1.state, 1_000)  # inside [100, 1100]: duplicate
    check_result(kernel, r1.state, r2)
    assert r2.output.num_rows == 0 and r2.upserts.num_rows == 0
    r3 = kernel.process(batch([], []), r2.state, 1_101)  # watermark > 100 + 1000: forgotten
    check_result(kernel, r2.state, r3)
    assert r3.state.num_rows == 0 and r3.deletes.num_rows == 2 and r3.metrics["keys_forgotten"] == 2
    r4 = kernel.process(batch(["x"], [1_200]), r3.state, 1_101)
    assert r4.output.num_rows == 1 and r4.state.to_pydict()[FIRST] == [1_200]


def test_out_of_order_row_before_the_remembered_one_passes() -> None:
    """The rule: a row passes when no earlier-or-equal row of its key is in state or batch."""
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64())])  # integer milliseconds
    kernel = DedupKernel(schema, ("k",), "ts", 50)

    def batch(ms: list[int]) -> pa.Table:
        return with_kg(pa.table({"k": [1] * len(ms), "ts": ms}, schema=schema), ("k",))

    r1 = kernel.process(batch([100]), kernel.empty_state(), 0)
    r2 = kernel.process(batch([120, 95, 90, 151]), r1.state, 80)
    check_result(kernel, r1.state, r2)
    # 90 passes (before the remembered 100), 95 is its duplicate, 120 is inside [100, 150],
    # 151 is past the remembered interval
    assert sorted(r2.output.column("ts").to_pylist()) == [90, 151]
    assert r2.state.to_pydict()[FIRST] == [90] and r2.state.to_pydict()[LAST] == [151]
    r3 = kernel.process(batch([]), r2.state, END_OF_STREAM)
    assert r3.state.num_rows == 0 and r3.deletes.num_rows == 1


@settings(max_examples=35, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 400), max_size=7),
    wm_lag=st.lists(st.integers(0, 8_000), min_size=8, max_size=8),
    ttl=st.sampled_from([0, 700, 3_000, 10**9]),
    seed=st.integers(0, 2**16),
)
def test_output_does_not_depend_on_epoch_split(
    cuts: list[int], wm_lag: list[int], ttl: int, seed: int
) -> None:
    """In-order input (ties in total order), cut anywhere, shuffled within each epoch, with a
    watermark that lags behind but never passes an unseen row: the same rows pass, and they are
    the reference's; the state ends empty."""
    rows = make_events(400, seed=5, span_ms=20_000)
    batches, bounds = cut(with_kg(rows, KEYS), cuts)
    times = rows.column("ts").to_numpy().astype("datetime64[ms]").astype(np.int64)
    watermarks, seen = [], NO_WATERMARK
    for i, _b in enumerate(batches):
        watermarks.append(seen)
        nxt = int(times[bounds[i + 1]]) if bounds[i + 1] < rows.num_rows else int(times[-1])
        seen = max(seen, min(int(times[bounds[i + 1] - 1]), nxt) - wm_lag[i])
    run = run_epochs(
        kernel_for(rows, ttl),
        zip(batches, watermarks, strict=True),
        check=check_result,
        shuffle=seed,
    )
    out, state, metrics = run.output, run.state, run.metrics
    assert multiset(out) == reference(rows, ttl)
    assert state.num_rows == 0 and metrics["late_rows"] == 0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    ttl=st.sampled_from([0, 300, 2_000, 10**9]),
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=5),
    lags=st.lists(st.integers(0, 6_000), min_size=5, max_size=5),
)
def test_the_hash_pre_pass_changes_no_result(
    seed: int, ttl: int, sizes: list[int], lags: list[int]
) -> None:
    """Out-of-order input, keys with nulls, equal times, watermarks that drop some rows as late:
    every epoch's output, state, upserts, deletes and counters are the same with the pre-pass
    that settles rows before the sort and without it (every row sorted)."""
    rng = np.random.default_rng(seed)
    events = make_events(sum(sizes), seed=seed, span_ms=8_000)
    events = events.take(pa.array(rng.permutation(events.num_rows)))  # out of order
    batches, _ = cut(with_kg(events, KEYS), list(np.cumsum(sizes)))
    times = [int(t.timestamp() * 1000) for t in events.column("ts").to_pylist()]
    watermarks, mark = [], NO_WATERMARK
    for i, b in enumerate(batches):
        watermarks.append(mark)
        if b.num_rows:
            mark = max(mark, max(times[: sum(sizes[: i + 1])]) - lags[i % len(lags)])

    def run(pre_pass: bool) -> list[tuple]:
        kernel = kernel_for(events, ttl)
        if not pre_pass:
            kernel._settled = lambda _s, rows, _t: np.zeros(rows.num_rows, bool)  # type: ignore[method-assign]
        run = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_result)
        return [
            (
                multiset(res.output),
                multiset(res.state),
                multiset(res.upserts),
                multiset(res.deletes),
                sorted(res.changed_key_groups),
                res.metrics,
            )
            for res in run.results
        ]

    with_pass, without = run(True), run(False)
    assert with_pass == without
    assert sum(e[0].total() for e in with_pass) > 0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    ttl=st.sampled_from([0, 300, 2_000, 10**9]),
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=5),
    keys=st.sampled_from([KEYS, ("k2",), ("plain",), ("plain", "k2")]),
)
def test_confining_to_the_batch_keys_changes_no_result(
    seed: int, ttl: int, sizes: list[int], keys: tuple[str, ...]
) -> None:
    """The kernel takes only the state rows of the batch's first key column's values (through
    Arrow's hash with nulls, numpy for integers without, key groups for a struct key): every
    epoch's output, state, upserts, deletes and counters are those of a kernel confined to the
    batch's key groups, out-of-order input, a watermark forgetting keys."""
    rng = np.random.default_rng(seed)
    events = make_events(sum(sizes), seed=seed, span_ms=8_000)
    events = events.append_column("plain", pa.compute.fill_null(events.column("k1"), -1))
    events = events.take(pa.array(rng.permutation(events.num_rows)))
    batches, _ = cut(with_kg(events, keys), list(np.cumsum(sizes)))
    watermarks = [NO_WATERMARK, *[1_000 * i for i in range(1, len(batches))]]

    def run() -> list[tuple]:
        run = run_epochs(kernel_for(events, ttl, keys), zip(batches, watermarks, strict=True), check=check_result)
        return [(multiset(r.output), multiset(r.state), multiset(r.upserts), multiset(r.deletes),
                 sorted(r.changed_key_groups), r.metrics) for r in run.results]

    by_key = run()
    with patch.object(dedup, "split_by_keys",
                      lambda state, rows, _keys: split_by_key_groups(state, np.unique(rows.column("_kg").to_numpy()))):
        by_group = run()
    assert by_key == by_group
    assert sum(e[0].total() for e in by_key) > 0
