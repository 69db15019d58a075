"""Sequence patterns (complex event processing) over a keyed event-time stream, as a pure kernel.

A :class:`Pattern` is a list of :class:`Element` s, each a named predicate with a quantifier:
``one`` (exactly one row) or ``plus`` (Kleene ``+``: one or more rows). The tick pattern of
AnduIN (Sattler & Beier, "Towards Elastic Stream Processing: Patterns and Infrastructure") is
``A B+ C D+``: A any row; each B lower than the row before it; C higher than the last B but lower
than A; each D higher than the row before it and higher than A (:func:`tick_pattern`).

Semantics (what :class:`PatternKernel` computes, and why):

* **Per key, in event-time order.** Rows of one key are matched in the order ``(event time, then
  every sortable input column in schema order, ascending, nulls last)``: a total order, so ties on
  the timestamp resolve the same way whatever order the rows arrived in.
* **Every start, every extension ("all matches").** Every row may start a match. A run (partial
  match) at element ``e`` tries, for the next row, to *stay* in ``e`` (if ``e`` is ``plus``) and to
  *advance* to ``e + 1``; both successors are kept when both predicates hold. Each time a run binds
  the last element it is a match, so ``D+`` emits ``A B C D``, ``A B C D D``, ... like AnduIN's
  ``p1p2, p1p2p3`` in its Fig. 8. A match is one assignment of rows to elements: two matches may
  span the same rows with a different split.
* **Contiguity.** ``strict`` (default): the key's very next row must extend a run, or the run dies.
  ``skip_till_next_match``: a row that satisfies none of a run's transitions is skipped and the run
  waits; a row that satisfies one is taken (the run does not also skip it).
* **Predicates** are picklable callables ``(cur, prev, bound) -> bool`` over Python dicts: ``cur``
  the candidate row, ``prev`` the row the run bound last (``None`` when starting; under strict
  contiguity this is the key's previous row), ``bound`` the first row bound to each element bound so
  far under its name and the last under ``"<name>.last"``. Plain callables keep arbitrary
  correlations (B against the previous B, C against A) correct; they are evaluated per row and run.
  The ready-made ones (:class:`Always`, :class:`Falling`, :class:`RisingBelow`,
  :class:`RisingAbove`) are small dataclasses naming columns and anchors, so they could later be
  compiled into vectorised pre-filters; today they are called like any other.
* **within_ms**: a match spans at most ``within_ms`` of event time (``match_end - match_start``,
  the times of its first and last rows in milliseconds, the unit of every time rule here); a run
  that could only be extended beyond that is dropped.
* **Measures** per match: ``name -> (element, column or None, first | last | count | min | max)``;
  ``count`` with ``None`` counts the element's rows, with a column its non-null values; min/max
  skip nulls.

Epochs and the watermark ``W`` (the same contract as :mod:`eddyline.operators.window`, whose
window ``[s, e)`` fires once ``e <= W``: every row with ``t < W`` has arrived, a row at exactly
``W`` may still come since the engine sets ``W`` to the largest event time seen minus a delay):

1. Rows with ``t < W`` are matched now, in the total order above (not ``t <= W``: a tie at ``W``
   arriving next epoch would have to be ordered before rows already matched); rows with ``t >= W``
   are **buffered** in state, so matching follows event time even when rows arrive out of order across
   epochs. ``END_OF_STREAM`` matches everything and leaves the state empty.
2. A row is **late** (dropped, counted in ``metrics["late_rows"]``) if its time is at or before the
   last time its key already matched (``t <= last``: it can no longer take its place in the key's
   order; ``t == last`` is late too, because a tie is ordered by the other columns and rows at that
   time have already been matched), or if it is more than ``allowed_lateness_ms`` behind the
   watermark. The second rule is what lets an idle key be forgotten: once ``last`` is behind the
   horizon ``W - allowed_lateness_ms`` and the key has no buffered rows and no runs, its state row
   goes, and any row it would have judged late is late by the horizon. The lateness decision thus
   depends only on the rows and watermarks, never on what happened to be evicted, which the
   two-stage pipeline below relies on. Rows without an event time are late.

Parallelisation, after AnduIN's Fig. 8:

* **Partitioned by key**: matching never looks across keys, so key groups may go to any lane.
* **Pipeline split** ``P+ = P v (P P+)`` (:func:`pipeline_split`): stage 1 matches the pattern up to
  and including the *first* occurrence of a Kleene-plus element ``P`` and emits each such run as a
  *seed* row; stage 2 receives the events and the seeds (:func:`stage2_batch`), continues every seed
  with further ``P`` rows and the suffix, and emits the matches. Limits: stage 2 still reads every
  event of its keys (strict contiguity needs them); a seed must reach stage 2 no later than the
  epoch in which stage 2 matches the row after the seed's last row, which holds when stage 2 gets
  stage 1's output of the same epoch with the same watermark; both stages need the same watermarks,
  ``allowed_lateness_ms`` and key groups (they then drop the same late rows and order ties alike);
  there is one split point, not AnduIN's arbitrary-length chain.

State (one flat Arrow table, primary key ``(_kg, *keys, _kind, _id)``): per key a *meta* row
(``_kind = 0``: ``_last_ms`` last matched time, ``_next_id`` id counter), its *buffered* rows
(``_kind = 1``: the input row in columns ``_row.<column>``), and its *runs* (``_kind = 2``):
``_start_ms``, ``_end_ms``, ``_elem`` (index of the element bound last), per element ``i`` the first
bound row in ``_first_<i>.<column>`` and, for ``plus`` elements, the last in ``_last_<i>.<column>``
and the row count ``_count_<i>``, and one ``_acc_<j>`` per count(column)/min/max measure. Key
columns are not repeated in the row columns. The table is flat (no struct columns) because the
store applies deltas with an Arrow hash join, which carries no nested columns; for the same reason
input columns must not be nested (project them away before the step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import KernelResult, changed_groups, sortable
from eddyline.operators.window import TIMESTAMP, event_time_ms

Row = dict[str, Any]
Bound = Mapping[str, Row]
Quantifier = Literal["one", "plus"]
Contiguity = Literal["strict", "skip_till_next_match"]
#: (element name, column or None, aggregate)
Measure = tuple[str, str | None, str]

ONE: Quantifier = "one"
PLUS: Quantifier = "plus"
STRICT: Contiguity = "strict"
SKIP_TILL_NEXT_MATCH: Contiguity = "skip_till_next_match"
MEASURE_FUNCS = ("first", "last", "count", "min", "max")

MATCH_START = "match_start"
MATCH_END = "match_end"

# state and seed columns
KIND, ID, LAST_MS, NEXT_ID, ROW = "_kind", "_id", "_last_ms", "_next_id", "_row"  # ROW: a prefix
START_MS, END_MS, ELEM, END_RANK, SEED = "_start_ms", "_end_ms", "_elem", "_end_rank", "_seed"
META, BUFFERED, RUN = 0, 1, 2
NOTHING_MATCHED = NO_WATERMARK  # per-key "last matched time" before the key matched any row


# --------------------------------------------------------------------------------- predicates
class Predicate(Protocol):
    """``(cur, prev, bound) -> bool``; see the module docstring. Must be picklable and must not
    mutate its arguments (runs share the dicts)."""

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool: ...


@dataclass(frozen=True)
class Always:
    """Every row (the tick pattern's A)."""

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        return True


@dataclass(frozen=True)
class Falling:
    """``cur[col] < prev[col]``: lower than the row bound before it (B+). False on nulls."""

    col: str

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        v, p = cur[self.col], None if prev is None else prev[self.col]
        return v is not None and p is not None and v < p


@dataclass(frozen=True)
class RisingBelow:
    """``prev[col] < cur[col] < bound[anchor][col]`` (C: up from the last B, still under A)."""

    col: str
    anchor: str

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        v, p, a = (
            cur[self.col],
            None if prev is None else prev[self.col],
            bound[self.anchor][self.col],
        )
        return v is not None and p is not None and a is not None and p < v < a


@dataclass(frozen=True)
class RisingAbove:
    """``cur[col] > prev[col]`` and ``cur[col] > bound[anchor][col]`` (D+: rising, above A)."""

    col: str
    anchor: str

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        v, p, a = (
            cur[self.col],
            None if prev is None else prev[self.col],
            bound[self.anchor][self.col],
        )
        return v is not None and p is not None and a is not None and v > p and v > a


# ------------------------------------------------------------------------------------ pattern
@dataclass(frozen=True)
class Element:
    name: str
    predicate: Predicate
    quantifier: Quantifier = ONE

    def __post_init__(self) -> None:
        if not self.name or "." in self.name:
            raise ValueError(f"element name {self.name!r} must be non-empty and without '.'")
        if self.quantifier not in (ONE, PLUS):
            raise ValueError(
                f"element {self.name}: quantifier must be 'one' or 'plus', got {self.quantifier!r}"
            )


@dataclass(frozen=True)
class Pattern:
    elements: tuple[Element, ...]
    contiguity: Contiguity = STRICT

    def __post_init__(self) -> None:
        object.__setattr__(self, "elements", tuple(self.elements))
        names = [e.name for e in self.elements]
        if not names:
            raise ValueError("a pattern needs at least one element")
        if len(set(names)) != len(names):
            raise ValueError(f"element names must be unique, got {names}")
        if self.contiguity not in (STRICT, SKIP_TILL_NEXT_MATCH):
            raise ValueError(
                f"contiguity must be 'strict' or 'skip_till_next_match', got {self.contiguity!r}"
            )


def tick_pattern(value_col: str, contiguity: Contiguity = STRICT) -> Pattern:
    """AnduIN's tick-shaped pattern ``A B+ C D+`` over ``value_col`` (see the module docstring)."""
    return Pattern(
        (
            Element("A", Always()),
            Element("B", Falling(value_col), PLUS),
            Element("C", RisingBelow(value_col, "A")),
            Element("D", RisingAbove(value_col, "A"), PLUS),
        ),
        contiguity,
    )


@dataclass(frozen=True)
class Split:
    """The half of a two-stage pipeline a kernel runs (see :func:`pipeline_split`): stage 1 emits
    runs that just bound element ``at`` for the first time, stage 2 continues them."""

    stage: Literal[1, 2]
    at: int


class _Measure(NamedTuple):
    name: str
    elem: int
    col: str | None
    func: str


@dataclass(frozen=True, slots=True)
class _Run:
    """A partial match while an epoch is matched. Rows are indices into the epoch's row pool."""

    start_ms: int
    end_ms: int
    elem: int  # the element bound last; elements 0..elem are bound
    first: tuple[int, ...]  # per element: pool index of its first row, -1 if unbound
    last: tuple[int, ...]
    count: tuple[int, ...]
    acc: tuple[Any, ...]  # per accumulated measure
    bound: dict[str, Row] = field(compare=False)  # the predicates' view of first/last
    origin: int = -1  # the state row it was decoded from; -1 when made this epoch


class _Pool:
    """Rows runs may bind this epoch, both as Arrow structs (to re-encode runs exactly with one
    ``take``) and as dicts (for predicates)."""

    def __init__(self, payload: pa.StructType) -> None:
        self.payload = payload
        self.parts: list[pa.Array] = []
        self.rows: list[Row | None] = []

    def add(self, structs: pa.Array, key_rows: Sequence[Row]) -> int:
        """Append ``structs`` (rows without their key columns) with their keys; returns the offset."""
        offset = len(self.rows)
        self.parts.append(structs)
        self.rows.extend(
            None if p is None else {**k, **p}
            for p, k in zip(structs.to_pylist(), key_rows, strict=True)
        )
        return offset

    def array(self) -> pa.Array:
        return pa.concat_arrays(self.parts) if self.parts else pa.array([], type=self.payload)


# ------------------------------------------------------------------------------------- kernel
class PatternKernel:
    """Matches a :class:`Pattern` per key (a :class:`~eddyline.operators.base.Kernel`).

    ``input_schema`` is the event schema, with or without ``_kg`` (appended as int32 when missing,
    as the step builders pass it); for stage 2 of a pipeline split the kernel's own
    ``input_schema`` adds the ``_seed`` column. Output: ``keys, match_start,
    match_end, measures`` (stage 1: seed rows, see :func:`pipeline_split`).
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        keys: tuple[str, ...],
        time: str,
        pattern: Pattern,
        within_ms: int,
        measures: Mapping[str, Measure],
        *,
        allowed_lateness_ms: int = 0,
        split: Split | None = None,
    ) -> None:
        if KG in input_schema.names:
            input_schema = input_schema.set(
                input_schema.get_field_index(KG), pa.field(KG, pa.int32())
            )
        else:
            input_schema = input_schema.append(pa.field(KG, pa.int32()))
        names = input_schema.names
        for k in keys:
            if k not in names or k.startswith("_"):
                raise ValueError(f"key {k!r} must be an input column not starting with '_'")
        if time not in names or time in keys or time == KG:
            raise ValueError(f"time column {time!r} must be a non-key input column")
        nested = [f.name for f in input_schema if pa.types.is_nested(f.type)]
        if nested:
            raise ValueError(
                f"nested input columns {nested} cannot be kept in pattern state; project them away"
            )
        if within_ms < 0 or allowed_lateness_ms < 0:
            raise ValueError("within_ms and allowed_lateness_ms must be >= 0")
        n = len(pattern.elements)
        if split is not None and (split.stage not in (1, 2) or not 0 <= split.at < n):
            raise ValueError(f"bad split {split} for a pattern of {n} elements")
        if split is not None and split.stage == 2 and SEED in names:
            raise ValueError(f"stage 2 reserves the input column name {SEED!r}")
        self.event_schema = input_schema
        self.keys = tuple(keys)
        self.time = time
        self.pattern = pattern
        self.within_ms = within_ms
        self.allowed_lateness_ms = allowed_lateness_ms
        self.split = split
        self._names = tuple(e.name for e in pattern.elements)
        self._preds = tuple(e.predicate for e in pattern.elements)
        self._plus = tuple(e.quantifier == PLUS for e in pattern.elements)
        self._tried = 0  # runs the current key's rows were tried against (see process, step 8)
        self.measures = tuple(self._parse_measure(m, spec) for m, spec in measures.items())
        self._accs = tuple(
            j for j, m in enumerate(self.measures) if m.func in ("min", "max") or m.col
        )
        #: per element, the accumulators (position in a run's ``acc``, measure) its rows feed
        self._folds = tuple(
            tuple(
                (pos, self.measures[j])
                for pos, j in enumerate(self._accs)
                if self.measures[j].elem == e
            )
            for e in range(len(self._names))
        )
        self._kcols = (KG, *self.keys)
        self._key_schema = pa.schema(
            [input_schema.field(c).with_nullable(True) for c in self._kcols]
        )
        self._events = pa.schema([f.with_nullable(True) for f in input_schema])
        self._payload_names = [c for c in names if c not in self._kcols]
        self._payload = pa.struct(
            [input_schema.field(c).with_nullable(True) for c in self._payload_names]
        )
        run_fields = self._run_fields()
        self.primary_key = (*self._kcols, KIND, ID)
        self.state_schema = pa.schema(
            [
                *self._key_schema,
                pa.field(KIND, pa.int8()),
                pa.field(ID, pa.int64()),
                pa.field(LAST_MS, pa.int64()),
                pa.field(NEXT_ID, pa.int64()),
                *self._row_fields(ROW),
                *run_fields,
            ]
        )
        self.seed_type = pa.struct([*run_fields, pa.field(END_RANK, pa.int64())])
        self.input_schema = (
            input_schema.append(pa.field(SEED, self.seed_type))
            if self._stage == 2
            else input_schema
        )
        if self._stage == 1:
            self.output_schema = pa.schema([*self._key_schema, *self.seed_type])
        else:
            out = [*self._key_schema][1:] + [
                pa.field(MATCH_START, TIMESTAMP),
                pa.field(MATCH_END, TIMESTAMP),
            ]
            out += [pa.field(m.name, self._measure_type(m)) for m in self.measures]
            self.output_schema = pa.schema(out)

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    def deferred(self, state: pa.Table) -> np.ndarray:
        """The buffered rows: input the watermark has not passed yet, matched in a later epoch."""
        return state.column(KIND).to_numpy(zero_copy_only=False) == BUFFERED

    # ------------------------------------------------------------------- schema helpers
    @property
    def _stage(self) -> int:
        return 0 if self.split is None else self.split.stage

    def _parse_measure(self, name: str, spec: Measure) -> _Measure:
        elem, col, func = spec
        if elem not in self._names:
            raise ValueError(f"measure {name}: unknown element {elem!r}; pattern has {self._names}")
        if func not in MEASURE_FUNCS:
            raise ValueError(
                f"measure {name}: aggregate must be one of {MEASURE_FUNCS}, got {func!r}"
            )
        if col is None and func != "count":
            raise ValueError(f"measure {name}: {func} needs a column")
        if col is not None and (col not in self.event_schema.names or col == KG):
            raise ValueError(f"measure {name}: unknown column {col!r}")
        if name in self.keys or name in (MATCH_START, MATCH_END):
            raise ValueError(f"measure name {name!r} clashes with an output column")
        return _Measure(name, self._names.index(elem), col, func)

    def _measure_type(self, m: _Measure) -> pa.DataType:
        return pa.int64() if m.func == "count" else self.event_schema.field(m.col).type

    def _row_fields(self, prefix: str) -> list[pa.Field]:
        """One stored row: the input columns except ``_kg`` and keys, as ``<prefix>.<column>``."""
        return [pa.field(f"{prefix}.{f.name}", f.type) for f in self._payload]

    def _run_fields(self) -> list[pa.Field]:
        fields = [
            pa.field(START_MS, pa.int64()),
            pa.field(END_MS, pa.int64()),
            pa.field(ELEM, pa.int32()),
        ]
        for i, plus in enumerate(self._plus):
            fields += self._row_fields(f"_first_{i}")
            if plus:
                fields += [*self._row_fields(f"_last_{i}"), pa.field(f"_count_{i}", pa.int64())]
        fields += [pa.field(f"_acc_{j}", self._measure_type(self.measures[j])) for j in self._accs]
        return fields

    # ------------------------------------------------------------------------- process
    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """One epoch: buffer, match the rows behind the watermark, prune, and emit.

        Everything but the per-key walk over ready rows (step 8) is vectorised: key ids, lateness,
        the total order, buffering, pruning and eviction work on whole columns. The result does
        not depend on the row order of ``batch``: rows are put in the total order first, runs are
        taken in id order, seeds in theirs.
        """
        eos = watermark_ms >= END_OF_STREAM
        horizon = NO_WATERMARK if eos else watermark_ms - self.allowed_lateness_ms

        # 1. normalise; stage 2 splits its input into events and seeds
        batch = batch.select(self.input_schema.names).cast(self.input_schema)
        state = (
            self.empty_state()
            if state is None
            else state.select(self.state_schema.names).cast(self.state_schema)
        )
        if self._stage == 2:
            is_seed = pc.is_valid(batch.column(SEED))
            events = batch.filter(pc.invert(is_seed)).drop_columns([SEED]).cast(self._events)
            seeds = _seed_table(batch.filter(is_seed), self._kcols)
        else:
            events = batch.cast(self._events)
            seeds = None

        # 2. dense key ids over state, events and seeds, ordered by (_kg, keys)
        parts = [state, events] + ([seeds] if seeds is not None else [])
        (s_kid, e_kid, *seed_kid), keytab = _key_index(parts, self._key_schema)
        n_keys = keytab.num_rows
        kind = state.column(KIND).to_numpy()

        # 3. per-key meta: last matched time and id counter
        meta_row = np.full(n_keys, -1, dtype=np.int64)
        is_meta = np.flatnonzero(kind == META)
        meta_row[s_kid[is_meta]] = is_meta
        old_last = np.full(n_keys, NOTHING_MATCHED, dtype=np.int64)
        old_next = np.zeros(n_keys, dtype=np.int64)
        old_last[s_kid[is_meta]] = _ints(state.column(LAST_MS).take(is_meta), NOTHING_MATCHED)
        old_next[s_kid[is_meta]] = _ints(state.column(NEXT_ID).take(is_meta), 0)
        last, next_id = old_last.copy(), old_next.copy()

        # 4. late rows: behind the key's last matched time or the lateness horizon
        e_t, e_valid = _times_ms(events.column(self.time))
        late = ~e_valid | (e_t <= old_last[e_kid]) | (e_t < horizon)
        live = ~late

        # 5. pending = still-buffered rows + live new rows, in the total order; t < W is ready
        is_buf = np.flatnonzero(kind == BUFFERED)
        buffered = self._unpack_buffered(state.take(is_buf))
        pending = pa.concat_tables([buffered, events.filter(pa.array(live))])
        p_kid = np.concatenate([s_kid[is_buf], e_kid[live]])
        p_origin = np.concatenate([is_buf, np.full(int(live.sum()), -1, dtype=np.int64)])
        p_t = np.concatenate([_times_ms(buffered.column(self.time))[0], e_t[live]])
        order = _canonical_order([p_kid, p_t], [pending.column(c) for c in self._payload_names])
        pending, p_kid, p_origin, p_t = (
            pending.take(order),
            p_kid[order],
            p_origin[order],
            p_t[order],
        )
        ready = p_t < watermark_ms
        removed = np.zeros(state.num_rows, dtype=bool)
        removed[p_origin[ready & (p_origin >= 0)]] = True

        # 6. new buffered rows get ids in the total order
        fresh = np.flatnonzero(~ready & (p_origin < 0))
        f_kid = p_kid[fresh]
        f_ids = next_id[f_kid] + _rank_in_runs(_starts_np(f_kid))
        np.add.at(next_id, f_kid, 1)
        new_buffered = self._state_rows(
            keytab, f_kid, BUFFERED, f_ids, _flatten(ROW, self._structs(pending.take(fresh)))
        )

        # 7. the row pool: ready rows, then the bound rows of the runs and seeds to continue
        ready_idx = np.flatnonzero(ready)
        r_kid, r_t = p_kid[ready_idx], p_t[ready_idx]
        r_rank = _rank_in_runs(_starts_np(r_kid, r_t))
        match_keys = np.unique(np.concatenate([r_kid, *seed_kid]))
        key_rows = self._key_rows(keytab, match_keys)
        pool = _Pool(self._payload)
        r_pool = pool.add(
            self._structs(pending.take(ready_idx)), [key_rows[k] for k in r_kid.tolist()]
        )
        is_run = kind == RUN
        continuing = np.flatnonzero(is_run & np.isin(s_kid, match_keys))
        continuing = continuing[
            np.lexsort((_ints(state.column(ID).take(continuing), 0), s_kid[continuing]))
        ]
        removed[continuing] = True
        runs_by_key = _by_key(
            s_kid[continuing],
            self._decode(state.take(continuing), s_kid[continuing], key_rows, pool, continuing),
        )
        seeds_by_key: dict[int, list[tuple[tuple[int, int], _Run]]] = {}
        if seeds is not None:
            s_order = _canonical_order(
                [seed_kid[0], *(_ints(seeds.column(c), 0) for c in (END_MS, END_RANK, START_MS))],
                [seeds.column(c) for c in seeds.column_names if c not in self._kcols],
            )
            seeds = seeds.take(s_order)
            sk = seed_kid[0][s_order]
            pos = zip(
                _ints(seeds.column(END_MS), 0).tolist(),
                _ints(seeds.column(END_RANK), 0).tolist(),
                strict=True,
            )
            decoded = self._decode(seeds, sk, key_rows, pool, None)
            for k, p, run in zip(sk.tolist(), pos, decoded, strict=True):
                seeds_by_key.setdefault(k, []).append((p, run))

        # 8. match each key (sequential per key, as a pattern is); the work per key group (each
        # ready row counts once, plus once per open run it is tried against) is reported for the
        # load statistics: a hot key's rows meet more open runs, so they cost more per row
        kg_of_key = keytab.column(KG).to_numpy(zero_copy_only=False)
        cost = np.zeros(n_keys, dtype=np.int64)
        matches: list[tuple[int, _Run]] = []
        emitted_seeds: list[tuple[int, _Run, int]] = []
        new_runs: list[tuple[int, _Run, int]] = []
        bounds = (
            np.searchsorted(r_kid, match_keys, "left"),
            np.searchsorted(r_kid, match_keys, "right"),
        )
        for k, lo, hi in zip(match_keys.tolist(), *bounds, strict=True):
            rows = [(r_pool + i, int(r_t[i]), int(r_rank[i])) for i in range(lo, hi)]
            self._tried = 0
            runs = self._match_key(
                k,
                runs_by_key.get(k, []),
                rows,
                seeds_by_key.get(k, []),
                pool.rows,
                matches,
                emitted_seeds,
            )
            cost[k] = (hi - lo) + self._tried
            if hi > lo:
                last[k] = max(last[k], int(r_t[hi - 1]))
            # the earliest time a row that is not late could still have
            earliest = END_OF_STREAM if eos else max(int(last[k]) + 1, horizon)
            for run in runs:
                if earliest - run.start_ms > self.within_ms:
                    continue
                if run.origin >= 0:
                    removed[run.origin] = False
                else:
                    new_runs.append((k, run, int(next_id[k])))
                    next_id[k] += 1

        # 9. runs of other keys die once no admissible row could extend them within within_ms
        idle_runs = np.flatnonzero(is_run & ~np.isin(s_kid, match_keys))
        next_t = (
            np.full(n_keys, END_OF_STREAM, dtype=np.int64) if eos else np.maximum(last + 1, horizon)
        )
        starts = _ints(state.column(START_MS).take(idle_runs), 0)
        removed[idle_runs[next_t[s_kid[idle_runs]] - starts > self.within_ms]] = True

        # 10. meta rows: kept while the key has runs or buffered rows, or its last time is within
        # the lateness horizon (rows at or before it are then still judged by it)
        alive = ~removed & (kind != META)
        n_rows = np.bincount(s_kid[alive], minlength=n_keys) + np.bincount(f_kid, minlength=n_keys)
        n_rows += np.bincount(
            np.array([k for k, _, _ in new_runs], dtype=np.int64), minlength=n_keys
        )
        evict = (n_rows == 0) & (eos | (last == NOTHING_MATCHED) | (last < horizon))
        has_meta = meta_row >= 0
        upsert_meta = ~evict & (~has_meta | (last != old_last) | (next_id != old_next))
        removed[meta_row[has_meta & (evict | upsert_meta)]] = True
        replaced = np.zeros(state.num_rows, dtype=bool)
        replaced[meta_row[has_meta & upsert_meta]] = True
        mk = np.flatnonzero(upsert_meta)
        metas = self._state_rows(
            keytab,
            mk,
            META,
            np.zeros(len(mk), dtype=np.int64),
            {
                LAST_MS: pa.array(last[mk], mask=last[mk] == NOTHING_MATCHED, type=pa.int64()),
                NEXT_ID: pa.array(next_id[mk], type=pa.int64()),
            },
        )

        # 11. assemble
        pool_array = pool.array()
        run_rows = self._state_rows(
            keytab,
            np.array([k for k, _, _ in new_runs], dtype=np.int64),
            RUN,
            np.array([i for _, _, i in new_runs], dtype=np.int64),
            self._encode([r for _, r, _ in new_runs], pool_array),
        )
        upserts = pa.concat_tables([metas, new_buffered, run_rows])
        new_state = pa.concat_tables([state.filter(pa.array(~removed)), upserts])
        deletes = state.filter(pa.array(removed & ~replaced)).select(list(self.primary_key))
        if self._stage == 1:
            output = self._seed_output(emitted_seeds, keytab, pool_array)
        else:
            output = self._match_output(matches, keytab, pool_array)
        kinds = new_state.column(KIND).to_numpy()
        metrics = {
            "late_rows": int(late.sum()),
            "matches": len(matches),
            "seeds": len(emitted_seeds),
            "runs": int((kinds == RUN).sum()),
            "buffered_rows": int((kinds == BUFFERED).sum()),
        }
        by_kg = np.bincount(kg_of_key, weights=cost) if n_keys else np.zeros(0)
        return KernelResult(
            output, new_state, upserts, deletes, changed_groups(upserts, deletes), metrics,
            {int(g): int(by_kg[g]) for g in np.flatnonzero(by_kg)},
        )

    # ------------------------------------------------------------------------ matching
    def _match_key(
        self,
        kid: int,
        runs: list[_Run],
        rows: list[tuple[int, int, int]],
        seeds: list[tuple[tuple[int, int], _Run]],
        pool: list[Row | None],
        matches: list[tuple[int, _Run]],
        emitted_seeds: list[tuple[int, _Run, int]],
    ) -> list[_Run]:
        """Run one key's ready rows ``(pool index, time, rank within the time)`` through its runs;
        returns the runs still open. Seeds join right after the row their last element bound."""
        n = len(self._names)
        skip = self.pattern.contiguity == SKIP_TILL_NEXT_MATCH
        starts = self._stage != 2
        split_at = self.split.at if self._stage == 1 else -1

        def admit(run: _Run, rank: int, into: list[_Run]) -> None:
            if run.elem == split_at:
                emitted_seeds.append((kid, run, rank))
                return
            if run.elem == n - 1:
                matches.append((kid, run))
                if not self._plus[-1]:
                    return
            into.append(run)

        next_seed = 0
        for p, t, rank in rows:
            while next_seed < len(seeds) and seeds[next_seed][0] < (t, rank):
                admit(seeds[next_seed][1], seeds[next_seed][0][1], runs)
                next_seed += 1
            row = _row(pool[p])
            self._tried += len(runs)
            survivors: list[_Run] = []
            for run in runs:
                if t - run.start_ms > self.within_ms:
                    continue
                e, took = run.elem, False
                prev = _row(pool[run.last[e]])
                if self._plus[e] and self._preds[e](row, prev, run.bound):
                    admit(self._bind(run, e, p, row, t), rank, survivors)
                    took = True
                if e + 1 < n and self._preds[e + 1](row, prev, run.bound):
                    admit(self._bind(run, e + 1, p, row, t), rank, survivors)
                    took = True
                if skip and not took:
                    survivors.append(run)
            if starts and self._preds[0](row, None, {}):
                admit(self._bind(None, 0, p, row, t), rank, survivors)
            runs = survivors
        for pos, seed in seeds[next_seed:]:
            admit(seed, pos[1], runs)
        return runs

    def _bind(self, run: _Run | None, e: int, p: int, row: Row, t: int) -> _Run:
        """``run`` (or a new run) with ``row`` (pool index ``p``, time ``t``) bound to element ``e``."""
        if run is None:
            n = len(self._names)
            first, last, count = (-1,) * n, (-1,) * n, (0,) * n
            acc: tuple[Any, ...] = tuple(
                0 if self.measures[j].func == "count" else None for j in self._accs
            )
            bound: dict[str, Row] = {}
            start = t
        else:
            first, last, count, acc, bound, start = (
                run.first,
                run.last,
                run.count,
                run.acc,
                dict(run.bound),
                run.start_ms,
            )
        name = self._names[e]
        if not count[e]:
            first = (*first[:e], p, *first[e + 1 :])
            bound[name] = row
        bound[f"{name}.last"] = row
        if self._folds[e]:
            folded = list(acc)
            for pos, m in self._folds[e]:
                folded[pos] = _fold(m, folded[pos], row)
            acc = tuple(folded)
        return _Run(
            start,
            t,
            e,
            first,
            (*last[:e], p, *last[e + 1 :]),
            (*count[:e], count[e] + 1, *count[e + 1 :]),
            acc,
            bound,
        )

    # --------------------------------------------------------------------- encode/decode
    def _key_rows(self, keytab: pa.Table, kids: np.ndarray) -> dict[int, Row]:
        """Key id → the key columns as a dict (merged into every row handed to predicates)."""
        if not self.keys:
            return dict.fromkeys(kids.tolist(), {})
        rows = keytab.select(list(self.keys)).take(pa.array(kids, type=pa.int64())).to_pylist()
        return dict(zip(kids.tolist(), rows, strict=True))

    def _unpack_buffered(self, rows: pa.Table) -> pa.Table:
        """Buffered state rows back into event-schema rows."""
        cols = [rows.column(c if c in self._kcols else f"{ROW}.{c}") for c in self._events.names]
        return pa.Table.from_arrays(cols, schema=self._events)

    def _structs(self, rows: pa.Table) -> pa.Array:
        """Event rows → payload structs (the row without ``_kg`` and keys)."""
        return pa.StructArray.from_arrays(
            [rows.column(c).combine_chunks() for c in self._payload_names],
            fields=list(self._payload),
        )

    def _decode(
        self,
        runs: pa.Table,
        kids: np.ndarray,
        key_rows: Mapping[int, Row],
        pool: _Pool,
        origins: np.ndarray | None,
    ) -> list[_Run]:
        """Run rows (state or seeds) → :class:`_Run` s whose bound rows are added to ``pool``."""
        krows = [key_rows[k] for k in kids.tolist()]
        n = len(self._names)
        elems = _ints(runs.column(ELEM), 0)

        def rows(prefix: str, i: int) -> int:
            structs = pa.StructArray.from_arrays(
                [runs.column(f"{prefix}.{f.name}").combine_chunks() for f in self._payload],
                fields=list(self._payload),
                mask=pa.array(elems < i),
            )
            return pool.add(structs, krows)

        first_off = [rows(f"_first_{i}", i) for i in range(n)]
        last_off = [rows(f"_last_{i}", i) if self._plus[i] else first_off[i] for i in range(n)]
        counts = [_ints(runs.column(f"_count_{i}"), 0) if self._plus[i] else None for i in range(n)]
        accs = [runs.column(f"_acc_{j}").to_pylist() for j in self._accs]
        starts, ends = _ints(runs.column(START_MS), 0), _ints(runs.column(END_MS), 0)
        out = []
        for r in range(runs.num_rows):
            e = int(elems[r])
            first = tuple(first_off[i] + r if i <= e else -1 for i in range(n))
            last = tuple(last_off[i] + r if i <= e else -1 for i in range(n))
            count = tuple(_bound_count(counts[i], r) if i <= e else 0 for i in range(n))
            bound: dict[str, Row] = {}
            for i in range(e + 1):
                bound[self._names[i]] = _row(pool.rows[first[i]])
                bound[f"{self._names[i]}.last"] = _row(pool.rows[last[i]])
            origin = -1 if origins is None else int(origins[r])
            acc = tuple(a[r] for a in accs)
            out.append(
                _Run(int(starts[r]), int(ends[r]), e, first, last, count, acc, bound, origin)
            )
        return out

    def _encode(self, runs: Sequence[_Run], pool: pa.Array) -> dict[str, pa.Array]:
        """Run columns (see :meth:`_run_fields`) for ``runs``, rows taken from ``pool``."""
        cols: dict[str, pa.Array] = {
            START_MS: pa.array([r.start_ms for r in runs], type=pa.int64()),
            END_MS: pa.array([r.end_ms for r in runs], type=pa.int64()),
            ELEM: pa.array([r.elem for r in runs], type=pa.int32()),
        }
        for i, plus in enumerate(self._plus):
            cols |= _flatten(f"_first_{i}", _take(pool, [r.first[i] for r in runs]))
            if plus:
                cols |= _flatten(f"_last_{i}", _take(pool, [r.last[i] for r in runs]))
                cols[f"_count_{i}"] = pa.array([r.count[i] for r in runs], type=pa.int64())
        for pos, j in enumerate(self._accs):
            cols[f"_acc_{j}"] = pa.array(
                [r.acc[pos] for r in runs], type=self._measure_type(self.measures[j])
            )
        return cols

    def _state_rows(
        self,
        keytab: pa.Table,
        kids: np.ndarray,
        kind: int,
        ids: np.ndarray,
        cols: Mapping[str, pa.Array],
    ) -> pa.Table:
        """State rows of one ``kind`` for keys ``kids``; columns not in ``cols`` are null."""
        n = len(kids)
        keyed = keytab.take(pa.array(kids, type=pa.int64()))
        arrays = []
        for f in self.state_schema:
            if f.name in self._kcols:
                arrays.append(keyed.column(f.name))
            elif f.name == KIND:
                arrays.append(pa.array(np.full(n, kind, dtype=np.int8)))
            elif f.name == ID:
                arrays.append(pa.array(ids, type=pa.int64()))
            else:
                arrays.append(cols.get(f.name, pa.nulls(n, f.type)))
        return pa.Table.from_arrays(arrays, schema=self.state_schema)

    def _seed_output(
        self, seeds: list[tuple[int, _Run, int]], keytab: pa.Table, pool: pa.Array
    ) -> pa.Table:
        """Stage 1's output: one row per seed ``(key id, run, rank of its last row's time)``."""
        kids = np.array([k for k, _, _ in seeds], dtype=np.int64)
        keyed = keytab.take(pa.array(kids, type=pa.int64()))
        cols = {c: keyed.column(c) for c in self._kcols}
        cols |= self._encode([r for _, r, _ in seeds], pool)
        cols[END_RANK] = pa.array([rank for _, _, rank in seeds], type=pa.int64())
        return pa.Table.from_arrays(
            [cols[f.name] for f in self.output_schema], schema=self.output_schema
        )

    def _match_output(
        self, matches: list[tuple[int, _Run]], keytab: pa.Table, pool: pa.Array
    ) -> pa.Table:
        """One row per match: keys, match_start, match_end, measures."""
        kids = pa.array([k for k, _ in matches], type=pa.int64())
        runs = [r for _, r in matches]
        keyed = keytab.take(kids)
        cols: list[pa.Array | pa.ChunkedArray] = [keyed.column(k) for k in self.keys]
        for ms in ([r.start_ms for r in runs], [r.end_ms for r in runs]):
            cols.append(
                pc.cast(pa.array(np.asarray(ms, dtype=np.int64) * 1000, type=pa.int64()), TIMESTAMP)
            )
        for j, m in enumerate(self.measures):
            if m.func in ("first", "last"):
                assert m.col is not None
                idx = [(r.first if m.func == "first" else r.last)[m.elem] for r in runs]
                cols.append(
                    keyed.column(m.col)
                    if m.col in self.keys
                    else pc.struct_field(_take(pool, idx), m.col)
                )
            elif j in self._accs:
                pos = self._accs.index(j)
                cols.append(pa.array([r.acc[pos] for r in runs], type=self._measure_type(m)))
            else:
                cols.append(pa.array([r.count[m.elem] for r in runs], type=pa.int64()))
        return pa.Table.from_arrays(cols, schema=self.output_schema)


# ----------------------------------------------------------------------- pipeline split
def pipeline_split(
    input_schema: pa.Schema,
    keys: tuple[str, ...],
    time: str,
    pattern: Pattern,
    within_ms: int,
    measures: Mapping[str, Measure],
    at: int | None = None,
    *,
    allowed_lateness_ms: int = 0,
) -> tuple[PatternKernel, PatternKernel]:
    """The two kernels of AnduIN's pipeline split ``P+ = P v (P P+)`` at Kleene-plus element
    ``at`` (default: the first one).

    Stage 1 matches ``pattern`` up to and including the first row bound to ``P`` and emits each
    such run as a seed row (``_kg, keys``, the run columns of the state, ``_end_rank``;
    ``_end_rank`` tells ties on ``_end_ms`` apart). Stage 2 starts no runs of its own: it continues
    the seeds, with further ``P`` rows (the ``P+`` branch) or the suffix directly (the ``P``
    branch), and emits the same matches a single :class:`PatternKernel` would. Feed stage 2 with
    :func:`stage2_batch` of the same epoch's events and stage 1's output, under the same watermark
    (see the module docstring for why, and for the limits).
    """
    plus = [i for i, e in enumerate(pattern.elements) if e.quantifier == PLUS]
    at = plus[0] if at is None and plus else at
    if at is None or at not in plus:
        raise ValueError(f"split point must be a Kleene-plus element; plus elements are at {plus}")
    return (
        PatternKernel(
            *(input_schema, keys, time, pattern, within_ms, measures),
            allowed_lateness_ms=allowed_lateness_ms,
            split=Split(1, at),
        ),
        PatternKernel(
            *(input_schema, keys, time, pattern, within_ms, measures),
            allowed_lateness_ms=allowed_lateness_ms,
            split=Split(2, at),
        ),
    )


def stage2_batch(stage2: PatternKernel, events: pa.Table, seeds: pa.Table) -> pa.Table:
    """Stage 2's input: the events (``_seed`` null) and stage 1's seed rows (event columns null
    except ``_kg`` and keys, the seed in ``_seed``)."""
    n = seeds.num_rows
    seed_struct = pa.StructArray.from_arrays(
        [seeds.column(f.name).combine_chunks() for f in stage2.seed_type],
        fields=list(stage2.seed_type),
    )
    seed_rows = pa.Table.from_arrays(
        [
            seeds.column(f.name)
            if f.name in (KG, *stage2.keys)
            else seed_struct
            if f.name == SEED
            else pa.nulls(n, f.type)
            for f in stage2.input_schema
        ],
        schema=stage2.input_schema,
    )
    event_rows = events.select(stage2.event_schema.names).append_column(
        SEED, pa.nulls(events.num_rows, stage2.seed_type)
    )
    return pa.concat_tables([event_rows.cast(stage2.input_schema), seed_rows])


# ------------------------------------------------------------------------- vector helpers
def _seed_table(rows: pa.Table, kcols: Sequence[str]) -> pa.Table:
    """Seed rows of a stage-2 batch → ``_kg, keys`` plus the seed's fields as columns."""
    seed = rows.column(SEED)
    fields = seed.type
    return pa.table(
        {
            **{c: rows.column(c) for c in kcols},
            **{f.name: pc.struct_field(seed, f.name) for f in fields},
        }
    )


def _ints(col: pa.Array | pa.ChunkedArray, null: int) -> np.ndarray:
    """An integer column as int64 numpy, nulls replaced by ``null``."""
    return (
        pc.fill_null(pc.cast(col, pa.int64()), null).to_numpy(zero_copy_only=False).astype(np.int64)
    )


def _times_ms(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(event time in ms, is-valid) per row; null times become 0 and invalid."""
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False).astype(bool)
    filled = pc.fill_null(col, pa.scalar(0).cast(col.type)) if len(col) else col
    return np.asarray(event_time_ms(filled), dtype=np.int64), valid


def _starts_np(*sorted_cols: np.ndarray) -> np.ndarray:
    """True where a row of rows sorted by ``sorted_cols`` starts a new run of equal values."""
    n = len(sorted_cols[0])
    starts = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
        for c in sorted_cols:
            starts[1:] |= c[1:] != c[:-1]
    return starts


def _rank_in_runs(starts: np.ndarray) -> np.ndarray:
    """Position of each row inside its run (0 at every ``starts``)."""
    idx = np.arange(len(starts), dtype=np.int64)
    return idx - np.maximum.accumulate(np.where(starts, idx, 0)) if len(starts) else idx


def _same_as_previous(col: pa.ChunkedArray) -> np.ndarray:
    """Row i equals row i-1 (for i >= 1), with null == null and NaN == NaN, as grouping needs."""
    a, b = col.slice(1), col.slice(0, len(col) - 1)
    same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(col.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return same.to_numpy(zero_copy_only=False).astype(bool)


def _key_index(
    parts: Sequence[pa.Table], key_schema: pa.Schema
) -> tuple[list[np.ndarray], pa.Table]:
    """Dense ids of the distinct keys over ``parts``, numbered in ``(_kg, keys)`` order; returns
    the ids per part and the distinct keys."""
    keys = pa.concat_tables([p.select(key_schema.names).cast(key_schema) for p in parts])
    order = pc.sort_indices(keys, [(c, "ascending") for c in key_schema.names]).to_numpy()
    ordered = keys.take(order)
    starts = np.zeros(keys.num_rows, dtype=bool)
    if keys.num_rows:
        starts[0] = True
        for c in key_schema.names:
            starts[1:] |= ~_same_as_previous(ordered.column(c))
    ids = np.empty(keys.num_rows, dtype=np.int64)
    ids[order] = np.cumsum(starts) - 1
    bounds = np.cumsum([0, *(p.num_rows for p in parts)])
    return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], ordered.filter(
        pa.array(starts)
    )


def _flatten(prefix: str, structs: pa.Array) -> dict[str, pa.Array]:
    """Struct rows → ``<prefix>.<field>`` columns (a null struct gives nulls)."""
    return {
        f"{prefix}.{f.name}": child
        for f, child in zip(structs.type, structs.flatten(), strict=True)
    }


def _canonical_order(
    leading: Sequence[np.ndarray], columns: Sequence[pa.ChunkedArray]
) -> np.ndarray:
    """Indices sorting by ``leading`` then every sortable column of ``columns`` (nulls last): the
    total order that makes results independent of arrival order. Rows equal on all of these are
    interchangeable unless they differ in an unsortable (e.g. dictionary) column."""
    arrays = [pa.array(a) for a in leading] + [c for c in columns if sortable(c.type)]
    table = pa.table({f"c{i}": a for i, a in enumerate(arrays)})
    return pc.sort_indices(table, [(f"c{i}", "ascending") for i in range(len(arrays))]).to_numpy()


def _bound_count(counts: np.ndarray | None, r: int) -> int:
    """Rows bound to a bound element: stored for ``plus`` elements, 1 for ``one`` elements."""
    return 1 if counts is None else int(counts[r])


def _row(row: Row | None) -> Row:
    """A pool row that must exist (a bound element's row is never null)."""
    if row is None:
        raise ValueError("corrupt run: a bound element has no row")
    return row


def _by_key(kids: np.ndarray, runs: list[_Run]) -> dict[int, list[_Run]]:
    out: dict[int, list[_Run]] = {}
    for k, run in zip(kids.tolist(), runs, strict=True):
        out.setdefault(k, []).append(run)
    return out


def _take(pool: pa.Array, idx: Sequence[int]) -> pa.Array:
    """``pool`` rows at ``idx``; -1 gives null."""
    arr = np.asarray(idx, dtype=np.int64)
    return pool.take(pa.array(arr, mask=arr < 0, type=pa.int64()))


def _fold(m: _Measure, acc: Any, row: Row) -> Any:
    """One row into a count(column)/min/max accumulator; nulls are skipped."""
    v = row[m.col] if m.col is not None else None
    if v is None:
        return acc
    if m.func == "count":
        return acc + 1
    if acc is None or (v < acc if m.func == "min" else v > acc):
        return v
    return acc
