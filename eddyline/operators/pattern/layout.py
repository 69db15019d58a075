"""The pattern kernel's tables: its state, stage 1's seed rows and its output, and the conversions
between their rows and the automaton's :class:`~eddyline.operators.pattern.nfa.Run` s.

State (one flat Arrow table, primary key ``(_kg, *keys, _kind, _id)``): per key a *meta* row
(``_kind = 0``: ``_last_ms`` last matched time, ``_next_id`` id counter), its *buffered* rows
(``_kind = 1``: the input row in columns ``_row.<column>``), and its *runs* (``_kind = 2``):
``_start_ms``, ``_end_ms``, ``_elem`` (index of the element bound last), per element ``i`` the first
bound row in ``_first_<i>.<column>`` and, for ``plus`` elements, the last in ``_last_<i>.<column>``
and the row count ``_count_<i>``, and one ``_acc_<j>`` per accumulated measure (see
:attr:`~eddyline.operators.pattern.nfa.Nfa.accs`). Key columns are not repeated in the row
columns. The table is flat (no struct columns) because the store applies deltas with an Arrow hash
join, which carries no nested columns; for the same reason input columns must not be nested
(project them away before the step).

A seed row (stage 1's output) is ``_kg``, the keys, the run columns and ``_end_rank``; stage 2
reads it packed into its ``_seed`` input column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG
from eddyline.eventtime import NO_WATERMARK
from eddyline.operators.pattern.dsl import Row
from eddyline.operators.pattern.nfa import MeasureSpec, Nfa, RowPool, Run, must_row
from eddyline.operators.rows import TIMESTAMP, int_values, ms_to_timestamp, nullable, take_or_null

MATCH_START = "match_start"
MATCH_END = "match_end"

# state and seed columns
KIND, ID, LAST_MS, NEXT_ID, ROW = "_kind", "_id", "_last_ms", "_next_id", "_row"  # ROW: a prefix
START_MS, END_MS, ELEM, END_RANK, SEED = "_start_ms", "_end_ms", "_elem", "_end_rank", "_seed"
META, BUFFERED, RUN = 0, 1, 2
NOTHING_MATCHED = NO_WATERMARK  # per-key "last matched time" before the key matched any row


class Layout:
    """The schemas of one kernel (``input_schema`` already with ``_kg``; ``stage`` 0 for a
    single kernel, else the pipeline stage) and the row conversions that follow them."""

    def __init__(self, input_schema: pa.Schema, keys: tuple[str, ...], nfa: Nfa, stage: int):
        self.keys = keys
        self.nfa = nfa
        self.stage = stage
        self.kcols = (KG, *keys)
        self.key_schema = pa.schema([nullable(input_schema.field(c)) for c in self.kcols])
        self.events = pa.schema([nullable(f) for f in input_schema])
        self.event_schema = input_schema
        self.payload_names = [c for c in input_schema.names if c not in self.kcols]
        self.payload = pa.struct([nullable(input_schema.field(c)) for c in self.payload_names])
        run_fields = self.run_fields()
        self.primary_key = (*self.kcols, KIND, ID)
        self.state_schema = pa.schema(
            [
                *self.key_schema,
                pa.field(KIND, pa.int8()),
                pa.field(ID, pa.int64()),
                pa.field(LAST_MS, pa.int64()),
                pa.field(NEXT_ID, pa.int64()),
                *self.row_fields(ROW),
                *run_fields,
            ]
        )
        self.seed_type = pa.struct([*run_fields, pa.field(END_RANK, pa.int64())])
        self.input_schema = (
            input_schema.append(pa.field(SEED, self.seed_type)) if stage == 2 else input_schema
        )
        if stage == 1:
            self.output_schema = pa.schema([*self.key_schema, *self.seed_type])
        else:
            out = [*self.key_schema][1:] + [
                pa.field(MATCH_START, TIMESTAMP),
                pa.field(MATCH_END, TIMESTAMP),
            ]
            out += [pa.field(m.name, self.measure_type(m)) for m in nfa.measures]
            self.output_schema = pa.schema(out)

    # ------------------------------------------------------------------------- schemas
    def measure_type(self, m: MeasureSpec) -> pa.DataType:
        return pa.int64() if m.func == "count" else self.event_schema.field(m.col).type

    def row_fields(self, prefix: str) -> list[pa.Field]:
        """One stored row: the input columns except ``_kg`` and keys, as ``<prefix>.<column>``."""
        return [pa.field(f"{prefix}.{f.name}", f.type) for f in self.payload]

    def run_fields(self) -> list[pa.Field]:
        fields = [
            pa.field(START_MS, pa.int64()),
            pa.field(END_MS, pa.int64()),
            pa.field(ELEM, pa.int32()),
        ]
        for i, plus in enumerate(self.nfa.plus):
            fields += self.row_fields(f"_first_{i}")
            if plus:
                fields += [*self.row_fields(f"_last_{i}"), pa.field(f"_count_{i}", pa.int64())]
        fields += [
            pa.field(f"_acc_{j}", self.measure_type(self.nfa.measures[j])) for j in self.nfa.accs
        ]
        return fields

    # ---------------------------------------------------------------------- rows in
    def key_rows(self, keytab: pa.Table, kids: np.ndarray) -> dict[int, Row]:
        """Key id → the key columns as a dict (merged into every row handed to predicates)."""
        if not self.keys:
            return dict.fromkeys(kids.tolist(), {})
        rows = keytab.select(list(self.keys)).take(pa.array(kids, type=pa.int64())).to_pylist()
        return dict(zip(kids.tolist(), rows, strict=True))

    def unpack_buffered(self, rows: pa.Table) -> pa.Table:
        """Buffered state rows back into event-schema rows."""
        cols = [rows.column(c if c in self.kcols else f"{ROW}.{c}") for c in self.events.names]
        return pa.Table.from_arrays(cols, schema=self.events)

    def structs(self, rows: pa.Table) -> pa.Array:
        """Event rows → payload structs (the row without ``_kg`` and keys)."""
        return pa.StructArray.from_arrays(
            [rows.column(c).combine_chunks() for c in self.payload_names],
            fields=list(self.payload),
        )

    def decode(
        self,
        runs: pa.Table,
        kids: np.ndarray,
        key_rows: Mapping[int, Row],
        pool: RowPool,
        origins: np.ndarray | None,
    ) -> list[Run]:
        """Run rows (state or seeds) → :class:`Run` s whose bound rows are added to ``pool``."""
        nfa = self.nfa
        krows = [key_rows[k] for k in kids.tolist()]
        n = len(nfa.names)
        elems = int_values(runs.column(ELEM), 0)

        def rows(prefix: str, i: int) -> int:
            structs = pa.StructArray.from_arrays(
                [runs.column(f"{prefix}.{f.name}").combine_chunks() for f in self.payload],
                fields=list(self.payload),
                mask=pa.array(elems < i),
            )
            return pool.add(structs, krows)

        first_off = [rows(f"_first_{i}", i) for i in range(n)]
        last_off = [rows(f"_last_{i}", i) if nfa.plus[i] else first_off[i] for i in range(n)]
        counts = [
            int_values(runs.column(f"_count_{i}"), 0) if nfa.plus[i] else None for i in range(n)
        ]
        accs = [runs.column(f"_acc_{j}").to_pylist() for j in nfa.accs]
        starts, ends = int_values(runs.column(START_MS), 0), int_values(runs.column(END_MS), 0)
        out = []
        for r in range(runs.num_rows):
            e = int(elems[r])
            first = tuple(first_off[i] + r if i <= e else -1 for i in range(n))
            last = tuple(last_off[i] + r if i <= e else -1 for i in range(n))
            count = tuple(_bound_count(counts[i], r) if i <= e else 0 for i in range(n))
            bound: dict[str, Row] = {}
            for i in range(e + 1):
                bound[nfa.names[i]] = must_row(pool.rows[first[i]])
                bound[f"{nfa.names[i]}.last"] = must_row(pool.rows[last[i]])
            origin = -1 if origins is None else int(origins[r])
            acc = tuple(a[r] for a in accs)
            out.append(Run(int(starts[r]), int(ends[r]), e, first, last, count, acc, bound, origin))
        return out

    # --------------------------------------------------------------------- rows out
    def encode(self, runs: Sequence[Run], pool: pa.Array) -> dict[str, pa.Array]:
        """Run columns (see :meth:`run_fields`) for ``runs``, rows taken from ``pool``."""
        cols: dict[str, pa.Array] = {
            START_MS: pa.array([r.start_ms for r in runs], type=pa.int64()),
            END_MS: pa.array([r.end_ms for r in runs], type=pa.int64()),
            ELEM: pa.array([r.elem for r in runs], type=pa.int32()),
        }
        for i, plus in enumerate(self.nfa.plus):
            cols |= flatten(f"_first_{i}", take_or_null(pool, _int64([r.first[i] for r in runs])))
            if plus:
                cols |= flatten(f"_last_{i}", take_or_null(pool, _int64([r.last[i] for r in runs])))
                cols[f"_count_{i}"] = pa.array([r.count[i] for r in runs], type=pa.int64())
        for pos, j in enumerate(self.nfa.accs):
            cols[f"_acc_{j}"] = pa.array(
                [r.acc[pos] for r in runs], type=self.measure_type(self.nfa.measures[j])
            )
        return cols

    def state_rows(
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
            if f.name in self.kcols:
                arrays.append(keyed.column(f.name))
            elif f.name == KIND:
                arrays.append(pa.array(np.full(n, kind, dtype=np.int8)))
            elif f.name == ID:
                arrays.append(pa.array(ids, type=pa.int64()))
            else:
                arrays.append(cols.get(f.name, pa.nulls(n, f.type)))
        return pa.Table.from_arrays(arrays, schema=self.state_schema)

    def seed_output(
        self, seeds: list[tuple[int, Run, int]], keytab: pa.Table, pool: pa.Array
    ) -> pa.Table:
        """Stage 1's output: one row per seed ``(key id, run, rank of its last row's time)``."""
        kids = np.array([k for k, _, _ in seeds], dtype=np.int64)
        keyed = keytab.take(pa.array(kids, type=pa.int64()))
        cols = {c: keyed.column(c) for c in self.kcols}
        cols |= self.encode([r for _, r, _ in seeds], pool)
        cols[END_RANK] = pa.array([rank for _, _, rank in seeds], type=pa.int64())
        return pa.Table.from_arrays(
            [cols[f.name] for f in self.output_schema], schema=self.output_schema
        )

    def match_output(
        self, matches: list[tuple[int, Run]], keytab: pa.Table, pool: pa.Array
    ) -> pa.Table:
        """One row per match: keys, match_start, match_end, measures."""
        kids = pa.array([k for k, _ in matches], type=pa.int64())
        runs = [r for _, r in matches]
        keyed = keytab.take(kids)
        cols: list[pa.Array | pa.ChunkedArray] = [keyed.column(k) for k in self.keys]
        cols.append(ms_to_timestamp(_int64([r.start_ms for r in runs])))
        cols.append(ms_to_timestamp(_int64([r.end_ms for r in runs])))
        accs = self.nfa.accs
        for j, m in enumerate(self.nfa.measures):
            if m.func in ("first", "last"):
                assert m.col is not None
                idx = _int64([(r.first if m.func == "first" else r.last)[m.elem] for r in runs])
                cols.append(
                    keyed.column(m.col)
                    if m.col in self.keys
                    else pc.struct_field(take_or_null(pool, idx), m.col)
                )
            elif j in accs:
                pos = accs.index(j)
                cols.append(pa.array([r.acc[pos] for r in runs], type=self.measure_type(m)))
            else:
                cols.append(pa.array([r.count[m.elem] for r in runs], type=pa.int64()))
        return pa.Table.from_arrays(cols, schema=self.output_schema)


def seed_table(rows: pa.Table, kcols: Sequence[str]) -> pa.Table:
    """Seed rows of a stage-2 batch → ``_kg, keys`` plus the seed's fields as columns."""
    seed = rows.column(SEED)
    return pa.table(
        {
            **{c: rows.column(c) for c in kcols},
            **{f.name: pc.struct_field(seed, f.name) for f in seed.type},
        }
    )


def flatten(prefix: str, structs: pa.Array) -> dict[str, pa.Array]:
    """Struct rows → ``<prefix>.<field>`` columns (a null struct gives nulls)."""
    return {
        f"{prefix}.{f.name}": child
        for f, child in zip(structs.type, structs.flatten(), strict=True)
    }


def _int64(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _bound_count(counts: np.ndarray | None, r: int) -> int:
    """Rows bound to a bound element: stored for ``plus`` elements, 1 for ``one`` elements."""
    return 1 if counts is None else int(counts[r])
