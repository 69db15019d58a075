"""The keyed (changelog) aggregate against DuckDB, and its independence from epoch splits.

Also home of the small helpers the dedup / top-k / session / over tests share: ``check_result``
verifies every epoch's contract (schemas, unique primary keys, exact upserts/deletes that turn the
previous state into the new one, changed key groups), as the ``check`` of
:func:`tests.operators.harness.run_epochs`, which drives the kernels over epochs.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.columns import DIFF, KG
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import Kernel
from eddyline.operators.keyed import KeyedAggregateKernel, KeyedAggregateSpec, parse_keyed_aggregate
from tests.operators.harness import consolidate, run_epochs
from tests.operators.keyedrows import TS, check_result, cut, multiset, norm, row_tuples, with_kg

# =============================================================================== keyed aggregate
AGGS: tuple = (
    ("n", "count", None),
    ("n_price", "count", "price"),
    ("total", "sum", "price"),
    ("lo", "min", "price"),
    ("hi", "max", "price"),
    ("mean", "avg", "price"),
    ("wmean", "avg", "weight"),
    ("latest", "last", "price"),
    ("winner", "max_by", "bidder", "price"),
    ("first_name", "min", "name"),
)


def make_bids(n: int, seed: int = 0, cats: int = 4) -> pa.Table:
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, cats, n)
    price = rng.integers(0, 50, n)  # small range: ties in max_by and last
    return pa.table(
        {
            "cat": pa.array(cat, pa.int64(), mask=rng.random(n) < 0.1),  # null keys group together
            "region": pa.array(rng.choice(["eu", "us"], n), pa.string(), mask=rng.random(n) < 0.1),
            "price": pa.array(price, pa.int64(), mask=rng.random(n) < 0.1),
            "weight": pa.array(rng.random(n) * 10, pa.float64()),
            "bidder": pa.array(rng.integers(0, 30, n), pa.int64(), mask=rng.random(n) < 0.1),
            "name": pa.array(rng.choice(["ann", "bob", "cy", "dee"], n), pa.string()),
            "ts": pa.array(rng.integers(0, 20, n) * 1000, TS),  # coarse: ties in last
        }
    )


def keyed(rows: pa.Table, keys: tuple[str, ...] = ("cat", "region")) -> KeyedAggregateKernel:
    return KeyedAggregateKernel(rows.schema, keys, AGGS, time="ts")


def final_values(changelog: pa.Table, keys: Sequence[str]) -> dict[tuple, tuple]:
    """The changelog's revisions summed per row: one row of weight 1 per key, its values."""
    out: dict[tuple, tuple] = {}
    for row, weight in consolidate(changelog).items():
        assert weight == 1, f"row {row} has weight {weight} once the changelog is summed"
        k, v = row[: len(keys)], row[len(keys) :]
        assert k not in out, f"key {k} has two rows once the changelog is summed"
        out[k] = v
    return out


def duckdb_final(rows: pa.Table, keys: Sequence[str]) -> dict[tuple, tuple]:
    con = duckdb.connect()
    con.register("r", rows)
    k = ", ".join(keys)
    aggs = con.execute(
        f"""SELECT {k}, count(*), count(price), sum(price), min(price), max(price), avg(price),
                   avg(weight), min(name)
            FROM r GROUP BY {k}"""
    ).fetchall()
    latest = con.execute(
        f"""SELECT {k}, price FROM (SELECT *, row_number() OVER (PARTITION BY {k}
                ORDER BY ts DESC, price DESC NULLS LAST) AS rn FROM r WHERE ts IS NOT NULL) WHERE rn = 1"""
    ).fetchall()
    winner = con.execute(
        f"""SELECT {k}, bidder FROM (SELECT *, row_number() OVER (PARTITION BY {k}
                ORDER BY price DESC, bidder DESC NULLS LAST) AS rn FROM r WHERE price IS NOT NULL) WHERE rn = 1"""
    ).fetchall()
    nk = len(keys)
    last_of = {tuple(r[:nk]): r[nk] for r in latest}
    win_of = {tuple(r[:nk]): r[nk] for r in winner}
    out = {}
    for r in aggs:
        key = tuple(r[:nk])
        n, n_price, total, lo, hi, mean, wmean, first_name = r[nk:]
        out[key] = tuple(
            norm(v)
            for v in (
                n,
                n_price,
                total,
                lo,
                hi,
                mean,
                wmean,
                last_of.get(key),
                win_of.get(key),
                first_name,
            )
        )
    return out


def assert_same_values(got: dict[tuple, tuple], want: dict[tuple, tuple]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        for g, w in zip(got[key], want[key], strict=True):
            if isinstance(w, float) and g is not None:
                assert g == pytest.approx(w), key
            else:
                assert g == w, key


def test_parse_keyed_aggregate() -> None:
    assert parse_keyed_aggregate("max_by(price, ts)") == ("max_by", "price", "ts")
    assert parse_keyed_aggregate("count(*)") == ("count", None, None)
    assert parse_keyed_aggregate(" LAST( price ) ") == ("last", "price", None)
    for bad in ("max_by(price)", "sum(*)", "avg(a, b)", "median(x)"):
        with pytest.raises(ValueError):
            parse_keyed_aggregate(bad)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("t", TS)])
    aggs = [
        KeyedAggregateSpec.parse("a", "max_by(v, t)"),
        ("c", "count", None, None),
        ("s", "sum", "v"),
    ]
    k = KeyedAggregateKernel(schema, ("k",), aggs)
    assert k.output_schema.names == ["k", "a", "c", "s", DIFF]
    assert k.aggregates[0] == KeyedAggregateSpec("a", "max_by", "v", "t")
    with pytest.raises(ValueError, match="last"):
        KeyedAggregateKernel(schema, ("k",), [("x", "last", "v")])
    with pytest.raises(ValueError, match="unknown column"):
        KeyedAggregateKernel(schema, ("nope",), [("x", "count", None)])


def test_matches_duckdb_in_one_epoch() -> None:
    rows = make_bids(1_500)
    kernel = keyed(rows)
    run = run_epochs(kernel, [(with_kg(rows, ("cat", "region")), NO_WATERMARK)], check=check_result)
    out, state, metrics = run.output, run.state, run.metrics
    assert set(out.column(DIFF).to_pylist()) == {1}
    assert_same_values(final_values(out, ("cat", "region")), duckdb_final(rows, ("cat", "region")))
    assert state.num_rows == out.num_rows == metrics["keys_inserted"]  # state is kept forever
    assert (None, None) in final_values(out, ("cat", "region"))  # null keys group together


def test_changelog_retracts_the_old_row_and_inserts_the_new_only_on_change() -> None:
    schema = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("bidder", pa.int64())])
    kernel = KeyedAggregateKernel(
        schema, ("auction",), [("best", "max", "price"), ("who", "max_by", "bidder", "price")]
    )

    def batch(a: list, p: list, b: list) -> pa.Table:
        return with_kg(
            pa.table({"auction": a, "price": p, "bidder": b}, schema=schema), ("auction",)
        )

    r1 = kernel.process(
        batch([1, 1, 2], [10, 30, 5], [7, 8, 9]), kernel.empty_state(), NO_WATERMARK
    )
    assert sorted(row_tuples(r1.output)) == [(1, 30, 8, 1), (2, 5, 9, 1)]
    r2 = kernel.process(batch([1, 2], [20, 6], [3, 4]), r1.state, 0)  # auction 1 unchanged
    check_result(kernel, r1.state, r2)
    assert row_tuples(r2.output) == [(2, 5, 9, -1), (2, 6, 4, 1)]
    assert r2.upserts.num_rows == 1
    assert r2.metrics == {"keys_inserted": 0, "keys_updated": 1, "keys_deleted": 0}
    r3 = kernel.process(
        batch([1, 1], [30, None], [9, 1]), r2.state, END_OF_STREAM
    )  # tie on 30: bidder 9 wins
    check_result(kernel, r2.state, r3)
    assert row_tuples(r3.output) == [(1, 30, 8, -1), (1, 30, 9, 1)]
    assert r3.state.num_rows == 2  # nothing is evicted, not even at end of stream


def test_global_aggregate_without_keys() -> None:
    rows = make_bids(300, seed=4)
    kernel = KeyedAggregateKernel(rows.schema, (), [("n", "count", None), ("s", "sum", "price")])
    batches, _ = cut(with_kg(rows, ()), [100, 200])
    run = run_epochs(kernel, zip(batches, [NO_WATERMARK] * 3, strict=True), check=check_result)
    out, state = run.output, run.state
    assert out.column(DIFF).to_pylist() == [1, -1, 1, -1, 1]
    assert row_tuples(out)[-1][:2] == (
        300,
        sum(p for p in rows.column("price").to_pylist() if p is not None),
    )
    assert state.num_rows == 1


@settings(max_examples=30, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 300), max_size=6),
    seed=st.integers(0, 2**16),
    keys=st.sampled_from([("cat",), ("cat", "region"), ("region",)]),
)
def test_final_values_do_not_depend_on_epoch_split(
    cuts: list[int], seed: int, keys: tuple[str, ...]
) -> None:
    """Any order, any cut: the changelog, summed, gives one row per key with DuckDB's values;
    each key is inserted exactly once."""
    rows = make_bids(300, seed=7)
    rows = rows.take(pa.array(np.random.default_rng(seed).permutation(rows.num_rows)))
    kernel = KeyedAggregateKernel(rows.schema, keys, AGGS, time="ts")
    batches, _ = cut(with_kg(rows, keys), cuts)
    run = run_epochs(
        kernel,
        zip(batches, [NO_WATERMARK] * len(batches), strict=True),
        check=check_result,
        shuffle=seed,
    )
    out, metrics = run.output, run.metrics
    final = final_values(out, keys)
    assert_same_values(final, duckdb_final(rows, keys))
    assert metrics["keys_inserted"] == len(final) and metrics["keys_deleted"] == 0


def test_kernels_pickle_and_accept_non_nullable_input() -> None:
    """Spark hands over non-nullable fields; kernels travel pickled to Python workers."""
    import pickle

    from eddyline.operators.dedup import DedupKernel
    from eddyline.operators.session import SessionWindowKernel
    from eddyline.operators.topk import TopKKernel

    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), pa.field("t", pa.int64(), nullable=False)]
    )
    kernels: list[Kernel] = [
        TopKKernel(schema, ("k",), [("t", "desc")], 1, "t"),
        DedupKernel(schema, ("k",), "t", 5),
        SessionWindowKernel(schema, ("k",), "t", 5, (("n", "count", None),)),
        KeyedAggregateKernel(schema, ("k",), [("n", "count", None), ("m", "max_by", "t", "t")]),
    ]
    rows = with_kg(pa.table({"k": [1, 1, 2], "t": [3, 4, 9]}, schema=schema), ("k",))
    for kernel in kernels:
        kernel = pickle.loads(pickle.dumps(kernel))
        assert isinstance(kernel, Kernel) and kernel.primary_key[0] == KG
        assert all(f.nullable for f in kernel.state_schema)
        out = run_epochs(kernel, [(rows, 0)], check=check_result).output
        assert out.num_rows > 0


# ==================================================================== local/global split
# integer sums only: a float sum whose rows all cancel may end at a residue like 1e-16 in one
# order of addition and at 0 in another, and a non-zero partial keeps a key's state row
REVISABLE: tuple = (("n", "count", None), ("n_price", "count", "price"), ("total", "sum", "price"),
                    ("mean", "avg", "price"))


def revised_bids(n: int, seed: int) -> pa.Table:
    """Bids with ``_diff``: every row inserted, then about a third of them taken back later."""
    rows = make_bids(n, seed=seed)
    rng = np.random.default_rng(seed)
    back = np.sort(rng.choice(n, n // 3, replace=False))
    out = pa.concat_tables([rows, rows.take(pa.array(back))])
    weights = np.concatenate([np.ones(n, np.int64), -np.ones(back.size, np.int64)])
    return out.append_column(DIFF, pa.array(weights))


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 400), max_size=5),
    switch=st.integers(0, 6),
    chunk=st.integers(10, 200),
    revised=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_local_global_split_emits_what_the_aggregate_emits(
    cuts: list[int], switch: int, chunk: int, revised: bool, seed: int
) -> None:
    """From any epoch on, the rows combined in chunks of any size first (the local step) and a
    merging kernel that takes the aggregate's state over (the global step): every epoch emits the
    aggregate's changelog and ends with its state."""
    rows = revised_bids(300, seed) if revised else make_bids(400, seed=seed)
    aggs = REVISABLE if revised else AGGS
    keys = ("cat", "region")
    whole = KeyedAggregateKernel(rows.schema, keys, aggs, time="ts")
    merging = KeyedAggregateKernel.merging(whole.partial_schema, keys, aggs, time="ts")
    assert merging.state_schema == whole.state_schema and merging.output_schema == whole.output_schema
    batches, _ = cut(rows, cuts)
    want_state = got_state = whole.empty_state()
    for epoch, batch in enumerate(batches):
        want = whole.process(with_kg(batch, keys), want_state, NO_WATERMARK)
        if epoch < switch:
            got = whole.process(with_kg(batch, keys), got_state, NO_WATERMARK)
        else:
            parts = [whole.combine(batch.slice(i, chunk)) for i in range(0, batch.num_rows, chunk)]
            partials = pa.concat_tables(parts) if parts else whole.partial_schema.empty_table()
            assert partials.num_rows <= len(parts) * len(set(row_tuples(batch, keys)))
            got = merging.process(with_kg(partials, keys), got_state, NO_WATERMARK)
            check_result(merging, got_state, got)
        assert multiset(got.output) == multiset(want.output), epoch
        assert multiset(got.state) == multiset(want.state), epoch
        want_state, got_state = want.state, got.state


def test_combine_refuses_what_it_cannot_merge() -> None:
    rows = revised_bids(20, 1)
    with_min = KeyedAggregateKernel(rows.schema, ("cat",), [("lo", "min", "price")])
    with pytest.raises(ValueError, match="min and max over a revised input"):
        with_min.combine(rows)
    plain = KeyedAggregateKernel(make_bids(5).schema, ("cat",), AGGS, time="ts")
    with pytest.raises(ValueError, match="missing column"):
        KeyedAggregateKernel.merging(plain.partial_schema.remove(3), ("cat",), AGGS, time="ts")
    with pytest.raises(ValueError, match="partials of types"):
        clash = pa.schema([("cat", pa.int64()), ("s", pa.int64()), ("m", pa.int32())])
        KeyedAggregateKernel.merging(clash, ("cat",), [("s", "sum", "p"), ("m", "max", "p")])


def test_a_key_whose_rows_cancel_in_its_first_batch_is_neither_stored_nor_deleted() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), (DIFF, pa.int64())])
    kernel = KeyedAggregateKernel(schema, ("k",), [("n", "count", None), ("s", "sum", "v")])
    first = kernel.process(with_kg(pa.table({"k": [1], "v": [5], DIFF: [1]}, schema=schema), ("k",)), None, NO_WATERMARK)
    batch = pa.table({"k": [1, 2, 2], "v": [5, 7, 7], DIFF: [1, 1, -1]}, schema=schema)  # key 2 comes and goes
    res = kernel.process(with_kg(batch, ("k",)), first.state, NO_WATERMARK)
    check_result(kernel, first.state, res)
    assert res.deletes.num_rows == 0 and row_tuples(res.state, ["k", "n", "s"]) == [(1, 2, 10)]
    assert sorted(row_tuples(res.output)) == [(1, 1, 5, -1), (1, 2, 10, 1)]
