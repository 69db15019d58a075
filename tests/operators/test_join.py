"""The join kernels against DuckDB, their independence from epoch cuts and row order, and their
state deltas (applying upserts / deletes to the previous state must give the new state)."""

from __future__ import annotations

import pickle
from collections import Counter
from functools import lru_cache

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import Kernel, KernelResult
from eddyline.operators.join import (
    EXPIRE,
    SEQ,
    UnboundedJoinKernel,
    WindowJoinKernel,
)
from tests.operators.harness import run_epochs
from tests.operators.joinrows import (
    LEFT,
    RIGHT,
    TS,
    TTL_MS,
    auction_row,
    batch_of,
    bid_row,
    check_epoch,
    check_schema,
    epochs,
    kernel_of,
    make_inputs,
    multiset,
    stream,
)

COLS = (
    'l.id, l.seller, l.name, l."start", l."end", l.reserve, '
    "r.auction, r.bidder, r.name AS name_right, r.price, r.ts"
)
























# --------------------------------------------------------------------------- references
def duck(sql: str, left: pa.Table, right: pa.Table, schema: pa.Schema) -> pa.Table:
    con = duckdb.connect()
    con.register("l", left)
    con.register("r", right)
    out = con.sql(sql).to_arrow_table()
    return out.rename_columns(schema.names).cast(schema)


def window_reference(kernel: WindowJoinKernel, left: pa.Table, right: pa.Table) -> pa.Table:
    size = kernel.size_ms
    us = size * 1000  # epoch_ms() rounds; windows need floored times
    out = duck(
        f"""SELECT {COLS}, (epoch_us(r.ts) // {us}) * {size} AS ws FROM l JOIN r
            ON l.id = r.auction AND epoch_us(l."start") // {us} = epoch_us(r.ts) // {us}""",
        left,
        right,
        kernel.output_schema.remove(len(kernel.output_schema) - 1)
        .remove(len(kernel.output_schema) - 2)
        .append(pa.field("ws", pa.int64())),
    )
    ws = out.column("ws")
    out = out.drop_columns(["ws"])
    out = out.append_column("window_start", pc.cast(pc.multiply(ws, 1000), TS))
    return out.append_column("window_end", pc.cast(pc.multiply(pc.add(ws, size), 1000), TS))


def interval_reference(kernel: Kernel, left: pa.Table, right: pa.Table) -> pa.Table:
    sql = (
        f'SELECT {COLS} FROM l JOIN r ON l.id = r.auction AND l."start" <= r.ts AND r.ts <= l."end"'
    )
    return duck(sql, left, right, kernel.output_schema)


def unbounded_reference(
    kernel: Kernel, left: pa.Table, right: pa.Table, within_ms: int | None = None
) -> pa.Table:
    cond = (
        ""
        if within_ms is None
        else f' AND abs(epoch_us(l."start") // 1000 - epoch_us(r.ts) // 1000) <= {within_ms}'
    )
    return duck(
        f"SELECT {COLS} FROM l JOIN r ON l.id = r.auction{cond}", left, right, kernel.output_schema
    )




@lru_cache
def reference(kind: str, within_ms: int | None = None) -> Counter[tuple]:
    left, right = make_inputs()
    kernel = kernel_of(kind)
    if kind == "window":
        assert isinstance(kernel, WindowJoinKernel)
        return multiset(window_reference(kernel, left, right))
    if kind == "interval":
        return multiset(interval_reference(kernel, left, right))
    return multiset(unbounded_reference(kernel, left, right, within_ms))


# --------------------------------------------------------------------------- against DuckDB
@pytest.mark.parametrize("kind", ["window", "interval", "unbounded"])
def test_matches_duckdb_over_epochs(kind: str) -> None:
    left, right = make_inputs()
    kernel = kernel_of(kind)
    batch, t = stream(kernel, left, right)
    batches, watermarks = epochs(batch, t, cuts=[100, 250, 400, 520], lags=[2_000, 0, 7_000])
    run = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_epoch)
    out, state, metrics = run.output, run.state, run.metrics
    want = reference(kind)
    assert sum(want.values()) > 100, "the data must produce plenty of pairs"
    assert multiset(out) == want
    assert metrics["late_rows"] == 0 and metrics["pairs_emitted"] == out.num_rows
    null_keys = (
        pc.sum(pc.is_null(left.column("id"))).as_py()
        + pc.sum(pc.is_null(right.column("auction"))).as_py()
    )
    assert metrics["dropped_rows"] == null_keys
    if kind != "unbounded":
        assert state.num_rows == 0, "end of stream must flush every row"
    else:
        assert state.num_rows == batch.num_rows - null_keys, "without TTL every row stays"


def test_window_size_is_respected() -> None:
    left, right = make_inputs(seed=5)
    kernel = WindowJoinKernel(
        LEFT, RIGHT, ("id",), ("auction",), left_time="start", right_time="ts", size_ms=4_000
    )
    batch, t = stream(kernel, left, right, seed=5)
    batches, watermarks = epochs(batch, t, cuts=[300], lags=[1_000])
    out = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_epoch).output
    assert multiset(out) == multiset(window_reference(kernel, left, right))


def test_ttl_join_keeps_close_pairs_and_only_real_pairs() -> None:
    left, right = make_inputs()
    kernel = kernel_of("unbounded", TTL_MS)
    batch, t = stream(kernel, left, right)
    batches, watermarks = epochs(batch, t, cuts=list(range(0, 700, 60)), lags=[0, 500])
    run = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_epoch)
    out, state, metrics = run.output, run.state, run.metrics
    got = multiset(out)
    assert not reference("unbounded", TTL_MS) - got, "pairs within the TTL must all join"
    assert not got - reference("unbounded"), "only key-equal pairs may join"
    assert got != reference("unbounded"), "the TTL must have cut some pairs far apart"
    assert state.num_rows == 0 and metrics["rows_evicted"] > 0


# --------------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["window", "interval", "unbounded", "ttl"]),
    cuts=st.lists(st.integers(0, 700), max_size=6),
    lags=st.lists(st.integers(0, 20_000), min_size=1, max_size=7),
    shuffle_seed=st.integers(0, 2**16),
)
def test_output_does_not_depend_on_epochs_or_row_order(
    kind: str, cuts: list[int], lags: list[int], shuffle_seed: int
) -> None:
    """However the same input is cut into epochs, with watermarks behind every unseen row, and
    however each epoch's rows are shuffled, the emitted multiset is the same (a TTL join's lies
    between the pairs within the TTL and all pairs)."""
    left, right = make_inputs()
    kernel = kernel_of("unbounded", TTL_MS) if kind == "ttl" else kernel_of(kind)
    batch, t = stream(kernel, left, right)
    batches, watermarks = epochs(batch, t, cuts, lags, shuffle_seed)
    run = run_epochs(kernel, zip(batches, watermarks, strict=True), check=check_schema)
    out, state, metrics = run.output, run.state, run.metrics
    got = multiset(out)
    assert metrics["late_rows"] == 0
    if kind == "ttl":
        assert not reference("unbounded", TTL_MS) - got and not got - reference("unbounded")
    else:
        assert got == reference(kind)
    if kind in ("window", "interval", "ttl"):
        assert state.num_rows == 0


@pytest.mark.parametrize("kind", ["window", "interval", "unbounded", "ttl"])
def test_results_are_identical_for_any_row_order(kind: str) -> None:
    """Same state and same batch rows in another order → the very same tables (replay safety)."""
    left, right = make_inputs(seed=2)
    kernel = kernel_of("unbounded", TTL_MS) if kind == "ttl" else kernel_of(kind)
    batch, t = stream(kernel, left, right, seed=2)
    first, second = batch.slice(0, 350), batch.slice(350)
    wm1, wm2 = int(t[0]), int(t[349]) - 3_000
    state = kernel.process(first, None, wm1).state
    base = kernel.process(second, state, wm2)
    assert base.output.num_rows and base.upserts.num_rows
    assert base.deletes.num_rows or kind == "unbounded"  # without a TTL nothing ever leaves
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(second.num_rows)
        other = kernel.process(second.take(pa.array(perm)), state, wm2)
        for name in ("output", "state", "upserts", "deletes"):
            assert getattr(other, name).equals(getattr(base, name)), name
        assert other.changed_key_groups == base.changed_key_groups and other.metrics == base.metrics








def test_window_fires_only_when_the_watermark_reaches_its_end() -> None:
    k = kernel_of("window")
    assert isinstance(k, WindowJoinKernel)
    r1 = k.process(
        batch_of(k, [auction_row(1, 1_000), auction_row(1, 1_000)], [bid_row(1, 9_999), bid_row(1, 10_000)]),
        None,
        0,
    )
    assert r1.output.num_rows == 0 and r1.state.num_rows == 4 and r1.changed_key_groups == [1]
    r2 = k.process(batch_of(k, [], []), r1.state, 9_999)
    assert r2.output.num_rows == 0 and r2.upserts.num_rows == 0 and r2.deletes.num_rows == 0
    r3 = k.process(batch_of(k, [], [bid_row(1, 3_000)]), r2.state, 10_000)  # window [0, 10s) fires
    assert r3.metrics["late_rows"] == 1 and r3.output.num_rows == 2  # the duplicate auction, twice
    out = r3.output.to_pydict()
    assert out["price"] == [10, 10] and out["name_right"] == ["b", "b"]
    assert {w.timestamp() for w in out["window_start"]} == {0} and {
        w.timestamp() for w in out["window_end"]
    } == {10}
    assert r3.deletes.num_rows == 3 and r3.state.num_rows == 1  # the bid of [10s, 20s) waits
    r4 = k.process(batch_of(k, [], []), r3.state, END_OF_STREAM)
    assert r4.output.num_rows == 0 and r4.state.num_rows == 0 and r4.deletes.num_rows == 1


def _bid_seconds(result: KernelResult) -> list[float]:
    return sorted(v.timestamp() for v in result.output.column("ts").to_pylist())


def test_interval_join_emits_each_pair_once_as_soon_as_both_are_there() -> None:
    k = kernel_of("interval")
    bids = [bid_row(1, 1_000), bid_row(1, 5_001), bid_row(2, 2_000)]
    r1 = k.process(batch_of(k, [auction_row(1, 1_000, 5_000)], bids), None, 0)
    assert _bid_seconds(r1) == [1]  # a pair within one epoch, once; bounds are inclusive
    r2 = k.process(batch_of(k, [], [bid_row(1, 5_000), bid_row(1, 4_000)]), r1.state, 1_000)
    assert _bid_seconds(r2) == [4, 5]  # new bids × the stored auction
    # W = 1.5 s: the bid at 1 s expires, the auction (to 5 s) stays; the bid at 1.2 s is late
    r3 = k.process(batch_of(k, [auction_row(1, 1_500, 9_000)], [bid_row(1, 1_200)]), r2.state, 1_500)
    assert r3.metrics["late_rows"] == 1 and r3.metrics["rows_evicted"] == 1
    assert _bid_seconds(r3) == [4, 5, 5.001]  # the new auction × stored bids
    # W = 5.001 s: a start or a bid at 5 s is late, at 5.001 s on time; the auction to 5 s and
    # the bids at 2 s (other key), 4 s and 5 s expire
    late = [auction_row(1, 5_000, 9_000), bid_row(1, 5_000)]
    on_time = [auction_row(1, 5_001, 9_000), bid_row(1, 5_001)]
    r4 = k.process(batch_of(k, [late[0], on_time[0]], [late[1], on_time[1]]), r3.state, 5_001)
    assert r4.metrics["late_rows"] == 2 and r4.metrics["rows_evicted"] == 4
    assert _bid_seconds(r4) == [
        5.001,
        5.001,
        5.001,
    ]  # two auctions × new bid, new auction × old bid
    assert r4.state.num_rows == 4
    r5 = k.process(batch_of(k, [], []), r4.state, END_OF_STREAM)
    assert r5.state.num_rows == 0 and r5.output.num_rows == 0 and r5.deletes.num_rows == 4


def test_ttl_evicts_and_a_row_without_ttl_stays() -> None:
    k = kernel_of("unbounded", 1_000)
    r1 = k.process(batch_of(k, [auction_row(1, 0), auction_row(1, 0)], []), None, NO_WATERMARK)
    assert r1.state.column(EXPIRE).to_pylist() == [1_001, 1_001]
    assert sorted(r1.state.column(SEQ).to_pylist()) == [0, 1]  # duplicates get distinct keys
    r2 = k.process(batch_of(k, [], [bid_row(1, 900)]), r1.state, 1_000)  # still alive: both pairs
    assert r2.output.num_rows == 2
    r3 = k.process(batch_of(k, [], [bid_row(1, 1_500)]), r2.state, 1_001)  # the auctions expire first
    assert r3.output.num_rows == 0 and r3.metrics["rows_evicted"] == 2 and r3.deletes.num_rows == 2
    r4 = k.process(batch_of(k, [], [bid_row(1, 0), bid_row(1, 1)]), r3.state, 1_001)  # 0 + ttl < W: late
    assert r4.metrics["late_rows"] == 1 and r4.state.num_rows == 3
    r5 = k.process(batch_of(k, [], []), r4.state, END_OF_STREAM)
    assert r5.state.num_rows == 0 and r5.deletes.num_rows == 3

    forever = kernel_of("unbounded")
    s = forever.process(batch_of(forever, [auction_row(1, 0)], [bid_row(1, 5)]), None, 0)
    s = forever.process(batch_of(forever, [], [bid_row(1, 5)]), s.state, END_OF_STREAM)
    assert s.output.num_rows == 1 and s.state.num_rows == 3 and s.deletes.num_rows == 0


def test_null_keys_never_match_and_are_not_stored() -> None:
    for kind in ("window", "interval", "unbounded"):
        k = kernel_of(kind)
        r = k.process(batch_of(k, [auction_row(None, 0, 10)], [bid_row(None, 5)]), None, NO_WATERMARK)
        r = k.process(batch_of(k, [], []), r.state, END_OF_STREAM)
        assert r.output.num_rows == 0 and r.state.num_rows == 0


def test_schemas_and_name_collisions() -> None:
    left = pa.schema([("k", pa.int32()), ("v", pa.string()), ("v_right", pa.int8())])
    right = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("w", pa.bool_())])
    k = UnboundedJoinKernel(left, right, ("k",), ("k",))
    assert k.output_schema.names == ["k", "v", "v_right", "k_right", "v_right_right", "w"]
    for kind in ("window", "interval", "unbounded"):  # a Kernel that travels to Spark workers
        kernel = kernel_of(kind)
        assert isinstance(kernel, Kernel)
        assert pickle.loads(pickle.dumps(kernel)).output_schema == kernel.output_schema
    assert k.input_schema.names == [
        "_kg",
        "_side",
        "l__k",
        "l__v",
        "l__v_right",
        "r__k",
        "r__v",
        "r__w",
    ]
    assert k.primary_key == ("_kg", "_seq") and k.state_schema.names[:4] == [
        "_kg",
        "_seq",
        "_side",
        "_expire_ms",
    ]
    batch = pa.table(
        {
            "_kg": [0, 0],
            "_side": [0, 1],
            "l__k": [7, None],
            "l__v": ["a", None],
            "l__v_right": [1, None],
            "r__k": [None, 7],
            "r__v": [None, 0.5],
            "r__w": [None, True],
        }
    )
    out = k.process(batch, None, 0).output  # int32 and int64 keys meet in int64
    assert out.to_pylist() == [
        {"k": 7, "v": "a", "v_right": 1, "k_right": 7, "v_right_right": 0.5, "w": True}
    ]
    with pytest.raises(ValueError, match="window_start"):
        WindowJoinKernel(
            pa.schema([("k", pa.int64()), ("window_start", TS)]),
            RIGHT,
            ("k",),
            ("auction",),
            left_time="window_start",
            right_time="ts",
            size_ms=10,
        )
    with pytest.raises(ValueError, match="incompatible"):
        UnboundedJoinKernel(left, right, ("v",), ("w",))
    with pytest.raises(ValueError, match="TTL"):
        UnboundedJoinKernel(left, right, ("k",), ("k",), ttl_ms=5)
