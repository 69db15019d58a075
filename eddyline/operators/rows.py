"""The row machinery the keyed kernels share (:mod:`~eddyline.operators.keyed`,
:mod:`~eddyline.operators.dedup`, :mod:`~eddyline.operators.topk`,
:mod:`~eddyline.operators.session`, :mod:`~eddyline.operators.over`,
:mod:`~eddyline.operators.pattern`):

* **a total order over rows**: kernels must not depend on the row order of a batch, so every
  choice between rows (the first row of a key, the k-th row of a partition) is made after a
  stable sort on the columns that matter, then on every other column. Rows equal in every
  column are indistinguishable, so which of them comes first cannot change any result;
* **grouping by sorting**: after the sort, a group is a run of equal key values. Unlike a hash
  join, this treats a null key as a value like any other (nulls group together) and gives each
  group a dense id for numpy segment arithmetic (:func:`sorted_key_ids` numbers the keys of
  several tables at once, in key order);
* event times as int64 milliseconds or nanoseconds, and back;
* a changelog's weights summed per row (:func:`consolidated`), for the joins and the PostgreSQL sink.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF, KG
from eddyline.operators.base import key_groups_of, sortable

ArrayLike = pa.Array | pa.ChunkedArray
TIMESTAMP = pa.timestamp("us", tz="UTC")
_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def event_time_ms(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Timestamps (any unit) → int64 milliseconds since the epoch."""
    if pa.types.is_timestamp(column.type):
        unit = column.type.unit
        ints = pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)
        div = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        return (ints * 1000) if unit == "s" else ints // int(div)
    return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)


def with_key_group(schema: pa.Schema) -> pa.Schema:
    """``schema`` with a ``_kg int32`` column (appended when missing, retyped when present)."""
    if KG in schema.names:
        return schema.set(schema.get_field_index(KG), pa.field(KG, pa.int32()))
    return schema.append(pa.field(KG, pa.int32()))


def nullable(field: pa.Field) -> pa.Field:
    """``field`` allowing nulls: state tables are written with null fillers (deleted keys)."""
    return field.with_nullable(True)


def require_columns(schema: pa.Schema, columns: Iterable[str | None], what: str) -> None:
    """Raise a ``ValueError`` naming the first of ``columns`` that ``schema`` lacks."""
    have = [n for n in schema.names if n != KG]
    for c in columns:
        if c is not None and c not in have:
            raise ValueError(f"{what}: unknown column {c!r}; input has {', '.join(have)}")


def normalize(table: pa.Table | None, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in one chunk (``None`` → empty)."""
    if table is None:
        return schema.empty_table()
    return table.select(schema.names).cast(schema).combine_chunks()


def on_time(batch: pa.Table, time: str, watermark_ms: int) -> tuple[pa.Table, np.ndarray, int]:
    """``(rows, their event times in ms, late count)``: rows without an event time, or behind the
    watermark, are late."""
    t_all, valid = event_times(batch.column(time))
    live = valid & (t_all >= watermark_ms)
    late = int(batch.num_rows - live.sum())
    return (batch.filter(pa.array(live)) if late else batch), t_all[live], late


def event_times(column: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(milliseconds, valid)`` per row: a row without an event time has ``valid`` False."""
    if len(column) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(0, pa.int64()).cast(column.type))
    return np.asarray(event_time_ms(column), dtype=np.int64), valid


def split_by_key_groups(state: pa.Table, kgs: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """``(rows of key groups kgs, the others)``: work is confined to the key groups a batch
    touches, so an epoch costs O(batch + touched state), not O(state)."""
    mask = np.isin(key_groups_of(state), kgs)
    return state.filter(pa.array(mask)), state.filter(pa.array(~mask))


def split_by_keys(state: pa.Table, rows: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """``(state rows that may share a key with rows, the others)``, for a kernel whose rows meet
    only the state of their own key. The rows are matched on the first key column alone, so the
    first part may hold more than the rows' keys (every state row of them is in it): one hash of
    the rows' values and a probe per state row. Confining to key groups instead
    (:func:`split_by_key_groups`, the fallback for keys Arrow cannot hash) costs a sort of nearly
    the whole state once a batch touches every group, which a busy one does."""
    if not keys:
        return split_by_key_groups(state, np.unique(key_groups_of(rows)))
    if not (rows.num_rows and state.num_rows):
        return state.slice(0, 0), state
    mask = among(state.column(keys[0]), rows.column(keys[0]))
    if mask is None:
        return split_by_key_groups(state, np.unique(key_groups_of(rows)))
    return state.filter(mask), state.filter(pc.invert(mask))


def among(values: pa.ChunkedArray, of: pa.ChunkedArray) -> pa.Array | None:
    """Whether each of ``values`` is one of ``of``, null matching null; None for a type Arrow
    cannot hash (a struct, a list). Integers and timestamps without nulls go through numpy,
    whose sort-based test is twice as fast as Arrow's hash probe on a large state."""
    t = values.type
    numeric = pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)
    if numeric and not values.null_count and not of.null_count:
        return pa.array(np.isin(values.to_numpy(), pc.unique(of).to_numpy()))
    try:
        return pc.is_in(values, value_set=pc.unique(of), skip_nulls=False)
    except pa.ArrowNotImplementedError:
        return None


def orderable(column: ArrayLike) -> list[tuple[pa.Array, bool]]:
    """Arrays that sort and compare like ``column``, each with whether it follows the requested
    direction (a struct's null flag does not: nulls stay last).

    Arrow sorts and compares the common types directly; a dictionary is decoded; a struct
    becomes its null flag then its fields; anything else (lists, maps, ...) is compared by the
    text of its values, a per-row fallback meant for rare key types only.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = arr.type
    if pa.types.is_dictionary(t):
        return orderable(arr.cast(t.value_type))
    if sortable(t):
        return [(arr, True)]
    if pa.types.is_struct(t):
        parts: list[tuple[pa.Array, bool]] = [(pc.is_null(arr), False)]
        for child in arr.flatten():
            parts += orderable(child)
        return parts
    text = [None if v is None else repr(v) for v in arr.to_pylist()]
    return [(pa.array(text, pa.string()), True)]


def sort_indices(keys: Sequence[tuple[ArrayLike, str]], n: int) -> np.ndarray:
    """Indices that sort ``n`` rows by ``keys`` (array, "ascending" | "descending"); nulls (and
    NaN) last in either direction; stable."""
    cols: dict[str, pa.Array] = {}
    sort_keys: list[tuple[str, str]] = []
    for arr, order in keys:
        for part, follows in orderable(arr):
            name = f"c{len(cols)}"
            cols[name] = part
            sort_keys.append((name, order if follows else "ascending"))
    if not cols or n == 0:
        return np.arange(n, dtype=np.int64)
    return np.asarray(
        pc.sort_indices(pa.table(cols), sort_keys=sort_keys).to_numpy(), dtype=np.int64
    )


def equal_null_safe(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise equality where null equals null and NaN equals NaN."""
    n = len(a)
    if pa.types.is_null(a.type):
        return np.ones(n, dtype=bool)
    eq = np.asarray(pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False), dtype=bool)
    if a.null_count or b.null_count:
        both = np.asarray(
            pc.and_(pc.is_null(a), pc.is_null(b)).to_numpy(zero_copy_only=False), dtype=bool
        )
        eq |= both
    if pa.types.is_floating(a.type):
        na = pc.fill_null(pc.is_nan(a), False).to_numpy(zero_copy_only=False)
        nb = pc.fill_null(pc.is_nan(b), False).to_numpy(zero_copy_only=False)
        eq |= np.asarray(na, dtype=bool) & np.asarray(nb, dtype=bool)
    return eq


def same_values(left: Sequence[ArrayLike], right: Sequence[ArrayLike], n: int) -> np.ndarray:
    """Per row, whether every column of ``left`` equals the matching column of ``right``."""
    same = np.ones(n, dtype=bool)
    for a, b in zip(left, right, strict=True):
        for (pa_, _), (pb, _) in zip(orderable(a), orderable(b), strict=True):
            same &= equal_null_safe(pa_, pb)
    return same


def key_codes(
    state_keys: Sequence[ArrayLike], row_keys: Sequence[ArrayLike]
) -> tuple[np.ndarray, np.ndarray, int]:
    """Dense integer codes for the keys of state rows and of batch rows, from one hash encoding
    of both, so equal keys get equal codes (null equals null, as in :func:`run_starts`):
    ``(state codes, row codes, number of codes)``. O(rows + state), no sort: kernels use it to
    settle the rows that state or an earlier row of their key already decides before they sort
    the rest."""
    ns = len(state_keys[0]) if state_keys else 0
    nr = len(row_keys[0]) if row_keys else 0
    if not state_keys:  # no key columns: one key
        return np.zeros(ns, np.int64), np.zeros(nr, np.int64), 1
    code = np.zeros(ns + nr, dtype=np.int64)
    size = 1
    for s, r in zip(state_keys, row_keys, strict=True):
        s = s.combine_chunks() if isinstance(s, pa.ChunkedArray) else s
        r = r.combine_chunks() if isinstance(r, pa.ChunkedArray) else r
        for part, _ in orderable(pa.concat_arrays([s, r.cast(s.type)])):
            enc = pc.dictionary_encode(part, null_encoding="encode")
            code = code * len(enc.dictionary) + enc.indices.to_numpy(zero_copy_only=False)
            if size > 1:  # keep the codes dense (and far from overflowing)
                code = np.unique(code, return_inverse=True)[1].astype(np.int64)
            size = int(code.max()) + 1 if code.size else 1
    return code[:ns], code[ns:], size


def run_starts(columns: Sequence[ArrayLike], n: int) -> np.ndarray:
    """For sorted rows: True where a row differs from the previous one in any of ``columns``
    (the first row always starts a run)."""
    starts = np.zeros(n, dtype=bool)
    if n == 0:
        return starts
    starts[0] = True
    for col in columns:
        for part, _ in orderable(col):
            starts[1:] |= ~equal_null_safe(part.slice(1), part.slice(0, n - 1))
    return starts


def segments(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(group id per row, first row per group, size per group)`` from run starts."""
    gid = np.cumsum(starts, dtype=np.int64) - 1
    firsts = np.flatnonzero(starts)
    sizes = np.diff(np.append(firsts, len(starts)))
    return gid, firsts, sizes


def ranks_in_segments(starts: np.ndarray) -> np.ndarray:
    """Position of each row inside its run of equal values (0 at every ``starts``)."""
    gid, firsts, _sizes = segments(starts)
    return np.arange(len(starts), dtype=np.int64) - firsts[gid]


def sorted_key_ids(
    parts: Sequence[pa.Table], key_schema: pa.Schema
) -> tuple[list[np.ndarray], pa.Table]:
    """Dense ids of the distinct keys (``key_schema``'s columns, nulls grouping together) over
    ``parts``, numbered in ascending key order: ``(the ids per part, the distinct keys)``. Unlike
    :func:`key_codes` the ids follow the key order, so a kernel walking keys by id walks them in
    ``(_kg, keys)`` order."""
    cols = key_schema.names
    keys = pa.concat_tables([p.select(cols).cast(key_schema) for p in parts])
    n = keys.num_rows
    order = sort_indices([(keys.column(c), "ascending") for c in cols], n)
    ordered = keys.take(pa.array(order))
    gid, firsts, _sizes = segments(run_starts([ordered.column(c) for c in cols], n))
    ids = np.empty(n, dtype=np.int64)
    ids[order] = gid
    bounds = np.cumsum([0, *(p.num_rows for p in parts)])
    per_part = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return per_part, ordered.take(pa.array(firsts, pa.int64()))


def int_values(column: ArrayLike, null: int) -> np.ndarray:
    """An integer column as int64 numpy, nulls replaced by ``null``."""
    if len(column) == 0:
        return np.zeros(0, dtype=np.int64)
    filled = pc.fill_null(pc.cast(column, pa.int64()), null)
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)


def take_or_null(column: ArrayLike, idx: np.ndarray) -> ArrayLike:
    """``column`` taken at ``idx``; ``-1`` gives a null."""
    return column.take(pa.array(idx, type=pa.int64(), mask=idx < 0))



def ms_to_timestamp(ms: np.ndarray) -> pa.Array:
    """int64 milliseconds → ``timestamp[us, UTC]``."""
    return pc.cast(pa.array(np.asarray(ms, dtype=np.int64) * 1000, pa.int64()), TIMESTAMP)


def time_ns(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Event times → ``(int64 nanoseconds since the epoch, valid mask)``.

    Timestamps of any unit are converted exactly; integer columns are taken as milliseconds.
    Nulls are filled before leaving Arrow: a null-bearing int64 column would otherwise become
    float64 in numpy and lose precision.
    """
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    ints = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
    unit = column.type.unit if pa.types.is_timestamp(column.type) else "ms"
    return ints.astype(np.int64) * _NS_PER[unit], valid


def ns_to_ms(ns: np.ndarray) -> np.ndarray:
    """Floor to milliseconds. With an integer watermark ``W``: ``t < W`` ⇔ ``floor(t) < W``."""
    return np.floor_divide(ns, 1_000_000)


def consolidated(changelog: pa.Table) -> pa.Table:
    """``changelog`` with its weights summed per row and the rows that cancel left out (in the
    order rows first appear), so that a retracted row still in the state and its insertion do
    not both pair with every new partner. Rows of types Arrow cannot group stay as they are."""
    names = [c for c in changelog.column_names if c != DIFF]
    try:
        summed = changelog.group_by(names, use_threads=False).aggregate([(DIFF, "sum")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return changelog
    summed = summed.select([*names, f"{DIFF}_sum"]).rename_columns([*names, DIFF])
    return summed.filter(pc.not_equal(summed.column(DIFF), 0))
