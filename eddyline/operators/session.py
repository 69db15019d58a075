"""Event-time session windows per key as a pure kernel over Arrow tables (no Spark here).

Semantics:

* Each row at time ``t`` spans ``[t, t + gap)``; rows of a key whose spans overlap — rows
  *closer* than ``gap`` — belong to one session ``[first, last + gap)``. Rows exactly ``gap``
  apart start separate sessions.
* A session is **emitted once**, when ``watermark >= last + gap`` (its end), and removed. This
  is final: a row that could still join it would need ``t < last + gap <= watermark``, which is
  late. ``END_OF_STREAM`` emits every session: the state ends empty.
* Rows before the watermark (or without a time) are late: dropped, counted in
  ``metrics["late_rows"]``.
* Rows may arrive out of order (within the watermark): a row can extend a session backwards, or
  bridge two sessions of its key into one. Sessions are merged as a union of spans, so the
  result does not depend on arrival order or on how the input is cut into epochs, as long as no
  row is late.

Aggregates are ``(name, func, column)`` with func in count/sum/min/max/avg, the partials and
types of a window aggregate (:mod:`eddyline.operators.window`).

State: one row per open session — ``_kg``, the keys, ``session_start`` (int64 ms, the first
row's time), ``_last_ms`` (int64 ms, the last row's time) and the partial columns; primary key
``(_kg, *keys, session_start)`` (sessions of a key never overlap, so starts are distinct).
Output: the keys, ``session_start`` and ``session_end`` (``timestamp[us, UTC]``), the aggregates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from eddyline.columns import KG
from eddyline.operators.base import KernelResult
from eddyline.operators.partials import (
    aggregate_fields,
    finish_aggregates,
    merge_partials,
    partial_columns,
    row_partials,
)
from eddyline.operators.rows import (
    TIMESTAMP,
    ms_to_timestamp,
    normalize,
    nullable,
    on_time,
    require_columns,
    run_starts,
    segments,
    sort_indices,
    split_by_keys,
    with_key_group,
)

SESSION_START = "session_start"
SESSION_END = "session_end"
LAST = "_last_ms"


def session_starts(gid: np.ndarray, first: np.ndarray, last: np.ndarray, gap_ms: int) -> np.ndarray:
    """For spans sorted by ``(gid, first)``: True where a span starts a new session, i.e. it is
    the first of its group or ``first >= max(last of the group's earlier spans) + gap``.

    The running maximum must restart at each group; numpy has no segmented ``accumulate``, so
    ``last`` is replaced by its rank among all values and offset by ``gid * (number of ranks)``:
    a later group's values are then all above an earlier group's, and one
    ``np.maximum.accumulate`` gives every group's own running maximum.
    """
    n = gid.size
    starts = np.ones(n, dtype=bool)
    if n < 2:
        return starts
    uniq = np.unique(last)
    u = np.int64(uniq.size)
    comp = gid.astype(np.int64) * u + np.searchsorted(uniq, last)
    running = np.maximum.accumulate(comp)
    same = gid[1:] == gid[:-1]
    prev_rank = running[:-1] - gid[:-1].astype(np.int64) * u
    prev_max = uniq[prev_rank]
    starts[1:] = ~same | (first[1:] >= prev_max + gap_ms)
    return starts


class SessionWindowKernel:
    """Session windows per key (a :class:`~eddyline.operators.base.Kernel`); see the module
    docstring for the semantics, state and output."""

    def __init__(
        self,
        input_schema: pa.Schema,
        keys: Sequence[str],
        time: str,
        gap_ms: int,
        aggregates: Sequence[tuple[str, str, str | None]],
    ):
        if gap_ms <= 0:
            raise ValueError(f"session window: gap must be positive, got {gap_ms} ms")
        if not aggregates:
            raise ValueError("session window: expected at least one aggregate")
        self.keys = tuple(keys)
        self.time = time
        self.gap_ms = int(gap_ms)
        self.aggregates = tuple((n, f, c) for n, f, c in aggregates)
        require_columns(input_schema, [*self.keys, time], "session window")
        names = [n for n, _, _ in self.aggregates]
        reserved = {*self.keys, SESSION_START, SESSION_END}
        clash = sorted(set(names) & reserved) or sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ValueError(
                f"session window: aggregate name {clash[0]!r} is used twice or is reserved"
            )
        self._partials = partial_columns(self.aggregates, input_schema)
        self.input_schema = with_key_group(input_schema)
        key_fields = [input_schema.field(k) for k in self.keys]
        self.state_schema = pa.schema(
            [
                pa.field(KG, pa.int32()),
                *[nullable(f) for f in key_fields],
                pa.field(SESSION_START, pa.int64()),
                pa.field(LAST, pa.int64()),
                *[pa.field(p.name, p.type) for p in self._partials],
            ]
        )
        self.primary_key = (KG, *self.keys, SESSION_START)
        self.output_schema = pa.schema(
            [
                *key_fields,
                pa.field(SESSION_START, TIMESTAMP),
                pa.field(SESSION_END, TIMESTAMP),
                *aggregate_fields(self.aggregates, input_schema),
            ]
        )

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    @property
    def local_keys(self) -> tuple[str, ...]:
        """A key's sessions meet only its own rows (:class:`~eddyline.state.inplace.LocalKernel`)."""
        return self.keys

    def deadline(self, state: pa.Table) -> np.ndarray:
        """An untouched session fires once the watermark reaches its last row's time + gap."""
        return state.column(LAST).to_numpy(zero_copy_only=False).astype(np.int64) + (self.gap_ms - 1)

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """1. drop late rows; turn each remaining row into a one-row session ``[t, t]``;
        2. confine work to the batch's key groups: their state sessions and the new one-row
           sessions, sorted by ``(key, start, last, state first, partials)``;
        3. cut sessions where a span starts at least ``gap`` after everything before it (a
           segmented running max); this merges, extends and bridges sessions in one pass;
        4. merge partials per session (start = min, last = max);
        5. emit sessions whose end the watermark reached, from the merged ones and from the
           untouched state; upsert changed sessions, delete state sessions that fired or were
           absorbed into a session with another start.
        """
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)
        wm, gap = watermark_ms, self.gap_ms

        # 1. late rows, one-row sessions
        rows, t_rows, late = on_time(batch, self.time, wm)
        t = pa.array(t_rows, pa.int64())
        one = pa.table(
            {
                KG: rows.column(KG),
                **{k: rows.column(k) for k in self.keys},
                SESSION_START: t,
                LAST: t,
                **row_partials(rows, self._partials),
            }
        ).cast(self.state_schema)

        # 2. touched sessions + new rows, sorted
        touched, rest = split_by_keys(state, rows, self.keys)
        both = pa.concat_tables([touched, one])
        n = both.num_rows
        src = np.concatenate([np.zeros(touched.num_rows, np.int8), np.ones(one.num_rows, np.int8)])
        group_cols = [KG, *self.keys]
        order = sort_indices(
            [(both.column(c), "ascending") for c in (*group_cols, SESSION_START, LAST)]
            + [(pa.array(src), "ascending")]
            + [(both.column(p.name), "ascending") for p in self._partials],
            n,
        )
        both, src = both.take(pa.array(order)), src[order]

        # 3. session boundaries
        gid, _, _ = segments(run_starts([both.column(c) for c in group_cols], n))
        first = both.column(SESSION_START).to_numpy().astype(np.int64)
        last = both.column(LAST).to_numpy().astype(np.int64)
        sid, s_firsts, _ = segments(session_starts(gid, first, last, gap))
        sessions = s_firsts.size

        # 4. merge per session
        merged_parts = merge_partials(
            both, sid, sessions, [(p.name, p.merge) for p in self._partials]
        )
        s_last = np.full(sessions, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(s_last, sid, last)
        s_start = first[s_firsts]
        n_state = np.bincount(sid, weights=(src == 0), minlength=sessions).astype(np.int64)
        n_rows = np.bincount(sid, weights=(src == 1), minlength=sessions).astype(np.int64)
        take = pa.array(s_firsts)
        merged = pa.table(
            {
                **{c: both.column(c).take(take) for c in group_cols},
                SESSION_START: pa.array(s_start, pa.int64()),
                LAST: pa.array(s_last, pa.int64()),
                **merged_parts,
            }
        ).cast(self.state_schema)

        # 5. fire, upsert, delete
        fire = wm >= s_last + gap
        rest_last = rest.column(LAST).to_numpy().astype(np.int64)
        rest_fire = wm >= rest_last + gap
        fired = pa.concat_tables([merged.filter(pa.array(fire)), rest.filter(pa.array(rest_fire))])
        output = self._emit(fired)

        changed = ~fire & ((n_rows > 0) | (n_state != 1))
        upserts = merged.filter(pa.array(changed))
        new_state = pa.concat_tables(
            [rest.filter(pa.array(~rest_fire)), merged.filter(pa.array(~fire))]
        )
        # a state session leaves when its session fired or now starts elsewhere (absorbed)
        gone = (src == 0) & (fire[sid] | (first != s_start[sid]))
        pk = list(self.primary_key)
        deletes = pa.concat_tables(
            [both.filter(pa.array(gone)).select(pk), rest.filter(pa.array(rest_fire)).select(pk)]
        )
        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {"late_rows": late, "sessions_fired": output.num_rows},
        )

    def _emit(self, fired: pa.Table) -> pa.Table:
        start = fired.column(SESSION_START).to_numpy().astype(np.int64)
        end = fired.column(LAST).to_numpy().astype(np.int64) + self.gap_ms
        cols = {k: fired.column(k) for k in self.keys}
        cols[SESSION_START] = ms_to_timestamp(start)
        cols[SESSION_END] = ms_to_timestamp(end)
        cols |= finish_aggregates(fired, self.aggregates)
        return pa.table(cols).cast(self.output_schema)
