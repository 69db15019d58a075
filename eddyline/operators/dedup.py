"""Event-time deduplication as a pure kernel over Arrow tables (no Spark here).

Semantics, per key (several columns, nulls being a value like any other):

* The **first** row of a key passes: the earliest event time, equal times broken by a total
  order over all columns. It opens a *dedup interval* ``[t, t + ttl]``: later rows of the key
  whose time falls in it are duplicates and are dropped.
* The first row *after* the interval (time ``> t + ttl``) passes again and opens the next
  interval. Within one batch this is a chain: each passing row is the earliest row past the
  previous one's interval.
* State keeps, per key, the time of the earliest passing row still remembered (``_first_ms``)
  and of the latest (``_last_ms``). A batch row is a duplicate if its time lies in
  ``[_first_ms, _last_ms + ttl]``: an earlier-or-equal row of its key was passed (in state) and
  the row is not past that row's interval. A row *before* ``_first_ms`` (out of order, yet not
  late) passes, as the brief rule "no earlier-or-equal row of its key in state or batch" says.
* A key is **forgotten** when ``watermark > _last_ms + ttl``: no row that is not late can fall
  into its interval any more (a row at ``t >= watermark`` is past it), so forgetting changes no
  result — it only bounds the state. ``END_OF_STREAM`` forgets every key.
* Rows with an event time before the watermark (or none) are late: dropped, counted in
  ``metrics["late_rows"]``.

Why an interval and not "drop while the key is remembered": that rule would pass or drop a
row past the interval depending on whether the watermark had already forgotten the key, i.e.
on the watermark's lag and so on how the input was cut into epochs. With the interval, the
watermark only decides when state is released: for input that arrives in event-time order
(equal times in total order) the output is the same however it is cut. Both rules agree on
every row inside the interval and on every row after the key was forgotten. Rows arriving out
of order can only be judged against what was already emitted (nothing emitted is taken back),
so for them the output depends on arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from eddyline.columns import KG
from eddyline.operators.base import KernelResult
from eddyline.operators.rows import (
    key_codes,
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

FIRST = "_first_ms"
LAST = "_last_ms"


def chain_heads(seg: np.ndarray, t: np.ndarray, heads: np.ndarray, ttl_ms: int) -> np.ndarray:
    """Which rows pass, for rows sorted by ``(seg, t)``: each head passes, then, within its
    segment, the first row with ``t > t_prev + ttl`` after every passing row.

    Vectorised: ``next[i]`` (the row that would pass after ``i``) comes from one searchsorted on
    ``(segment, rank of t)``; the rows reachable from the heads are then marked by pointer
    doubling — round ``r`` adds the nodes ``2**r`` to ``2**(r+1) - 1`` steps down each chain —
    so a batch costs O(n log L) numpy work for chains of length L, never a Python loop per row.
    """
    n = t.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    uniq = np.unique(np.concatenate([t, t + ttl_ms]))
    u = np.int64(uniq.size)
    seg = seg.astype(np.int64)
    comp = seg * u + np.searchsorted(uniq, t)
    nxt = np.searchsorted(comp, seg * u + np.searchsorted(uniq, t + ttl_ms), side="right")
    starts = np.ones(n, dtype=bool)
    starts[1:] = seg[1:] != seg[:-1]
    seg_end = np.append(np.flatnonzero(starts)[1:], n)[np.cumsum(starts) - 1]
    jump = np.append(np.where(nxt < seg_end, nxt, n), n)  # n: the end of every chain
    on = np.zeros(n + 1, dtype=bool)
    on[heads] = True
    while True:
        reached = jump[np.flatnonzero(on[:n])]
        new = reached[~on[reached]]
        new = new[new < n]
        if new.size == 0:
            break
        on[new] = True
        jump = jump[jump]
    return on[:n]


@dataclass(frozen=True)
class _Sorted:
    """The touched keys' state rows and remaining batch rows in :meth:`DedupKernel._sorted`'s
    order. Per row: where it came from (``src`` 0: the state, 1: the batch), its time ``t`` (a
    state row's ``_first_ms``), its batch row (-1: a state row), its key's id ``gid`` and (in
    ``group_cols``) its ``_kg`` and keys. Per key: its first row, whether the state remembers
    it and its remembered interval ``[lo, hi]`` (0 when it does not)."""

    src: np.ndarray
    t: np.ndarray
    row: np.ndarray
    gid: np.ndarray
    firsts: np.ndarray
    group_cols: list[pa.Array]
    had: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


class DedupKernel:
    """Passes the first row per key and drops its duplicates within ``ttl_ms`` (a
    :class:`~eddyline.operators.base.Kernel`). See the module docstring for the exact rule.

    ``time`` is a timestamp column (or integer milliseconds). Output: the input columns.
    State: ``_kg``, the keys, ``_first_ms``, ``_last_ms`` (int64 ms); primary key
    ``(_kg, *keys)``, one row per remembered key.
    """

    def __init__(self, input_schema: pa.Schema, keys: Sequence[str], time: str, ttl_ms: int):
        if ttl_ms < 0:
            raise ValueError(f"dedup: ttl must not be negative, got {ttl_ms} ms")
        self.keys = tuple(keys)
        self.time = time
        self.ttl_ms = int(ttl_ms)
        require_columns(input_schema, [*self.keys, time], "dedup")
        self.input_schema = with_key_group(input_schema)
        self.output_schema = pa.schema([f for f in self.input_schema if f.name != KG])
        self.state_schema = pa.schema(
            [
                pa.field(KG, pa.int32()),
                *[nullable(input_schema.field(k)) for k in self.keys],
                pa.field(FIRST, pa.int64()),
                pa.field(LAST, pa.int64()),
            ]
        )
        self.primary_key = (KG, *self.keys)

    def empty_state(self) -> pa.Table:
        return self.state_schema.empty_table()

    @property
    def local_keys(self) -> tuple[str, ...]:
        """A key's state meets only its own rows (:class:`~eddyline.state.inplace.LocalKernel`)."""
        return self.keys

    def deadline(self, state: pa.Table) -> np.ndarray:
        """An untouched key is forgotten once the watermark is past ``_last_ms + ttl``."""
        return state.column(LAST).to_numpy(zero_copy_only=False).astype(np.int64) + self.ttl_ms

    def _settled(self, touched: pa.Table, rows: pa.Table, t: np.ndarray) -> np.ndarray:
        """Rows that cannot pass whatever the others do (see step 2 of :meth:`process`)."""
        ttl = self.ttl_ms
        sc, rc, codes = key_codes(
            [touched.column(k) for k in self.keys], [rows.column(k) for k in self.keys]
        )
        at = np.full(codes, -1, dtype=np.int64)
        at[sc] = np.arange(sc.size)
        at = at[rc]
        known = at >= 0
        pad = np.zeros(1, np.int64)  # a slot for rows of new keys
        lo = np.append(touched.column(FIRST).to_numpy(), pad)[np.where(known, at, -1)]
        hi = np.append(touched.column(LAST).to_numpy(), pad)[np.where(known, at, -1)]
        inside = known & (t >= lo) & (t <= hi + ttl)
        seg = rc * 2 + (known & (t > hi + ttl))
        first = np.full(2 * codes, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, seg[~inside], t[~inside])
        head = first[seg]
        return inside | ((t > head) & (t <= head + ttl))

    def _sorted(self, touched: pa.Table, rows: pa.Table, t_rows: np.ndarray) -> _Sorted:
        """Step 2's sort of the state rows and the remaining batch rows by ``(key, state first,
        time, every other column)``, with the keys they fall into (see :class:`_Sorted`)."""
        ns, nb = touched.num_rows, rows.num_rows
        src = np.concatenate([np.zeros(ns, np.int8), np.ones(nb, np.int8)])
        t = np.concatenate([touched.column(FIRST).to_numpy(), t_rows]).astype(np.int64)
        hi = np.concatenate([touched.column(LAST).to_numpy(), t_rows]).astype(np.int64)
        row = np.concatenate([np.full(ns, -1, np.int64), np.arange(nb, dtype=np.int64)])
        group_cols = [
            pa.concat_arrays([touched.column(c).combine_chunks(), rows.column(c).combine_chunks()])
            for c in (KG, *self.keys)
        ]
        others = [c for c in self.output_schema.names if c not in self.keys]
        other_cols = [
            pa.concat_arrays(
                [pa.nulls(ns, rows.schema.field(c).type), rows.column(c).combine_chunks()]
            )
            for c in others
        ]
        order = sort_indices(
            [(c, "ascending") for c in group_cols]
            + [(pa.array(src), "ascending"), (pa.array(t), "ascending")]
            + [(c, "ascending") for c in other_cols],
            ns + nb,
        )
        take = pa.array(order)
        src, t, hi, row = src[order], t[order], hi[order], row[order]
        group_cols = [c.take(take) for c in group_cols]
        gid, firsts, _ = segments(run_starts(group_cols, ns + nb))
        had = src[firsts] == 0  # the state row sorts first in its key
        return _Sorted(
            src,
            t,
            row,
            gid,
            firsts,
            group_cols,
            had,
            np.where(had, t[firsts], 0),
            np.where(had, hi[firsts], 0),
        )

    def _passing(self, s: _Sorted) -> np.ndarray:
        """Steps 3 and 4: where the batch rows that pass stand in the sorted order. The rows inside their key's remembered
        interval are duplicates; of the others, the chains from the heads pass (per key and side
        of the interval, the first row, then each first row past a passing row's interval)."""
        ttl = self.ttl_ms
        is_row = s.src == 1
        g_has = s.had[s.gid]
        covered = is_row & g_has & (s.t >= s.lo[s.gid]) & (s.t <= s.hi[s.gid] + ttl)
        cand = np.flatnonzero(is_row & ~covered)
        cg = s.gid[cand]
        after = g_has[cand] & (s.t[cand] > s.hi[cg] + ttl)
        seg = cg * 2 + after
        heads = np.flatnonzero(run_starts([pa.array(seg)], cand.size))
        return cand[chain_heads(seg, s.t[cand], heads, ttl)]

    def _remember(
        self, s: _Sorted, passing: np.ndarray, rest: pa.Table, watermark_ms: int
    ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """Step 5: ``(new state, upserts, deletes)``. The touched keys' intervals widen to their
        passing rows; every key the watermark has passed (``watermark > _last_ms + ttl``), touched
        or not, is forgotten."""
        wm, ttl = watermark_ms, self.ttl_ms
        groups = s.firsts.size
        changed = np.zeros(groups, dtype=bool)
        changed[s.gid[passing]] = True
        new_lo = np.where(s.had, s.lo, np.iinfo(np.int64).max)
        new_hi = np.where(s.had, s.hi, np.iinfo(np.int64).min)
        np.minimum.at(new_lo, s.gid[passing], s.t[passing])
        np.maximum.at(new_hi, s.gid[passing], s.t[passing])
        keep_g = (s.had | changed) & ~(wm > new_hi + ttl)
        firsts_take = pa.array(s.firsts)
        merged = pa.table(
            {
                KG: s.group_cols[0].take(firsts_take),
                **{
                    k: c.take(firsts_take) for k, c in zip(self.keys, s.group_cols[1:], strict=True)
                },
                FIRST: pa.array(new_lo, pa.int64()),
                LAST: pa.array(new_hi, pa.int64()),
            }
        ).cast(self.state_schema)
        rest_t = rest.column(LAST).to_numpy().astype(np.int64)
        rest_keep = ~(wm > rest_t + ttl)
        kept = rest if rest_keep.all() else rest.filter(pa.array(rest_keep))  # most epochs forget nothing
        new_state = pa.concat_tables([kept, merged.filter(pa.array(keep_g))])
        upserts = merged.filter(pa.array(keep_g & changed))
        pk = list(self.primary_key)
        deletes = pa.concat_tables(
            [
                rest.filter(pa.array(~rest_keep)).select(pk),
                merged.filter(pa.array(s.had & ~keep_g)).select(pk),
            ]
        )
        return new_state, upserts, deletes

    def process(self, batch: pa.Table, state: pa.Table | None, watermark_ms: int) -> KernelResult:
        """1. drop late rows (no time, or before the watermark);
        2. confine work to the state rows of the batch's keys (``split_by_keys``); settle by a
           hash pass the rows whose fate does not depend on the others (see :meth:`_settled`),
           then sort the state rows and the remaining batch rows together by ``(key, state first, time, every other column)``;
        3. drop batch rows inside their key's remembered interval ``[_first_ms, _last_ms + ttl]``;
        4. pass the chain heads: per key, the first remaining row before ``_first_ms`` and the
           first after ``_last_ms + ttl`` (or simply the first, for a new key), then each first
           row past the previous passing row's interval;
        5. widen the key's interval to the passing rows; forget keys the watermark has passed
           (``watermark > _last_ms + ttl``); upserts are the widened keys, deletes the forgotten.
        """
        batch = normalize(batch, self.input_schema)
        state = normalize(state, self.state_schema)

        # 1. late rows
        rows, t_rows, late = on_time(batch, self.time, watermark_ms)

        # 2. touched state. Before sorting, a hash pass drops the rows that are settled anyway:
        #    rows inside their key's remembered interval, and rows after the first remaining row
        #    of their key's segment (before / after the interval) but within its ttl: that first
        #    row passes, so they are its duplicates. In a steady dedup that is nearly every row.
        touched, rest = split_by_keys(state, rows, self.keys)
        received = rows.num_rows
        if received:
            settled = self._settled(touched, rows, t_rows)
            if settled.any():
                rows, t_rows = rows.filter(pa.array(~settled)), t_rows[~settled]
        #    ... then state + remaining rows, sorted
        work = self._sorted(touched, rows, t_rows)

        # 3., 4. duplicates of the remembered interval; chains from the heads
        passing = self._passing(work)
        output = (
            rows.take(pa.array(work.row[passing]))
            .select(self.output_schema.names)
            .cast(self.output_schema)
        )

        # 5. new intervals, forgetting
        new_state, upserts, deletes = self._remember(work, passing, rest, watermark_ms)
        return KernelResult.of(
            output,
            new_state,
            upserts,
            deletes,
            {
                "late_rows": late,
                "rows_passed": int(passing.size),
                "duplicates_dropped": int(received - passing.size),
                "keys_forgotten": int(deletes.num_rows),
            },
        )
