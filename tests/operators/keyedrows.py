"""Rows and checks the keyed kernels' tests share: key groups added, batches cut into epochs, rows as
comparable tuples, and the contract every keyed kernel's result keeps."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from eddyline.columns import KG
from eddyline.columns import OP as DELTA_OP
from eddyline.operators.base import Kernel, KernelResult
from eddyline.state.store import apply_delta

TS = pa.timestamp("us", tz="UTC")

# ================================================================================ shared helpers
def with_kg(rows: pa.Table, keys: Sequence[str], groups: int = 5) -> pa.Table:
    """``rows`` plus ``_kg``: a deterministic function of the key values (nulls included)."""
    cols = [rows.column(k).to_pylist() for k in keys]
    kg = [
        zlib.crc32(repr(tuple(c[i] for c in cols)).encode()) % groups for i in range(rows.num_rows)
    ]
    return rows.append_column(KG, pa.array(kg, pa.int32()))


def norm(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else float(f"{v:.9g}")
    return v


def row_tuples(table: pa.Table, columns: Sequence[str] | None = None) -> list[tuple]:
    cols = [table.column(c).to_pylist() for c in (columns or table.column_names)]
    return [tuple(norm(c[i]) for c in cols) for i in range(table.num_rows)]


def multiset(table: pa.Table, columns: Sequence[str] | None = None) -> Counter:
    return Counter(row_tuples(table, columns))


def check_result(kernel: Kernel, prev: pa.Table, res: KernelResult) -> None:
    """The contract of one epoch: schemas; unique primary keys; upserts/deletes applied to the
    previous state give the new state; they are exact (an upsert changes its row, a delete names
    a row that existed and is gone); changed key groups are exactly those whose rows changed."""
    pk = list(kernel.primary_key)
    assert pk[0] == KG
    assert res.output.schema.equals(kernel.output_schema), (res.output.schema, kernel.output_schema)
    assert res.state.schema.equals(kernel.state_schema)
    assert res.upserts.schema.equals(kernel.state_schema)
    assert res.deletes.column_names == pk
    new_keys = row_tuples(res.state, pk)
    assert len(set(new_keys)) == len(new_keys), "state primary key is not unique"
    delta = pa.concat_tables(
        [
            res.upserts.append_column(DELTA_OP, pa.array(np.zeros(res.upserts.num_rows, np.int8))),
            pa.table(
                {
                    **{
                        f.name: (
                            res.deletes.column(f.name)
                            if f.name in pk
                            else pa.nulls(res.deletes.num_rows, f.type)
                        )
                        for f in kernel.state_schema
                    },
                    DELTA_OP: pa.array(np.ones(res.deletes.num_rows, np.int8)),
                }
            ).cast(kernel.state_schema.append(pa.field(DELTA_OP, pa.int8()))),
        ]
    )
    applied = apply_delta(prev, delta, pk)
    assert multiset(applied) == multiset(res.state), (
        "upserts/deletes do not turn the old state into the new"
    )
    old = dict(zip(row_tuples(prev, pk), row_tuples(prev), strict=True))
    new = dict(zip(new_keys, row_tuples(res.state), strict=True))
    for key, row in zip(row_tuples(res.upserts, pk), row_tuples(res.upserts), strict=True):
        assert old.get(key) != row, f"upsert of an unchanged row {row}"
    dels = row_tuples(res.deletes)
    assert len(set(dels)) == len(dels)
    ups = set(row_tuples(res.upserts, pk))
    for key in dels:
        assert key in old and key not in new and key not in ups, f"inexact delete {key}"
    changed = {k[0] for k in set(old) ^ set(new)} | {
        k[0] for k in old.keys() & new.keys() if old[k] != new[k]
    }
    assert sorted(changed) == list(res.changed_key_groups)


def cut(rows: pa.Table, cuts: Sequence[int]) -> tuple[list[pa.Table], list[int]]:
    bounds = sorted({0, rows.num_rows, *(c for c in cuts if 0 <= c <= rows.num_rows)})
    return [rows.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)], bounds
