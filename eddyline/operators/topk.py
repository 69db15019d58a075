"""Top-k rows per partition, emitted when the partition is complete (no Spark here).

Semantics:

* A **group** is a partition value (``partition_by``, e.g. ``window_start``) together with the
  ``time`` value of its rows (e.g. ``window_end``). With ``time`` determined by the partition
  (a window's end), the group *is* the partition; otherwise each ``time`` value of a partition
  is ranked on its own — the only reading under which "complete" is well defined.
* A group is **complete** when ``watermark >= time``: then its top ``k`` rows by ``order_by``
  are emitted with their ``rank`` (1-based, dense: tied rows share a rank), and the group is
  removed. ``with_ties=False`` emits exactly ``k`` rows (ties broken by a total order over all
  columns); ``with_ties=True`` also emits every row tied with the k-th (SQL ``FETCH FIRST k ROWS
  WITH TIES``; with ``k=1`` this is "every row with the maximum", Nexmark q5/q7). Nulls in
  ``order_by`` columns rank last in either direction.
* **Late rows** — a ``time`` before the watermark, no ``time``, or a ``time`` equal to the
  watermark for a group that already fired — are dropped and counted in
  ``metrics["late_rows"]``. The last case needs a *tombstone*: a group that fires while
  ``watermark == time`` leaves a marker row (``_slot = -1``) until the watermark passes
  ``time``, so a straggler cannot make it fire twice. ``END_OF_STREAM`` fires every group and
  removes every tombstone: the state ends empty.

Only rows that can still be in the top ``k`` are kept: a row with ``k`` rows strictly ahead of
it (ahead in ``order_by``, with ties; in the total order, without) never re-enters, since new
rows only push it further down. So a group's state is at most ``k`` rows plus the ties.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF, KG
from eddyline.eventtime import NO_WATERMARK
from eddyline.operators.base import KernelResult, key_groups_of
from eddyline.operators.rows import (
    event_times,
    normalize,
    require_columns,
    run_starts,
    segments,
    sort_indices,
    sorted_key_ids,
    with_key_group,
)

RANK = "rank"
SLOT = "_slot"  # state: the row's position in its group's ranking; -1 marks a tombstone

_DIRECTIONS = {
    "asc": "ascending",
    "ascending": "ascending",
    "desc": "descending",
    "descending": "descending",
}


class TopKKernel:
    """The top ``k`` rows of each partition once it is complete (a
    :class:`~eddyline.operators.base.Kernel`); see the module docstring.

    ``order_by`` is a list of ``(column, "desc" | "asc")``. Output: the input columns plus
    ``rank int32``. State: ``_kg``, every input column (nullable), ``_slot int32``; primary key
    ``(_kg, *partition_by, time, _slot)``.
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        partition_by: Sequence[str],
        order_by: Sequence[tuple[str, str]],
        k: int,
        time: str,
        with_ties: bool = False,
    ):
        if k < 1:
            raise ValueError(f"top_k: k must be at least 1, got {k}")
        if not order_by:
            raise ValueError("top_k: order_by needs at least one column")
        self.partition_by = tuple(partition_by)
        self.time = time
        self.k = int(k)
        self.with_ties = bool(with_ties)
        order: list[tuple[str, str]] = []
        for col, direction in order_by:
            d = _DIRECTIONS.get(str(direction).lower())
            if d is None:
                raise ValueError(
                    f"top_k: order_by {col!r}: expected 'asc' or 'desc', got {direction!r}"
                )
            order.append((col, d))
        self.order_by = tuple(order)
        require_columns(input_schema, [*self.partition_by, time, *(c for c, _ in order)], "top_k")
        if RANK in input_schema.names:
            raise ValueError(f"top_k: the input already has a column {RANK!r}; rename it upstream")
        self.group_by = (*self.partition_by, *(() if time in self.partition_by else (time,)))

        self.input_schema = with_key_group(input_schema)
        columns = [f for f in self.input_schema if f.name != KG]
        self.columns = tuple(f.name for f in columns)
        self.output_schema = pa.schema([*columns, pa.field(RANK, pa.int32())])
        self.state_schema = pa.schema(
            [
                pa.field(KG, pa.int32()),
                *[pa.field(f.name, f.type) for f in columns],
                pa.field(SLOT, pa.int32()),
            ]
        )
        self.primary_key = (KG, *self.group_by, SLOT)

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        return self._process(batch, state, watermark_ms, watermark_ms)

    def _process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int, late_before: int) -> KernelResult:
        """(``late_before``: rows with an earlier time are late; the watermark, except for the
        complete groups :class:`WeightedTopKKernel` ranks.)

        1. drop rows whose ``time`` is missing or before the watermark;
        2. the work set: state rows of the batch's key groups and of groups the watermark
           reaches; the other state rows carry over untouched;
        3. sort work rows and batch rows by ``(group, tombstone first, order_by, every other
           column, state before batch, slot)``; rows of a tombstoned group are late;
        4. per group: position, dense rank over ``order_by``; keep the first ``k`` (and, with
           ties, every row tied with the k-th);
        5. complete groups (``watermark >= time``) emit their kept rows and leave (a tombstone
           when ``watermark == time``); others keep their kept rows at slots ``0..m-1``.
           Upserts are rows whose slot content changed, deletes the slots that emptied.
        """
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)
        wm = watermark_ms

        # 1. late by time
        t_batch, valid = event_times(batch.column(self.time))
        live = valid & (t_batch >= late_before)
        late = int(batch.num_rows - live.sum())
        rows = batch.filter(pa.array(live)) if late else batch

        # 2. work set
        t_state, _ = event_times(state.column(self.time))
        work_mask = np.isin(key_groups_of(state), np.unique(key_groups_of(rows))) | (wm >= t_state)
        work, rest = state.filter(pa.array(work_mask)), state.filter(pa.array(~work_mask))

        # 3. sort
        both, src, slot_all, tomb = self._sorted(work, rows)
        n = both.num_rows
        t_all, _ = event_times(both.column(self.time))
        gid, firsts, sizes = segments(run_starts([both.column(c) for c in (KG, *self.group_by)], n))
        groups = firsts.size
        g_tomb = tomb[firsts]
        g_time = t_all[firsts]
        in_tomb = g_tomb[gid]
        late_tomb = int((in_tomb & (src == 1)).sum())

        # 4. rank and keep (meaningful outside tombstoned groups, which hold nothing else)
        pos = np.arange(n, dtype=np.int64) - firsts[gid]
        tie_starts = run_starts([both.column(c) for c, _ in self.order_by], n)
        tie_starts[firsts] = True
        cs = np.cumsum(tie_starts, dtype=np.int64)
        rank = cs - cs[firsts[gid]] + 1
        kth_rank = rank[firsts + np.minimum(self.k, sizes) - 1]
        keep = ~in_tomb & ((pos < self.k) | (self.with_ties & (rank == kth_rank[gid])))

        # 5. fire, keep, tombstones
        g_fire = ~g_tomb & (wm >= g_time)
        fire = g_fire[gid]
        emitted = keep & fire
        out = both.filter(pa.array(emitted))
        output = (
            out.select(list(self.columns))
            .append_column(RANK, pa.array(rank[emitted].astype(np.int32), pa.int32()))
            .cast(self.output_schema)
        )

        stay = keep & ~fire
        m_new = np.bincount(gid[stay], minlength=groups)
        new_slot = pos  # kept rows are the first m_new of their group
        state_rows = _at_slots(both, stay, new_slot)
        moved = stay & ((src == 1) | (slot_all != new_slot))
        upsert_rows = _at_slots(both, moved, new_slot)
        g_new_tomb = g_fire & (wm == g_time)
        g_keep_tomb = g_tomb & ~(wm > g_time)
        tombs_new = self._tombstones(both, firsts[g_new_tomb])
        tombs_kept = both.filter(pa.array(tomb & g_keep_tomb[gid]))
        old_gone = (src == 0) & ~tomb & (fire | (slot_all >= m_new[gid]))
        old_gone |= tomb & ~g_keep_tomb[gid]

        pk = list(self.primary_key)
        new_state = pa.concat_tables([rest, state_rows, tombs_kept, tombs_new]).cast(self.state_schema)
        upserts = pa.concat_tables([upsert_rows, tombs_new]).cast(self.state_schema)
        deletes = both.filter(pa.array(old_gone)).select(pk)
        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {
                "late_rows": late + late_tomb,
                "partitions_fired": int(g_fire.sum()),
                "rows_emitted": output.num_rows,
            },
        )

    def _tombstones(self, both: pa.Table, idx: np.ndarray) -> pa.Table:
        return tombstones(self.state_schema, (KG, *self.group_by), both, idx)

    def _sorted(self, work: pa.Table, rows: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
        """Step 3: the work rows and the batch's rows (without a slot) sorted by ``(group,
        tombstone first, order_by, every other column, state before batch, slot)``; with where
        each came from (0: the state, 1: the batch), its slot (0 for a batch row) and whether it
        is a tombstone."""
        src = np.concatenate([np.zeros(work.num_rows, np.int8), np.ones(rows.num_rows, np.int8)])
        unslotted = rows.append_column(SLOT, pa.nulls(rows.num_rows, pa.int32()))
        both = pa.concat_tables([work, unslotted.select(self.state_schema.names).cast(self.state_schema)])
        slot_all = np.asarray(pc.fill_null(both.column(SLOT), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        tomb = (src == 0) & (slot_all == -1)
        ranked_cols = {c for c, _ in self.order_by} | set(self.group_by)
        order = sort_indices(
            [(both.column(c), "ascending") for c in (KG, *self.group_by)]
            + [(pa.array(tomb), "descending")]
            + [(both.column(c), d) for c, d in self.order_by]
            + [(both.column(c), "ascending") for c in self.columns if c not in ranked_cols]
            + [(pa.array(src), "ascending"), (pa.array(slot_all), "ascending")],
            both.num_rows,
        )
        return both.take(pa.array(order)), src[order], slot_all[order], tomb[order]


def _at_slots(rows: pa.Table, mask: np.ndarray, slots: np.ndarray) -> pa.Table:
    """The rows under ``mask``, each put at its slot in ``slots``."""
    return rows.filter(pa.array(mask)).set_column(
        rows.schema.get_field_index(SLOT), SLOT, pa.array(slots[mask].astype(np.int32), pa.int32()))


def tombstones(state_schema: pa.Schema, group_cols: Sequence[str], rows: pa.Table, idx: np.ndarray) -> pa.Table:
    """Marker rows (``_slot`` −1) for the groups of ``rows`` at ``idx``: the group's columns,
    every other column null."""
    take = pa.array(idx, pa.int64())
    cols = {}
    for f in state_schema:
        if f.name in group_cols:
            cols[f.name] = rows.column(f.name).take(take)
        elif f.name == SLOT:
            cols[f.name] = pa.array(np.full(len(idx), -1, np.int32), pa.int32())
        else:
            cols[f.name] = pa.nulls(len(idx), f.type)
    return pa.table(cols).cast(state_schema)


class WeightedTopKKernel:
    """``top_k`` over a revised input (rows with a ``_diff`` weight, docs/revisions.md).

    A group's rows wait in the state with their weights, all of them: a row that cannot reach
    the top ``k`` now may once a row ahead of it is taken back, so nothing is pruned. Revisions
    of a row merge as they arrive (a row and its retraction leave nothing). When the group is
    complete (the same rule as :class:`TopKKernel`), its rows of positive weight are ranked, a
    row of weight n counting as n rows, and the top ``k`` are emitted with ``_diff`` = +1. A
    revision for a group that has fired is late, like any row. Rows of negative weight when the
    group fires (a retraction of a row that never came) are dropped and counted
    (``unmatched_retractions``).

    State: ``_kg``, every input column, ``_diff``, ``_slot`` (the row's place in its group's
    canonical order; −1 a tombstone). Primary key ``(_kg, *group, _slot)``.
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        partition_by: Sequence[str],
        order_by: Sequence[tuple[str, str]],
        k: int,
        time: str,
        with_ties: bool = False,
    ):
        plain = pa.schema([f for f in input_schema if f.name != DIFF])
        self.ranker = TopKKernel(plain, partition_by, order_by, k, time, with_ties)
        self.time, self.group_by = time, self.ranker.group_by
        self.columns = self.ranker.columns
        self.input_schema = with_key_group(plain).append(pa.field(DIFF, pa.int64()))
        self.output_schema = self.ranker.output_schema.append(pa.field(DIFF, pa.int64()))
        self.state_schema = self.ranker.state_schema.insert(
            self.ranker.state_schema.get_field_index(SLOT), pa.field(DIFF, pa.int64())
        )
        self.primary_key = self.ranker.primary_key

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)
        wm = watermark_ms
        group_cols = [KG, *self.group_by]

        # rows without a time or behind the watermark are late; so are those of a fired group
        # (its tombstone stays while the watermark equals its time)
        t_batch, valid = event_times(batch.column(self.time))
        live = valid & (t_batch >= wm)
        tomb_rows = state.filter(pc.equal(state.column(SLOT), -1))
        if tomb_rows.num_rows and live.any():
            ids = self._ids([batch, tomb_rows], group_cols)
            live &= ~np.isin(ids[0], ids[1])
        late = int(batch.num_rows - live.sum())
        rows = batch.filter(pa.array(live))

        # the work set: the groups of the batch's key groups, and groups the watermark reaches
        t_state, _ = event_times(state.column(self.time))
        slots = state.column(SLOT).to_numpy(zero_copy_only=False)
        touched = np.isin(key_groups_of(state), np.unique(key_groups_of(rows))) | (wm >= t_state)
        work = state.filter(pa.array(touched & (slots >= 0)))
        tombs = state.filter(pa.array(touched & (slots < 0)))
        rest = state.filter(pa.array(~touched))

        # merge the revisions: one row per distinct content, its weights summed
        merged = pa.concat_tables([work.drop_columns([SLOT]), rows.select(work.drop_columns([SLOT]).column_names)])
        content = [KG, *self.columns]
        merged = merged.group_by(content, use_threads=False).aggregate([(DIFF, "sum")])
        merged = merged.select([*content, f"{DIFF}_sum"]).rename_columns([*content, DIFF])
        merged = merged.filter(pc.not_equal(merged.column(DIFF), 0))
        t_merged, _ = event_times(merged.column(self.time))
        fire = wm >= t_merged

        # complete groups: their rows, each as often as it weighs, ranked
        firing = merged.filter(pa.array(fire))
        weight = firing.column(DIFF).to_numpy(zero_copy_only=False)
        unmatched = int((weight < 0).sum())
        copies = np.repeat(np.arange(firing.num_rows), np.maximum(weight, 0))
        expanded = firing.drop_columns([DIFF]).take(pa.array(copies, pa.int64()))
        ranked = self.ranker._process(expanded, None, wm, NO_WATERMARK).output
        output = ranked.append_column(DIFF, pa.array(np.ones(ranked.num_rows, np.int64))).cast(self.output_schema)

        # waiting groups keep their merged rows, renumbered 0..m-1 in canonical order
        waiting = merged.filter(pa.array(~fire))
        order = sort_indices([(waiting.column(c), "ascending") for c in content], waiting.num_rows)
        waiting = waiting.take(pa.array(order))
        starts = run_starts([waiting.column(c) for c in group_cols], waiting.num_rows)
        gid, firsts, _sizes = segments(starts)
        slot = np.arange(waiting.num_rows, dtype=np.int64) - (firsts[gid] if waiting.num_rows else 0)
        waiting = waiting.append_column(SLOT, pa.array(slot.astype(np.int32), pa.int32())).cast(self.state_schema)
        g_time_ok = wm == t_merged[fire]  # a group that fired at its own time leaves a tombstone
        new_tombs = self._tombstones(firing.filter(pa.array(g_time_ok)), group_cols)
        kept_tombs = tombs.filter(pa.array(~(wm > event_times(tombs.column(self.time))[0])))

        new_state = pa.concat_tables([rest, waiting, kept_tombs, new_tombs]).cast(self.state_schema)
        # every touched slot is rewritten; the old slots no longer there go
        upserts = pa.concat_tables([waiting, new_tombs]).cast(self.state_schema)
        old = pa.concat_tables([work, tombs])
        ids = self._ids([old, new_state], [*group_cols, SLOT])
        deletes = old.filter(pa.array(~np.isin(ids[0], ids[1]))).select(list(self.primary_key))
        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {
                "late_rows": late,
                "partitions_fired": len(np.unique(self._ids([firing], group_cols)[0])),
                "rows_emitted": output.num_rows,
                "unmatched_retractions": unmatched,
            },
        )

    def _ids(self, parts: list[pa.Table], cols: list[str]) -> list[np.ndarray]:
        """Per part, a dense id per row of its ``cols`` values, equal values equal ids."""
        return sorted_key_ids(parts, pa.schema([self.state_schema.field(c) for c in cols]))[0]

    def _tombstones(self, rows: pa.Table, group_cols: list[str]) -> pa.Table:
        """One marker row per distinct group of ``rows``."""
        if not rows.num_rows:
            return self.state_schema.empty_table()
        _, first = np.unique(self._ids([rows], group_cols)[0], return_index=True)
        return tombstones(self.state_schema, group_cols, rows, first)
