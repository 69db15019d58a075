"""A resident lane's state of one step, kept in place: an epoch costs what its rows touch, not
what the lane holds.

A pure kernel takes a state table and returns the new one whole, so a lane that hands it its
whole state pays for every row it holds, every epoch (a probe of the batch's keys against all of
them, a copy of all of them into the new table, a scan for the ones to forget). A kernel that is
*local* promises two things (:class:`LocalKernel`): a state row meets only batch rows of its own
key (``local_keys``), and an untouched row changes, fires or leaves only once the watermark is
past its ``deadline``. Such a kernel gives the same output and the same changes when it is given
only the state rows of the batch's keys and the rows whose deadline the watermark passed (or
more: rows it does not touch come back unchanged). :class:`InPlaceState` finds those rows by an
index and applies the kernel's changes (its upserts and deletes, which the checkpoint's deltas
are made of anyway) where the rows are, so an epoch of a few thousand rows against millions held
costs a few milliseconds.

How the rows are held: a *base* table sorted by key group (the rows of a group are one slice, so
a snapshot of a group costs its own rows) and the *young* tables of the epochs since, each with
a mask of the rows still alive; per table, the 64-bit hash of each row's local keys and each
row's deadline. The index is two sorted arrays of hashes (the base's, built once, and the young
tables', merged an epoch at a time); the rows past their deadline are found by a pointer that
moves along each table's deadlines in order (sorted once the watermark first reaches the
earliest). Past 32 young tables they become one; when the young rows reach a sixteenth of the
base, everything alive becomes the new base: a pass over every row held (about two seconds at
five million), which is why a lane keeps a state in place only while its epochs change little of
it (:mod:`eddyline.runtime.resident`). A hash collision only adds rows the kernel hands back
unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.operators.base import Kernel, KernelResult
from eddyline.operators.rows import key_codes

#: an offset is (table << 32) | row: a table holds fewer than 2**32 rows
_ROW_BITS = 32
_ROW_MASK = (1 << _ROW_BITS) - 1
_NEVER = np.iinfo(np.int64).max
_MIX = np.uint64(0x9E3779B97F4A7C15)


@runtime_checkable
class LocalKernel(Kernel, Protocol):
    """A kernel whose state rows meet only batch rows of their own key, and change untouched
    only once the watermark is past their deadline (see the module docstring)."""

    #: the columns (of the state and the batch) that say which rows meet
    local_keys: tuple[str, ...]

    def deadline(self, state: pa.Table) -> np.ndarray | None:
        """Per state row (int64 ms), the watermark past which the kernel changes, fires or
        forgets it even when no batch row touches it, and before which it leaves it as it is
        (exact: a row handed over for its deadline and left as it was is not handed over again);
        None: no row ever changes untouched."""
        ...


def hashable(schema: pa.Schema, keys: Sequence[str]) -> bool:
    """Whether :func:`key_hashes` takes these key columns."""
    return all(_kind(schema.field(k).type) is not None for k in keys)


def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_boolean(t):
        return "int"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    return None


def key_hashes(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """A 64-bit hash of each row's ``keys`` (uint64): equal keys, equal hashes (null equal to
    null). Not Spark's hash (key groups are): a fast one, vectorised for integers and text."""
    n = table.num_rows
    h = np.zeros(n, np.uint64)
    for k in keys:
        col = table.column(k).combine_chunks() if table.num_rows else pa.array([], table.schema.field(k).type)
        part = _ints(col) if _kind(col.type) == "int" else _bytes(col)
        if col.null_count:
            part = np.where(col.is_valid().to_numpy(zero_copy_only=False), part, np.uint64(0x5BD1E995))
        h = _mixed(h * _MIX + part)
    return h


def _ints(col: pa.Array) -> np.ndarray:
    if pa.types.is_boolean(col.type):
        col = col.cast(pa.int8())
    values = col.cast(pa.int64()) if not pa.types.is_int64(col.type) else col
    return pc.fill_null(values, 0).to_numpy(zero_copy_only=False).view(np.uint64)


def _bytes(col: pa.Array) -> np.ndarray:
    """A polynomial hash of each value's bytes, all values at once (offsets into one buffer)."""
    large = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
    col = col.cast(pa.large_binary() if large else pa.binary())
    offsets = np.frombuffer(col.buffers()[1], np.int64 if large else np.int32)[col.offset: col.offset + len(col) + 1]
    data = np.frombuffer(col.buffers()[2], np.uint8) if col.buffers()[2] is not None else np.zeros(0, np.uint8)
    lo, hi = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    lengths = hi - lo
    out = lengths.astype(np.uint64) * _MIX
    total = int(lengths.sum())
    if total:
        owner = np.repeat(np.arange(len(col)), lengths)
        at = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # position in its value
        taken = data[np.repeat(lo, lengths) + at].astype(np.uint64)
        with np.errstate(over="ignore"):
            powers = np.cumprod(np.full(int(lengths.max()), np.uint64(1099511628211)), dtype=np.uint64)
            np.add.at(out, owner, taken * powers[at])
    return _mixed(out)


def _mixed(h: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix's): every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def local(kernel: Kernel) -> bool:
    """Whether a lane may keep ``kernel``'s state in place (:class:`InPlaceState`)."""
    keys = getattr(kernel, "local_keys", None)
    return (isinstance(kernel, LocalKernel) and bool(keys)
            and hashable(kernel.state_schema, keys) and hashable(kernel.input_schema, keys))


class _Table:
    """One table of the held rows: its rows, which are alive, their hashes and their deadlines
    (put in order only once the watermark first reaches the earliest: a state whose rows expire
    late never pays for the sort)."""

    def __init__(self, rows: pa.Table, hashes: np.ndarray, deadlines: np.ndarray | None):
        self.rows, self.hashes = rows, hashes
        self.alive = np.ones(rows.num_rows, bool)
        self.kgs = rows.column(KG).to_numpy(zero_copy_only=False).astype(np.int64) if rows.num_rows else np.zeros(0, np.int64)
        self.deadlines = deadlines  # per row (None: no row has one)
        self.earliest = int(deadlines.min()) if deadlines is not None and deadlines.size else _NEVER
        self.by_deadline: np.ndarray | None = None  # the rows in the order of their deadlines, once needed
        self.passed = 0  # by_deadline[:passed]: handed over already as past their deadline

    def due(self, watermark_ms: int) -> np.ndarray:
        """The rows (alive) whose deadline ``watermark_ms`` passes that were not handed over yet."""
        if self.deadlines is None or watermark_ms <= self.earliest:
            return np.zeros(0, np.int64)
        if self.by_deadline is None:
            self.by_deadline = np.argsort(self.deadlines, kind="stable")
            self.sorted_deadlines = self.deadlines[self.by_deadline]
        upto = int(np.searchsorted(self.sorted_deadlines, watermark_ms, side="left"))
        if upto <= self.passed:
            return np.zeros(0, np.int64)
        rows = self.by_deadline[self.passed: upto]
        self.passed = upto
        return rows[self.alive[rows]]


class InPlaceState:
    """The rows a lane holds of one local kernel's state (module docstring)."""

    #: the young rows become part of the base when they reach this share of it (or this many)
    YOUNG_SHARE, YOUNG_MIN = 1 / 16, 65_536
    #: the young tables (one an epoch that changed rows) become one when there are more than
    #: this many: an epoch looks at each table, so their number must stay small
    MAX_YOUNG_TABLES = 32

    def __init__(self, kernel: Kernel, young_min: int | None = None):
        if not local(kernel):
            raise ValueError(f"{type(kernel).__name__} does not keep its rows to its own keys")
        self.kernel = kernel
        self.schema = kernel.state_schema
        self.keys: tuple[str, ...] = kernel.local_keys  # type: ignore[attr-defined]
        self.pk = list(kernel.primary_key)
        self.young_min = self.YOUNG_MIN if young_min is None else young_min
        self.load(self.schema.empty_table())

    # ------------------------------------------------------------------ the held rows
    def load(self, rows: pa.Table) -> None:
        """Hold ``rows`` (a loaded state) and nothing else."""
        rows = rows.select(self.schema.names).cast(self.schema).combine_chunks()
        kgs = rows.column(KG).to_numpy(zero_copy_only=False).astype(np.int64)
        if kgs.size > 1 and not np.all(kgs[:-1] <= kgs[1:]):
            rows = rows.take(pa.array(np.argsort(kgs, kind="stable")))
        hashes = key_hashes(rows, self.keys)
        order = np.argsort(hashes, kind="stable")
        self._hold(_Table(rows, hashes, self._deadlines(rows)), hashes[order], order.astype(np.int64))

    def _deadlines(self, rows: pa.Table) -> np.ndarray | None:
        got = self.kernel.deadline(rows)  # type: ignore[attr-defined]
        return None if got is None else np.asarray(got, np.int64)

    def _hold(self, base: _Table, hashes: np.ndarray, at: np.ndarray) -> None:
        if base.rows.num_rows >= 1 << _ROW_BITS:
            raise ValueError("a lane's state of one step holds fewer than 2**32 rows")
        self.tables = [base]
        self.base_hashes, self.base_at = hashes, at
        self.young_hashes, self.young_at = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self.young_rows = 0
        self.counts = np.bincount(base.kgs) if base.kgs.size else np.zeros(0, np.int64)
        self.rows = base.rows.num_rows

    @property
    def num_rows(self) -> int:
        return self.rows

    @property
    def nbytes(self) -> int:
        return sum(t.rows.nbytes * int(t.alive.sum()) // max(t.rows.num_rows, 1) for t in self.tables)

    def group_counts(self) -> np.ndarray:
        """Rows held per key group (index = key group)."""
        return self.counts

    def group_rows(self, groups: np.ndarray) -> pa.Table:
        """The rows held of ``groups``, grouped by key group."""
        parts = []
        base = self.tables[0]
        starts = np.searchsorted(base.kgs, groups, side="left")
        ends = np.searchsorted(base.kgs, groups, side="right")
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            if e > s:
                alive = base.alive[s:e]
                part = base.rows.slice(s, e - s)
                parts.append(part if alive.all() else part.filter(pa.array(alive)))
        for t in self.tables[1:]:
            mask = t.alive & np.isin(t.kgs, groups)
            if mask.any():
                parts.append(t.rows.filter(pa.array(mask)))
        if not parts:
            return self.schema.empty_table()
        out = pa.concat_tables(parts)
        order = np.argsort(out.column(KG).to_numpy(zero_copy_only=False), kind="stable")
        return out.take(pa.array(order))

    def table(self) -> pa.Table:
        """Every row held (for tests and moves; an epoch never needs it)."""
        return pa.concat_tables([t.rows.filter(pa.array(t.alive)) for t in self.tables])

    # ------------------------------------------------------------------ an epoch
    def touched(self, batch: pa.Table, watermark_ms: int) -> tuple[pa.Table, np.ndarray]:
        """The rows an epoch of ``batch`` at ``watermark_ms`` (the highest it reaches) may change:
        those of the batch's keys and those past their deadline; with where they are held."""
        at = [(i << _ROW_BITS) | t.due(watermark_ms) for i, t in enumerate(self.tables)]
        if batch.num_rows:
            probe = np.sort(key_hashes(batch, self.keys))  # (sorted probes search far faster)
            probe = probe[np.r_[True, probe[1:] != probe[:-1]]]
            at += [_matches(self.base_hashes, self.base_at, probe), _matches(self.young_hashes, self.young_at, probe)]
        where = np.sort(np.concatenate(at))  # (by table, then row: each table's rows are one slice)
        if where.size:
            where = where[np.r_[True, where[1:] != where[:-1]]]
        parts, kept = [], []
        for i, lo, hi in self._by_table(where):
            t, rows = self.tables[i], where[lo:hi] & _ROW_MASK
            alive = t.alive[rows]
            rows = rows if alive.all() else rows[alive]
            parts.append(t.rows.take(pa.array(rows)))
            kept.append((i << _ROW_BITS) | rows)
        rows = pa.concat_tables(parts) if parts else self.schema.empty_table()
        return rows, (np.concatenate(kept) if kept else np.zeros(0, np.int64))

    def _by_table(self, where: np.ndarray) -> list[tuple[int, int, int]]:
        """``(table, lo, hi)`` for each table with held places in ``where[lo:hi]`` (sorted)."""
        bounds = np.searchsorted(where, np.arange(len(self.tables) + 1, dtype=np.int64) << _ROW_BITS)
        return [(i, int(lo), int(hi)) for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)) if hi > lo]

    def _alive_at(self, where: np.ndarray) -> np.ndarray:
        """Whether each place of ``where`` (any order) holds a row alive."""
        return self._per_table(where, lambda i, rows: self.tables[i].alive[rows], bool)

    def _per_table(self, where: np.ndarray, f: Any, dtype: Any) -> np.ndarray:
        """``f(table, rows)`` for the places of ``where`` (any order), table by table."""
        out = np.zeros(where.size, dtype)
        if not where.size:
            return out
        first, last = int(where.min()) >> _ROW_BITS, int(where.max()) >> _ROW_BITS
        if first == last:  # (the base's index: no sort needed)
            out[:] = f(first, where & _ROW_MASK)
            return out
        order = np.argsort(where, kind="stable")
        ordered = where[order]
        for i, lo, hi in self._by_table(ordered):
            out[order[lo:hi]] = f(i, ordered[lo:hi] & _ROW_MASK)
        return out

    def apply(self, touched: pa.Table, where: np.ndarray, result: KernelResult) -> None:
        """The kernel's changes to the rows it was given (``touched``, held at ``where``, as
        :meth:`touched` returned them): the rows it deleted or replaced are dropped where they
        are; its upserts become a young table."""
        upserts = result.upserts.select(self.schema.names).cast(self.schema)
        pk = upserts.select(self.pk).schema
        changed = pa.concat_tables([upserts.select(self.pk), result.deletes.select(self.pk).cast(pk)])
        if touched.num_rows and changed.num_rows:
            held, gone, _ = key_codes([touched.column(c) for c in self.pk], [changed.column(c) for c in self.pk])
            dead = np.sort(where[np.isin(held, gone)])
            for i, lo, hi in self._by_table(dead):
                t, rows = self.tables[i], dead[lo:hi] & _ROW_MASK
                t.alive[rows] = False
                self.counts = _added(self.counts, t.kgs[rows], -1)
                self.rows -= rows.size
        if upserts.num_rows:
            self._add(upserts.combine_chunks())
        if self.young_rows > max(self.young_min, self.YOUNG_SHARE * self.tables[0].rows.num_rows):
            self._compact()
        elif len(self.tables) > 1 + self.MAX_YOUNG_TABLES:
            self._merge_young()

    def _add(self, rows: pa.Table) -> None:
        hashes = key_hashes(rows, self.keys)
        table = _Table(rows, hashes, self._deadlines(rows))
        i = len(self.tables)
        self.tables.append(table)
        order = np.argsort(hashes, kind="stable")
        self.young_hashes, self.young_at = _merged(
            (self.young_hashes, self.young_at), (hashes[order], (i << _ROW_BITS) | order.astype(np.int64)))
        self.young_rows += rows.num_rows
        self.counts = _added(self.counts, table.kgs, 1)
        self.rows += rows.num_rows

    def _compact(self) -> None:
        """Every row alive into a new base, sorted by key group. Nothing is hashed again, and the
        index is not sorted again from scratch: its two sorted runs are merged."""
        alive = [t.alive for t in self.tables]
        offsets = np.cumsum([0] + [int(a.sum()) for a in alive])
        rows = pa.concat_tables([t.rows.filter(pa.array(a)) for t, a in zip(self.tables, alive, strict=True)])
        kgs = np.concatenate([t.kgs[a] for t, a in zip(self.tables, alive, strict=True)])
        by_kg = np.argsort(kgs, kind="stable")  # (the base's rows are one sorted run)
        new_at = np.empty(by_kg.size, np.int64)
        new_at[by_kg] = np.arange(by_kg.size)
        #: where each held row (alive) goes: its place among the rows alive, then after the sort
        moved = [new_at[np.cumsum(a) - 1 + offsets[i]] for i, a in enumerate(alive)]

        def renamed(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            keep = self._alive_at(at)
            return keep, self._per_table(at[keep], lambda i, rows: moved[i][rows], np.int64)

        keep_b, at_b = renamed(self.base_at)
        keep_y, at_y = renamed(self.young_at)
        hashes, at = _merged((self.base_hashes[keep_b], at_b), (self.young_hashes[keep_y], at_y))
        row_hashes = np.concatenate([t.hashes[a] for t, a in zip(self.tables, alive, strict=True)])[by_kg]
        rows = rows.combine_chunks().take(pa.array(by_kg))
        deadlines = None
        if self.tables[0].deadlines is not None:  # (a kernel's tables all have deadlines, or none)
            deadlines = np.concatenate([t.deadlines[a] for t, a in zip(self.tables, alive, strict=True)])[by_kg]
        base = _Table(rows, row_hashes, deadlines)
        self._hold(base, hashes, at)


    def _merge_young(self) -> None:
        """The young tables' rows alive into one young table (the base and its index stay)."""
        young = self.tables[1:]
        alive = [t.alive for t in young]
        offsets = np.cumsum([0] + [int(a.sum()) for a in alive])
        moved = [np.cumsum(a) - 1 + offsets[i] for i, a in enumerate(alive)]
        keep = self._alive_at(self.young_at)
        at = self._per_table(self.young_at[keep], lambda i, rows: moved[i - 1][rows], np.int64)
        rows = pa.concat_tables([t.rows.filter(pa.array(a)) for t, a in zip(young, alive, strict=True)]).combine_chunks()
        hashes = np.concatenate([t.hashes[a] for t, a in zip(young, alive, strict=True)])
        deadlines = (None if young[0].deadlines is None
                     else np.concatenate([t.deadlines[a] for t, a in zip(young, alive, strict=True)]))
        self.tables = [self.tables[0], _Table(rows, hashes, deadlines)]
        self.young_hashes, self.young_at = self.young_hashes[keep], (1 << _ROW_BITS) | at
        self.young_rows = rows.num_rows


def _merged(*runs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted runs of (value, payload), merged into one: a stable sort finds the runs, so this
    costs a merge, not a sort."""
    values = np.concatenate([v for v, _ in runs])
    payload = np.concatenate([p for _, p in runs])
    by = np.argsort(values, kind="stable")
    return values[by], payload[by]


def _matches(hashes: np.ndarray, at: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Where the entries whose hash is one of ``probe`` (distinct; sorted, for speed) are held."""
    if not hashes.size or not probe.size:
        return np.zeros(0, np.int64)
    lo = np.searchsorted(hashes, probe, side="left")
    hi = np.searchsorted(hashes, probe, side="right")
    n = hi - lo
    if not n.any():
        return np.zeros(0, np.int64)
    starts = np.repeat(lo, n)
    return at[starts + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)]


def _added(counts: np.ndarray, kgs: np.ndarray, sign: int) -> np.ndarray:
    if not kgs.size:
        return counts
    got = np.bincount(kgs)
    if got.size > counts.size:
        counts = np.concatenate([counts, np.zeros(got.size - counts.size, counts.dtype)])
    counts = counts.copy()
    counts[: got.size] += sign * got
    return counts
