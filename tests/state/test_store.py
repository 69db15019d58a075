"""Contract of the key-group state store: whatever is written can be loaded back, cold or cached."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.state.store import KeyGroupStore, StateCache
from tests.state.storerows import PK, SCHEMA, as_dict, store, table

ops = st.lists(
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 6)), st.one_of(st.none(), st.integers(0, 99))),
    max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(epochs=st.lists(ops, min_size=1, max_size=10), lanes=st.lists(st.integers(0, 2), min_size=10, max_size=10))
def test_chains_reproduce_the_model(tmp_path_factory: pytest.TempPathFactory, epochs, lanes) -> None:
    """Random upserts (v given) and deletes (v None), each epoch written by some lane, loaded cold."""
    root = tmp_path_factory.mktemp("state")
    writer = store(root)
    model: dict[tuple[int, int | None], int] = {}
    index: dict[int, list] = {}
    for epoch, batch in enumerate(epochs, start=1):
        ups, dels = {}, {}
        for kg, key, v in batch:
            if v is None:
                model.pop((kg, key), None)
                ups.pop((kg, key), None)
                dels[(kg, key)] = 0
            else:
                model[(kg, key)] = v
                ups[(kg, key)] = v
                dels.pop((kg, key), None)
        changed = {kg for kg, _, _ in batch}
        res = writer.write(epoch, lanes[epoch - 1], index, table(model), table(ups), table(dels).select(list(PK)), changed)
        for kg, chain in res.chains.items():
            if chain is None:
                index.pop(kg, None)
            else:
                index[kg] = chain
        cold = store(root)  # a fresh process: nothing cached
        assert as_dict(cold.load(index, range(4))) == model
        assert as_dict(writer.load(index, range(4))) == model


def test_deltas_then_snapshot(tmp_path: Path) -> None:
    s = store(tmp_path, snapshot_every=3)
    base = {(0, k): k for k in range(10)}
    index: dict[int, list] = {}
    kinds = []
    for epoch in range(1, 6):
        base[(0, 0)] = epoch
        res = s.write(epoch, 0, index, table(base), table({(0, 0): epoch}), table({}).select(list(PK)), [0])
        index[0] = res.chains[0]
        kinds.append(index[0][-1][2])
    # new, then deltas, a snapshot in the group's phase ((epoch + kg) mod 3 = 0), deltas
    assert kinds == ["s", "d", "s", "d", "d"]
    assert as_dict(store(tmp_path).load(index, [0])) == base


def test_groups_born_together_take_their_snapshots_in_turns(tmp_path: Path) -> None:
    """Not all at once when their chains reach the limit: each epoch writes a quarter of them whole."""
    s = store(tmp_path, snapshot_every=4)
    groups = list(range(12))
    base = {(kg, k): k for kg in groups for k in range(20)}
    index: dict[int, list] = {}
    per_epoch = []
    for epoch in range(1, 14):
        for kg in groups:
            base[(kg, 0)] = epoch
        res = s.write(epoch, 0, index, table(base), table({(kg, 0): epoch for kg in groups}),
                      table({}).select(list(PK)), groups)
        index.update(res.chains)
        per_epoch.append(res.snapshots)
        assert max(len(c) for c in index.values()) <= 4
    assert per_epoch[0] == 12 and per_epoch[1:] == [3] * 12
    assert as_dict(store(tmp_path).load(index, groups)) == base


def test_cache_budget_is_respected_and_misses_reload(tmp_path: Path) -> None:
    cache = StateCache(budget_bytes=4_000)
    s = KeyGroupStore(str(tmp_path), "agg", SCHEMA, PK, cache=cache)
    rows = {(kg, k): k for kg in range(8) for k in range(50)}
    res = s.write(1, 0, {}, table(rows), table(rows), table({}).select(list(PK)), range(8))
    index = {kg: c for kg, c in res.chains.items() if c}
    assert cache.used <= cache.budget and cache.evictions > 0
    assert as_dict(s.load(index, range(8))) == rows
    assert cache.misses > 0


def test_null_keys_are_deleted_and_updated(tmp_path: Path) -> None:
    s = store(tmp_path, snapshot_every=100)
    first = {(0, None): 1, (0, 1): 2, (0, 2): 3, **{(0, k): k for k in range(3, 10)}}
    res = s.write(1, 0, {}, table(first), table(first), table({}).select(list(PK)), [0])
    index = {0: res.chains[0]}
    second = {k: v for k, v in first.items() if k != (0, 2)} | {(0, None): 5}
    res = s.write(2, 0, index, table(second), table({(0, None): 5}), table({(0, 2): 0}).select(list(PK)), [0])
    index = {0: res.chains[0]}
    assert index[0][-1][2] == "d"
    assert as_dict(store(tmp_path).load(index, [0])) == second


def test_uri_root_and_cleanup(tmp_path: Path) -> None:
    s = store(f"file://{tmp_path}")
    index: dict[int, list] = {}
    for epoch in range(1, 4):
        rows = {(0, 1): epoch}
        res = s.write(epoch, 0, index, table(rows), table(rows), table({}).select(list(PK)), [0])
        index = {0: res.chains[0]}
    files = sorted(p.name for p in (tmp_path / "state" / "agg").iterdir())
    assert len(files) == 3
    removed = s.cleanup([index], below_epoch=3)
    assert removed == 2 - sum(seg[0] < 3 for seg in index[0])
    assert as_dict(store(tmp_path).load(index, [0])) == {(0, 1): 3}


def _changes(before: dict, batch: list) -> tuple[dict, dict, dict]:
    """``batch`` (as :data:`ops`) applied to ``before``: the state after, its upserts, its deletes."""
    after, ups, dels = dict(before), {}, {}
    for kg, key, v in batch:
        if v is None:
            if (kg, key) in after:
                del after[(kg, key)]
                dels[(kg, key)] = 0
            ups.pop((kg, key), None)
        else:
            after[(kg, key)] = v
            ups[(kg, key)] = v
    return after, ups, dels


@settings(max_examples=60, deadline=None)
@given(start=ops, first=ops, then=ops)
def test_two_changes_merged_rebuild_the_state(start, first, then) -> None:
    """A kernel called twice in one epoch (a watermark advanced after the rows): the two
    changes told as one rebuild, from the state before, the state after both, null keys too."""
    from eddyline.columns import OP
    from eddyline.state.store import apply_delta, merged_changes

    s0, _, _ = _changes({}, start)
    s1, ups1, dels1 = _changes(s0, first)
    s2, ups2, dels2 = _changes(s1, then)
    keys = list(PK)
    upserts, deletes = merged_changes(
        (table(ups1), table(dels1).select(keys)), (table(ups2), table(dels2).select(keys)), SCHEMA, PK
    )
    delta = pa.concat_tables([
        upserts.append_column(OP, pa.array([0] * upserts.num_rows, pa.int8())),
        pa.table({"_kg": deletes.column("_kg"), "key": deletes.column("key"), "v": pa.nulls(deletes.num_rows, pa.int64()),
                  OP: pa.array([1] * deletes.num_rows, pa.int8())}, schema=SCHEMA.append(pa.field(OP, pa.int8()))),
    ])
    assert as_dict(apply_delta(table(s0), delta, keys)) == s2
    named = list(zip(upserts.column("_kg").to_pylist(), upserts.column("key").to_pylist(), strict=True))
    assert len(named) == len(set(named)), "a key upserted twice in one delta"
