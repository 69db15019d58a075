"""Row-based OVER aggregates as a pure kernel over Arrow tables (no Spark here).

:class:`OverAggregateKernel` computes, for every row, SQL's

    AGG(col) OVER (PARTITION BY keys ORDER BY time ROWS BETWEEN <preceding> PRECEDING AND CURRENT ROW)

for ``count/sum/min/max/avg`` (the types of a window aggregate, see
:mod:`eddyline.operators.keyed`), e.g. Nexmark q6 (the average selling price of each seller's
last closed auctions) is ``avg(final)`` by ``seller`` with ``preceding=10``, as its SQL
``ROWS BETWEEN 10 PRECEDING AND CURRENT ROW`` says: up to 11 rows.

Semantics (the watermark contract of :mod:`eddyline.operators.pattern`):

* **Per key, in event-time order.** Rows of a key are *processed* in the order ``(event time,
  then every input column in schema order, ascending, nulls last)``: a total order, so ties on
  the time resolve the same way whatever order the rows arrived in. Null keys are a key like
  any other (nulls group together).
* **A row is processed once the watermark ``W`` passes it** (``t < W``); rows with ``t >= W``
  are **buffered** in state (a row at exactly ``W`` may still get a tie that sorts before it).
  ``END_OF_STREAM`` processes every buffered row.
* **Every processed row is emitted once**, with all its input columns (not ``_kg``) and one
  column per aggregate over the row itself and up to ``preceding`` earlier processed rows of
  its key. ``count(*)`` counts the frame's rows, ``count(col)`` its non-null values; ``sum``,
  ``min``, ``max`` skip nulls and are null when the frame has no value; ``avg`` is the sum over
  the non-null count (null when zero). Results are final: nothing is revised.
* **Late rows** are dropped and counted in ``metrics["late_rows"]``: rows without an event
  time, rows with ``t < W`` when they arrive (their place in the key's order may already be
  taken) and rows with ``t <= last``, the key's last processed time. Under a non-decreasing
  watermark the second rule implies the third, except in the ``END_OF_STREAM`` epoch, where
  every row is "behind" the watermark and only the ``last`` rule judges a row. ``t == last``
  is late as well: a tie is ordered by the other columns, and rows at that time were processed
  already.

As long as no row is late, the output does not depend on how the input is cut into epochs or
on the row order of a batch: each key's rows are processed in the total order above, and a
frame is always the same rows (float sums are added in frame order, current row first).

State (one flat Arrow table, no struct columns, primary key ``(_kg, *keys, _kind, _seq)``):

* **history rows** (``_kind = 0``): the last ``max(preceding, 1)`` processed rows of each key,
  ``_seq`` being the row's ordinal among the key's processed rows (0, 1, 2, ...). Only the
  time and the aggregates' input columns are kept, in ``_row.<column>``; the other ``_row.*``
  columns are null. The key's last processed time is its newest history row's time (hence at
  least one row even for ``preceding=0``).
* **buffered rows** (``_kind = 1``): rows waiting for the watermark, every input column but
  ``_kg`` and the keys in ``_row.<column>``; ``_seq`` is a per-key id, new ids continuing after
  the largest one in state.

History rows are kept **forever** (there is no TTL): the state holds up to
``max(preceding, 1)`` rows per distinct key ever seen, and it is *not* empty after
``END_OF_STREAM`` (the buffered rows are gone; the history stays). Size it for the key
cardinality. Every new state row has a primary key absent from the previous state (new
ordinals and ids continue after the key's largest), so ``upserts`` are exactly the inserted
rows and ``deletes`` exactly the removed ones. Input columns must be flat (project nested
columns away before the step).

Cost per epoch: one scan of the state's ``_kind`` and ``_row.<time>`` columns (to find key
groups whose buffered rows the watermark passed), work confined to the touched key groups
(sorting their buffered and new rows), plus ``O(processed rows x (preceding + 1))`` numpy work
for the frames (one vectorised pass per frame offset; ``min``/``max`` fold value ranks, so any
sortable type works).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import KernelResult, key_groups_of
from eddyline.operators.partials import (
    PartialColumn,
    aggregate_fields,
    finish_aggregates,
    partial_columns,
    row_partials,
)
from eddyline.operators.rows import (
    event_times,
    int_values,
    normalize,
    nullable,
    ranks_in_segments,
    require_columns,
    segments,
    sort_indices,
    sorted_key_ids,
    split_by_key_groups,
    take_or_null,
    with_key_group,
)

KIND, SEQ, ROW = "_kind", "_seq", "_row."  # ROW: the prefix of stored input columns
HISTORY, BUFFERED = 0, 1
NOTHING_PROCESSED = NO_WATERMARK  # a key's "last processed time" before its first row


class OverAggregateKernel:
    """``AGG(col) OVER (PARTITION BY keys ORDER BY time ROWS BETWEEN preceding PRECEDING AND
    CURRENT ROW)`` per row (a :class:`~eddyline.operators.base.Kernel`); see the module
    docstring for the semantics and the state.

    ``aggregates`` are ``(name, func, column)`` with func in count/sum/min/max/avg and
    ``column=None`` for ``count(*)``. ``time`` is a timestamp or integer (milliseconds) column
    that is not a key. Output: every input column but ``_kg`` (in input order), then one
    column per aggregate.
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        keys: Sequence[str],
        time: str,
        preceding: int,
        aggregates: Sequence[tuple[str, str, str | None]],
    ):
        self.keys = tuple(keys)
        self.time = time
        require_columns(input_schema, [*self.keys, time], "over aggregate")
        if time in self.keys:
            raise ValueError(f"over aggregate: time column {time!r} must not be a key")
        ttype = input_schema.field(time).type
        if not (pa.types.is_timestamp(ttype) or pa.types.is_integer(ttype)):
            raise ValueError(
                f"over aggregate: time column {time!r} must be a timestamp or integer milliseconds, not {ttype}"
            )
        if isinstance(preceding, bool) or not isinstance(preceding, int) or preceding < 0:
            raise ValueError(
                f"over aggregate: preceding must be an integer >= 0, got {preceding!r}"
            )
        for k in self.keys:
            if k in (KIND, SEQ) or k.startswith(ROW):
                raise ValueError(f"over aggregate: key name {k!r} is reserved for the state")
        nested = [f.name for f in input_schema if f.name != KG and pa.types.is_nested(f.type)]
        if nested:
            raise ValueError(
                f"over aggregate: nested input columns {nested} cannot be kept in state; project them away"
            )
        if not aggregates:
            raise ValueError("over aggregate: expected at least one aggregate")
        self.preceding = int(preceding)
        self.aggregates = tuple((n, f, c) for n, f, c in aggregates)
        self._partials: list[PartialColumn] = partial_columns(self.aggregates, input_schema)
        names = [n for n, _, _ in self.aggregates]
        inputs = [n for n in input_schema.names if n != KG]
        clash = sorted(set(names) & {*inputs, KG}) or sorted(
            {n for n in names if names.count(n) > 1}
        )
        if clash:
            raise ValueError(
                f"over aggregate: aggregate name {clash[0]!r} is used twice or is an input column"
            )

        self.input_schema = with_key_group(input_schema)
        #: the stored (``_row.*``) columns: every input column but ``_kg`` and the keys
        self._payload = [n for n in inputs if n not in self.keys]
        sources = {c for _, _, c in self.aggregates if c is not None}
        #: what a history row keeps: the time and the aggregates' inputs (keys are columns anyway)
        self._kept = [c for c in self._payload if c == time or c in sources]
        self._key_schema = pa.schema(
            [pa.field(KG, pa.int32()), *[nullable(input_schema.field(k)) for k in self.keys]]
        )
        #: the rows as processed: every input column but ``_kg``, nullable
        self._rows_schema = pa.schema([nullable(input_schema.field(n)) for n in inputs])
        self.state_schema = pa.schema(
            [
                *self._key_schema,
                pa.field(KIND, pa.int8()),
                pa.field(SEQ, pa.int64()),
                *[nullable(input_schema.field(c)).with_name(ROW + c) for c in self._payload],
            ]
        )
        self.primary_key = (KG, *self.keys, KIND, SEQ)
        self.output_schema = pa.schema(
            [
                *[input_schema.field(n) for n in inputs],
                *aggregate_fields(self.aggregates, input_schema),
            ]
        )

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    # ------------------------------------------------------------------------- process
    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """One epoch:

        1. touched key groups: the batch's, and those with buffered rows the watermark passed;
        2. dense key ids over their state rows and the batch, in ``(_kg, keys)`` order;
        3. per key from its history: the last processed time, the next ordinal; the next
           buffered id;
        4. drop late batch rows;
        5. pending = buffered + live batch rows in the total order; ``t < W`` (or end of stream)
           is ready; new rows that are not ready are buffered;
        6. per key with ready rows, the sequence history (by ordinal) + ready rows, and the
           frames over it (one numpy pass per offset ``1..preceding``);
        7. the output; the new history (last ``max(preceding, 1)`` rows), inserts and deletes.
        """
        eos = watermark_ms >= END_OF_STREAM
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)
        p_time = ROW + self.time

        # 1. touched key groups
        kind = int_values(state.column(KIND), -1)
        due = kind == BUFFERED
        if not eos:
            due &= event_times(state.column(p_time))[0] < watermark_ms
        kgs = np.unique(np.concatenate([key_groups_of(batch), key_groups_of(state)[due]]))
        touched, rest = split_by_key_groups(state, kgs)
        kind = int_values(touched.column(KIND), -1)
        seq = int_values(touched.column(SEQ), 0)

        # 2. key ids
        (s_kid, b_kid), keytab = sorted_key_ids([touched, batch], self._key_schema)
        n_keys = keytab.num_rows

        # 3. per-key history and buffer counters
        hist = np.flatnonzero(kind == HISTORY)
        buf = np.flatnonzero(kind == BUFFERED)
        s_t = event_times(touched.column(p_time))[0]
        last = _per_key_max(n_keys, s_kid[hist], s_t[hist], NOTHING_PROCESSED)
        next_ord = _per_key_max(n_keys, s_kid[hist], seq[hist] + 1, 0)
        next_buf = _per_key_max(n_keys, s_kid[buf], seq[buf] + 1, 0)

        # 4. late rows
        b_t, b_valid = event_times(batch.column(self.time))
        late = ~b_valid | (b_t <= last[b_kid])
        if not eos:
            late |= b_t < watermark_ms
        live = np.flatnonzero(~late)

        # 5. pending rows in the total order; ready ones and newly buffered ones
        pending, p_kid, p_t, p_origin = self._pending(touched, batch, keytab, (s_kid, s_t, buf), (b_kid, b_t, live))
        ready = np.ones(p_t.size, dtype=bool) if eos else p_t < watermark_ms
        removed = np.zeros(touched.num_rows, dtype=bool)
        removed[p_origin[ready & (p_origin >= 0)]] = True

        new_buf = np.flatnonzero(~ready & (p_origin < 0))
        nb_kid = p_kid[new_buf]
        buffered_rows = self._state_rows(
            keytab,
            nb_kid,
            BUFFERED,
            next_buf[nb_kid] + _ranks(nb_kid),
            pending.take(pa.array(new_buf)),
        )

        # 6. the sequence per key with ready rows: history by ordinal, then the ready rows
        r_idx = np.flatnonzero(ready)
        r_kid = p_kid[r_idx]
        r_ord = next_ord[r_kid] + _ranks(r_kid)
        sequence, at, lo = self._sequence(touched, keytab, hist, seq, s_kid, pending.take(pa.array(r_idx)), r_kid)
        partials = self._frames(sequence, at, lo)

        # 7. output and state
        processed = sequence.take(pa.array(at))
        columns = {c: processed.column(c) for c in self._rows_schema.names}
        output = pa.table({**columns, **finish_aggregates(partials, self.aggregates)}).cast(self.output_schema)

        keep = max(self.preceding, 1)
        new_next = next_ord.copy()
        np.add.at(new_next, r_kid, 1)
        removed[hist[seq[hist] < new_next[s_kid[hist]] - keep]] = True
        stays = r_ord >= new_next[r_kid] - keep
        history_rows = self._state_rows(keytab, r_kid[stays], HISTORY, r_ord[stays],
                                        processed.filter(pa.array(stays)).select(self._kept))
        upserts = pa.concat_tables([history_rows, buffered_rows])
        deletes = touched.filter(pa.array(removed)).select(list(self.primary_key))
        new_state = pa.concat_tables([rest, touched.filter(pa.array(~removed)), upserts])
        metrics = {
            "late_rows": int(late.sum()),
            "rows_emitted": output.num_rows,
            "buffered_rows": int((int_values(new_state.column(KIND), -1) == BUFFERED).sum()),
        }
        return KernelResult.of(output, new_state, upserts, deletes, metrics)

    # ------------------------------------------------------------------------- helpers

    def _pending(self, touched: pa.Table, batch: pa.Table, keytab: pa.Table, stored: tuple[np.ndarray, ...],
                 arrived: tuple[np.ndarray, ...]) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
        """Step 5's pending rows: the buffered rows (``stored``: key ids and times of ``touched``,
        the buffered rows' indices) and the live batch rows (``arrived``: key ids, times, live
        indices), in the total order; with their key ids, times and state row (-1: new)."""
        (s_kid, s_t, buf), (b_kid, b_t, live) = stored, arrived
        buffered = self._unpack(touched.take(pa.array(buf)), s_kid[buf], keytab)
        fresh_rows = batch.take(pa.array(live)).select(self._rows_schema.names)
        pending = pa.concat_tables([buffered, fresh_rows.cast(self._rows_schema)])
        p_kid = np.concatenate([s_kid[buf], b_kid[live]])
        p_t = np.concatenate([s_t[buf], b_t[live]])
        p_origin = np.concatenate([buf, np.full(live.size, -1, dtype=np.int64)])
        order = sort_indices(
            [(pa.array(p_kid), "ascending"), (pa.array(p_t), "ascending")]
            + [(pending.column(c), "ascending") for c in self._payload],
            pending.num_rows,
        )
        return pending.take(pa.array(order)), p_kid[order], p_t[order], p_origin[order]

    def _sequence(self, touched: pa.Table, keytab: pa.Table, hist: np.ndarray, seq: np.ndarray, s_kid: np.ndarray,
                  ready: pa.Table, r_kid: np.ndarray) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Step 6's sequence: per key with ready rows, its history by ordinal then its ready rows;
        with where the ready rows are in it (in their order) and where each one's key begins."""
        h_idx = hist[np.isin(s_kid[hist], r_kid)]
        h_idx = h_idx[np.lexsort((seq[h_idx], s_kid[h_idx]))]
        h_rows = self._unpack(touched.take(pa.array(h_idx)), s_kid[h_idx], keytab)
        sequence = pa.concat_tables([h_rows, ready])
        q_kid = np.concatenate([s_kid[h_idx], r_kid])
        q_phase = np.concatenate([np.zeros(h_idx.size, np.int8), np.ones(r_kid.size, np.int8)])
        q_order = np.lexsort((np.arange(q_kid.size), q_phase, q_kid))
        at = np.flatnonzero(q_phase[q_order] == 1)  # the ready rows, in their order
        _gid, firsts, _ = segments(_key_starts(q_kid[q_order]))
        lo = firsts[_gid[at]] if at.size else np.zeros(0, dtype=np.int64)
        return sequence.take(pa.array(q_order)), at, lo

    def _unpack(self, rows: pa.Table, kid: np.ndarray, keytab: pa.Table) -> pa.Table:
        """State rows → rows of ``_rows_schema`` (keys from ``keytab``)."""
        keys = keytab.take(pa.array(kid, pa.int64()))
        return pa.table(
            {
                n: keys.column(n) if n in self.keys else rows.column(ROW + n)
                for n in self._rows_schema.names
            }
        ).cast(self._rows_schema)

    def _state_rows(
        self, keytab: pa.Table, kid: np.ndarray, kind: int, seq: np.ndarray, rows: pa.Table
    ) -> pa.Table:
        """State rows of ``kind`` for keys ``kid``: ``rows``' columns in ``_row.*``, the other
        stored columns null."""
        n = kid.size
        keys = keytab.take(pa.array(kid, pa.int64()))
        cols: dict[str, pa.Array | pa.ChunkedArray] = {
            c: keys.column(c) for c in keytab.column_names
        }
        cols[KIND] = pa.array(np.full(n, kind, dtype=np.int8))
        cols[SEQ] = pa.array(np.asarray(seq, dtype=np.int64))
        for c in self._payload:
            f = self.state_schema.field(ROW + c)
            cols[f.name] = rows.column(c) if c in rows.column_names else pa.nulls(n, f.type)
        return pa.table(cols).cast(self.state_schema)

    def _frames(self, sequence: pa.Table, at: np.ndarray, lo: np.ndarray) -> pa.Table:
        """The merged partials of every frame: rows ``max(lo, i - preceding) .. i`` of
        ``sequence`` for ``i`` in ``at`` (``lo`` the first row of ``i``'s key)."""
        one = row_partials(sequence, self._partials)
        cols: dict[str, pa.Array] = {}
        for p in self._partials:
            col = one[p.name]
            if p.kind == "count":
                acc = self._fold(int_values(col, 0), at, lo, np.add)
                cols[p.name] = pa.array(acc, pa.int64())
            elif p.kind == "sum":
                valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=np.int64)
                zero = pa.scalar(0, pa.int64()).cast(p.type)
                values = np.asarray(pc.fill_null(col, zero).to_numpy(zero_copy_only=False))
                acc = self._fold(values, at, lo, np.add)
                nonnull = self._fold(valid, at, lo, np.add)
                cols[p.name] = pa.array(acc, p.type, mask=nonnull == 0)
            else:  # min / max: fold the rank of each value, then take the winner
                n = len(col)
                rank_order = sort_indices([(col, "ascending")], n)
                rank = np.empty(n, dtype=np.int64)
                rank[rank_order] = np.arange(n, dtype=np.int64)
                null = np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
                if p.kind == "min":
                    rank[null] = n
                    acc = self._fold(rank, at, lo, np.minimum)
                    none = acc >= n
                else:
                    rank[null] = -1
                    acc = self._fold(rank, at, lo, np.maximum)
                    none = acc < 0
                winner = np.where(none, -1, rank_order[np.clip(acc, 0, max(n - 1, 0))])
                cols[p.name] = take_or_null(col, winner).cast(p.type)
        return pa.table(cols) if cols else pa.table({"_n": pa.nulls(at.size)})

    def _fold(self, values: np.ndarray, at: np.ndarray, lo: np.ndarray, op: np.ufunc) -> np.ndarray:
        """``op``-fold ``values`` over each frame: the row itself, then back to ``preceding``
        rows earlier, never before ``lo`` (one vectorised pass per offset)."""
        acc = values[at].copy()
        for d in range(1, self.preceding + 1):
            src = at - d
            ok = np.flatnonzero(src >= lo)
            if ok.size == 0:
                break
            acc[ok] = op(acc[ok], values[src[ok]])
        return acc


def _key_starts(kid: np.ndarray) -> np.ndarray:
    """True where a row of rows sorted by ``kid`` starts a new key."""
    starts = np.ones(kid.size, dtype=bool)
    starts[1:] = kid[1:] != kid[:-1]
    return starts


def _ranks(kid: np.ndarray) -> np.ndarray:
    """Position of each row among the rows of its key (rows sorted by ``kid``)."""
    return ranks_in_segments(_key_starts(kid))


def _per_key_max(n_keys: int, kid: np.ndarray, values: np.ndarray, default: int) -> np.ndarray:
    """Per key id, the largest of its ``values`` (``default`` for a key without any)."""
    out = np.full(n_keys, default, dtype=np.int64)
    np.maximum.at(out, kid, values)
    return out
