"""The join kernels' test inputs (auctions and bids packed per key group), their epochs, and the
contract each join's result keeps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.eventtime import NO_WATERMARK
from eddyline.operators.base import Kernel, KernelResult
from eddyline.operators.join import (
    SIDE,
    IntervalJoinKernel,
    UnboundedJoinKernel,
    WindowJoinKernel,
)

TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema(
    [
        ("id", pa.int64()),
        ("seller", pa.int32()),
        ("name", pa.string()),
        ("start", TS),
        ("end", TS),
        ("reserve", pa.float64()),
    ]
)


RIGHT = pa.schema(
    [
        ("auction", pa.int64()),
        ("bidder", pa.int32()),
        ("name", pa.string()),
        ("price", pa.int64()),
        ("ts", TS),
    ]
)


KEY_GROUPS = 4
WINDOW_MS = 10_000


TTL_MS = 3_000

# --------------------------------------------------------------------------- data
def make_inputs(
    n_left: int = 150, n_right: int = 450, seed: int = 0, keys: int = 12
) -> tuple[pa.Table, pa.Table]:
    """Auctions and bids over a minute, in microseconds (sub-millisecond times on purpose), with
    null keys, exact duplicates on both sides, and bids exactly on / just off interval bounds."""
    rng = np.random.default_rng(seed)
    span_us = 60_000_000
    start = rng.integers(0, span_us, n_left)
    left = pa.table(
        {
            "id": pa.array(
                rng.integers(0, keys, n_left), pa.int64(), mask=rng.random(n_left) < 0.05
            ),
            "seller": pa.array(rng.integers(0, 50, n_left), pa.int32()),
            "name": pa.array(rng.choice(["x", "y", "z"], n_left)),
            "start": pa.array(start, TS),
            "end": pa.array(start + rng.integers(0, 8_000_000, n_left), TS),
            "reserve": pa.array(
                rng.integers(0, 100, n_left) / 4, pa.float64(), mask=rng.random(n_left) < 0.1
            ),
        },
        schema=LEFT,
    )
    bounds = left.slice(0, 10)
    edge_ts = np.concatenate(
        [
            bounds.column(c).cast(pa.int64()).to_numpy() + d
            for c, d in (("start", 0), ("end", 0), ("start", -1), ("end", 1))
        ]
    )
    ts = np.concatenate([rng.integers(0, span_us, n_right - len(edge_ts)), edge_ts])
    auction = np.concatenate(
        [
            rng.integers(0, keys, n_right - len(edge_ts)),
            np.tile(pc.fill_null(bounds.column("id"), -1).to_numpy(), 4),
        ]
    )
    right = pa.table(
        {
            "auction": pa.array(
                auction, pa.int64(), mask=(rng.random(n_right) < 0.05) | (auction < 0)
            ),
            "bidder": pa.array(rng.integers(0, 50, n_right), pa.int32()),
            "name": pa.array(rng.choice(["x", "y"], n_right)),
            "price": pa.array(rng.integers(1, 1000, n_right), pa.int64()),
            "ts": pa.array(ts, TS),
        },
        schema=RIGHT,
    )
    dup_l, dup_r = rng.integers(0, n_left, n_left // 10), rng.integers(0, n_right, n_right // 10)
    return (
        pa.concat_tables([left, left.take(pa.array(dup_l))]),
        pa.concat_tables([right, right.take(pa.array(dup_r))]),
    )


def pack(kernel: Kernel, left: pa.Table, right: pa.Table) -> pa.Table:
    """Both inputs in the runtime's layout; the key group is the key modulo ``KEY_GROUPS``."""
    parts = []
    for side, table, key in ((0, left, "id"), (1, right, "auction")):
        kg = pc.fill_null(table.column(key), 0).to_numpy() % KEY_GROUPS
        cols: dict[str, pa.Array | pa.ChunkedArray] = {
            KG: pa.array(kg, pa.int32()),
            SIDE: pa.array(np.full(table.num_rows, side), pa.int8()),
        }
        for f in kernel.input_schema:
            if f.name.startswith(("l__", "r__")):
                own = f.name.startswith("l__") == (side == 0)
                cols[f.name] = table.column(f.name[3:]) if own else pa.nulls(table.num_rows, f.type)
        parts.append(pa.table(cols, schema=kernel.input_schema))
    return pa.concat_tables(parts)


def event_ms(batch: pa.Table) -> np.ndarray:
    """A packed row's event time: an auction's start, a bid's time."""
    left = batch.column(SIDE).to_numpy() == 0
    start = pc.fill_null(batch.column("l__start").cast(pa.int64()), 0).to_numpy()
    ts = pc.fill_null(batch.column("r__ts").cast(pa.int64()), 0).to_numpy()
    return np.where(left, start, ts) // 1000


def stream(
    kernel: Kernel, left: pa.Table, right: pa.Table, seed: int = 0
) -> tuple[pa.Table, np.ndarray]:
    """Packed rows in event-time order (ties in random order), with their event times."""
    batch = pack(kernel, left, right)
    t = event_ms(batch)
    order = np.lexsort((np.random.default_rng(seed).random(batch.num_rows), t))
    return batch.take(pa.array(order)), t[order]


def epochs(
    batch: pa.Table, t: np.ndarray, cuts: list[int], lags: list[int], shuffle_seed: int = 0
) -> tuple[list[pa.Table], list[int]]:
    """Cut an event-time-ordered stream into epochs, each shuffled; the watermark of epoch ``i``
    comes from epochs before ``i`` (max seen time minus a lag) and never passes an unseen row."""
    n = batch.num_rows
    bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
    rng = np.random.default_rng(shuffle_seed)
    batches, watermarks, seen = [], [], NO_WATERMARK
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        batches.append(batch.slice(a, b - a).take(pa.array(rng.permutation(b - a), pa.int64())))
        watermarks.append(seen)
        seen = max(seen, int(t[b - 1]) - lags[i % len(lags)])
    return batches, watermarks

# --------------------------------------------------------------------------- driving
def apply_changes(prev: pa.Table, result: KernelResult, pk: tuple[str, ...]) -> pa.Table:
    """The previous state without the deleted and upserted keys, plus the upserted rows."""
    gone = pa.concat_tables([result.deletes.select(list(pk)), result.upserts.select(list(pk))])
    kept = prev.join(gone, keys=list(pk), join_type="left anti", use_threads=False)
    return pa.concat_tables([kept.select(prev.column_names), result.upserts])


def by_pk(table: pa.Table, pk: tuple[str, ...]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in pk]).combine_chunks()


def check_deltas(kernel: Kernel, prev: pa.Table, res: KernelResult) -> None:
    """Upserts / deletes are exact: they rebuild the new state, delete only keys that left it,
    upsert only rows that are new or changed, and name every touched key group."""
    pk = kernel.primary_key
    assert pk[0] == KG and res.state.schema == kernel.state_schema
    assert by_pk(apply_changes(prev, res, pk), pk).equals(by_pk(res.state, pk))
    keys = lambda t: Counter(zip(*(t.column(k).to_pylist() for k in pk), strict=True))  # noqa: E731
    prev_keys, new_keys, deleted = keys(prev), keys(res.state), keys(res.deletes)
    assert max(new_keys.values(), default=1) == 1, "primary key must be unique"
    assert set(deleted) == set(prev_keys) - set(new_keys) and max(deleted.values(), default=1) == 1
    prev_rows = {tuple(r.values())[: len(pk)]: r for r in prev.to_pylist()}
    changed = [r for r in res.state.to_pylist() if prev_rows.get(tuple(r.values())[: len(pk)]) != r]
    assert Counter(map(repr, changed)) == Counter(map(repr, res.upserts.to_pylist()))
    touched = {*res.upserts.column(KG).to_pylist(), *res.deletes.column(KG).to_pylist()}
    assert res.changed_key_groups == sorted(touched)


def check_schema(kernel: Kernel, prev: pa.Table, res: KernelResult) -> None:
    assert res.output.schema == kernel.output_schema


def check_epoch(kernel: Kernel, prev: pa.Table, res: KernelResult) -> None:
    """The harness's per-epoch check: the output schema, then the exact deltas."""
    check_schema(kernel, prev, res)
    check_deltas(kernel, prev, res)


def multiset(table: pa.Table) -> Counter[tuple]:
    return Counter(tuple(r.values()) for r in table.to_pylist())


def kernel_of(kind: str, ttl_ms: int | None = None) -> Kernel:
    common = (LEFT, RIGHT, ("id",), ("auction",))
    if kind == "window":
        return WindowJoinKernel(*common, left_time="start", right_time="ts", size_ms=WINDOW_MS)
    if kind == "interval":
        return IntervalJoinKernel(*common, left_start="start", left_end="end", right_time="ts")
    return UnboundedJoinKernel(*common, ttl_ms=ttl_ms, left_time="start", right_time="ts")

# --------------------------------------------------------------------------- semantics, by hand
def batch_of(kernel: Kernel, left: list[dict], right: list[dict]) -> pa.Table:
    return pack(
        kernel, pa.Table.from_pylist(left, schema=LEFT), pa.Table.from_pylist(right, schema=RIGHT)
    )


def auction_row(id_: int | None, start_ms: int, end_ms: int = 0) -> dict:
    return {
        "id": id_,
        "seller": 1,
        "name": "a",
        "start": start_ms * 1000,
        "end": end_ms * 1000,
        "reserve": 1.0,
    }


def bid_row(auction: int | None, ts_ms: int, price: int = 10) -> dict:
    return {"auction": auction, "bidder": 2, "name": "b", "price": price, "ts": ts_ms * 1000}
