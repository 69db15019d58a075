"""A resident epoch as each lane runs it: its own share of every source, the stateless steps, and
the stateful steps' rows exchanged lane to lane.

The driver of a resident stage (:mod:`eddyline.runtime.residentmode`) sends every lane the same
small message per epoch: the plan's slices, watermarks and advances. Each lane then, with no
Spark job and no row passing through the driver:

1. reads its share of every source's slice with the readers the per-epoch job's tasks run
   (:meth:`~eddyline.io.sources.Source.read_arrow` with ``task=lane``: every ``L``-th file, a run
   of a text slice's bytes, a range of a generator's ids), so the lanes parse in parallel;
2. runs the ``filter`` and ``select`` steps on its rows in DuckDB;
3. for each stateful step in turn, prepares its rows as the kind does in Spark (key groups and
   all, :meth:`~eddyline.kinds.base.StepKind.lane_input`), sends every other lane the rows of its
   key groups and receives theirs (the shuffle a per-epoch job does in Spark), runs the kernel on
   what it owns and goes on with the kernel's output;
4. writes its part of each ``files`` sink's rows into the epoch's staging, and answers the
   driver with its manifests, what it observed (rows read, newest event times), the names of
   the parts, and the rows of the other sinks and the dead letters, which the driver stages.

A source's revisions (``_op`` or ``_diff``) become a ``_diff`` weight as the lane reads them
(:func:`~eddyline.io.revisions.arrow_weighted`); a row without a valid weight is a dead
letter, worded as a per-epoch job's Spark words it.

The rows a lane receives from the others are concatenated in lane order, so a replay of an
epoch on the same lanes gives each kernel the same input. What every row used to cost the
driver, a read, a parse, a route and, for a ``files`` sink, a write, is now the lanes'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.api.network import NetworkSpec
from eddyline.columns import DIFF
from eddyline.errors import SpecError
from eddyline.io.files.target import write_part
from eddyline.io.revisions import arrow_weighted
from eddyline.operators.rows import event_time_ms
from eddyline.operators.sqlsteps import SqlStep
from eddyline.plan.keygroups import key_groups_of

if TYPE_CHECKING:
    from eddyline.api.steps import StepSpec
    from eddyline.io.sources import Source

#: a stateful step's rows of this lane's epoch, prepared and keyed, in; the rows of the lane's
#: key groups from every lane (this one included), in lane order, out
Exchange = Callable[[int, str, pa.Table], pa.Table]
#: one stateful step's epoch on this lane's state: (epoch, step, rows, watermark, advance) in;
#: (its manifest, its output rows) out
RunStep = Callable[[int, str, pa.Table, int, "int | None"], "tuple[dict[str, Any], pa.Table]"]


def newest_ms(column: pa.ChunkedArray) -> int | None:
    """The newest value of a timestamp column in epoch milliseconds, rounded down as
    :func:`eddyline.runtime.compile.max_event_ms` gives it (None: no value)."""
    newest = pc.max(column)
    return int(event_time_ms(pa.array([newest], column.type))[0]) if newest.is_valid else None


def sql(step: SqlStep, rows: pa.Table) -> pa.Table:
    """A filter or a select over ``rows``; a select keeps a revision's weight, as in Spark
    (:class:`eddyline.kinds.select.Select`)."""
    out = step.run(rows)
    if DIFF in rows.column_names and DIFF not in out.column_names:
        out = out.append_column(DIFF, rows.column(DIFF))
    return out


def time_columns_checked(step: StepSpec, inputs: list[pa.Schema]) -> None:
    """A stateful step's time columns exist in its inputs and are timestamps (SpecError)."""
    for schema, column in zip(inputs, step.time_columns(), strict=True):
        if column is None:
            continue
        if column not in schema.names:
            raise SpecError(f"step '{step.name}': time: unknown column '{column}'; input has {', '.join(schema.names)}")
        if not pa.types.is_timestamp(schema.field(column).type):
            raise SpecError(f"step '{step.name}': time: expected a timestamp column, '{column}' is "
                            f"{schema.field(column).type}")


@dataclass(frozen=True)
class LaneNetwork:
    """What every lane of a resident stage needs to run a whole epoch of ``spec`` on its own
    (pickled once, with the stage)."""

    spec: NetworkSpec
    sources: Mapping[str, Source]
    read_by: Mapping[str, frozenset[str] | None]
    sql: Mapping[str, SqlStep]

    # the kinds' side (eddyline.kinds.base.LaneFeed)
    def key_groups(self, step: StepSpec, table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
        try:
            return key_groups_of(table, keys, self.spec.key_groups)
        except TypeError as e:
            raise SpecError(f"step '{step.name}': resident lanes key BIGINT, TIMESTAMP and STRING columns: {e}") from None

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        return self.read_by.get(step.name)

    def run(self, lane: int, lanes: int, header: Mapping[str, Any], exchange: Exchange, run_step: RunStep,
            part: str) -> LaneEpoch:
        """Lane ``lane``'s part of the epoch ``header`` names. The sinks ``header["parts"]``
        names get their rows written here, as part ``part``; the others' rows are returned."""
        epoch = int(header["epoch"])
        tables: dict[str, pa.Table] = {}
        observed: dict[str, Any] = {}
        dead: list[pa.Table] = []
        for src in self.spec.sources:
            got = self.sources[src.name].read_arrow(header["slices"][src.name], self.read_by.get(src.name),
                                                    task=lane, tasks=lanes)
            tables[src.name], unweighed = arrow_weighted(got.data, src.name)  # (revisions: their _diff)
            observed[f"source:{src.name}"] = {"rows": tables[src.name].num_rows}
            dead += [t for t in (got.dead_letters, unweighed) if t is not None and t.num_rows]
        manifests: dict[str, dict[str, Any]] = {}
        for step in self.spec.topological():
            inputs = [tables[i] for i in step.inputs]
            if not step.stateful:
                tables[step.name] = sql(self.sql[step.name], inputs[0])
                continue
            for i, (rows, column) in enumerate(zip(inputs, step.time_columns(), strict=True)):
                if column is not None:
                    observed[f"step:{step.name}:{i}"] = {"max_t": newest_ms(rows.column(column))}
            keyed, _ = step.info.lane_input(self, step, inputs)
            mine = exchange(epoch, step.name, keyed)
            manifests[step.name], tables[step.name] = run_step(
                epoch, step.name, mine, int(header["watermarks"][step.name]), header["advance"].get(step.name))
        done = LaneEpoch(observed, manifests)
        for sink in self.spec.sinks:
            rows, parts = tables[sink.input], header.get("parts", {}).get(sink.name)
            if parts is None:
                done.tables[sink.name] = rows
            else:
                done.written[sink.name] = (write_part(rows, parts, part), rows.num_rows)
        if dead:
            done.tables["_dead"] = pa.concat_tables(dead)
        return done


@dataclass
class LaneEpoch:
    """What a lane did of an epoch: its ``observed`` rows and event times (as the per-epoch
    job's observations, :attr:`~eddyline.runtime.epoch.records.Staged.observed`), its manifest
    by step, the rows it sends back (by sink; the dead letters as ``"_dead"``) and, by sink,
    the part it wrote (None: no rows) and its rows."""

    observed: dict[str, Any]
    manifests: dict[str, dict[str, Any]]
    tables: dict[str, pa.Table] = field(default_factory=dict)
    written: dict[str, tuple[str | None, int]] = field(default_factory=dict)


def merged_observed(parts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The lanes' observations as one: rows added up (each lane's under ``lanes``, in lane
    order), the newest event time the newest of any."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for key, seen in part.items():
            into = out.setdefault(key, {})
            if "rows" in seen:
                into["rows"] = into.get("rows", 0) + int(seen["rows"])
                into.setdefault("lanes", []).append(int(seen["rows"]))
            if "max_t" in seen:
                known = [t for t in (into.get("max_t"), seen["max_t"]) if t is not None]
                into["max_t"] = max(known) if known else None
    return out
