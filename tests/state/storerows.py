"""A key-group store over a small schema, and its state as rows, for the store's and the lanes' tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from eddyline.state.store import KeyGroupStore, StateCache

SCHEMA = pa.schema([("_kg", pa.int32()), ("key", pa.int64()), ("v", pa.int64())])
PK = ("_kg", "key")


def table(rows: dict[tuple[int, int | None], int]) -> pa.Table:
    items = sorted(rows.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1]))
    return pa.table(
        {"_kg": [k[0] for k, _ in items], "key": [k[1] for k, _ in items], "v": [v for _, v in items]},
        schema=SCHEMA,
    )


def as_dict(t: pa.Table) -> dict[tuple[int, int | None], int]:
    d = t.to_pydict()
    return {(g, k): v for g, k, v in zip(d["_kg"], d["key"], d["v"], strict=True)}


def store(root: Path | str, cache_bytes: int = 1 << 20, snapshot_every: int = 4) -> KeyGroupStore:
    return KeyGroupStore(str(root), "agg", SCHEMA, PK, snapshot_every=snapshot_every, cache=StateCache(cache_bytes))
