"""The pattern kernel: one epoch of matching per lane, as a pure Arrow-in, Arrow-out step.

Epochs and the watermark ``W`` (the same contract as :mod:`eddyline.operators.window`, whose
window ``[s, e)`` fires once ``e <= W``: every row with ``t < W`` has arrived, a row at exactly
``W`` may still come since the engine sets ``W`` to the largest event time seen minus a delay):

1. Rows with ``t < W`` are matched now, in the total order of :mod:`~eddyline.operators.pattern.nfa`
   (not ``t <= W``: a tie at ``W`` arriving next epoch would have to be ordered before rows already
   matched); rows with ``t >= W`` are **buffered** in state, so matching follows event time even
   when rows arrive out of order across epochs. ``END_OF_STREAM`` matches everything and leaves the
   state empty.
2. A row is **late** (dropped, counted in ``metrics["late_rows"]``) if its time is at or before the
   last time its key already matched (``t <= last``: it can no longer take its place in the key's
   order; ``t == last`` is late too, because a tie is ordered by the other columns and rows at that
   time have already been matched), or if it is more than ``allowed_lateness_ms`` behind the
   watermark. The second rule is what lets an idle key be forgotten: once ``last`` is behind the
   horizon ``W - allowed_lateness_ms`` and the key has no buffered rows and no runs, its state row
   goes, and any row it would have judged late is late by the horizon. The lateness decision thus
   depends only on the rows and watermarks, never on what happened to be evicted, which the
   two-stage pipeline of :mod:`~eddyline.operators.pattern.split` relies on. Rows without an event
   time are late.

The state and output tables are described in :mod:`~eddyline.operators.pattern.layout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import KernelResult, sortable
from eddyline.operators.pattern.dsl import MEASURE_FUNCS, Measure, Pattern, Split
from eddyline.operators.pattern.layout import (
    BUFFERED,
    ELEM,
    END_MS,
    END_RANK,
    ID,
    KIND,
    LAST_MS,
    MATCH_END,
    MATCH_START,
    META,
    NEXT_ID,
    NOTHING_MATCHED,
    ROW,
    RUN,
    SEED,
    START_MS,
    Layout,
    flatten,
    seed_table,
)
from eddyline.operators.pattern.nfa import MeasureSpec, Nfa, RowPool, Run, runs_by_key
from eddyline.operators.rows import (
    event_times,
    int_values,
    ranks_in_segments,
    run_starts,
    sort_indices,
    sorted_key_ids,
    with_key_group,
)


class PatternKernel:
    """Matches a :class:`~eddyline.operators.pattern.dsl.Pattern` per key (a
    :class:`~eddyline.operators.base.Kernel`).

    ``input_schema`` is the event schema, with or without ``_kg`` (appended as int32 when missing,
    as the step builders pass it); for stage 2 of a pipeline split the kernel's own
    ``input_schema`` adds the ``_seed`` column. Output: ``keys, match_start,
    match_end, measures`` (stage 1: seed rows, see
    :func:`~eddyline.operators.pattern.split.pipeline_split`).
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
        input_schema = with_key_group(input_schema)
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
        elements = tuple(e.name for e in pattern.elements)
        self.measures = tuple(
            self._parse_measure(m, spec, elements) for m, spec in measures.items()
        )
        self._nfa = Nfa(pattern, within_ms, self.measures, split)
        self._layout = layout = Layout(input_schema, self.keys, self._nfa, self._stage)
        self.primary_key = layout.primary_key
        self.state_schema = layout.state_schema
        self.seed_type = layout.seed_type
        self.input_schema = layout.input_schema
        self.output_schema = layout.output_schema

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    def deferred(self, state: pa.Table) -> np.ndarray:
        """The buffered rows: input the watermark has not passed yet, matched in a later epoch."""
        return state.column(KIND).to_numpy(zero_copy_only=False) == BUFFERED

    def _foreign_runs(self, state: pa.Table, kind: np.ndarray) -> np.ndarray | None:
        """The runs of a split stage's state that belong to the other stage (None: there are
        none). A pipeline split made while the step runs (:mod:`eddyline.kinds.rewrite`) starts
        both stages from the single step's state: stage 1 keeps the runs that have not bound
        the split element yet, stage 2 those that have; buffered rows and per-key meta are the
        same for both. Once split, no stage ever makes a run of the other's."""
        if self.split is None:
            return None
        runs = kind == RUN
        if not runs.any():
            return None
        elem = int_values(state.column(ELEM), 0)
        mine = elem < self.split.at if self.split.stage == 1 else elem >= self.split.at
        foreign = runs & ~mine
        return foreign if foreign.any() else None

    @property
    def _stage(self) -> int:
        return 0 if self.split is None else self.split.stage

    def _parse_measure(self, name: str, spec: Measure, elements: tuple[str, ...]) -> MeasureSpec:
        elem, col, func = spec
        if elem not in elements:
            raise ValueError(f"measure {name}: unknown element {elem!r}; pattern has {elements}")
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
        return MeasureSpec(name, elements.index(elem), col, func)

    # ------------------------------------------------------------------------- process
    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """One epoch: buffer, match the rows behind the watermark, prune, and emit.

        Everything but the per-key walk over ready rows (step 8) is vectorised: key ids, lateness,
        the total order, buffering, pruning and eviction work on whole columns. The result does
        not depend on the row order of ``batch``: rows are put in the total order first, runs are
        taken in id order, seeds in theirs.
        """
        layout = self._layout
        eos = watermark_ms >= END_OF_STREAM
        horizon = NO_WATERMARK if eos else watermark_ms - self.allowed_lateness_ms

        # 1. normalise; stage 2 splits its input into events and seeds
        state, events, seeds = self._normalised(batch, state)

        # 2. dense key ids over state, events and seeds, ordered by (_kg, keys)
        parts = [state, events] + ([seeds] if seeds is not None else [])
        (s_kid, e_kid, *seed_kid), keytab = sorted_key_ids(parts, layout.key_schema)
        n_keys = keytab.num_rows
        kind = state.column(KIND).to_numpy()
        foreign = self._foreign_runs(state, kind)
        if foreign is not None:
            kind = np.where(foreign, -1, kind)  # neither meta, buffered nor a run: only deleted

        # 3. per-key meta: last matched time and id counter
        meta = _Meta.read(state, kind, s_kid, n_keys)
        last, next_id = meta.last.copy(), meta.next_id.copy()

        # 4. late rows: behind the key's last matched time or the lateness horizon
        e_t, e_valid = event_times(events.column(self.time))
        late = ~e_valid | (e_t <= meta.last[e_kid]) | (e_t < horizon)
        live = ~late

        # 5. pending = still-buffered rows + live new rows, in the total order; t < W is ready
        is_buf = np.flatnonzero(kind == BUFFERED)
        buffered = layout.unpack_buffered(state.take(is_buf))
        pending = pa.concat_tables([buffered, events.filter(pa.array(live))])
        p_kid = np.concatenate([s_kid[is_buf], e_kid[live]])
        p_origin = np.concatenate([is_buf, np.full(int(live.sum()), -1, dtype=np.int64)])
        p_t = np.concatenate([event_times(buffered.column(self.time))[0], e_t[live]])
        order = _canonical_order([p_kid, p_t], [pending.column(c) for c in layout.payload_names])
        pending, p_kid, p_origin, p_t = pending.take(order), p_kid[order], p_origin[order], p_t[order]
        ready = p_t < watermark_ms
        removed = np.zeros(state.num_rows, dtype=bool) if foreign is None else foreign.copy()
        removed[p_origin[ready & (p_origin >= 0)]] = True

        # 6. new buffered rows get ids in the total order
        fresh = np.flatnonzero(~ready & (p_origin < 0))
        f_kid = p_kid[fresh]
        f_ids = next_id[f_kid] + _ranks(f_kid)
        np.add.at(next_id, f_kid, 1)
        new_buffered = layout.state_rows(keytab, f_kid, BUFFERED, f_ids, flatten(ROW, layout.structs(pending.take(fresh))))

        # 7. the row pool: ready rows, then the bound rows of the runs and seeds to continue
        ready_idx = np.flatnonzero(ready)
        r_kid, r_t = p_kid[ready_idx], p_t[ready_idx]
        match_keys = np.unique(np.concatenate([r_kid, *seed_kid]))
        key_rows = layout.key_rows(keytab, match_keys)
        pool = RowPool(layout.payload)
        r_pool = pool.add(layout.structs(pending.take(ready_idx)), [key_rows[k] for k in r_kid.tolist()])
        is_run = kind == RUN
        continuing = np.flatnonzero(is_run & np.isin(s_kid, match_keys))
        continuing = continuing[np.lexsort((int_values(state.column(ID).take(continuing), 0), s_kid[continuing]))]
        removed[continuing] = True
        open_runs = runs_by_key(
            s_kid[continuing], layout.decode(state.take(continuing), s_kid[continuing], key_rows, pool, continuing))
        seeds_by_key = {} if seeds is None else self._seeds_by_key(seeds, seed_kid[0], key_rows, pool)

        # 8. match each key, sequentially per key as a pattern is
        walk = _Walk(match_keys, r_kid, r_t, r_pool, open_runs, seeds_by_key, n_keys)
        self._walk(walk, pool, last, next_id, removed, END_OF_STREAM if eos else None, horizon)

        # 9. runs of other keys die once no admissible row could extend them within within_ms
        idle_runs = np.flatnonzero(is_run & ~np.isin(s_kid, match_keys))
        next_t = np.full(n_keys, END_OF_STREAM, dtype=np.int64) if eos else np.maximum(last + 1, horizon)
        starts = int_values(state.column(START_MS).take(idle_runs), 0)
        removed[idle_runs[next_t[s_kid[idle_runs]] - starts > self.within_ms]] = True

        # 10. meta rows: kept while the key has runs or buffered rows, or its last time is within
        # the lateness horizon (rows at or before it are then still judged by it)
        alive = ~removed & (kind != META)
        n_rows = np.bincount(s_kid[alive], minlength=n_keys) + np.bincount(f_kid, minlength=n_keys)
        n_rows += np.bincount(np.array([k for k, _, _ in walk.new_runs], dtype=np.int64), minlength=n_keys)
        evict = (n_rows == 0) & (eos | (last == NOTHING_MATCHED) | (last < horizon))
        metas, replaced = self._meta_rows(keytab, meta, last, next_id, evict, removed)

        # 11. assemble
        return self._result(state, keytab, walk, pool.array(), [metas, new_buffered], removed, replaced, int(late.sum()))

    def _normalised(self, batch: pa.Table, state: pa.Table | None) -> tuple[pa.Table, pa.Table, pa.Table | None]:
        """The state, the events and (stage 2) the seeds, each in its schema. Not with
        rows.normalize: combining chunks would re-encode dictionary columns, and the state must
        come out as it did."""
        batch = batch.select(self.input_schema.names).cast(self.input_schema)
        state = self.empty_state() if state is None else state.select(self.state_schema.names).cast(self.state_schema)
        if self._stage != 2:
            return state, batch.cast(self._layout.events), None
        is_seed = pc.is_valid(batch.column(SEED))
        events = batch.filter(pc.invert(is_seed)).drop_columns([SEED]).cast(self._layout.events)
        return state, events, seed_table(batch.filter(is_seed), self._layout.kcols)

    def _seeds_by_key(self, seeds: pa.Table, seed_kid: np.ndarray, key_rows: Any, pool: RowPool
                      ) -> dict[int, list[tuple[tuple[int, int], Run]]]:
        """Stage 2's seeds (runs stage 1 began) per key id, in their total order, each with the
        position (time, rank) of the row it ended at."""
        layout = self._layout
        s_order = _canonical_order(
            [seed_kid, *(int_values(seeds.column(c), 0) for c in (END_MS, END_RANK, START_MS))],
            [seeds.column(c) for c in seeds.column_names if c not in layout.kcols],
        )
        seeds = seeds.take(s_order)
        sk = seed_kid[s_order]
        pos = zip(int_values(seeds.column(END_MS), 0).tolist(), int_values(seeds.column(END_RANK), 0).tolist(), strict=True)
        out: dict[int, list[tuple[tuple[int, int], Run]]] = {}
        for k, p, run in zip(sk.tolist(), pos, layout.decode(seeds, sk, key_rows, pool, None), strict=True):
            out.setdefault(k, []).append((p, run))
        return out

    def _walk(self, walk: _Walk, pool: RowPool, last: np.ndarray, next_id: np.ndarray, removed: np.ndarray,
              eos: int | None, horizon: int) -> None:
        """Step 8: each key's ready rows against its open runs and seeds. A run that can still
        complete stays (an old one is kept, a new one gets the key's next id); ``last`` and
        ``next_id`` advance. The work per key (each ready row once, plus once per open run it is
        tried against) is kept for the load statistics: a hot key's rows meet more open runs, so
        they cost more per row."""
        r_rank = _ranks(walk.r_kid, walk.r_t)
        bounds = np.searchsorted(walk.r_kid, walk.keys, "left"), np.searchsorted(walk.r_kid, walk.keys, "right")
        for k, lo, hi in zip(walk.keys.tolist(), *bounds, strict=True):
            rows = [(walk.r_pool + i, int(walk.r_t[i]), int(r_rank[i])) for i in range(lo, hi)]
            runs, tried = self._nfa.match_key(k, walk.open_runs.get(k, []), rows, walk.seeds_by_key.get(k, []),
                                              pool.rows, walk.matches, walk.emitted_seeds)
            walk.cost[k] = (hi - lo) + tried
            if hi > lo:
                last[k] = max(last[k], int(walk.r_t[hi - 1]))
            # the earliest time a row that is not late could still have
            earliest = eos if eos is not None else max(int(last[k]) + 1, horizon)
            for run in runs:
                if earliest - run.start_ms > self.within_ms:
                    continue
                if run.origin >= 0:
                    removed[run.origin] = False
                else:
                    walk.new_runs.append((k, run, int(next_id[k])))
                    next_id[k] += 1

    def _meta_rows(self, keytab: pa.Table, meta: _Meta, last: np.ndarray, next_id: np.ndarray, evict: np.ndarray,
                   removed: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Step 10: the meta rows to upsert (a key that is kept and new or changed), and which old
        state rows they replace; an evicted key's meta row is removed."""
        has_meta = meta.row >= 0
        upsert = ~evict & (~has_meta | (last != meta.last) | (next_id != meta.next_id))
        removed[meta.row[has_meta & (evict | upsert)]] = True
        replaced = np.zeros(removed.size, dtype=bool)
        replaced[meta.row[has_meta & upsert]] = True
        mk = np.flatnonzero(upsert)
        metas = self._layout.state_rows(keytab, mk, META, np.zeros(len(mk), dtype=np.int64), {
            LAST_MS: pa.array(last[mk], mask=last[mk] == NOTHING_MATCHED, type=pa.int64()),
            NEXT_ID: pa.array(next_id[mk], type=pa.int64()),
        })
        return metas, replaced

    def _result(self, state: pa.Table, keytab: pa.Table, walk: _Walk, pool_array: pa.Array, upserted: list[pa.Table],
                removed: np.ndarray, replaced: np.ndarray, late_rows: int) -> KernelResult:
        """Step 11: the new state (kept rows, then the meta rows, buffered rows and new runs),
        its changes, the output and the metrics."""
        layout = self._layout
        run_rows = layout.state_rows(
            keytab,
            np.array([k for k, _, _ in walk.new_runs], dtype=np.int64),
            RUN,
            np.array([i for _, _, i in walk.new_runs], dtype=np.int64),
            layout.encode([r for _, r, _ in walk.new_runs], pool_array),
        )
        upserts = pa.concat_tables([*upserted, run_rows])
        new_state = pa.concat_tables([state.filter(pa.array(~removed)), upserts])
        deletes = state.filter(pa.array(removed & ~replaced)).select(list(self.primary_key))
        if self._stage == 1:
            output = layout.seed_output(walk.emitted_seeds, keytab, pool_array)
        else:
            output = layout.match_output(walk.matches, keytab, pool_array)
        kinds = new_state.column(KIND).to_numpy()
        metrics = {
            "late_rows": late_rows,
            "matches": len(walk.matches),
            "seeds": len(walk.emitted_seeds),
            "runs": int((kinds == RUN).sum()),
            "buffered_rows": int((kinds == BUFFERED).sum()),
        }
        kg_of_key = keytab.column(KG).to_numpy(zero_copy_only=False)
        by_kg = np.bincount(kg_of_key, weights=walk.cost) if keytab.num_rows else np.zeros(0)
        return KernelResult.of(output, new_state, upserts, deletes, metrics,
                               {int(g): int(by_kg[g]) for g in np.flatnonzero(by_kg)})


@dataclass
class _Meta:
    """Per key id, its meta row in the state (-1: none), last matched time and next run id."""

    row: np.ndarray
    last: np.ndarray
    next_id: np.ndarray

    @classmethod
    def read(cls, state: pa.Table, kind: np.ndarray, s_kid: np.ndarray, n_keys: int) -> _Meta:
        row = np.full(n_keys, -1, dtype=np.int64)
        is_meta = np.flatnonzero(kind == META)
        row[s_kid[is_meta]] = is_meta
        last = np.full(n_keys, NOTHING_MATCHED, dtype=np.int64)
        next_id = np.zeros(n_keys, dtype=np.int64)
        last[s_kid[is_meta]] = int_values(state.column(LAST_MS).take(is_meta), NOTHING_MATCHED)
        next_id[s_kid[is_meta]] = int_values(state.column(NEXT_ID).take(is_meta), 0)
        return cls(row, last, next_id)


@dataclass
class _Walk:
    """Step 8's input (the keys to match, their ready rows sorted by key id, open runs and seeds)
    and what it finds."""

    keys: np.ndarray
    r_kid: np.ndarray
    r_t: np.ndarray
    r_pool: int  # the ready rows' first index in the row pool
    open_runs: dict[int, list[Run]]
    seeds_by_key: dict[int, list[tuple[tuple[int, int], Run]]]
    n_keys: int
    matches: list[tuple[int, Run]] = field(default_factory=list)
    emitted_seeds: list[tuple[int, Run, int]] = field(default_factory=list)
    new_runs: list[tuple[int, Run, int]] = field(default_factory=list)
    cost: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.cost = np.zeros(self.n_keys, dtype=np.int64)


def _canonical_order(
    leading: Sequence[np.ndarray], columns: Sequence[pa.ChunkedArray]
) -> np.ndarray:
    """Indices sorting by ``leading`` then every sortable column of ``columns`` (nulls last): the
    total order that makes results independent of arrival order. Rows equal on all of these are
    interchangeable unless they differ in an unsortable (e.g. dictionary) column."""
    keys = [(pa.array(a), "ascending") for a in leading]
    keys += [(c, "ascending") for c in columns if sortable(c.type)]
    return sort_indices(keys, len(leading[0]))


def _ranks(*sorted_cols: np.ndarray) -> np.ndarray:
    """Position of each row of rows sorted by ``sorted_cols`` among the rows equal on all of them."""
    n = len(sorted_cols[0])
    return ranks_in_segments(run_starts([pa.array(c) for c in sorted_cols], n))
