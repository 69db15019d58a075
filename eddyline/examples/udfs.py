"""Sample user functions for the ``udf`` step (and the tests)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: Nexmark q1's dollar-to-euro rate.
EUR_PER_USD = 0.908


def to_euro(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Nexmark q1 on Arrow: price in euro cents; refuses negative prices."""
    price = batch.column("price")
    if pc.any(pc.less(price, 0)).as_py():
        raise ValueError("negative price")
    euro = pc.cast(pc.floor(pc.multiply(pc.cast(price, pa.float64()), EUR_PER_USD)), pa.int64())
    return batch.set_column(batch.schema.get_field_index("price"), "price", euro)


def price_band(frame: pd.DataFrame) -> pd.DataFrame:
    """On pandas: a coarse band per price (0: < 1000, 1: < 100000, 2: otherwise)."""
    band = (frame["price"] >= 1_000).astype("int64") + (frame["price"] >= 100_000).astype("int64")
    return frame.assign(band=band)
