"""A lane names the most frequent key of its busiest key groups, whatever order rows arrive in."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from eddyline.runtime.lanes import heavy_hitters


def test_the_busiest_groups_hottest_keys_from_unsorted_rows() -> None:
    # key group 5: key "a" x3, "b" x1; key group 9: "c" x2; key group 2: "d" x1 (rows interleaved)
    keys = ["a", "c", "b", "a", "d", "c", "a"]
    kgs = np.array([5, 9, 5, 5, 2, 9, 5], dtype=np.int32)
    rows = pa.table({"k": keys, "_kg": kgs})
    found = heavy_hitters(rows, kgs, np.bincount(kgs), ("k",))
    assert found == [
        {"kg": 5, "key": "a", "rows": 3, "share": round(3 / 7, 4)},
        {"kg": 9, "key": "c", "rows": 2, "share": round(2 / 7, 4)},
    ]


def test_a_joins_key_is_either_sides_column() -> None:
    # a join's rows carry the key in the left or the right column (the other is null)
    left = pa.array(["x", None, "x", None], pa.string())
    right = pa.array([None, "x", None, "y"], pa.string())
    kgs = np.array([1, 1, 1, 1], dtype=np.int32)
    rows = pa.table({"lk": left, "rk": right})
    found = heavy_hitters(rows, kgs, np.bincount(kgs), ("lk", "rk"))
    assert found == [{"kg": 1, "key": "x", "rows": 3, "share": 0.75}]
    assert heavy_hitters(rows, kgs, np.bincount(kgs), ("missing",)) == []
