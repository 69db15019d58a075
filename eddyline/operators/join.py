"""Two-input equi-joins as pure kernels over Arrow tables (no Spark here).

The runtime packs both inputs of a join into one batch and routes it by key group, so rows of the
two sides with equal keys meet in the same lane and the same call. The batch columns are exactly

* ``_kg`` int32 (key group) and ``_side`` int8 (``0`` = left, ``1`` = right);
* every left column renamed ``l__<name>``, then every right column renamed ``r__<name>``; the
  other side's columns are null on a row.

Three kernels share one state layout and one way of pairing rows:

* :class:`WindowJoinKernel` (Nexmark q8): a left and a right row join when their keys are equal
  and both fall into the same tumbling window ``[s, s + size)``. A window's pairs are emitted
  once, when the watermark reaches its end, and its rows then leave the state.
* :class:`IntervalJoinKernel` (Nexmark q4): a left row carries an interval ``[start, end]``, a
  right row a point ``time``; they join when keys are equal and ``start <= time <= end``.
* :class:`UnboundedJoinKernel` (Nexmark q3): a regular equi-join; rows may leave the state after
  an event-time TTL.

The interval and unbounded joins are *symmetric hash joins*: a pair is emitted exactly once, in
the epoch in which its second row arrives (a pair of two rows arriving in the same epoch, once
too), so results come out as soon as they are known and never need a retraction.

Revisions (docs/revisions.md): when a side has a ``_diff`` column, its rows carry their weight
into the state, and a pair weighs the product of its two rows' weights (a side without one
weighs +1). A retracted row is stored like any other and pairs like any other, so it takes back
every pair its insertion made, and an epoch's output is summed per row before it leaves, so the
pairs a row and its retraction form with one new partner cancel there.

Semantics shared by all three (SQL inner-join semantics, Flink's timing):

* A key containing a null never matches, so such rows are dropped on arrival (``dropped_rows``),
  as are rows whose time columns make a match impossible (see each kernel).
* The watermark ``W`` of an epoch comes from earlier epochs. A row arriving with an event time
  that the watermark has already passed (by each kernel's rule) is *late*: it might miss partners
  that already left the state, so it is dropped and counted in ``metrics["late_rows"]``.
* Every state row carries ``_expire_ms``: it leaves the state in the first epoch whose watermark
  is ``>= _expire_ms`` (null: never). ``END_OF_STREAM`` is above every expiry, so the window and
  interval joins end with an empty state; an unbounded join empties out only what its TTL covers.
* Duplicate rows are legal and join as often as they occur (multiset semantics).

State: one table per lane holding the waiting rows of both sides, primary key ``(_kg, _seq)``.
``_seq`` is a per-key-group counter: the rows admitted in an epoch are sorted canonically (by
key group, side, then their content) and numbered after the largest ``_seq`` the key group held
before the epoch. Identical rows therefore get distinct keys, and the numbering depends only on
the previous state and the *multiset* of batch rows — not on their order — without the collision
risk of a content hash (pyarrow has no vectorised row hash). Numbers above every previous one are
never reused within an epoch, so a key is never deleted and upserted in the same delta. Rows never
change once stored: ``upserts`` are the admitted rows, ``deletes`` the expired ones.

Output: all left columns under their names, then all right columns under theirs, a right column
whose name is taken getting ``_right`` appended (repeatedly, until unique); the window join adds
``window_start`` and ``window_end``. Output rows are ordered by ``(_kg, left _seq, right _seq)``,
so a replay writes the same bytes.

Spreading a hot key group (SPREADFIRE): the state of one key group ``g`` may be split into
*fragments* on several lanes, fragment ``f`` being the virtual key group ``g + K * f`` (the kernel
only sees distinct ``_kg`` values). A new row of a spread group is *stored* in exactly one
fragment, its home, and sent as a *probe copy* (``_probe`` true, carrying the ``_kg`` of the
fragment it is sent to) to every other fragment. ``_probe`` is an optional boolean batch column,
not part of ``input_schema``: absent or null means false, and a batch without probes is processed
exactly as before. Only the symmetric joins can be spread (``spreadable``); for them, per call:

* every on-time, matchable batch row — store or probe — meets the state rows of the other side
  in its ``_kg`` (state × batch);
* two batch rows ``(l, r)`` pair only when ``l`` is a store row (``r`` may be either), so a pair
  of two new rows is formed once, at ``l``'s home, whatever fragments the lane owns;
* probe copies never enter the state and are never counted as late or dropped (their store copy
  is), but pass the same late / null-key / time filters: a late probe copy matches nothing.

Each pair (old row stored in one fragment, new row present in all) is therefore emitted exactly
once over all fragments, and the union of their outputs equals the unsplit run's. For ordering,
probe copies get transient ``_seq`` numbers after the admitted rows of their ``_kg`` (in the same
canonical content order), so the output order is still ``(_kg, left _seq, right _seq)`` and
depends only on the state and the multiset of batch rows. The window join emits pairs from the
state when a window closes, so a split window would lose the pairs across fragments: it rejects
probe rows with a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF, KG, PROBE, join_right_names
from eddyline.operators.base import KernelResult, sortable
from eddyline.operators.rows import TIMESTAMP, consolidated, ns_to_ms, time_ns
from eddyline.operators.window import WINDOW_END, WINDOW_START

SIDE = "_side"
SEQ = "_seq"
EXPIRE = "_expire_ms"
LEFT, RIGHT = 0, 1
LEFT_PREFIX, RIGHT_PREFIX = "l__", "r__"
#: ``_expire_ms`` marker, in numpy, for rows that never expire (stored as null).
NEVER = np.iinfo(np.int64).max


def _result(
    output: pa.Table,
    state: pa.Table,
    admitted: pa.Table,
    deletes: pa.Table,
    late: np.ndarray,
    dropped: np.ndarray,
) -> KernelResult:
    """Stored rows never change, so the upserts are exactly the admitted rows."""
    return KernelResult.of(
        output,
        state,
        admitted,
        deletes,
        {
            "late_rows": int(late.sum()),
            "dropped_rows": int(dropped.sum()),
            "pairs_emitted": output.num_rows,
            "rows_evicted": deletes.num_rows,
        },
    )


class _EquiJoin:
    """The layout, admission and pairing the three join kernels share.

    Not a kernel by itself: subclasses decide when rows are late, when they expire and which
    pairs are emitted when.
    """

    #: Whether a key group's state may be split into fragments fed with ``_probe`` copies.
    spreadable: bool = False

    def __init__(
        self,
        left_schema: pa.Schema,
        right_schema: pa.Schema,
        left_key: tuple[str, ...],
        right_key: tuple[str, ...],
        extra_output: Sequence[pa.Field] = (),
    ):
        if not left_key or len(left_key) != len(right_key):
            raise ValueError(
                f"join keys {left_key} and {right_key} must be non-empty and of equal arity"
            )
        for side, schema, keys in (
            ("left", left_schema, left_key),
            ("right", right_schema, right_key),
        ):
            missing = [k for k in keys if k not in schema.names]
            if missing:
                raise ValueError(f"{side} join key columns {missing} are not in {schema.names}")
        self.left_schema, self.right_schema = left_schema, right_schema
        self.left_key, self.right_key = tuple(left_key), tuple(right_key)
        # Keys of both sides are compared in one common type (e.g. int32 vs int64 → int64).
        self._key_types: list[pa.DataType] = []
        for lk, rk in zip(left_key, right_key, strict=True):
            try:
                unified = pa.unify_schemas(
                    [
                        pa.schema([left_schema.field(lk).with_name("k")]),
                        pa.schema([right_schema.field(rk).with_name("k")]),
                    ],
                    promote_options="permissive",
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
                raise ValueError(f"join keys {lk!r} and {rk!r} have incompatible types") from exc
            self._key_types.append(unified.field("k").type)

        self._left_cols = [f"{LEFT_PREFIX}{f.name}" for f in left_schema]
        self._right_cols = [f"{RIGHT_PREFIX}{f.name}" for f in right_schema]
        data = [pa.field(c, f.type) for c, f in zip(self._left_cols, left_schema, strict=True)]
        data += [pa.field(c, f.type) for c, f in zip(self._right_cols, right_schema, strict=True)]
        self.input_schema = pa.schema([pa.field(KG, pa.int32()), pa.field(SIDE, pa.int8()), *data])
        self.state_schema = pa.schema(
            [
                pa.field(KG, pa.int32()),
                pa.field(SEQ, pa.int64()),
                pa.field(SIDE, pa.int8()),
                pa.field(EXPIRE, pa.int64()),
                *data,
            ]
        )
        self.primary_key: tuple[str, ...] = (KG, SEQ)

        # A revised side's rows carry a weight; a pair weighs the product of its rows' weights.
        self.weighted = DIFF in left_schema.names or DIFF in right_schema.names
        left_data = [f for f in left_schema if f.name != DIFF]
        right_data = [f for f in right_schema if f.name != DIFF]
        self._left_out = [f"{LEFT_PREFIX}{f.name}" for f in left_data]
        self._right_out = [f"{RIGHT_PREFIX}{f.name}" for f in right_data]
        right_out = join_right_names([f.name for f in left_data], [f.name for f in right_data])
        out_fields = [
            *left_data,
            *(f.with_name(n) for f, n in zip(right_data, right_out, strict=True)),
        ]
        clash = {f.name for f in extra_output} & {f.name for f in out_fields}
        if clash:
            raise ValueError(
                f"join inputs must not have columns named {sorted(clash)}: the join adds them"
            )
        weight = [pa.field(DIFF, pa.int64())] if self.weighted else []
        self.output_schema = pa.schema([*out_fields, *extra_output, *weight])
        # Canonical order of admitted rows: every data column Arrow can sort (dictionaries decoded).
        self._sort_cols = [
            f.name
            for f in data
            if sortable(f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
        ]

    # ------------------------------------------------------------------ inputs
    def _normalize(
        self, batch: pa.Table, state: pa.Table | None
    ) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """Batch and state in their schemas (other columns dropped), plus the batch's probe
        mask: the optional ``_probe`` column, absent or null meaning false."""
        if PROBE in batch.column_names:
            probe = (
                pc.fill_null(pc.cast(batch.column(PROBE), pa.bool_()), False)
                .to_numpy(zero_copy_only=False)
                .astype(bool)
            )
        else:
            probe = np.zeros(batch.num_rows, dtype=bool)
        batch = batch.select(self.input_schema.names).cast(self.input_schema)
        state = (
            self.state_schema.empty_table()
            if state is None
            else state.select(self.state_schema.names).cast(self.state_schema)
        )
        return batch, state, probe

    def _is_left(self, table: pa.Table) -> np.ndarray:
        return table.column(SIDE).to_numpy(zero_copy_only=False) == LEFT

    def _null_key(self, batch: pa.Table, is_left: np.ndarray) -> np.ndarray:
        """Per row: does its own side's key contain a null (so that it can never match)?"""
        bad = np.zeros(batch.num_rows, dtype=bool)
        for lk, rk in zip(self.left_key, self.right_key, strict=True):
            l_null = pc.is_null(batch.column(LEFT_PREFIX + lk)).to_numpy(zero_copy_only=False)
            r_null = pc.is_null(batch.column(RIGHT_PREFIX + rk)).to_numpy(zero_copy_only=False)
            bad |= np.where(is_left, l_null, r_null)
        return bad

    def _admit(
        self,
        batch: pa.Table,
        admit: np.ndarray,
        expire: np.ndarray,
        prior: pa.Table,
        probe: np.ndarray | None = None,
    ) -> pa.Table:
        """The admitted batch rows as state rows, in canonical order, numbered after ``prior``.

        ``expire`` holds each batch row's ``_expire_ms`` (``NEVER``: kept forever, stored as
        null); ``prior`` is the state before this epoch's
        evictions, so a freshly deleted key is not handed out again in the same epoch.

        With ``probe`` (a mask over the batch), the admitted probe copies are numbered too, after
        the store rows of their key group, and returned behind them: the store rows are exactly
        the first ``admit & ~probe`` rows (numbered as without probes), the rest are probe copies
        with transient numbers for ordering the output only.
        """
        rows = batch.filter(pa.array(admit))
        exp = pa.array(expire[admit], type=pa.int64(), mask=expire[admit] == NEVER)
        rows = rows.add_column(2, EXPIRE, exp)
        # 1. canonical order: key group, (store rows before probe copies,) side, then content
        #    (independent of the batch's order)
        is_probe = probe[admit] if probe is not None and probe[admit].any() else None
        sort_table = pa.table(
            {
                "k": rows.column(KG),
                **({"p": pa.array(is_probe)} if is_probe is not None else {}),
                "s": rows.column(SIDE),
                **{
                    c: pc.cast(rows.column(c), rows.schema.field(c).type.value_type)
                    if pa.types.is_dictionary(rows.schema.field(c).type)
                    else rows.column(c)
                    for c in self._sort_cols
                },
            }
        )
        order = pc.sort_indices(
            sort_table, sort_keys=[(c, "ascending") for c in sort_table.column_names]
        )
        rows = rows.take(order)
        if is_probe is not None:
            is_probe = is_probe[order.to_numpy(zero_copy_only=False)]
        # 2. number rows per key group after the largest sequence number the group held
        kg = rows.column(KG).to_numpy(zero_copy_only=False)
        rank = np.arange(len(kg), dtype=np.int64) - np.searchsorted(kg, kg, side="left")
        base = np.zeros(len(kg), dtype=np.int64)
        if prior.num_rows and len(kg):
            top = prior.group_by(KG, use_threads=False).aggregate([(SEQ, "max")])
            top_kg = top.column(KG).to_numpy(zero_copy_only=False)
            top_seq = top.column(f"{SEQ}_max").to_numpy(zero_copy_only=False)
            order = np.argsort(top_kg)
            top_kg, top_seq = top_kg[order], top_seq[order]
            pos = np.minimum(np.searchsorted(top_kg, kg), len(top_kg) - 1)
            base = np.where(top_kg[pos] == kg, top_seq[pos] + 1, 0)
        rows = rows.add_column(1, SEQ, pa.array(base + rank, type=pa.int64()))
        rows = rows.select(self.state_schema.names).cast(self.state_schema)
        if is_probe is not None:  # store rows first, each part still ordered by (key group, _seq)
            rows = rows.take(pa.array(np.argsort(is_probe, kind="stable"), type=pa.int64()))
        return rows

    # ------------------------------------------------------------------ pairing
    def _key_pairs(
        self, rows: pa.Table, left_idx: np.ndarray, right_idx: np.ndarray, extra: Sequence[str] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every ``(i, j)`` with ``i`` in ``left_idx``, ``j`` in ``right_idx`` (row numbers of
        ``rows``) whose key group, ``extra`` columns and join keys are equal.

        Only key columns and row numbers go through Arrow's hash join (any payload type works,
        and the cross product of duplicate keys stays narrow); nulls never match.
        """
        if not len(left_idx) or not len(right_idx):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        names = [KG, *extra, *(f"k{n}" for n in range(len(self.left_key)))]

        def side(idx: np.ndarray, prefix: str, keys: Sequence[str], number: str) -> pa.Table:
            take = pa.array(idx, type=pa.int64())
            cols = [rows.column(c).take(take) for c in (KG, *extra)]
            cols += [
                pc.cast(rows.column(prefix + k).take(take), t)
                for k, t in zip(keys, self._key_types, strict=True)
            ]
            return pa.Table.from_arrays([*cols, take], names=[*names, number])

        joined = side(left_idx, LEFT_PREFIX, self.left_key, "_i").join(
            side(right_idx, RIGHT_PREFIX, self.right_key, "_j"),
            keys=names,
            join_type="inner",
            use_threads=False,
        )
        return (
            joined.column("_i").to_numpy(zero_copy_only=False).astype(np.int64),
            joined.column("_j").to_numpy(zero_copy_only=False).astype(np.int64),
        )

    def _emit(
        self, rows: pa.Table, i: np.ndarray, j: np.ndarray, extra: Sequence[pa.Array] = ()
    ) -> pa.Table:
        """Output rows for pairs ``(i, j)``, ordered by ``(_kg, left _seq, right _seq)``."""
        seq = rows.column(SEQ).to_numpy(zero_copy_only=False)
        kg = rows.column(KG).to_numpy(zero_copy_only=False)
        order = np.lexsort((seq[j], seq[i], kg[i]))
        i_take, j_take = pa.array(i[order], type=pa.int64()), pa.array(j[order], type=pa.int64())
        cols = [rows.column(c).take(i_take) for c in self._left_out]
        cols += [rows.column(c).take(j_take) for c in self._right_out]
        cols += [a.take(pa.array(order, type=pa.int64())) for a in extra]
        if not self.weighted:
            return pa.Table.from_arrays(cols, names=self.output_schema.names).cast(self.output_schema)
        weight = self._weight(rows, LEFT_PREFIX, i_take) * self._weight(rows, RIGHT_PREFIX, j_take)
        out = pa.Table.from_arrays([*cols, pa.array(weight)], names=self.output_schema.names)
        return consolidated(out).cast(self.output_schema)

    def _weight(self, rows: pa.Table, prefix: str, take: pa.Array) -> np.ndarray:
        name = f"{prefix}{DIFF}"
        if name not in rows.column_names:
            return np.ones(len(take), dtype=np.int64)
        return pc.fill_null(rows.column(name).take(take), 1).to_numpy(zero_copy_only=False).astype(np.int64)


class WindowJoinKernel(_EquiJoin):
    """Tumbling-window equi-join (Nexmark q8), a :class:`~eddyline.operators.base.Kernel`.

    A left row at ``left_time`` and a right row at ``right_time`` join when their keys are equal
    and both lie in the same window ``[s, s + size_ms)`` (``s`` a multiple of ``size_ms``).
    Rows wait in state until the watermark reaches their window's end (``end <= W``); then all
    pairs of the window are emitted, with ``window_start`` / ``window_end``, and the window's rows
    are deleted. A row whose window has already ended (``end <= W``) when it arrives is late.
    Rows with a null time or key belong to no window or match nothing and are dropped.

    Because only the watermark decides when a window fires, and a window fires once with every
    row that arrived on time, the output does not depend on how the input is cut into epochs.

    Not spreadable: a batch with a true ``_probe`` raises ``ValueError``.
    """

    spreadable = False

    def __init__(
        self,
        left_schema: pa.Schema,
        right_schema: pa.Schema,
        left_key: tuple[str, ...],
        right_key: tuple[str, ...],
        *,
        left_time: str,
        right_time: str,
        size_ms: int,
    ):
        if size_ms <= 0:
            raise ValueError(f"window size {size_ms} ms must be positive")
        super().__init__(
            left_schema,
            right_schema,
            left_key,
            right_key,
            [pa.field(WINDOW_START, TIMESTAMP), pa.field(WINDOW_END, TIMESTAMP)],
        )
        self.left_time, self.right_time, self.size_ms = left_time, right_time, size_ms

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        batch, state, probe = self._normalize(batch, state)
        if probe.any():
            raise ValueError(
                f"{type(self).__name__}: window join cannot be split across lanes; a window's "
                "pairs are formed from the state when it closes, so every row of a key group "
                "must be stored in one lane (got rows with _probe set)"
            )
        # 1. each arriving row's window end (its expiry); late once the window has ended
        is_left = self._is_left(batch)
        lt, l_ok = time_ns(batch.column(LEFT_PREFIX + self.left_time))
        rt, r_ok = time_ns(batch.column(RIGHT_PREFIX + self.right_time))
        t_ms, has_time = ns_to_ms(np.where(is_left, lt, rt)), np.where(is_left, l_ok, r_ok)
        end = np.floor_divide(t_ms, self.size_ms) * self.size_ms + self.size_ms
        late = has_time & (end <= watermark_ms)
        dropped = ~late & (~has_time | self._null_key(batch, is_left))
        # 2. fire: the state rows whose window ended, paired within (key group, window, key)
        expire = state.column(EXPIRE).to_numpy(zero_copy_only=False)
        fire = expire <= watermark_ms
        fired_left = np.flatnonzero(fire & self._is_left(state))
        fired_right = np.flatnonzero(fire & ~self._is_left(state))
        i, j = self._key_pairs(state, fired_left, fired_right, extra=(EXPIRE,))
        ends_us = pa.array(expire[i] * 1000, type=pa.int64())
        output = self._emit(
            state,
            i,
            j,
            [
                pc.cast(pc.subtract(ends_us, self.size_ms * 1000), TIMESTAMP),
                pc.cast(ends_us, TIMESTAMP),
            ],
        )
        # 3. admit the on-time rows (numbered after the state before firing), delete fired windows
        admitted = self._admit(batch, ~late & ~dropped, end, state)
        kept = state.filter(pa.array(~fire))
        deletes = state.filter(pa.array(fire)).select(list(self.primary_key))
        return _result(output, pa.concat_tables([kept, admitted]), admitted, deletes, late, dropped)


class _SymmetricJoin(_EquiJoin):
    """Symmetric hash join: emit each pair once, in the epoch its second row arrives.

    Subclasses say when an arriving row is late or unmatchable and when it expires
    (:meth:`_arrival`), and may narrow key-equal pairs by a condition (:meth:`_match`).
    Spreadable: batches may hold ``_probe`` copies (see the module docstring).
    """

    spreadable = True

    def _arrival(
        self, batch: pa.Table, is_left: np.ndarray, watermark_ms: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(late, unmatchable, expire)`` per batch row; ``expire == NEVER``: kept forever."""
        raise NotImplementedError

    def _match(self, rows: pa.Table, i: np.ndarray, j: np.ndarray) -> np.ndarray | None:
        """Which key-equal pairs ``(i, j)`` of ``rows`` match (``None``: all of them)."""
        return None

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        batch, state, probe = self._normalize(batch, state)
        # 1. evict the state rows the watermark has reached: they can meet no on-time row
        expired = pc.fill_null(pc.less_equal(state.column(EXPIRE), watermark_ms), False).to_numpy(
            zero_copy_only=False
        )
        kept = state.filter(pa.array(~expired))
        deletes = state.filter(pa.array(expired)).select(list(self.primary_key))
        # 2. admit arriving store rows that are on time and can match (numbered after the old
        #    state); probe copies pass the same filters and are numbered after them, unstored
        is_left = self._is_left(batch)
        late, unmatchable, expire = self._arrival(batch, is_left, watermark_ms)
        dropped = ~late & (unmatchable | self._null_key(batch, is_left))
        on_time = ~late & ~dropped
        n_store = int((on_time & ~probe).sum())
        arrived = self._admit(batch, on_time, expire, state, probe)
        admitted = arrived.slice(0, n_store)
        # 3. pair new store left rows with all right rows, old left rows with all new right rows
        #    and new probe left rows with old right rows, so that every pair with at least one
        #    new row comes out exactly once (over all fragments of a spread key group)
        rows = pa.concat_tables([kept, arrived])
        pos = np.arange(rows.num_rows)
        old, store = pos < kept.num_rows, (pos >= kept.num_rows) & (pos < kept.num_rows + n_store)
        left = self._is_left(rows)
        i1, j1 = self._key_pairs(rows, np.flatnonzero(left & store), np.flatnonzero(~left))
        i2, j2 = self._key_pairs(rows, np.flatnonzero(left & old), np.flatnonzero(~left & ~old))
        i3, j3 = self._key_pairs(
            rows, np.flatnonzero(left & ~old & ~store), np.flatnonzero(~left & old)
        )
        i, j = np.concatenate([i1, i2, i3]), np.concatenate([j1, j2, j3])
        # 4. keep the pairs that satisfy the kernel's condition, emit in canonical order
        match = self._match(rows, i, j)
        if match is not None:
            i, j = i[match], j[match]
        output = self._emit(rows, i, j)
        state = rows.slice(0, kept.num_rows + n_store)
        return _result(output, state, admitted, deletes, late & ~probe, dropped & ~probe)


class IntervalJoinKernel(_SymmetricJoin):
    """Interval join (Nexmark q4: a bid joins the auction whose lifetime contains it).

    The left side carries intervals ``[left_start, left_end]``, the right side points
    ``right_time``; a pair matches when keys are equal and ``left_start <= right_time <=
    left_end`` (inclusive, compared exactly in the columns' own precision). Each matching pair is
    emitted once, as soon as both rows are present.

    Event time of a left row is its start, of a right row its time; the watermark ``W`` promises
    that no on-time row arrives below it. Hence:

    * a right row is late when ``right_time < W`` and waits in state while ``W <= right_time``:
      a later interval starts at ``>= W``, so once ``W > right_time`` none can contain it;
    * a left row is late when ``left_start < W`` (points in ``[start, W)`` may already be gone)
      and waits while ``W <= left_end``: points still to come lie at ``>= W``;
    * rows with a null time, and intervals with ``end < start``, can match nothing: dropped.
    """

    def __init__(
        self,
        left_schema: pa.Schema,
        right_schema: pa.Schema,
        left_key: tuple[str, ...],
        right_key: tuple[str, ...],
        *,
        left_start: str,
        left_end: str,
        right_time: str,
    ):
        super().__init__(left_schema, right_schema, left_key, right_key)
        self.left_start, self.left_end, self.right_time = left_start, left_end, right_time

    def _arrival(
        self, batch: pa.Table, is_left: np.ndarray, watermark_ms: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start, start_ok = time_ns(batch.column(LEFT_PREFIX + self.left_start))
        end, end_ok = time_ns(batch.column(LEFT_PREFIX + self.left_end))
        point, point_ok = time_ns(batch.column(RIGHT_PREFIX + self.right_time))
        has_time = np.where(is_left, start_ok & end_ok, point_ok)
        event_ms = ns_to_ms(np.where(is_left, start, point))
        late = has_time & (event_ms < watermark_ms)
        unmatchable = ~has_time | (is_left & (end < start))
        expire = ns_to_ms(np.where(is_left, end, point)) + 1  # gone once W > end / W > time
        return late, unmatchable, expire

    def _match(self, rows: pa.Table, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        start, _ = time_ns(rows.column(LEFT_PREFIX + self.left_start))
        end, _ = time_ns(rows.column(LEFT_PREFIX + self.left_end))
        point, _ = time_ns(rows.column(RIGHT_PREFIX + self.right_time))
        return (start[i] <= point[j]) & (point[j] <= end[i])


class UnboundedJoinKernel(_SymmetricJoin):
    """Regular equi-join with event-time state retention (Nexmark q3).

    Each pair of rows with equal (non-null) keys is emitted once, as soon as both are present.
    With ``ttl_ms`` set, a row leaves the state once ``W > time + ttl_ms`` (its side's time column)
    and a row arriving with ``time + ttl_ms < W`` is late. Eviction happens before this epoch's
    arrivals are paired, so a pair joins iff neither row has expired under the watermark of the
    epoch in which the second arrives. When the watermark never passes a row before it arrives,
    every pair within ``ttl_ms`` of each other is guaranteed to join; pairs further apart may or
    may not, depending on how the watermark advanced (as with Flink's state TTL).

    With ``ttl_ms=None`` (and for rows whose time is null) rows stay forever: the state grows
    with the input, also past ``END_OF_STREAM``.
    """

    def __init__(
        self,
        left_schema: pa.Schema,
        right_schema: pa.Schema,
        left_key: tuple[str, ...],
        right_key: tuple[str, ...],
        *,
        ttl_ms: int | None = None,
        left_time: str | None = None,
        right_time: str | None = None,
    ):
        if ttl_ms is not None and (ttl_ms < 0 or left_time is None or right_time is None):
            raise ValueError("a TTL must be non-negative and needs left_time and right_time")
        super().__init__(left_schema, right_schema, left_key, right_key)
        self.ttl_ms, self.left_time, self.right_time = ttl_ms, left_time, right_time

    def _arrival(
        self, batch: pa.Table, is_left: np.ndarray, watermark_ms: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = batch.num_rows
        never = np.zeros(n, dtype=bool)
        if self.ttl_ms is None or self.left_time is None or self.right_time is None:
            return never, never, np.full(n, NEVER, dtype=np.int64)
        lt, l_ok = time_ns(batch.column(LEFT_PREFIX + self.left_time))
        rt, r_ok = time_ns(batch.column(RIGHT_PREFIX + self.right_time))
        has_time = np.where(is_left, l_ok, r_ok)
        expire = ns_to_ms(np.where(is_left, lt, rt)) + self.ttl_ms + 1  # gone once W > t + ttl
        late = has_time & (expire <= watermark_ms)
        return late, never, np.where(has_time, expire, NEVER)
