"""Unbounded keyed aggregates with a changelog output.

:class:`KeyedAggregateKernel` keeps one state row per distinct key **forever** (there is no
watermark-based emission and no TTL: an average price per category or a winning bid per auction
can change at any time) and emits, every epoch, the change of each key whose result changed as
revisions (docs/revisions.md): its previous row with ``_diff`` = −1 and its new row with +1. Summed
per row, the changelog is the current result; a consumer keyed by the key may also simply apply
the −1 rows as deletes, then the +1 rows as upserts. Its rows are ordered and grouped by
:mod:`eddyline.operators.rows`, its aggregates are :mod:`eddyline.operators.partials`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF, KG
from eddyline.operators.base import KernelResult
from eddyline.operators.partials import (
    KEYED_FUNCS,
    ROWS,
    SLOT,
    WEIGHT_SUM,
    WINDOW_FUNCS,
    PartialColumn,
    aggregate_fields,
    extremes,
    finish_aggregates,
    merge_partials,
    partial_columns,
    row_partials,
)
from eddyline.operators.rows import (
    ArrayLike,
    int_values,
    normalize,
    nullable,
    require_columns,
    run_starts,
    same_values,
    segments,
    sort_indices,
    sorted_key_ids,
    split_by_keys,
    take_or_null,
    with_key_group,
)

_KEYED_AGG = re.compile(
    r"^\s*(count|sum|min|max|avg|last|max_by)\s*\(\s*(\*|[A-Za-z_]\w*)\s*(?:,\s*([A-Za-z_]\w*)\s*)?\)\s*$",
    re.I,
)


def parse_keyed_aggregate(text: str) -> tuple[str, str | None, str | None]:
    """``"max_by(price, ts)"`` → ``("max_by", "price", "ts")``; ``"count(*)"`` →
    ``("count", None, None)``; ``"last(price)"`` → ``("last", "price", None)``.

    A spec entry ``name: text`` becomes the aggregate ``(name, *parse_keyed_aggregate(text))``
    (drop the trailing ``None`` or keep it: both forms are accepted).
    """
    m = _KEYED_AGG.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            "expected count(*), count(col), sum(col), min(col), max(col), avg(col), last(col) "
            f"or max_by(col, by); got {text!r}"
        )
    func, col, by = m.group(1).lower(), m.group(2), m.group(3)
    if (func == "max_by") != (by is not None):
        raise ValueError(f"max_by takes (col, by), the other functions one column; got {text!r}")
    if col == "*":
        if func != "count":
            raise ValueError(f"expected a column inside {func}(), got {text!r}")
        return func, None, None
    return func, col, by


def keyed_revision_problem(aggregates: Sequence[tuple[str, str]]) -> str | None:
    """Why an aggregate with these ``(name, func)`` cannot take rows back (None: it can)."""
    kept = [f"{name}={func}()" for name, func in aggregates if func not in ("count", "sum", "avg", "min", "max")]
    if kept:
        return f"{', '.join(kept)}: only count, sum, avg, min and max can take a value back"
    return None


def _rows_behind(
    partials: pa.Schema, keys: Sequence[str], aggregates: Sequence[AggregateLike], time: str | None
) -> pa.Schema:
    """An input schema whose rows a kernel of ``aggregates`` would turn into ``partials``: each
    aggregated column with the type its partial has (a sum's partial is its own sum type; a
    count's column only needs to be there), ``_diff`` when the partials are weighted."""
    types: dict[str, pa.DataType | None] = {}

    def put(column: str | None, partial: str | None) -> None:
        if column is None:
            return
        have = types.get(column)
        if partial is None:
            types.setdefault(column, None)
            return
        if partial not in partials.names:
            raise ValueError(
                f"input: expected the partials of a combine step with these keys and aggregates; "
                f"missing column {partial} (input has {', '.join(partials.names)})"
            )
        t = partials.field(partial).type
        if have is not None and have != t:
            raise ValueError(f"aggregates: column {column!r} has partials of types {have} and {t}; a combine step cannot carry both")
        types[column] = t

    for spec in aggregates:
        name, func, *columns = spec
        col = columns[0] if columns else None
        by = columns[1] if len(columns) > 1 else None
        if func == "count":
            put(col, None)
        elif func == "avg":
            put(col, f"{name}__sum")
        elif func in ("last", "max_by"):
            put(col, name)
            put(time if func == "last" else by, f"{name}__by")
        else:
            put(col, name)
    put(time, None)
    missing = [k for k in keys if k not in partials.names]
    if missing:
        raise ValueError(f"input: expected the partials of a combine step keyed by {', '.join(keys)}; missing {', '.join(missing)}")
    fields = [partials.field(k) for k in keys]
    fields += [pa.field(c, t if t is not None else pa.int8()) for c, t in types.items() if c not in keys]
    if ROWS in partials.names:
        fields.append(pa.field(DIFF, pa.int64()))
    return pa.schema(fields)


class _ValueRows(NamedTuple):
    kept: pa.Table  # every value row after the batch
    live: pa.Table  # of the batch's key groups, the values present (weight > 0)
    upserts: pa.Table
    deletes: pa.Table


class KeyedAggregateSpec(NamedTuple):
    """One keyed aggregate: ``(name, func, column)``, ``column=None`` for ``count(*)``;
    ``max_by`` also names ``by``. Plain tuples of the same shape are accepted as well."""

    name: str
    func: str
    column: str | None = None
    #: max_by's ordering column (the kernel sets it to the time column for ``last``)
    by: str | None = None

    @classmethod
    def parse(cls, name: str, text: str) -> KeyedAggregateSpec:
        """``KeyedAggregateSpec.parse("winner", "max_by(bidder, price)")``."""
        return cls(name, *parse_keyed_aggregate(text))


AggregateLike = (
    KeyedAggregateSpec | tuple[str, str, str | None] | tuple[str, str, str | None, str | None]
)


class KeyedAggregateKernel:
    """An unbounded aggregate per key with a changelog output (a :class:`~eddyline.operators.base.Kernel`).

    ``aggregates`` are ``(name, func, column)`` with func in count/sum/min/max/avg (as in a
    window aggregate; ``column=None`` for ``count(*)``) or ``last``, plus
    ``(name, "max_by", column, by)``:

    * ``last(col)``: ``col`` of the row with the greatest ``time``; equal times are broken by
      the greater ``col`` (nulls lowest), a total order on what is output, so the state keeps
      only the value and its time. Rows without a time are ignored. Needs ``time``;
    * ``max_by(col, by)``: ``col`` of the row with the greatest ``by``, equal ``by`` broken the
      same way; rows with a null ``by`` are ignored (Spark's and DuckDB's rule).

    Every aggregate is exact and independent of row order and epoch split (``avg`` is
    sum/count at emission; float sums may differ in the last bits).

    Each epoch emits, per key whose *result* changed, its previous row with ``_diff`` −1 (unless
    the key is new) and its new row with ``_diff`` +1: the keys, the aggregate values and
    ``_diff``. A key whose partial state changed but whose result did not (a lower bid for
    ``max``) is written to state, not emitted. The watermark is ignored: nothing is late and
    nothing is evicted, so the state holds one row per distinct key forever — size it for the
    key cardinality.

    An input with a ``_diff`` column is revised: count, sum and avg subtract what a negative
    weight takes back, a ``_n`` partial counts each key's rows, and a key whose rows are all
    taken back is retracted (−1 only) and leaves the state. min and max keep what they need to
    take a value back: each distinct value of their column per key with its summed weight (a
    *value row*); the extremum is that of the values whose weight is positive. last and max_by
    would have to keep every row, so they refuse a revised input.

    State: ``_kg``, the keys, then per aggregate its partial columns: ``name`` (count, sum, min,
    max, the value of last/max_by), ``name__sum`` + ``name__cnt`` (avg), ``name__by`` (the time
    or ``by`` of last/max_by), and ``_n`` for a revised input. Primary key ``(_kg, *keys)``.
    A revised input with min or max adds ``_slot`` (0: the key's row; j + 1: a value row of the
    j-th min/max), ``name__v`` per min/max (its value rows' value) and ``_w`` (their weight);
    the primary key is then ``(_kg, *keys, _slot, *name__v)``.
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        keys: Sequence[str],
        aggregates: Sequence[AggregateLike],
        time: str | None = None,
    ):
        self.keys = tuple(keys)
        self.time = time
        require_columns(input_schema, [*self.keys, time], "keyed aggregate")
        if not aggregates:
            raise ValueError("keyed aggregate: expected at least one aggregate")
        aggs: list[KeyedAggregateSpec] = []
        for spec in aggregates:
            name, func, *columns = spec
            col: str | None = columns[0] if columns else None
            by: str | None = columns[1] if len(columns) > 1 else None
            if func not in KEYED_FUNCS:
                raise ValueError(
                    f"aggregates.{name}: unknown function {func!r}; expected one of {', '.join(KEYED_FUNCS)}"
                )
            if func == "max_by" and by is None:
                raise ValueError(f"aggregates.{name}: max_by needs (name, 'max_by', column, by)")
            if func != "max_by" and by is not None:
                raise ValueError(f"aggregates.{name}: only max_by takes a second column")
            if func == "last":
                if time is None:
                    raise ValueError(
                        f"aggregates.{name}: last() needs the keyed aggregate's time column"
                    )
                by = time
            if func in ("last", "max_by") and col is None:
                raise ValueError(f"aggregates.{name}: {func}() needs a column")
            require_columns(input_schema, [col, by], f"aggregates.{name}")
            aggs.append(KeyedAggregateSpec(name, func, col, by))
        names = [a.name for a in aggs]
        clash = sorted(set(names) & {*self.keys, DIFF, ROWS}) or sorted(
            {n for n in names if names.count(n) > 1}
        )
        if clash:
            raise ValueError(f"aggregates: name {clash[0]!r} is used twice (or is a key or reserved)")
        self.weighted = DIFF in input_schema.names
        if self.weighted and (problem := keyed_revision_problem([(a.name, a.func) for a in aggs])):
            raise ValueError(problem)
        self.aggregates = tuple(aggs)
        self._simple = tuple((a.name, a.func, a.column) for a in aggs if a.func in WINDOW_FUNCS)
        self._partials = partial_columns(self._simple, input_schema)
        if self.weighted:  # the rows per key; per sum its values (a sum of none is null, not 0)
            self._partials += [
                PartialColumn(f"{p.name}__cnt", p.aggregate, "count", p.source, pa.int64())
                for p in self._partials
                if p.kind == "sum" and not p.name.endswith("__sum")
            ]
            self._partials.append(PartialColumn(ROWS, ROWS, "count", None, pa.int64()))

        self.input_schema = with_key_group(input_schema)
        key_fields = [input_schema.field(k) for k in self.keys]
        state_fields = [pa.field(KG, pa.int32()), *[nullable(f) for f in key_fields]]
        out_fields = [*key_fields]
        simple_out = {f.name: f for f in aggregate_fields(self._simple, input_schema)}
        for a in aggs:
            if a.func in WINDOW_FUNCS:
                state_fields += [
                    pa.field(p.name, p.type) for p in self._partials if p.aggregate == a.name
                ]
                out_fields.append(simple_out[a.name])
            else:
                assert a.column is not None and a.by is not None
                vtype = input_schema.field(a.column).type
                state_fields += [
                    pa.field(a.name, vtype),
                    pa.field(f"{a.name}__by", input_schema.field(a.by).type),
                ]
                out_fields.append(pa.field(a.name, vtype))
        if self.weighted:
            state_fields.append(pa.field(ROWS, pa.int64()))
        self._partial_names = [f.name for f in state_fields[1 + len(self.keys) :]]
        self.primary_key: tuple[str, ...] = (KG, *self.keys)
        #: min/max over a revised input: their value rows (see the class docstring)
        self._extrema = tuple(a for a in aggs if self.weighted and a.func in ("min", "max"))
        if self._extrema:
            values = [pa.field(f"{a.name}__v", input_schema.field(a.column).type) for a in self._extrema]
            state_fields += [pa.field(SLOT, pa.int8()), *values, pa.field(WEIGHT_SUM, pa.int64())]
            self.primary_key = (KG, *self.keys, SLOT, *(f.name for f in values))
        self.state_schema = pa.schema(state_fields)
        self.output_schema = pa.schema([*out_fields, pa.field(DIFF, pa.int64())])
        #: whether input rows are :meth:`combine`'s partials rather than rows (see :meth:`merging`)
        self.combined = False

    @property
    def partial_schema(self) -> pa.Schema:
        """The rows :meth:`combine` makes: the state's columns without ``_kg``."""
        return self.state_schema.remove(self.state_schema.get_field_index(KG))

    def combine(self, batch: pa.Table) -> pa.Table:
        """The batch's rows (the input schema, without ``_kg``) merged into one partial row per
        key, in :attr:`partial_schema`: the local step of a local/global split
        (:mod:`eddyline.kinds.combine`). A :meth:`merging` kernel that takes these rows ends
        with the state and emits the changelog this kernel would from the rows themselves, since
        partials merge associatively; a key whose weighted partials all cancel is left out.
        min and max over a revised input keep every value and cannot be combined."""
        if self._extrema:
            raise ValueError(
                f"aggregates {', '.join(a.name for a in self._extrema)}: min and max over a revised input "
                "keep every value per key; they cannot be combined"
            )
        if batch.num_rows == 0:
            return self.partial_schema.empty_table()
        rows = batch.append_column(KG, pa.array(np.zeros(batch.num_rows, np.int32)))
        return self.process(rows, None, 0).state.drop_columns([KG])

    @classmethod
    def merging(
        cls, partials: pa.Schema, keys: Sequence[str], aggregates: Sequence[AggregateLike], time: str | None = None
    ) -> KeyedAggregateKernel:
        """The kernel of the same aggregates whose input rows are the partials :meth:`combine`
        makes (``partials``: their schema): the global step of a local/global split. Its state
        is that of the kernel over the rows themselves, so it can take that state over."""
        kernel = cls(_rows_behind(partials, keys, aggregates, time), keys, aggregates, time)
        if kernel._extrema:
            raise ValueError("min and max over a revised input cannot take combined partials")
        want = kernel.partial_schema
        missing = [f.name for f in want if f.name not in partials.names]
        if missing:
            raise ValueError(
                f"input: expected the partials of a combine step with these keys and aggregates; "
                f"missing column(s) {', '.join(missing)} (input has {', '.join(partials.names)})"
            )
        kernel.combined = True
        kernel.input_schema = with_key_group(want)
        return kernel

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    @property
    def local_keys(self) -> tuple[str, ...]:
        """A key's partials meet only its own rows (:class:`~eddyline.state.inplace.LocalKernel`)."""
        return self.keys

    def deadline(self, state: pa.Table) -> None:
        """An untouched key's partials never change."""
        return None

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """Fold the batch into the touched keys' partials and emit the keys whose result changed.

        1. one-row partials per batch row (``max_by``/``last`` rows with a null ``by`` carry
           nulls, so they never win);
        2. confine work to the batch's key groups; put their state rows and the batch partials
           together, sorted by key (state row first), then by every partial column so that float
           sums add in a fixed order;
        3. group equal keys; merge count/sum/min/max partials with one hash aggregate, pick
           ``last``/``max_by`` winners by a sort on ``(group, by desc, value desc)``;
        4. compare the new partials and results with the old ones: changed partials are upserts,
           changed results (and new keys) are the changelog.
        """
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)
        if batch.num_rows == 0:
            nothing = self.state_schema.empty_table()
            return KernelResult.of(self.output_schema.empty_table(), state, nothing, nothing.select(list(self.primary_key)),
                                   {"keys_inserted": 0, "keys_updated": 0})
        value_rows = None
        if self._extrema:  # the key rows go through the steps below, the value rows aside
            is_value = pc.not_equal(state.column(SLOT), 0).to_numpy(zero_copy_only=False)
            value_rows, state = state.filter(pa.array(is_value)), state.filter(pa.array(~is_value))

        # 1. one-row partials (a combined input's rows are partials already)
        rows = batch.select(self.state_schema.names).cast(self.state_schema) if self.combined else self._one_row(batch)

        # 2. the state of the batch's keys + the batch, sorted
        touched, rest = split_by_keys(state, batch, self.keys)
        both, src = self._with_state(touched, rows)

        # 3. merge per key
        gid, firsts, _sizes = segments(run_starts([both.column(c) for c in [KG, *self.keys]], both.num_rows))
        groups = len(firsts)
        values = self._values(batch, value_rows) if value_rows is not None else None
        new = self._merged(both, gid, firsts, values)

        # 4. what changed
        had = src[firsts] == 0
        old = both.take(pa.array(np.where(had, firsts, -1), mask=~had))
        state_changed = ~had | ~same_values(
            [old.column(c) for c in self._partial_names],
            [new.column(c) for c in self._partial_names],
            groups,
        )
        new_out, old_out = self._results(new), self._results(old)
        names = [a.name for a in self.aggregates]
        out_changed = ~had | ~same_values(
            [old_out[c] for c in names], [new_out[c] for c in names], groups
        )

        # A revised key whose rows were all taken back is forgotten: every partial is back to
        # zero. (A zero row count alone is not enough: a retraction may arrive before the row it
        # takes back, leaving a count of 0 and a sum that the insertion will cancel.)
        alive = self._alive(new) if self.weighted else np.ones(groups, bool)
        shown_old = had & out_changed
        shown_new = out_changed & alive
        if self.weighted:
            shown_old &= pc.fill_null(old.column(ROWS), 0).to_numpy(zero_copy_only=False) > 0
            shown_new &= new.column(ROWS).to_numpy(zero_copy_only=False) > 0
        output = pa.concat_tables([
            self._changelog(old, old_out, shown_old, -1),
            self._changelog(new, new_out, shown_new, 1),
        ])
        upserts = new.filter(pa.array(state_changed & alive))
        deletes = new.filter(pa.array(~alive & had)).select(list(self.primary_key))  # (only stored keys)
        new_state = pa.concat_tables([rest, new.filter(pa.array(alive))])
        if values is not None:
            upserts = pa.concat_tables([upserts, values.upserts])
            deletes = pa.concat_tables([deletes, values.deletes])
            new_state = pa.concat_tables([new_state, values.kept])
        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {
                "keys_inserted": int((~had & shown_new).sum()),
                "keys_updated": int((had & shown_new).sum()),
                "keys_deleted": int((shown_old & ~shown_new).sum()),
            },
        )

    def _with_state(self, touched: pa.Table, rows: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """The touched state rows and the batch's partials, sorted by key (a state row first),
        then by every partial column so that float sums add in a fixed order; with where each
        row came from (0: the state, 1: the batch)."""
        both = pa.concat_tables([touched, rows])
        src = np.concatenate([np.zeros(touched.num_rows, np.int8), np.ones(rows.num_rows, np.int8)])
        order = sort_indices(
            [(both.column(c), "ascending") for c in [KG, *self.keys]]
            + [(pa.array(src), "ascending")]
            + [(both.column(c), "ascending") for c in self._partial_names],
            both.num_rows,
        )
        return both.take(pa.array(order)), src[order]

    def _merged(self, both: pa.Table, gid: np.ndarray, firsts: np.ndarray, values: _ValueRows | None) -> pa.Table:
        """Step 3: one state row per key: count/sum/min/max partials merged with one hash
        aggregate, ``last``/``max_by`` winners picked by a sort, the extremes from the value rows."""
        groups = len(firsts)
        merged = merge_partials(both, gid, groups, [(p.name, p.merge) for p in self._partials])
        new_cols: dict[str, ArrayLike] = {c: both.column(c).take(pa.array(firsts)) for c in [KG, *self.keys]}
        for a in self.aggregates:
            if a.func in WINDOW_FUNCS:
                new_cols |= {p.name: merged[p.name] for p in self._partials if p.aggregate == a.name}
            else:
                win = self._winners(both, gid, groups, a)
                new_cols[a.name] = take_or_null(both.column(a.name), win)
                new_cols[f"{a.name}__by"] = take_or_null(both.column(f"{a.name}__by"), win)
        if self.weighted:
            new_cols[ROWS] = merged[ROWS]
        if values is not None:
            new_cols |= self._extremes(values.live, both.take(pa.array(firsts)))
            new_cols[SLOT] = pa.array(np.zeros(groups, np.int8))
            new_cols |= {f.name: pa.nulls(groups, f.type) for f in self.state_schema if f.name not in new_cols}
        return pa.table(new_cols).select(self.state_schema.names).cast(self.state_schema)

    def _alive(self, new: pa.Table) -> np.ndarray:
        """The revised keys some of whose partials are not back to zero (a min/max lives while
        its key's rows do)."""
        alive = np.zeros(new.num_rows, bool)
        extrema = {a.name for a in self._extrema}
        for c in self._partial_names:
            if c not in extrema:
                alive |= pc.fill_null(pc.not_equal(new.column(c), 0), False).to_numpy(zero_copy_only=False)
        return alive

    def _one_row(self, batch: pa.Table) -> pa.Table:
        """Each batch row as a partial in the state's schema (``max_by``/``last`` rows with a
        null ``by`` carry nulls, so they never win)."""
        cols: dict[str, ArrayLike] = {
            KG: batch.column(KG),
            **{k: batch.column(k) for k in self.keys},
        }
        weight = batch.column(DIFF).to_numpy(zero_copy_only=False) if self.weighted else None
        simple = row_partials(batch, self._partials, weight)
        for a in self.aggregates:
            if a.func in WINDOW_FUNCS:
                cols |= {p.name: simple[p.name] for p in self._partials if p.aggregate == a.name}
            else:
                assert a.column is not None and a.by is not None
                by = batch.column(a.by)
                ok = pc.is_valid(by)
                cols[a.name] = pc.if_else(
                    ok, batch.column(a.column), pa.scalar(None, batch.schema.field(a.column).type)
                )
                cols[f"{a.name}__by"] = by
        if self.weighted:
            cols[ROWS] = simple[ROWS]
        if self._extrema:
            cols[SLOT] = pa.array(np.zeros(batch.num_rows, np.int8))
            cols |= {f.name: pa.nulls(batch.num_rows, f.type) for f in self.state_schema if f.name not in cols}
        return pa.table(cols).cast(self.state_schema)

    def _values(self, batch: pa.Table, stored: pa.Table) -> _ValueRows:
        """The min/max value rows after the batch: each batch row adds its weight to the value
        row of (key, aggregate, value); a value row whose weight sums to 0 goes."""
        n = batch.num_rows
        weight = batch.column(DIFF)
        parts = []
        for j, a in enumerate(self._extrema):
            assert a.column is not None
            col = batch.column(a.column)
            cols: dict[str, ArrayLike] = {KG: batch.column(KG), **{k: batch.column(k) for k in self.keys}}
            cols |= {SLOT: pa.array(np.full(n, j + 1, np.int8)), f"{a.name}__v": col, WEIGHT_SUM: weight}
            part = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in self.state_schema})
            parts.append(part.filter(pc.is_valid(col)).cast(self.state_schema))
        touched, rest = split_by_keys(stored, batch, self.keys)
        fresh = pa.concat_tables(parts)
        both = pa.concat_tables([touched, fresh])
        pk = pa.schema([self.state_schema.field(c) for c in self.primary_key])
        (ids,), distinct = sorted_key_ids([both], pk)
        groups = distinct.num_rows
        total = np.zeros(groups, np.int64)
        np.add.at(total, ids, int_values(both.column(WEIGHT_SUM), 0))
        stored_before = np.zeros(groups, bool)
        stored_before[ids[: touched.num_rows]] = True
        new_weight = np.zeros(groups, bool)
        new_weight[ids[touched.num_rows :]] = True
        cols = {**{c: distinct.column(c) for c in distinct.column_names}, WEIGHT_SUM: pa.array(total)}
        merged = pa.table({f.name: cols.get(f.name, pa.nulls(groups, f.type)) for f in self.state_schema}).cast(self.state_schema)
        keep = total != 0
        changed = keep & new_weight  # (a batch row may also leave the sum as it was; rare)
        return _ValueRows(
            kept=pa.concat_tables([rest, merged.filter(pa.array(keep))]),
            live=merged.filter(pa.array(total > 0)),
            upserts=merged.filter(pa.array(changed)),
            deletes=merged.filter(pa.array(~keep & stored_before)).select(list(self.primary_key)),
        )

    def _extremes(self, values: pa.Table, keys: pa.Table) -> dict[str, ArrayLike]:
        key_schema = pa.schema([self.state_schema.field(c) for c in (KG, *self.keys)])
        return extremes(keys, values, key_schema, [(a.name, a.func) for a in self._extrema])

    def _changelog(self, partials: pa.Table, results: dict[str, ArrayLike], shown: np.ndarray, diff: int) -> pa.Table:
        cols = {k: partials.column(k) for k in self.keys} | results
        cols[DIFF] = pa.array(np.full(partials.num_rows, diff, dtype=np.int64))
        return pa.table(cols).filter(pa.array(shown)).cast(self.output_schema)

    def _winners(
        self, both: pa.Table, gid: np.ndarray, groups: int, a: KeyedAggregateSpec
    ) -> np.ndarray:
        """Per group, the row index whose ``a.name`` value wins ``max_by``/``last``, or -1."""
        by = both.column(f"{a.name}__by")
        valid = np.flatnonzero(
            np.asarray(pc.is_valid(by).to_numpy(zero_copy_only=False), dtype=bool)
        )
        win = np.full(groups, -1, dtype=np.int64)
        if valid.size == 0:
            return win
        idx = pa.array(valid)
        order = sort_indices(
            [
                (pa.array(gid[valid]), "ascending"),
                (by.take(idx), "descending"),
                (both.column(a.name).take(idx), "descending"),
            ],
            valid.size,
        )
        ranked = valid[order]
        g = gid[ranked]
        first = np.ones(g.size, dtype=bool)
        first[1:] = g[1:] != g[:-1]
        win[g[first]] = ranked[first]
        return win

    def _results(self, partials: pa.Table) -> dict[str, ArrayLike]:
        simple = finish_aggregates(partials, self._simple)
        return {
            a.name: simple[a.name] if a.func in WINDOW_FUNCS else partials.column(a.name)
            for a in self.aggregates
        }
