"""Event-time window aggregation as a pure kernel over Arrow tables (no Spark here).

The work is split the way a combiner splits it:

1. **assign + pre-aggregate** (per epoch, stateless): every row is assigned to its windows and
   rows are folded into *partials* per ``(_kg, keys, window_start)``. On Spark this runs in the
   JVM before the lane shuffle (:mod:`eddyline.runtime.compile`); :func:`partial_aggregate` is the
   same thing in pyarrow, used by tests and as the reference.
2. **merge + fire** (per lane, stateful): :meth:`WindowKernel.process` folds the partials into the
   lane's state and emits every window whose end the watermark has passed.

Semantics (Flink's, with Spark's watermark timing):

* A row with event time ``t`` belongs to windows ``[s, s + size)`` with ``s`` a multiple of
  ``slide`` and ``s <= t < s + size``. Cumulative windows (Flink's ``CUMULATE``, ``cumulate_ms``
  = its step) start at the multiples ``s`` of ``size`` and end every step up to ``s + size``: a
  row belongs to ``[s, e)`` for every end ``e`` after ``t``. Such a window is kept under the
  *virtual start* ``e - size``, so that its end is ``start + size`` like every other window's.
* The watermark ``W`` of an epoch is fixed in the epoch plan (computed from earlier epochs).
  A window fires when ``s + size <= W``. A window step fed by sources alone may also advance it
  within the epoch (``advance_delay_ms``): a lane fires with ``max(W, t_max - delay)``, where
  ``t_max`` is the newest event time among the rows it received this epoch. That is what the
  next epoch's ``W`` will be at least, so no row is judged late differently: windows only fire
  one epoch sooner (and a replay, with the same rows on the same lanes, fires the same). It stays in state until ``s + size + lateness <= W``;
  a late row for a window that already fired updates it, and the window fires again with
  ``revision`` one higher (revision 0 is the first result).
* A (row, window) pair whose window is already past ``end + lateness`` at ``W`` is dropped; a
  row all of whose windows are dropped is *late* and is counted (and optionally written to a
  late sink). Step 1 may leave the dropping to the kernel, so that its plan does not depend on
  ``W``: each partial counts the rows whose *last* window it is (``_last``), and the kernel
  drops the partials of closed windows and counts those rows as late.

The kernel is independent of how input is split into epochs: only the watermark sequence
decides what fires, and partial aggregates merge associatively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF, KG
from eddyline.operators.base import KernelResult
from eddyline.operators.partials import ROWS, SLOT, WEIGHT_SUM, extremes, finish_aggregates
from eddyline.operators.rows import TIMESTAMP, event_time_ms

WINDOW_START = "window_start"
#: window start (ms) in partials and state; output names it WINDOW_START. Internal, so that a
#: window over another window's output (which has a window_start column) does not clash.
START_MS = "_wstart"
WINDOW_END = "window_end"
REVISION = "revision"
#: partials: the newest event time (ms) among their rows (when the watermark advances in-epoch)
TMAX = "_tmax"
#: partials: how many of their rows have this window as their last (the rows that are late when
#: it has closed); a partial without an event time holds rows that are late whatever the watermark
LAST = "_last"
REV = "_rev"  # state: how many times the window has been emitted
OLD = "_old_"  # while merging: a state row's partials as its last emission showed them
TOUCHED = "_touched"


@dataclass(frozen=True)
class WindowConfig:
    keys: tuple[str, ...]
    size_ms: int
    slide_ms: int
    #: (output name, function, input column or None for count(*))
    aggregates: tuple[tuple[str, str, str | None], ...]
    allowed_lateness_ms: int = 0
    #: the input carries revisions (``_diff`` weights): partials are weighted sums, a ``_n``
    #: partial counts the window's rows, and the output is a changelog with ``_diff``
    weighted: bool = False
    #: advance the watermark within the epoch to (newest event time on the lane − this delay);
    #: None: the planned watermark only (a step fed by other stateful steps)
    advance_delay_ms: int | None = None
    #: cumulative windows: their step (ends every ``cumulate_ms`` from each multiple of the size)
    cumulate_ms: int | None = None

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0 or self.size_ms % self.slide_ms:
            raise ValueError(
                f"window size {self.size_ms} ms must be a positive multiple of slide {self.slide_ms} ms"
            )
        if self.cumulate_ms is not None and (
            self.slide_ms != self.size_ms or self.cumulate_ms <= 0 or self.size_ms % self.cumulate_ms
        ):
            raise ValueError(f"cumulative windows: size {self.size_ms} ms must be a multiple of the step "
                             f"{self.cumulate_ms} ms (and there is no slide)")

    @property
    def windows_per_row(self) -> int:
        """The most windows a row belongs to."""
        return self.size_ms // (self.cumulate_ms or self.slide_ms)

    def window_starts(self, start_ms: np.ndarray) -> np.ndarray:
        """The windows' real starts from their (virtual, for cumulative windows) starts."""
        if self.cumulate_ms is None:
            return start_ms
        return -((-start_ms) // self.size_ms) * self.size_ms

    @property
    def extrema(self) -> tuple[tuple[str, str, str | None], ...]:
        """The min/max aggregates of a revised input: each keeps its values, with their summed
        weights, as value rows beside the window's row (see :class:`WindowKernel`)."""
        return tuple(a for a in self.aggregates if self.weighted and a[1] in ("min", "max"))

    @property
    def primary_key(self) -> tuple[str, ...]:
        values = (SLOT, *(f"{name}__v" for name, _, _ in self.extrema)) if self.extrema else ()
        return (KG, *self.keys, START_MS, *values)

    # ----------------------------------------------------------------- partial columns
    def partial_columns(self) -> list[tuple[str, str, str | None, str]]:
        """(partial column, merge function, input column, final aggregate name) per partial.

        count → one count column; sum/min/max → one column of the same function; avg → a sum and
        a non-null count, divided at emission.
        """
        cols: list[tuple[str, str, str | None, str]] = []
        for name, func, col in self.aggregates:
            if func == "count":
                cols.append((name, "count", col, name))
            elif func == "avg":
                cols.append((f"{name}__sum", "sum", col, name))
                cols.append((f"{name}__cnt", "count", col, name))
            else:
                cols.append((name, func, col, name))
                if func == "sum" and self.weighted:  # a sum of no values is null, not 0
                    cols.append((f"{name}__cnt", "count", col, name))
        if self.weighted:
            cols.append((ROWS, "count", None, ROWS))
        return cols

    def partial_type(self, func: str, input_type: pa.DataType | None) -> pa.DataType:
        if func == "count":
            return pa.int64()
        assert input_type is not None
        if func == "sum":
            return (
                pa.float64()
                if pa.types.is_floating(input_type) or pa.types.is_decimal(input_type)
                else pa.int64()
            )
        return input_type

    def partial_schema(self, input_schema: pa.Schema) -> pa.Schema:
        fields = [pa.field(KG, pa.int32())]
        fields += [input_schema.field(k) for k in self.keys]
        fields.append(pa.field(START_MS, pa.int64()))
        for pcol, func, col, _ in self.partial_columns():
            itype = input_schema.field(col).type if col else None
            fields.append(pa.field(pcol, self.partial_type(func, itype)))
        if self.extrema:
            fields.append(pa.field(SLOT, pa.int8()))
            fields += [pa.field(f"{name}__v", input_schema.field(col).type) for name, _, col in self.extrema]
            fields.append(pa.field(WEIGHT_SUM, pa.int64()))
        if self.advance_delay_ms is not None:
            fields.append(pa.field(TMAX, pa.int64()))
        fields.append(pa.field(LAST, pa.int64()))
        return pa.schema(fields)

    def state_schema(self, partial_schema: pa.Schema) -> pa.Schema:
        return partial_schema.append(pa.field(REV, pa.int32()))

    def output_schema(self, partial_schema: pa.Schema) -> pa.Schema:
        fields = [partial_schema.field(k) for k in self.keys]
        fields += [pa.field(WINDOW_START, TIMESTAMP), pa.field(WINDOW_END, TIMESTAMP)]
        for name, func, _col in self.aggregates:
            if func == "avg":
                fields.append(pa.field(name, pa.float64()))
            else:
                fields.append(partial_schema.field(name))
        fields.append(pa.field(REVISION, pa.int32()))
        if self.weighted:
            fields.append(pa.field(DIFF, pa.int64()))
        return pa.schema(fields)


def partial_aggregate(
    cfg: WindowConfig,
    rows: pa.Table,
    time_col: str,
    watermark_ms: int,
    key_groups: np.ndarray | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Assign windows and pre-aggregate ``rows``; returns ``(partials, late_rows)``.

    ``key_groups`` gives each row's key group (the runtime computes it in Spark); default 0.
    """
    n = rows.num_rows
    t = event_time_ms(rows.column(time_col)) if n else np.zeros(0, dtype=np.int64)
    last_start = (t // cfg.slide_ms) * cfg.slide_ms
    late_mask = last_start + cfg.size_ms + cfg.allowed_lateness_ms <= watermark_ms
    late_rows = rows.filter(pa.array(late_mask)) if n else rows
    if cfg.cumulate_ms is None:
        k = cfg.windows_per_row
        row_idx = np.repeat(np.arange(n), k)
        starts = np.repeat(last_start, k) - np.tile(np.arange(k, dtype=np.int64) * cfg.slide_ms, n)
    else:  # virtual starts from (the first end after t) - size up to the period's start, by step
        step = cfg.cumulate_ms
        first = t - t % step + step - cfg.size_ms
        counts = (last_start - first) // step + 1
        row_idx = np.repeat(np.arange(n), counts)
        within = np.arange(len(row_idx)) - np.repeat(np.cumsum(counts) - counts, counts)
        starts = np.repeat(first, counts) + within * step
    alive = starts + cfg.size_ms + cfg.allowed_lateness_ms > watermark_ms
    row_idx, starts = row_idx[alive], starts[alive]
    kg = key_groups if key_groups is not None else np.zeros(n, dtype=np.int32)
    cols: dict[str, pa.Array] = {KG: pa.array(np.asarray(kg, dtype=np.int32)[row_idx])}
    take = pa.array(row_idx, type=pa.int64())
    for key in cfg.keys:
        cols[key] = rows.column(key).take(take)
    cols[START_MS] = pa.array(starts, type=pa.int64())
    aggs = []
    one = "_one"
    weight = (
        rows.column(DIFF).to_numpy(zero_copy_only=False).astype(np.int64)[row_idx]
        if cfg.weighted
        else np.ones(len(row_idx), dtype=np.int64)
    )
    cols[one] = pa.array(weight)
    cols[LAST] = pa.array((starts == last_start[row_idx]).astype(np.int64))
    aggs.append((LAST, "sum", LAST))
    if cfg.advance_delay_ms is not None:
        cols["_t"] = pa.array(t[row_idx], type=pa.int64())
        aggs.append(("_t", "max", TMAX))
    extrema = {name for name, _, _ in cfg.extrema}
    inputs_needed = {c for p, _, c, _ in cfg.partial_columns() if c and p not in extrema}
    for c in inputs_needed:
        cols[f"_in_{c}"] = rows.column(c).take(take)
        if cfg.weighted:  # a weighted count sums the weights of non-null values; a sum, value × weight
            valid = pc.is_valid(cols[f"_in_{c}"])
            cols[f"_cn_{c}"] = pc.if_else(valid, cols[one], 0)
            cols[f"_in_{c}"] = pc.multiply(cols[f"_in_{c}"], pc.cast(cols[one], cols[f"_in_{c}"].type))
    exploded = pa.table(cols)
    for pcol, func, col, _ in cfg.partial_columns():
        if pcol in extrema:  # from the value rows, in the kernel
            continue
        if func == "count" and col is None:
            aggs.append((one, "sum", pcol))
        elif func == "count":
            aggs.append((f"_cn_{col}", "sum", pcol) if cfg.weighted else (f"_in_{col}", "count", pcol))
        else:
            aggs.append((f"_in_{col}", func, pcol))
    schema = cfg.partial_schema(rows.schema)
    unique_aggs = list(dict.fromkeys((src, fn) for src, fn, _ in aggs))
    window_key = [KG, *cfg.keys, START_MS]
    grouped = exploded.group_by(window_key, use_threads=False).aggregate(unique_aggs)
    out = {name: grouped.column(name) for name in window_key}
    for src, fn, pcol in aggs:
        out[pcol] = grouped.column(f"{src}_{fn}")
    parts = [_full(out, schema, grouped.num_rows, {SLOT: 0})]
    for j, (name, _, col) in enumerate(cfg.extrema):  # per value of the column, its summed weight
        assert col is not None
        one_col = exploded.select([*window_key, one]).append_column("_v", rows.column(col).take(take))
        g = one_col.filter(pc.is_valid(one_col.column("_v"))).group_by(
            [*window_key, "_v"], use_threads=False).aggregate([(one, "sum")])
        cols_v = {c: g.column(c) for c in window_key} | {f"{name}__v": g.column("_v"), WEIGHT_SUM: g.column(f"{one}_sum")}
        parts.append(_full(cols_v, schema, g.num_rows, {SLOT: j + 1}))
    partials = pa.concat_tables(parts)
    return partials, late_rows


def _full(cols: dict[str, Any], schema: pa.Schema, n: int, constants: dict[str, int]) -> pa.Table:
    """``cols`` as a table of ``schema``: the ``constants`` where the schema has them, nulls for
    the columns not given."""
    out = {}
    for f in schema:
        if f.name in cols:
            out[f.name] = cols[f.name]
        elif f.name in constants:
            out[f.name] = pa.array(np.full(n, constants[f.name]), f.type)
        else:
            out[f.name] = pa.nulls(n, f.type)
    return pa.table(out).cast(schema)


class WindowKernel:
    """Folds partials into state and fires windows (a :class:`~eddyline.operators.base.Kernel`).

    Over a revised input (``_diff``), a min or max cannot be merged from partials once a value
    is taken back, so each keeps *value rows*: per window and distinct value of its column the
    summed weight (``_slot`` j + 1 for the j-th min/max, the value in ``<name>__v``, the weight
    in ``_w``; the window's own row has ``_slot`` 0). The window's min/max is recomputed from
    its values of positive weight whenever it changes, so firing, retraction and the changelog
    treat it like any other partial; a value whose weight sums to 0 goes, and all of a window's
    values go with it.
    """

    def __init__(self, cfg: WindowConfig, partial_schema: pa.Schema):
        self.cfg = cfg
        self.input_schema = partial_schema
        for col in (TMAX, LAST):  # read in process(), not kept in state
            if col in partial_schema.names:
                partial_schema = partial_schema.remove(partial_schema.get_field_index(col))
        self.partial_schema = partial_schema
        self.state_schema = cfg.state_schema(partial_schema)
        self.primary_key = cfg.primary_key
        self.output_schema = cfg.output_schema(partial_schema)
        self._float_sums = any(
            f == "sum" and pa.types.is_floating(partial_schema.field(p).type)
            for p, f, _, _ in cfg.partial_columns()
        )

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    def process(
        self, partials: pa.Table, state: pa.Table | None, watermark_ms: int
    ) -> KernelResult:
        cfg = self.cfg
        pk = list(cfg.primary_key)
        state = self.empty_state() if state is None else state.select(self.state_schema.names)
        partials, late = self._open(partials, watermark_ms)
        if cfg.advance_delay_ms is not None and partials.num_rows and TMAX in partials.column_names:
            newest = pc.max(partials.column(TMAX)).as_py()
            if newest is not None:
                watermark_ms = max(watermark_ms, int(newest) - cfg.advance_delay_ms)
        partials = partials.select(self.partial_schema.names).cast(self.partial_schema)
        values = None
        if cfg.extrema:  # the value rows go aside; the windows' rows take the steps below
            (partials, fresh), (state, stored) = _split_values(partials), _split_values(state)
            values = self._values(stored, fresh, watermark_ms)
        if partials.num_rows and self._float_sums:
            # Float addition is not associative: merge in a fixed order so that a replay, whose
            # shuffle may deliver partials in another order, sums to the same bits.
            partials = partials.sort_by([(c, "ascending") for c in pk])
        merge = [(p, "sum" if f == "count" else f) for p, f, _, _ in cfg.partial_columns()]
        # Weighted windows retract what they emitted: each state row also carries its partials
        # as they were (what the last emission showed) through the merge.
        olds = [p for p, _ in merge] if cfg.weighted else []
        state_side = state.append_column(TOUCHED, pa.array(np.zeros(state.num_rows, dtype=np.int8)))
        batch_side = partials.append_column(REV, pa.nulls(partials.num_rows, pa.int32())).append_column(
            TOUCHED, pa.array(np.ones(partials.num_rows, dtype=np.int8))
        )
        for p in olds:
            state_side = state_side.append_column(f"{OLD}{p}", state.column(p))
            batch_side = batch_side.append_column(f"{OLD}{p}", pa.nulls(partials.num_rows, state.schema.field(p).type))
        both = pa.concat_tables([state_side, batch_side])
        if partials.num_rows:
            g = both.group_by(pk, use_threads=False).aggregate(
                [*merge, (REV, "max"), (TOUCHED, "max"), *[(f"{OLD}{p}", "max") for p in olds]]
            )
            merged_cols = {c: g.column(c) for c in pk}
            for p, f in merge:
                merged_cols[p] = g.column(f"{p}_{f}")
            merged_cols[REV] = pc.fill_null(g.column(f"{REV}_max"), 0)
            merged_cols[TOUCHED] = g.column(f"{TOUCHED}_max")
            for p in olds:
                merged_cols[f"{OLD}{p}"] = g.column(f"{OLD}{p}_max")
            if cfg.extrema:
                merged_cols[WEIGHT_SUM] = pa.nulls(g.num_rows, pa.int64())
            merged = pa.table(merged_cols)
        else:
            merged = both
        if values is not None:  # each window's min/max: over its values of positive weight now
            for name, extreme in self._extremes(merged, values.live).items():
                merged = merged.set_column(merged.schema.get_field_index(name), name, extreme)
        start = merged.column(START_MS).to_numpy()
        end = start + cfg.size_ms
        rev = merged.column(REV).to_numpy(zero_copy_only=False)
        touched = merged.column(TOUCHED).to_numpy(zero_copy_only=False).astype(bool)
        ready = end <= watermark_ms
        if cfg.weighted:
            rows = merged.column(ROWS).to_numpy(zero_copy_only=False)
            changed = ~same_partials(merged, olds)
            # first emission once the window has rows; later ones only when its result changed
            fire = ready & np.where(rev == 0, rows > 0, touched & changed)
        else:
            fire = ready & ((rev == 0) | touched)
        keep = end + cfg.allowed_lateness_ms > watermark_ms
        new_rev = rev + fire.astype(np.int32)

        output = self._emit(merged.filter(pa.array(fire)), rev[fire])
        if cfg.weighted:
            output = self._deltas(merged, fire, rev, output)
        state_cols = merged.set_column(
            merged.schema.get_field_index(REV), REV, pa.array(new_rev, type=pa.int32())
        ).select(self.state_schema.names)
        new_state = state_cols.filter(pa.array(keep)).cast(self.state_schema)
        changed = (touched | fire) & keep
        upserts = state_cols.filter(pa.array(changed)).cast(self.state_schema)
        evicted = ~keep
        deletes = merged.filter(pa.array(evicted)).select(pk)
        if values is not None:
            new_state = pa.concat_tables([new_state, values.kept])
            upserts = pa.concat_tables([upserts, values.upserts])
            deletes = pa.concat_tables([deletes.cast(values.deletes.schema), values.deletes])

        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {"windows_fired": int(fire.sum()), "late_rows": late},
        )

    def _open(self, partials: pa.Table, watermark_ms: int) -> tuple[pa.Table, int]:
        """The partials of windows still open at the planned watermark, and how many rows were
        late: those whose last window has closed, or that have no event time."""
        if not partials.num_rows:
            return partials, 0
        horizon = watermark_ms - self.cfg.size_ms - self.cfg.allowed_lateness_ms
        closed = pc.fill_null(pc.less_equal(partials.column(START_MS), horizon), True)
        if not pc.any(closed).as_py():
            return partials, 0
        late = pc.sum(partials.column(LAST).filter(closed)).as_py() if LAST in partials.column_names else 0
        return partials.filter(pc.invert(closed)), int(late or 0)

    def _values(self, stored: pa.Table, fresh: pa.Table, watermark_ms: int) -> _Values:
        """The value rows after the batch: each fresh row adds its weight to the stored row of
        (window, aggregate, value); a value whose weight sums to 0 goes, and so do the values of
        a window that leaves the state."""
        pk = list(self.cfg.primary_key)
        flags = [(stored, 1, 0), (fresh, 0, 1)]
        both = pa.concat_tables([
            t.select([*pk, WEIGHT_SUM]).append_column("_s", pa.array(np.full(t.num_rows, s, np.int8)))
            .append_column("_f", pa.array(np.full(t.num_rows, f, np.int8))) for t, s, f in flags])
        g = both.group_by(pk, use_threads=False).aggregate([(WEIGHT_SUM, "sum"), ("_s", "max"), ("_f", "max")])
        total = np.asarray(pc.fill_null(g.column(f"{WEIGHT_SUM}_sum"), 0).to_numpy(zero_copy_only=False), np.int64)
        was = g.column("_s_max").to_numpy(zero_copy_only=False).astype(bool)
        new = g.column("_f_max").to_numpy(zero_copy_only=False).astype(bool)
        end = g.column(START_MS).to_numpy() + self.cfg.size_ms
        keep = (total != 0) & (end + self.cfg.allowed_lateness_ms > watermark_ms)
        rows = _full({c: g.column(c) for c in pk} | {WEIGHT_SUM: pa.array(total)}, self.state_schema, g.num_rows, {})
        return _Values(
            kept=rows.filter(pa.array(keep)),
            live=rows.filter(pa.array(total > 0)),  # also of windows that fire as they leave
            upserts=rows.filter(pa.array(keep & new)),
            deletes=rows.filter(pa.array(~keep & was)).select(pk),
        )

    def _extremes(self, windows: pa.Table, values: pa.Table) -> dict[str, Any]:
        """Per row of ``windows`` and min/max aggregate, the extremum of its values (null: none)."""

        key_schema = pa.schema([self.state_schema.field(c) for c in (KG, *self.cfg.keys, START_MS)])
        return extremes(windows, values, key_schema, [(name, func) for name, func, _ in self.cfg.extrema])

    def _deltas(self, merged: pa.Table, fire: np.ndarray, rev: np.ndarray, new: pa.Table) -> pa.Table:
        """A weighted window's changelog: for each firing window, its last emitted row taken
        back (when it had rows) and its new row (when it has rows)."""
        was = fire & (rev > 0)
        old = merged.filter(pa.array(was))
        old = old.drop_columns([p for p, _, _, _ in self.cfg.partial_columns()])
        old = old.rename_columns([c.removeprefix(OLD) for c in old.column_names])
        old_rows = self._emit(old, rev[was] - 1).filter(pa.array(old.column(ROWS).to_numpy(zero_copy_only=False) > 0))
        old_rows = old_rows.set_column(
            old_rows.schema.get_field_index(DIFF), DIFF, pa.array(np.full(old_rows.num_rows, -1, np.int64))
        )
        new = new.filter(pa.array(merged.column(ROWS).to_numpy(zero_copy_only=False)[fire] > 0))
        return pa.concat_tables([old_rows, new])

    def _emit(self, fired: pa.Table, prior_revisions: np.ndarray) -> pa.Table:
        cfg = self.cfg
        start = fired.column(START_MS)
        cols: dict[str, pa.Array | pa.ChunkedArray] = {k: fired.column(k) for k in cfg.keys}
        real = pa.array(cfg.window_starts(start.to_numpy()), pa.int64()) if cfg.cumulate_ms else start
        cols[WINDOW_START] = pc.cast(pc.multiply(real, 1000), TIMESTAMP)
        cols[WINDOW_END] = pc.cast(pc.multiply(pc.add(start, cfg.size_ms), 1000), TIMESTAMP)
        # a weighted sum has its non-null count beside it exactly when the window is weighted
        cols.update(finish_aggregates(fired, cfg.aggregates))
        cols[REVISION] = pa.array(prior_revisions.astype(np.int32), type=pa.int32())
        if cfg.weighted:
            cols[DIFF] = pa.array(np.ones(fired.num_rows, dtype=np.int64))
        return pa.table(cols).cast(self.output_schema)


@dataclass(frozen=True)
class _Values:
    """A revised window's min/max value rows after a batch."""

    kept: pa.Table  # every value row the state keeps
    live: pa.Table  # the values present (of positive weight), before windows leave the state
    upserts: pa.Table
    deletes: pa.Table  # primary keys


def _split_values(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(the windows' rows, the value rows) of a state or a batch of partials."""
    is_value = pc.fill_null(pc.not_equal(table.column(SLOT), 0), False).to_numpy(zero_copy_only=False)
    return table.filter(pa.array(~is_value)), table.filter(pa.array(is_value))


def same_partials(merged: pa.Table, partials: list[str]) -> np.ndarray:
    """Per row, whether every partial equals its ``_old_`` value (null equal to null)."""
    same = np.ones(merged.num_rows, dtype=bool)
    for p in partials:
        a, b = merged.column(p), merged.column(f"{OLD}{p}")
        eq = pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b)).to_numpy(zero_copy_only=False)
        same &= np.asarray(eq, dtype=bool) | np.asarray(both_null, dtype=bool)
    return same
