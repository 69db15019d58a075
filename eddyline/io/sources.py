"""Replayable sources: each one maps an offset range to a Spark DataFrame, deterministically.

The driver asks a source how far it has got (:meth:`Source.available`), picks the epoch's range
(admission control may take less), logs it in the epoch plan, and only then asks for the frame.
A replay of the plan therefore reads exactly the same rows. Most sources can also build a frame
that takes its slice only when its tasks run (:class:`EpochSlice`), so that one frame serves every
epoch (:meth:`Source.run_time_key`).

* ``generator`` / ``nexmark``: offsets are row (event) numbers; rows are computed in Spark.
* ``files``: offsets are positions in the name-sorted file list; the plan records the file names,
  so files added later never change an epoch that was already planned. JSON and CSV records are
  decoded in the Python workers (:mod:`eddyline.io.textrecords`), so a malformed line becomes a
  dead letter (raw text, reason, file, line) instead of failing the epoch; Parquet files are read
  there too, and their footers tell the slice's rows and newest event times before it runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.api import sources as api_sources
from eddyline.api.sources import SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Offsets per epoch for an unpaced synthetic source with no ``max_rows_per_epoch``.
DEFAULT_UNPACED_BATCH = 1_000_000

BadCounter = Callable[["DataFrame"], "DataFrame"] | None

#: the Spark local property (this prefix + the source's name) that tells the tasks of a frame
#: built once and run every epoch which slice to read (see :class:`EpochSlice`)
SLICE_PROPERTY = "eddyline.slice."


@dataclass(frozen=True)
class EpochSlice:
    """A source's slice as a Spark task sees it.

    A frame built for one epoch carries its slice (``fixed``). A frame built once and run again
    every epoch (:meth:`Source.frames` with no plan) cannot: its plan must not change, so the
    slice comes with the job instead, as a local property the executor sets from the logged
    plan before the epoch's jobs (:func:`slice_properties`). Either way a task reads what the
    plan says, so a replay reads the same rows."""

    source: str
    fixed: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self.fixed is not None:
            return self.fixed
        from pyspark import TaskContext

        ctx = TaskContext.get()
        text = ctx.getLocalProperty(SLICE_PROPERTY + self.source) if ctx is not None else None
        if text is None:
            raise RuntimeError(f"source '{self.source}': this task was given no slice to read "
                               f"(local property {SLICE_PROPERTY}{self.source} is not set)")
        return json.loads(text)


def slice_properties(slices: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The local properties that give every source's planned slice to the tasks."""
    return {SLICE_PROPERTY + name: json.dumps(planned, sort_keys=True) for name, planned in slices.items()}


@dataclass
class Frames:
    data: DataFrame
    dead_letters: DataFrame | None = None


@dataclass(frozen=True)
class ArrowSlice:
    """A slice read without Spark: its rows, and its dead letters (``source``, ``file``,
    ``line``, ``raw``, ``reason``, as :func:`eddyline.io.records.decode` gives them) if any."""

    data: pa.Table
    dead_letters: pa.Table | None = None


def arrow_decoded(decoded: pa.Table, columns: Sequence[str], source: str) -> ArrowSlice:
    """Records decoded in this process by the readers Spark's tasks run (with ``_file``,
    ``_line``, ``_raw``, ``_reason``), split as :func:`eddyline.io.records.split_decoded` splits
    their frame: ``columns`` of the records that fit, and the dead letters."""
    bad = decoded.column("_reason").is_valid()
    data = decoded.filter(pc.invert(bad)).select(list(columns))
    if not pc.any(bad).as_py():
        return ArrowSlice(data)
    dead = decoded.filter(bad)
    return ArrowSlice(data, pa.table({
        "source": pa.array([source] * dead.num_rows, pa.string()), "file": dead.column("_file"),
        "line": dead.column("_line"), "raw": dead.column("_raw"), "reason": dead.column("_reason")}))


def footer_facts(footers: list[Any], time_columns: list[str]) -> dict[str, Any] | None:
    """What observing the rows of Parquet files would find, read from their ``footers`` before
    anything runs: the rows (``rows``) and the newest value of each of ``time_columns`` in epoch
    ms (``max_t:<column>``; None when all are null). None unless every value is exact there: the
    files' row counts, and INT64 timestamps in milli- or microseconds adjusted to UTC (what Spark
    reads as TIMESTAMP) with min/max statistics in every row group that has a non-null value."""
    out: dict[str, Any] = {"rows": sum(m.num_rows for m in footers)}
    for col in time_columns:
        newest = None
        for meta in footers:
            found = _newest_ms(meta, col)
            if found is False:
                return None
            if found is not None:
                newest = found if newest is None else max(newest, found)
        out[f"max_t:{col}"] = newest
    return out


@dataclass
class Source:
    spec: SourceSpec
    #: how long planning retries a server that does not answer before the source is reported
    #: unreachable (:class:`~eddyline.errors.SourceUnreachable`); None: the source's own bound.
    #: A network with ``max_delay`` probes once per plan: it waits by planning again, so that it
    #: can go on without the source once ``max_delay`` has passed.
    patience_s: float | None = None
    #: whether the slice :meth:`run_time_key` saw last is small enough for one task: then the
    #: frame built with no plan has one task, not one per partition (the others would read
    #: nothing, and each still costs a Python task)
    _one_task = False
    #: whether a stateful step reads this source's rows (the compiler says so). The frames behind
    #: such a source include lanes, costly to plan anew; behind one that feeds only stateless
    #: steps there is little to plan, so a reader faster per row may be worth a new frame an epoch.
    feeds_state = True

    @property
    def name(self) -> str:
        return self.spec.name

    def _one_task_key(self, one: bool) -> tuple[str, ...]:
        """Note whether the slice is one task's, and return the part of the run-time key saying so."""
        self._one_task = one
        return ("one task",) if one else ()

    def _run_time_tasks(self, partitions: int) -> int:
        """How many tasks the frame built with no plan has (see :attr:`_one_task`)."""
        return 1 if self._one_task else partitions

    def available(self, elapsed_s: float) -> int:
        """How many offsets exist now (the end of the readable range). A source whose server
        does not answer raises :class:`~eddyline.errors.SourceUnreachable`."""
        raise NotImplementedError

    def status(self) -> dict[str, Any] | None:
        """How its server is doing (sources that read from one): shown in the progress."""
        return None

    # Upstream backup (sources whose input cannot replay, e.g. ``nats_core``): the engine
    # attaches every source when a run starts, tells it each commit, and detaches it at the end.
    # Sources that can replay ignore all three.
    def attach(self, checkpoint: str, committed: int) -> None:
        """A run starts on ``checkpoint`` (its location), where this source's committed end
        offset is ``committed`` (0: none yet): start receiving, into a log in the checkpoint."""

    def committed(self, end: int, cursor: str | None = None) -> None:
        """An epoch committed, with this source's end offset ``end`` (and ``cursor``, what its
        plan kept for the next one): offsets before it will not be read again (a log may delete
        them; a source that reports progress to its server, as ``kafka`` commits its consumer
        group's offsets, does it here, after the checkpoint's commit)."""

    def detach(self) -> None:
        """The run ends (also on an error): stop receiving, release what :meth:`attach` took."""

    def plan(self, start: int, elapsed_s: float, cursor: str | None = None, cap: int | None = None) -> dict[str, Any]:
        """The epoch's slice: ``{"start", "end"}`` plus anything a replay needs (files: the
        names, and ``cursor``, the last name read, which the commit keeps for the next plan).
        ``cap`` is admission control's limit for this epoch; ``backlog`` is what stays waiting."""
        ready = min(self.available(elapsed_s), self.spec.limit or 2**62)
        end = min(ready, start + self.batch_limit(), start + cap if cap is not None else 2**62)
        return {"start": start, "end": max(start, end), "backlog": max(0, ready - max(start, end))}

    def batch_limit(self) -> int:
        return self.spec.max_rows_per_epoch or DEFAULT_UNPACED_BATCH

    def capped(self) -> bool:
        """Whether the spec bounds what one epoch takes of this source; if not, the backlog sizes
        its epochs (:mod:`eddyline.control.catchup`)."""
        return self.spec.max_rows_per_epoch is not None

    def peek(self, planned: dict[str, Any], columns: tuple[str, ...]) -> Any:
        """``columns`` of the planned slice as an Arrow table, read in the driver before the epoch
        runs, or None when this source cannot do that cheaply (the balancer's look-ahead)."""
        return None

    def following(self, planned: dict[str, Any]) -> list[str]:
        """The files the slice after ``planned`` would take if it were planned now, where
        :meth:`peek` can read them (so the look-ahead can count them early); else none."""
        return []

    def run_time_key(self, planned: dict[str, Any]) -> Hashable | None:
        """Whether the ``planned`` slice can be read by a frame built with no plan, whose tasks take
        the slice when they run (:class:`EpochSlice`): a key, the same for every slice that one
        such frame reads, so that the frame serves every epoch planned with that key; None when
        the slice needs a frame built for it. :meth:`frames` with no plan builds the frame for the
        key this method returned last."""
        return None

    def known(self, planned: dict[str, Any], time_columns: list[str]) -> dict[str, Any] | None:
        """What observing the slice's rows would find, known from its plan before anything runs
        (see :func:`footer_facts`), or None where only running the rows can tell."""
        return None

    def arrow_problem(self) -> str | None:
        """Why :meth:`read_arrow` cannot read this source (None: it can)."""
        return f"a {self.spec.kind} source is read by Spark's tasks only"

    def read_arrow(self, planned: dict[str, Any], columns: frozenset[str] | None = None, *,
                   task: int = 0, tasks: int = 1) -> ArrowSlice:
        """Task ``task``'s share of the ``planned`` slice among ``tasks`` (the whole slice by
        default) read here, in this process, with the rows and types its Spark frame has
        (``columns`` as for :meth:`frames`): for a resident epoch, whose lanes read their own
        shares without a Spark job (:mod:`eddyline.runtime.lanenetwork`). The shares of the
        tasks together are the slice, each row in one of them."""
        raise NotImplementedError(self.arrow_problem())

    def frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter = None,
        columns: frozenset[str] | None = None,
    ) -> Frames:
        """The slice's rows; ``count_bad`` (if given) is applied to the frame of all parsed
        records, which has a boolean ``_bad`` column, before it splits into data and dead letters.
        ``columns``: the (lower-case) columns the network reads of it, None for all; a source
        that decodes records may leave the others out of what it hands to Spark. ``planned``
        None (only where :meth:`run_time_key` gave a key): the slice is given when the frame runs."""
        raise NotImplementedError


#: a synthetic slice of at most this many rows is computed by one task
ONE_TASK_ROWS = 20_000


class SyntheticSource(Source):
    """Rows computed in Spark from their offsets (``generator`` and ``nexmark``): offsets become
    available at the source's rate of event time, or all at once when ``unpaced``.

    ``columns(spark, params, ids)`` computes the rows from a frame of row ids (column ``id``),
    ``ids(params, start, end)`` says which ids the offsets ``[start, end)`` hold. The ids come
    from the slice when the tasks run (each task its share, exploded in the JVM), so that the
    frame does not change from one epoch to the next (see :class:`EpochSlice`)."""

    def __init__(
        self,
        spec: SourceSpec,
        available: Callable[[Any, float], int],
        columns: Callable[[SparkSession, Any, DataFrame], DataFrame],
        ids: Callable[[Any, int, int], tuple[int, int]],
        *,
        unpaced: bool,
        arrow: Callable[[Any, int, int], pa.Table] | None = None,
    ) -> None:
        """``arrow(params, lo, hi)``: the rows of ids ``[lo, hi)`` computed without Spark, the
        values ``columns`` gives (None: only Spark computes them)."""
        super().__init__(spec)
        self._available, self._columns, self._ids, self.unpaced = available, columns, ids, unpaced
        self._arrow = arrow

    def arrow_problem(self) -> str | None:
        return None if self._arrow is not None else super().arrow_problem()

    def read_arrow(self, planned: dict[str, Any], columns: frozenset[str] | None = None, *,
                   task: int = 0, tasks: int = 1) -> ArrowSlice:
        if self._arrow is None:
            return super().read_arrow(planned, columns, task=task, tasks=tasks)
        lo, hi = self._ids(self.spec.params, planned["start"], planned["end"])
        share = -(-(hi - lo) // tasks)  # contiguous ids, as Spark's tasks split a range
        return ArrowSlice(self._arrow(self.spec.params, min(hi, lo + task * share), min(hi, lo + (task + 1) * share)))

    def available(self, elapsed_s: float) -> int:
        return self._available(self.spec.params, elapsed_s)

    def batch_limit(self) -> int:
        if self.spec.max_rows_per_epoch:
            return self.spec.max_rows_per_epoch
        return DEFAULT_UNPACED_BATCH if self.unpaced else 2**62

    def run_time_key(self, planned: dict[str, Any]) -> Hashable | None:
        # a small slice gets a frame of one task: the rows of a second would not pay for its start
        return self._one_task_key(planned["end"] - planned["start"] <= ONE_TASK_ROWS)

    def frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter = None,
        columns: frozenset[str] | None = None,
    ) -> Frames:
        if planned is None:
            partitions = self._run_time_tasks(partitions)
        shares = functools.partial(_id_shares, EpochSlice(self.name, planned), partitions, self._ids, self.spec.params)
        ranges = spark.range(0, partitions, 1, partitions).mapInArrow(shares, "lo long, hi long")
        ids = ranges.selectExpr("explode(sequence(lo, hi - 1)) AS id")
        return Frames(self._columns(spark, self.spec.params, ids))


#: row ids per exploded sequence: a task's share is cut into pieces this long, since a long
#: sequence is built whole as one array before it is exploded
ID_CHUNK = 4096


def _id_shares(
    slice_: EpochSlice, tasks: int, ids: Callable[[Any, int, int], tuple[int, int]], params: Any,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the task's share ``[lo, hi)`` of the slice's row ids (none if empty)."""
    planned = slice_.get()
    lo, hi = ids(params, planned["start"], planned["end"])
    for batch in batches:
        for i in batch.column(0).to_pylist():
            a, b = lo + (hi - lo) * i // tasks, lo + (hi - lo) * (i + 1) // tasks
            if b > a:
                starts = np.arange(a, b, ID_CHUNK, dtype=np.int64)
                ends = np.minimum(starts + ID_CHUNK, b)
                yield pa.RecordBatch.from_arrays([pa.array(starts), pa.array(ends)], names=["lo", "hi"])


class SourceKind(api_sources.SourceKind):
    """A source kind that can read: ``make`` turns its spec into a :class:`Source`."""

    def make(self, spec: SourceSpec) -> Source:
        raise NotImplementedError

    def unreadable(self, params: Any) -> str | None:
        """Why the source cannot be read at all as configured (its field and what was expected),
        checked by ``eddyline validate`` and before ``eddyline run`` starts Spark; None: it can
        (a server that is down now is waited for, not refused here)."""
        return None


_TO_MS = {"milliseconds": 1, "microseconds": 1000}


def _newest_ms(meta: Any, col: str) -> int | None | bool:
    """The largest value of top-level column ``col`` in one Parquet file, in epoch ms (None: no
    non-null value), or False when the footer cannot say exactly (see :func:`footer_facts`)."""
    schema = meta.schema
    i = next((j for j in range(len(schema)) if schema.column(j).path == col), None)
    if i is None or schema.column(i).physical_type != "INT64":
        return False
    logical = json.loads(schema.column(i).logical_type.to_json())
    if logical.get("Type") != "Timestamp" or not logical.get("isAdjustedToUTC"):
        return False
    per_ms = _TO_MS.get(logical.get("timeUnit", ""))
    if per_ms is None:
        return False
    newest = None
    for r in range(meta.num_row_groups):
        chunk = meta.row_group(r).column(i)
        stats = chunk.statistics
        if stats is not None and stats.has_min_max:
            value = int(stats.max_raw) // per_ms  # floor, as the observation's floor(micros / 1000)
            newest = value if newest is None else max(newest, value)
        elif not (stats is not None and stats.has_null_count and stats.null_count == chunk.num_values):
            return False  # values without statistics
    return newest


def make_source(spec: SourceSpec) -> Source:
    kind = spec.info
    assert isinstance(kind, SourceKind), kind
    return kind.make(spec)
