"""Partial aggregates for ``count/sum/min/max/avg``, shared by windows and keyed aggregates.

The types are those of :class:`~eddyline.operators.window.WindowConfig`: a count is an int64, a
sum an int64 (integer input) or a float64 (float or decimal input), min/max keep the input type,
and an average is a sum and a non-null count divided at emission. Partials merge associatively,
so a result does not depend on how rows were split into epochs (float sums may differ in the
last bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.operators.rows import ArrayLike, require_columns, sorted_key_ids, take_or_null

#: a revised input's partial: the rows per key (the sum of their weights); at 0 the key is gone
ROWS = "_n"
#: min/max over a revised input keep value rows (windows here, keyed aggregates too): which
#: aggregate a state row is a value of (0: the window's or key's own row), and its summed weight
SLOT, WEIGHT_SUM = "_slot", "_w"

WINDOW_FUNCS = ("count", "sum", "min", "max", "avg")
KEYED_FUNCS = (*WINDOW_FUNCS, "last", "max_by")


def sum_type(t: pa.DataType) -> pa.DataType:
    return pa.float64() if pa.types.is_floating(t) or pa.types.is_decimal(t) else pa.int64()


def _numeric(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_boolean(t)
    )


@dataclass(frozen=True)
class PartialColumn:
    """One state column of a ``count/sum/min/max`` partial (an ``avg`` has two)."""

    name: str  # state column
    aggregate: str  # the aggregate it belongs to
    kind: str  # "count" | "sum" | "min" | "max": how one row becomes a partial
    source: str | None  # input column; None for count(*)
    type: pa.DataType

    @property
    def merge(self) -> str:
        """The Arrow hash aggregate that merges partials."""
        return "sum" if self.kind in ("count", "sum") else self.kind


def partial_columns(
    aggregates: Sequence[tuple[str, str, str | None]], schema: pa.Schema, what: str = "aggregates"
) -> list[PartialColumn]:
    """The partial columns of ``(name, func, column)`` aggregates with func in count/sum/min/
    max/avg (``WindowConfig.partial_columns`` semantics)."""
    out: list[PartialColumn] = []
    for name, func, col in aggregates:
        if func not in WINDOW_FUNCS:
            raise ValueError(
                f"{what}.{name}: unknown function {func!r}; expected one of {', '.join(WINDOW_FUNCS)}"
            )
        require_columns(schema, [col], f"{what}.{name}")
        if col is None and func != "count":
            raise ValueError(f"{what}.{name}: {func}() needs a column")
        itype = schema.field(col).type if col is not None else None
        if func in ("sum", "avg") and (itype is None or not _numeric(itype)):
            raise ValueError(
                f"{what}.{name}: {func}() expects a numeric column, {col!r} is {itype}"
            )
        if func == "count":
            out.append(PartialColumn(name, name, "count", col, pa.int64()))
        elif func == "avg":
            assert itype is not None
            out.append(PartialColumn(f"{name}__sum", name, "sum", col, sum_type(itype)))
            out.append(PartialColumn(f"{name}__cnt", name, "count", col, pa.int64()))
        elif func == "sum":
            assert itype is not None
            out.append(PartialColumn(name, name, "sum", col, sum_type(itype)))
        else:
            assert itype is not None
            out.append(PartialColumn(name, name, func, col, itype))
    return out


def row_partials(
    table: pa.Table, partials: Sequence[PartialColumn], weight: np.ndarray | None = None
) -> dict[str, ArrayLike]:
    """Each row as a one-row partial: count(*) → 1, count(col) → 1 or 0, others → the value.
    With ``weight`` (a revision's ``_diff``), counts and sums are multiplied by it."""
    n = table.num_rows
    w = pa.array(np.ones(n, dtype=np.int64) if weight is None else weight.astype(np.int64))
    out: dict[str, ArrayLike] = {}
    for p in partials:
        if p.kind == "count" and p.source is None:
            out[p.name] = w
        elif p.kind == "count":
            out[p.name] = pc.multiply(pc.cast(pc.is_valid(table.column(p.source)), pa.int64()), w)
        elif p.kind == "sum" and weight is not None:
            out[p.name] = pc.multiply(pc.cast(table.column(p.source), p.type), pc.cast(w, p.type))
        else:
            out[p.name] = pc.cast(table.column(p.source), p.type)
    return out


def aggregate_fields(
    aggregates: Sequence[tuple[str, str, str | None]], schema: pa.Schema
) -> list[pa.Field]:
    """Output fields of count/sum/min/max/avg aggregates."""
    fields = []
    for name, func, col in aggregates:
        if func == "count":
            fields.append(pa.field(name, pa.int64()))
        elif func == "avg":
            fields.append(pa.field(name, pa.float64()))
        elif func == "sum":
            fields.append(pa.field(name, sum_type(schema.field(col).type)))
        else:
            fields.append(pa.field(name, schema.field(col).type))
    return fields


def finish_aggregates(
    table: pa.Table, aggregates: Sequence[tuple[str, str, str | None]]
) -> dict[str, ArrayLike]:
    """Final values from merged partials: an average is its sum over its non-null count."""
    out: dict[str, ArrayLike] = {}
    for name, func, _col in aggregates:
        if func == "avg":
            s = pc.cast(table.column(f"{name}__sum"), pa.float64())
            c = table.column(f"{name}__cnt")
            out[name] = pc.if_else(
                pc.equal(c, 0),
                pa.scalar(None, pa.float64()),
                pc.divide(s, pc.cast(c, pa.float64())),
            )
        elif func == "sum" and f"{name}__cnt" in table.column_names:  # weighted: none left is null
            c = table.column(f"{name}__cnt")
            out[name] = pc.if_else(pc.equal(c, 0), pa.scalar(None, table.schema.field(name).type), table.column(name))
        else:
            out[name] = table.column(name)
    return out


def merge_partials(
    table: pa.Table, group: np.ndarray, groups: int, columns: Sequence[tuple[str, str]]
) -> dict[str, ArrayLike]:
    """Merge ``columns`` (name, Arrow hash aggregate) of ``table`` per ``group`` (dense ids
    ``0..groups-1``, every id present), in row order: float sums are deterministic when the
    rows are in a deterministic order."""
    if not columns:
        return {}
    gid = "__gid"
    t = pa.table({gid: pa.array(group, pa.int64()), **{c: table.column(c) for c, _ in columns}})
    specs = list(dict.fromkeys(columns))
    g = t.group_by([gid], use_threads=False).aggregate(specs).sort_by(gid)
    assert g.num_rows == groups
    return {c: g.column(f"{c}_{f}") for c, f in columns}

def extremes(
    keys: pa.Table, values: pa.Table, key_schema: pa.Schema, aggregates: Sequence[tuple[str, str]]
) -> dict[str, ArrayLike]:
    """Min/max over value rows (a revised input's, see :class:`KeyedAggregateKernel`): per row of
    ``keys`` and j-th ``(name, min|max)`` of ``aggregates``, the extremum of the values
    (``<name>__v``) of ``values``' rows of slot j + 1 with the same key (``key_schema``'s
    columns); null where there is none. ``values``: the values present (of positive weight)."""
    out: dict[str, ArrayLike] = {}
    for j, (name, func) in enumerate(aggregates):
        mine = values.filter(pc.equal(values.column(SLOT), j + 1))
        (kid, vid), distinct = sorted_key_ids([keys, mine], key_schema)
        v = mine.column(f"{name}__v")
        result = pa.nulls(keys.num_rows, v.type)
        if mine.num_rows:
            g = pa.table({"g": pa.array(vid), "v": v}).group_by(["g"], use_threads=False).aggregate([("v", func)])
            row_of = np.full(distinct.num_rows, -1, dtype=np.int64)  # key id -> its row of g
            row_of[g.column("g").to_numpy()] = np.arange(g.num_rows)
            result = take_or_null(g.column(f"v_{func}"), row_of[kid])
        out[name] = result
    return out
