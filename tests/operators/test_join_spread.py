"""SPREADFIRE for the joins: splitting a hot key group's state into fragments fed with ``_probe``
copies must not change the result.

A spread run of key group ``g`` over ``F`` fragments stores each new row in one fragment (its
home, ``_kg = g + K * home``) and sends a probe copy to every other fragment; each fragment keeps
its own state across epochs (several fragments may share a lane, i.e. one ``process`` call). Its
per-epoch output multiset, its metrics and the multiset of its stored rows must equal those of the
unsplit run (every row at ``_kg = g``, no ``_probe`` column)."""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.columns import KG
from eddyline.eventtime import NO_WATERMARK
from eddyline.operators.base import Kernel, KernelResult
from eddyline.operators.join import (
    PROBE,
    SEQ,
    SIDE,
    IntervalJoinKernel,
    UnboundedJoinKernel,
    WindowJoinKernel,
)
from tests.operators.harness import Driver, with_end_of_stream
from tests.operators.joinrows import (
    KEY_GROUPS,
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

K = KEY_GROUPS  # ``pack`` puts a row into key group ``key % K``


# --------------------------------------------------------------------------- spreading
def homes(batch: pa.Table, fragments: int, how: str, seed: int) -> np.ndarray:
    """Each row's home fragment: seeded at random (duplicates may land apart) or by a hash of
    the row's content (duplicates land together)."""
    if how == "rng":
        return np.random.default_rng(seed).integers(0, fragments, batch.num_rows)
    return np.array(
        [zlib.crc32(repr(sorted(r.items())).encode()) % fragments for r in batch.to_pylist()],
        dtype=np.int64,
    )


def spread(batch: pa.Table, spread_kgs: set[int], fragments: int, home: np.ndarray) -> pa.Table:
    """A row of a spread key group ``g``: stored at ``g + K * home`` and probed at ``g + K * f``
    for every other fragment ``f``; other rows stay at ``g`` with a null ``_probe`` (= false)."""
    n = batch.num_rows
    kg = batch.column(KG).to_numpy()
    row = np.repeat(np.arange(n), fragments)
    frag = np.tile(np.arange(fragments), n)
    spread_row = np.isin(kg, sorted(spread_kgs))[row]
    keep = spread_row | (frag == 0)
    row, frag, spread_row = row[keep], frag[keep], spread_row[keep]
    out = batch.take(pa.array(row, pa.int64()))
    out = out.set_column(out.column_names.index(KG), KG, pa.array(kg[row] + K * frag, pa.int32()))
    probe = pa.array(frag != home[row], pa.bool_(), mask=~spread_row)
    return out.append_column(PROBE, probe)


def lanes_of(batch: pa.Table, n_lanes: int) -> list[pa.Table]:
    """Fragment ``f`` lives on lane ``f % n_lanes`` (a lane may own several fragments)."""
    lane = (batch.column(KG).to_numpy() // K) % n_lanes
    return [batch.filter(pa.array(lane == i)) for i in range(n_lanes)]


def drive(
    kernel: Kernel, plan: list[list[pa.Table]], watermarks: list[int], check: bool = True
) -> tuple[list[Counter[tuple]], list[Counter[tuple]], Counter[str]]:
    """Run ``plan[epoch][lane]`` lane by lane (each lane keeps its state), then end the stream.

    Returns per epoch the output multiset and the stored rows' multiset over all lanes (without
    ``_kg`` / ``_seq``, which depend on the fragment), and the summed metrics."""
    n_lanes = max(len(p) for p in plan)
    lanes = [Driver(kernel, check=check_epoch if check else check_schema) for _ in range(n_lanes)]
    empty = plan[0][0].slice(0, 0)
    outputs, stored = [], []
    for lane_batches, wm in with_end_of_stream(zip(plan, watermarks, strict=True), empty=[]):
        out = Counter[tuple]()
        for i, lane in enumerate(lanes):
            res = lane.step(lane_batches[i] if i < len(lane_batches) else empty, wm)
            out += multiset(res.output)
        outputs.append(out)
        stored.append(
            sum((multiset(lane.state.drop_columns([KG, SEQ])) for lane in lanes), Counter[tuple]())
        )
    metrics = Counter[str]()
    for lane in lanes:
        metrics.update(lane.metrics)
    return outputs, stored, metrics


def compare(
    kernel: Kernel,
    batches: list[pa.Table],
    watermarks: list[int],
    *,
    fragments: int,
    spread_kgs: set[int],
    spread_from: int,
    n_lanes: int,
    home: str = "rng",
    seed: int = 0,
    check: bool = True,
) -> tuple[Counter[str], int]:
    """Assert that the spread run equals the unsplit one; returns the metrics and pair count."""
    plain = drive(kernel, [[b] for b in batches], watermarks, check)
    plan = []
    for e, b in enumerate(batches):
        if e < spread_from:  # not spread yet: no _probe column at all, every row at fragment 0
            plan.append([b])
        else:
            split = spread(b, spread_kgs, fragments, homes(b, fragments, home, seed + e))
            plan.append(lanes_of(split, n_lanes))
    split_out, split_stored, split_metrics = drive(kernel, plan, watermarks, check)
    plain_out, plain_stored, plain_metrics = plain
    for e, (got, want) in enumerate(zip(split_out, plain_out, strict=True)):
        assert got == want, f"epoch {e}: output differs"
    for e, (got, want) in enumerate(zip(split_stored, plain_stored, strict=True)):
        assert got == want, f"epoch {e}: stored rows differ"
    assert split_metrics == plain_metrics
    return plain_metrics, sum(sum(c.values()) for c in plain_out)


# --------------------------------------------------------------------------- over the test data
SCENARIOS = [  # fragments, spread key groups, spread from epoch, lanes, home, watermark ahead
    pytest.param(2, {0, 1, 2, 3}, 0, 2, "rng", 0, id="F2-all-lanes"),
    pytest.param(2, {1, 3}, 0, 1, "content", 0, id="F2-some-one-call"),
    pytest.param(3, {0, 1, 2, 3}, 2, 3, "rng", 0, id="F3-mid-run-lanes"),
    pytest.param(3, {2}, 2, 2, "content", 0, id="F3-mid-run-shared-lane"),
    pytest.param(3, {0, 1, 2, 3}, 0, 1, "rng", 4_000, id="F3-late-one-call"),
    pytest.param(2, {0, 2, 3}, 1, 2, "content", 4_000, id="F2-late-mid-run"),
]


@pytest.mark.parametrize("kind", ["interval", "unbounded", "ttl"])
@pytest.mark.parametrize(
    ("fragments", "spread_kgs", "spread_from", "n_lanes", "home", "ahead"), SCENARIOS
)
def test_spreading_does_not_change_the_result(
    kind: str,
    fragments: int,
    spread_kgs: set[int],
    spread_from: int,
    n_lanes: int,
    home: str,
    ahead: int,
) -> None:
    """With null keys, duplicates, interval bounds, TTL evictions and (``ahead``: watermarks
    ahead of unseen rows) late rows."""
    left, right = make_inputs()
    kernel = kernel_of("unbounded", TTL_MS) if kind == "ttl" else kernel_of(kind)
    batch, t = stream(kernel, left, right)
    batches, watermarks = epochs(batch, t, cuts=[100, 250, 400, 520], lags=[2_000, 0, 7_000])
    watermarks = [w if w == NO_WATERMARK else w + ahead for w in watermarks]
    metrics, pairs = compare(
        kernel,
        batches,
        watermarks,
        fragments=fragments,
        spread_kgs=spread_kgs,
        spread_from=spread_from,
        n_lanes=n_lanes,
        home=home,
    )
    assert pairs > 100 and metrics["dropped_rows"] > 0
    if ahead and kind != "unbounded":  # without a TTL nothing is ever late
        assert metrics["late_rows"] > 0
    if kind == "ttl":
        assert metrics["rows_evicted"] > 0


# --------------------------------------------------------------------------- random inputs
_key = st.one_of(st.none(), st.integers(0, 2))  # few keys: many pairs
_epoch = st.integers(0, 3)
_auctions = st.lists(
    st.tuples(_key, st.integers(-3, 6), st.integers(-1, 8), _epoch), min_size=2, max_size=12
)
_bids = st.lists(
    st.tuples(_key, st.integers(-4, 6), st.integers(0, 1), _epoch), min_size=3, max_size=18
)
STEP = 4  # epoch e's rows lie around e * STEP, its watermark too


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["interval", "unbounded", "ttl"]),
    auctions=_auctions,
    bids=_bids,
    marks=st.lists(st.integers(-3, 3), min_size=4, max_size=4),
    fragments=st.integers(2, 3),
    spread_kgs=st.sets(st.integers(0, 2), min_size=2),
    spread_from=st.integers(0, 2),
    n_lanes=st.integers(1, 3),
    home=st.sampled_from(["rng", "content"]),
    seed=st.integers(0, 2**16),
)
def test_spreading_random_inputs(
    kind: str,
    auctions: list[tuple],
    bids: list[tuple],
    marks: list[int],
    fragments: int,
    spread_kgs: set[int],
    spread_from: int,
    n_lanes: int,
    home: str,
    seed: int,
) -> None:
    """Small inputs over four epochs, times in units of 100 ms: rows of epoch ``e`` near
    ``e * STEP``, and watermarks near it too, so that rows of earlier epochs are often still
    stored while some new rows (and their probe copies) are late; a TTL of 300 ms expires rows."""
    kernel = kernel_of("unbounded", 300) if kind == "ttl" else kernel_of(kind)
    batches = [
        batch_of(
            kernel,
            [
                auction_row(k, (e * STEP + s) * 100, (e * STEP + s + d) * 100)
                for k, s, d, e in auctions
                if e == epoch
            ],
            [bid_row(k, (e * STEP + ts) * 100, p) for k, ts, p, e in bids if e == epoch],
        )
        for epoch in range(4)
    ]
    marks = [e * STEP + m for e, m in enumerate(marks)]
    watermarks = [NO_WATERMARK, *(m * 100 for m in np.maximum.accumulate(marks)[1:])]
    compare(
        kernel,
        batches,
        watermarks,
        fragments=fragments,
        spread_kgs=spread_kgs,
        spread_from=spread_from,
        n_lanes=min(n_lanes, fragments),
        home=home,
        seed=seed,
    )


# --------------------------------------------------------------------------- semantics, by hand
def _probe_batch(kernel: Kernel, left: list[dict], right: list[dict], kg: int, probe: list[bool]):
    """Hand-made rows (left first) all in key group ``kg``, with the given ``_probe`` flags."""
    b = batch_of(kernel, left, right)
    b = b.set_column(b.column_names.index(KG), KG, pa.array([kg] * b.num_rows, pa.int32()))
    return b.append_column(PROBE, pa.array(probe, pa.bool_()))


def _prices(result: KernelResult) -> list[int]:
    return sorted(result.output.column("price").to_pylist())


def test_probe_rows_meet_the_state_but_only_store_left_rows_pair_within_the_batch() -> None:
    k = kernel_of("unbounded")
    frag = 1 + K  # fragment 1 of key group 1
    r1 = k.process(_probe_batch(k, [auction_row(1, 0)], [], frag, [False]), None, 0)
    assert r1.state.num_rows == 1 and r1.changed_key_groups == [frag]
    # a probe bid meets the stored auction (rule 1) and is not stored (rule 3)
    r2 = k.process(_probe_batch(k, [], [bid_row(1, 5, price=1)], frag, [True]), r1.state, 0)
    assert _prices(r2) == [1] and r2.state.equals(r1.state) and r2.upserts.num_rows == 0
    assert r2.changed_key_groups == []
    # probe auction × store bid: formed at the auction's home, not here (rule 2); the stored
    # auction meets the new bid; store auction × probe bid is formed here; the probe auction
    # meets no stored bid (there is none) and a probe × probe pair is never formed
    batch = _probe_batch(
        k,
        [auction_row(1, 0), auction_row(1, 1)],
        [bid_row(1, 5, price=2), bid_row(1, 6, price=3), bid_row(1, 7, price=4)],
        frag,
        [True, False, False, True, True],
    )
    r3 = k.process(batch, r2.state, 0)
    # stored auction (1 old) × {2, 3, 4}; new store auction × {2, 3, 4}; probe auction × nothing
    assert _prices(r3) == [2, 2, 3, 3, 4, 4]
    assert r3.state.num_rows == 3 and r3.upserts.num_rows == 2  # the store auction and bid 2
    assert sorted(r3.upserts.column(SIDE).to_pylist()) == [0, 1]


def test_late_and_null_key_probes_match_nothing_and_are_not_counted() -> None:
    k = kernel_of("interval")
    r1 = k.process(_probe_batch(k, [auction_row(1, 0, 10_000)], [], 1, [False]), None, 0)
    bids = [bid_row(1, 500), bid_row(None, 2_000), bid_row(1, 3_000)]
    r2 = k.process(_probe_batch(k, [], bids, 1, [True, True, True]), r1.state, 1_000)
    assert r2.metrics["late_rows"] == 0 and r2.metrics["dropped_rows"] == 0
    assert [v.timestamp() for v in r2.output.column("ts").to_pylist()] == [3]
    assert r2.state.equals(r1.state)
    r3 = k.process(_probe_batch(k, [], bids, 1, [False, False, False]), r1.state, 1_000)
    assert r3.metrics["late_rows"] == 1 and r3.metrics["dropped_rows"] == 1
    assert r3.output.equals(r2.output) and r3.state.num_rows == 2


def test_probe_results_do_not_depend_on_row_order() -> None:
    """Same state and the same multiset of store and probe rows → the very same tables."""
    left, right = make_inputs(seed=2)
    for kernel in (kernel_of("interval"), kernel_of("unbounded", TTL_MS)):
        batch, t = stream(kernel, left, right, seed=2)
        first, second = batch.slice(0, 350), batch.slice(350)
        wm1, wm2 = int(t[0]), int(t[349]) - 3_000
        state = kernel.process(spread(first, {1, 2}, 3, homes(first, 3, "rng", 0)), None, wm1)
        second = spread(second, {0, 1, 2}, 3, homes(second, 3, "rng", 1))
        base = kernel.process(second, state.state, wm2)
        assert base.output.num_rows and base.upserts.num_rows and base.deletes.num_rows
        for seed in range(3):
            perm = np.random.default_rng(seed).permutation(second.num_rows)
            other = kernel.process(second.take(pa.array(perm)), state.state, wm2)
            for name in ("output", "state", "upserts", "deletes"):
                assert getattr(other, name).equals(getattr(base, name)), name
            assert other.changed_key_groups == base.changed_key_groups
            assert other.metrics == base.metrics


@pytest.mark.parametrize("kind", ["window", "interval", "unbounded"])
def test_probe_column_is_optional_and_false_changes_nothing(kind: str) -> None:
    kernel = kernel_of(kind)
    assert PROBE not in kernel.input_schema.names
    left, right = make_inputs(seed=3)
    batch, t = stream(kernel, left, right, seed=3)
    first, second = batch.slice(0, 300), batch.slice(300)
    state = kernel.process(first, None, int(t[0])).state
    base = kernel.process(second, state, int(t[299]) - 2_000)
    flags = np.random.default_rng(0).random(second.num_rows) < 0.5
    for probe in (
        pa.array(np.zeros(second.num_rows, dtype=bool)),
        pa.nulls(second.num_rows, pa.bool_()),
        pa.array(np.zeros(second.num_rows, dtype=bool), mask=flags),
    ):
        other = kernel.process(second.append_column(PROBE, probe), state, int(t[299]) - 2_000)
        for name in ("output", "state", "upserts", "deletes"):
            assert getattr(other, name).equals(getattr(base, name)), name
        assert other.metrics == base.metrics


def test_only_the_symmetric_joins_are_spreadable() -> None:
    assert IntervalJoinKernel.spreadable and UnboundedJoinKernel.spreadable
    assert not WindowJoinKernel.spreadable
    for kind in ("window", "interval", "unbounded"):
        assert kernel_of(kind).spreadable is (kind != "window")
    k = kernel_of("window")
    batch = _probe_batch(k, [auction_row(1, 0)], [bid_row(1, 5)], 1 + K, [False, True])
    with pytest.raises(ValueError, match="WindowJoinKernel.*window join cannot be split"):
        k.process(batch, None, 0)
    assert k.process(batch.drop_columns([PROBE]), None, 0).state.num_rows == 2
