"""Input rows of the window kernel's tests (also the lane tests' kernel input)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def make_rows(n: int, seed: int = 0, keys: int = 5, span_ms: int = 60_000) -> pa.Table:
    rng = np.random.default_rng(seed)
    price = rng.integers(0, 1000, n)
    mask = rng.random(n) < 0.1  # some null prices: count(col) and sum must skip them
    return pa.table(
        {
            "auction": pa.array(rng.integers(0, keys, n), pa.int64()),
            "price": pa.array(price, pa.int64(), mask=mask),
            "ts": pa.array(
                np.sort(rng.integers(0, span_ms, n)) * 1000, pa.timestamp("us", tz="UTC")
            ),
        }
    )
