"""The automaton: how a :class:`~eddyline.operators.pattern.dsl.Pattern` matches one key's rows.

Semantics (what :class:`~eddyline.operators.pattern.kernel.PatternKernel` computes, and why):

* **Per key, in event-time order.** Rows of one key are matched in the order ``(event time, then
  every sortable input column in schema order, ascending, nulls last)``: a total order, so ties on
  the timestamp resolve the same way whatever order the rows arrived in. The kernel puts the rows
  in this order; :meth:`Nfa.match_key` walks them.
* **Every start, every extension ("all matches").** Every row may start a match. A run (partial
  match) at element ``e`` tries, for the next row, to *stay* in ``e`` (if ``e`` is ``plus``) and to
  *advance* to ``e + 1``; both successors are kept when both predicates hold. Each time a run binds
  the last element it is a match, so ``D+`` emits ``A B C D``, ``A B C D D``, ... like AnduIN's
  ``p1p2, p1p2p3`` in its Fig. 8. A match is one assignment of rows to elements: two matches may
  span the same rows with a different split.
* **Contiguity** and **predicates** as in :mod:`eddyline.operators.pattern.dsl`.
* **within_ms**: a match spans at most ``within_ms`` of event time (``match_end - match_start``,
  the times of its first and last rows in milliseconds, the unit of every time rule here); a run
  that could only be extended beyond that is dropped.
* **Measures** are folded as rows bind: count(column)/min/max into one accumulator per measure
  (:func:`fold`); first/last and row counts come from the run's bound rows.

A run (:class:`Run`) refers to its bound rows by index into the epoch's :class:`RowPool`, which
holds each row both as an Arrow struct (to re-encode runs exactly) and as a dict (for predicates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from eddyline.operators.pattern.dsl import PLUS, SKIP_TILL_NEXT_MATCH, Pattern, Row, Split


class MeasureSpec(NamedTuple):
    """A validated measure: output name, element index, column (or None), aggregate."""

    name: str
    elem: int
    col: str | None
    func: str


@dataclass(frozen=True, slots=True)
class Run:
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


class RowPool:
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


class Nfa:
    """The pattern as a nondeterministic automaton over runs: one state per element, a run per
    partial match. ``split`` makes it half of a pipeline: stage 1 hands over the runs that just
    bound element ``split.at`` (seeds), stage 2 starts no runs of its own."""

    def __init__(
        self,
        pattern: Pattern,
        within_ms: int,
        measures: Sequence[MeasureSpec],
        split: Split | None = None,
    ) -> None:
        self.within_ms = within_ms
        self.names = tuple(e.name for e in pattern.elements)
        self.preds = tuple(e.predicate for e in pattern.elements)
        self.plus = tuple(e.quantifier == PLUS for e in pattern.elements)
        self.skip = pattern.contiguity == SKIP_TILL_NEXT_MATCH
        self.starts = split is None or split.stage != 2
        self.split_at = split.at if split is not None and split.stage == 1 else -1
        self.measures = tuple(measures)
        #: the measures folded into a run's ``acc``, by index into ``measures``
        self.accs = tuple(
            j for j, m in enumerate(self.measures) if m.func in ("min", "max") or m.col
        )
        #: per element, the accumulators (position in a run's ``acc``, measure) its rows feed
        self.folds = tuple(
            tuple(
                (pos, self.measures[j])
                for pos, j in enumerate(self.accs)
                if self.measures[j].elem == e
            )
            for e in range(len(self.names))
        )

    def match_key(
        self,
        kid: int,
        runs: list[Run],
        rows: list[tuple[int, int, int]],
        seeds: list[tuple[tuple[int, int], Run]],
        pool: list[Row | None],
        matches: list[tuple[int, Run]],
        emitted_seeds: list[tuple[int, Run, int]],
    ) -> tuple[list[Run], int]:
        """Run one key's ready rows ``(pool index, time, rank within the time)`` through its runs;
        returns the runs still open and how many runs the rows were tried against. Seeds join
        right after the row their last element bound."""
        n = len(self.names)
        split_at = self.split_at
        tried = 0

        def admit(run: Run, rank: int, into: list[Run]) -> None:
            if run.elem == split_at:
                emitted_seeds.append((kid, run, rank))
                return
            if run.elem == n - 1:
                matches.append((kid, run))
                if not self.plus[-1]:
                    return
            into.append(run)

        next_seed = 0
        for p, t, rank in rows:
            while next_seed < len(seeds) and seeds[next_seed][0] < (t, rank):
                admit(seeds[next_seed][1], seeds[next_seed][0][1], runs)
                next_seed += 1
            row = must_row(pool[p])
            tried += len(runs)
            survivors: list[Run] = []
            for run in runs:
                if t - run.start_ms > self.within_ms:
                    continue
                e, took = run.elem, False
                prev = must_row(pool[run.last[e]])
                if self.plus[e] and self.preds[e](row, prev, run.bound):
                    admit(self.bind(run, e, p, row, t), rank, survivors)
                    took = True
                if e + 1 < n and self.preds[e + 1](row, prev, run.bound):
                    admit(self.bind(run, e + 1, p, row, t), rank, survivors)
                    took = True
                if self.skip and not took:
                    survivors.append(run)
            if self.starts and self.preds[0](row, None, {}):
                admit(self.bind(None, 0, p, row, t), rank, survivors)
            runs = survivors
        for pos, seed in seeds[next_seed:]:
            admit(seed, pos[1], runs)
        return runs, tried

    def bind(self, run: Run | None, e: int, p: int, row: Row, t: int) -> Run:
        """``run`` (or a new run) with ``row`` (pool index ``p``, time ``t``) bound to element ``e``."""
        if run is None:
            n = len(self.names)
            first, last, count = (-1,) * n, (-1,) * n, (0,) * n
            acc: tuple[Any, ...] = tuple(
                0 if self.measures[j].func == "count" else None for j in self.accs
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
        name = self.names[e]
        if not count[e]:
            first = (*first[:e], p, *first[e + 1 :])
            bound[name] = row
        bound[f"{name}.last"] = row
        if self.folds[e]:
            folded = list(acc)
            for pos, m in self.folds[e]:
                folded[pos] = fold(m, folded[pos], row)
            acc = tuple(folded)
        return Run(
            start,
            t,
            e,
            first,
            (*last[:e], p, *last[e + 1 :]),
            (*count[:e], count[e] + 1, *count[e + 1 :]),
            acc,
            bound,
        )


def fold(m: MeasureSpec, acc: Any, row: Row) -> Any:
    """One row into a count(column)/min/max accumulator; nulls are skipped."""
    v = row[m.col] if m.col is not None else None
    if v is None:
        return acc
    if m.func == "count":
        return acc + 1
    if acc is None or (v < acc if m.func == "min" else v > acc):
        return v
    return acc


def must_row(row: Row | None) -> Row:
    """A pool row that must exist (a bound element's row is never null)."""
    if row is None:
        raise ValueError("corrupt run: a bound element has no row")
    return row


def runs_by_key(kids: np.ndarray, runs: list[Run]) -> dict[int, list[Run]]:
    """``runs`` grouped by their key ids ``kids``, in order."""
    out: dict[int, list[Run]] = {}
    for k, run in zip(kids.tolist(), runs, strict=True):
        out.setdefault(k, []).append(run)
    return out
