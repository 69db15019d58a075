"""The row helpers the kernels share."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from eddyline.columns import KG
from eddyline.operators.rows import split_by_keys

VALUES = {
    "int": (pa.int64(), [1, 2, 3, 4, 5, 6]),
    "int with nulls": (pa.int64(), [1, None, 3, 4, None, 6]),
    "string": (pa.string(), ["a", "b", None, "d", "é", "f"]),
    "timestamp": (pa.timestamp("ms"), [0, 1_000, 2_000, 3_000, 4_000, 5_000]),
    "struct": (pa.struct([("x", pa.int64())]), [{"x": i} for i in range(6)]),
}


@pytest.mark.parametrize("kind", list(VALUES))
def test_split_by_keys_puts_every_state_row_of_a_batch_key_first(kind: str) -> None:
    """Whatever the key's type (a struct by key group), the first part holds every state row
    whose key is among the batch's and the two parts hold the state exactly once."""
    dtype, values = VALUES[kind]
    rng = np.random.default_rng(3)
    pick = rng.integers(0, len(values), 200)
    state = pa.table({KG: pa.array(pick % 4, pa.int32()), "k": pa.array([values[i] for i in pick], dtype),
                      "n": np.arange(200)})
    batch = pa.table({KG: pa.array([2, 1], pa.int32()), "k": pa.array([values[2], values[1]], dtype)})
    touched, rest = split_by_keys(state, batch, ["k"])
    assert Counter(touched.column("n").to_pylist()) + Counter(rest.column("n").to_pylist()) == Counter(range(200))
    def key(v: object) -> object:
        return tuple(sorted(v.items())) if isinstance(v, dict) else v

    wanted = {key(v) for v in batch.column("k").to_pylist()}
    taken = set(touched.column("n").to_pylist())
    for row in state.to_pylist():
        if key(row["k"]) in wanted:
            assert row["n"] in taken, row
        elif row["n"] in taken:  # more only where the key cannot be hashed: the batch's key groups
            assert kind == "struct" and row[KG] in (1, 2), row
    empty, everything = split_by_keys(state, batch.slice(0, 0), ["k"])
    assert empty.num_rows == 0 and everything.num_rows == 200
