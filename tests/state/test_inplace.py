"""State kept in place (``eddyline.state.inplace``) against the pure kernels given the whole state.

Each local kernel (dedup, keyed aggregate, session window) runs the same epochs twice: as a
per-epoch lane runs it, the whole state in and out, and as a resident lane keeps it in place,
given only the rows :meth:`InPlaceState.touched` finds and its changes applied. Every epoch must
give the same output, the same upserts and deletes, and the same rows held; the young tables are
kept small so that the base is rebuilt many times on the way. Keys are integers or text, with
nulls, repeated across epochs, and the watermark passes many keys' deadlines."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from eddyline.columns import KG
from eddyline.eventtime import END_OF_STREAM
from eddyline.hashing import spark_xxhash64
from eddyline.operators.dedup import DedupKernel
from eddyline.operators.keyed import KeyedAggregateKernel
from eddyline.operators.session import SessionWindowKernel
from eddyline.runtime.lanes import process
from eddyline.state.inplace import InPlaceState, key_hashes, local

KEY_GROUPS = 8


def rows(rng: np.random.Generator, n: int, keys: int, t0: int, text: bool) -> pa.Table:
    k = rng.integers(0, keys, n)
    key = pa.array([None if v == 0 else f"k{v}" for v in k.tolist()]) if text else pa.array(k, mask=k == 0)
    t = t0 + rng.integers(0, 3_000, n)
    table = pa.table({"key": key, "ts": pa.array(t, pa.timestamp("ms")), "v": rng.integers(-50, 50, n)})
    kg = np.mod(spark_xxhash64(k), KEY_GROUPS).astype(np.int32)  # (any grouping by key will do here)
    return table.append_column(KG, pa.array(kg))


def canonical(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


KERNELS = {
    "dedup": lambda s: DedupKernel(s, ["key"], "ts", ttl_ms=2_000),
    "keyed": lambda s: KeyedAggregateKernel(s, ("key",), [("n", "count", None), ("top", "max", "v"), ("s", "sum", "v")]),
    "session": lambda s: SessionWindowKernel(s, ["key"], "ts", 700, [("n", "count", None), ("s", "sum", "v")]),
}


@pytest.mark.parametrize("merges", ["base", "young"], ids=["base-rebuilt", "young-tables-merged"])
@pytest.mark.parametrize("text", [False, True], ids=["int-keys", "text-keys"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_an_epoch_on_the_rows_found_in_place_is_the_epoch_on_the_whole_state(name: str, text: bool, merges: str) -> None:
    rng = np.random.default_rng(7)
    schema = rows(rng, 1, 10, 0, text).schema
    kernel = KERNELS[name](schema)
    assert local(kernel)
    held = InPlaceState(kernel, young_min=300 if merges == "base" else 10**9)
    if merges == "young":
        held.MAX_YOUNG_TABLES = 3
    whole = kernel.state_schema.empty_table()
    wm, rebuilt, due_seen, young_merged = -1, 0, 0, 0
    for epoch in range(40):
        batch = rows(rng, int(rng.integers(0, 400)), 600, 1_000 * epoch, text)
        wm = END_OF_STREAM if epoch == 39 else max(wm, 1_000 * epoch - 1_500)
        advance = None if epoch % 5 else wm + 800  # the plan may move the watermark on within the epoch
        want = process(kernel, batch, whole, wm, advance)
        bases, tables = id(held.tables[0]), len(held.tables)
        touched, where = held.touched(batch, wm if advance is None else max(wm, advance))
        got = process(kernel, batch, touched, wm, advance)
        held.apply(touched, where, got)
        rebuilt += id(held.tables[0]) != bases
        young_merged += id(held.tables[0]) == bases and len(held.tables) < tables
        due_seen += len(set(touched.column("key").to_pylist()) - set(batch.column("key").to_pylist()))
        assert canonical(got.output) == canonical(want.output), epoch
        assert canonical(got.upserts) == canonical(want.upserts), epoch
        assert canonical(got.deletes) == canonical(want.deletes), epoch
        assert canonical(held.table()) == canonical(want.state), epoch
        assert held.num_rows == want.state.num_rows
        counts = np.bincount(want.state.column(KG).to_numpy(), minlength=held.group_counts().size)
        assert held.group_counts().tolist() == counts.tolist()
        groups = np.array([1, 4, 6])
        mine = held.group_rows(groups)
        assert canonical(mine) == canonical(want.state.filter(pa.array(np.isin(want.state.column(KG).to_numpy(), groups))))
        whole = want.state
    if merges == "base":
        assert rebuilt >= 3  # the base was rebuilt from the young tables along the way
    else:
        assert rebuilt == 0 and young_merged >= 5 and len(held.tables) <= 5  # the young tables were merged
    assert due_seen > 100 or name == "keyed"  # rows came for their deadline, not for a key of the batch
    assert held.num_rows == 0 or name == "keyed"  # the end of the stream fires and forgets every key


def test_a_loaded_state_is_found_by_its_keys_and_its_deadlines() -> None:
    rng = np.random.default_rng(3)
    batch = rows(rng, 2_000, 500, 0, False)
    kernel = DedupKernel(batch.schema, ["key"], "ts", ttl_ms=1_000)
    state = kernel.process(batch, None, -1).state
    held = InPlaceState(kernel)
    held.load(state)
    probe = batch.slice(0, 5)
    touched, _ = held.touched(probe, 0)  # nothing is past its deadline at 0
    keys = set(probe.column("key").to_pylist())
    assert set(touched.column("key").to_pylist()) == keys
    # at a watermark past some keys' deadlines, those come too, whatever the batch
    cut = 2_500
    touched, _ = held.touched(probe.slice(0, 0), cut)
    last = state.column("_last_ms").to_numpy()
    assert sorted(touched.column("key").to_pylist(), key=str) == sorted(
        state.filter(pa.array(last + 1_000 < cut)).column("key").to_pylist(), key=str)


def test_key_hashes_are_equal_for_equal_keys_across_tables_and_types() -> None:
    a = pa.table({"k": pa.array([1, None, 3], pa.int64()), "s": ["x", None, "long text é"]})
    b = pa.table({"k": pa.array([3, 1, None], pa.int64()), "s": ["long text é", "x", None]})
    ha, hb = key_hashes(a, ["k", "s"]), key_hashes(b, ["k", "s"])
    assert ha[0] == hb[1] and ha[1] == hb[2] and ha[2] == hb[0]
    assert len(set(ha.tolist())) == 3
    sliced = pa.table({"s": pa.array(["a", "bc", "bc", ""])}).slice(1)  # an offset into the buffers
    h = key_hashes(sliced, ["s"])
    assert h[0] == h[1] != h[2]


def test_a_kernel_that_is_not_local_is_refused() -> None:
    from eddyline.operators.window import WindowKernel

    kernel = WindowKernel.__new__(WindowKernel)  # (a window's state is found by its windows' ends, not declared)
    assert not local(kernel)
    with pytest.raises(ValueError, match="does not keep its rows to its own keys"):
        InPlaceState(kernel)
