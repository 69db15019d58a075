"""A resident epoch as each lane runs it: its own share of every source, the stateless steps, and
the stateful steps' rows exchanged lane to lane.

The driver of a resident stage (:mod:`eddyline.runtime.residentmode`) sends every lane the same
small message per epoch: the plan's slices, watermarks and advances. Each lane then, with no
Spark job and no row passing through the driver:

1. reads its share of every source's slice with the readers the per-epoch job's tasks run
   (:meth:`~eddyline.io.sources.Source.read_arrow` with ``task=lane``: every ``L``-th file, a run
   of a text slice's bytes, a range of a generator's ids), so the lanes parse in parallel;
2. runs the stateless steps on its rows, each as its kind does on Arrow
   (:meth:`~eddyline.kinds.base.StepKind.lane_run`: a ``filter`` or a ``select`` in DuckDB, a
   ``udf``'s function on the lane's batches, a ``union``'s inputs one after the other, a
   ``lookup``'s join with the table version the header pins, read once per version);
3. for each stateful step in turn, writes its part of the step's rows too late for its late
   target, if it has one (:meth:`~eddyline.kinds.base.StepKind.lane_late`), into that epoch's
   staging, prepares the other rows as the kind does in Spark (key groups and
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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.api.network import NetworkSpec
from eddyline.errors import SpecError
from eddyline.hashing import row_hash_sum
from eddyline.io.files.target import write_part
from eddyline.io.revisions import arrow_weighted
from eddyline.io.tables import read_arrow
from eddyline.operators.rows import event_time_ms
from eddyline.plan.keygroups import key_groups_of
from eddyline.runtime.shedding import shed_tables

if TYPE_CHECKING:
    from eddyline.api.steps import StepSpec
    from eddyline.io.sources import Source

#: the name of the rows a lane shed (for the shed sink) among the tables it answers with, and
#: the prefix of each shed point's utility values (``<step>:<input>``, for the quantiles)
SHED, UTILITY = "_shed", "_utility:"

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
    #: by stateless step, what its kind prepared for its lanes (:meth:`~eddyline.kinds.base.StepKind.lane_step`)
    stateless: Mapping[str, Any]
    #: by step that reads a table whole (a lookup), where the version the epoch's plan pinned is
    #: (the header's ``tables``; none: the live files, as before the first plan)
    tables: Mapping[str, str] = field(default_factory=dict)

    # the kinds' side (eddyline.kinds.base.LaneFeed)
    def key_groups(self, step: StepSpec, table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
        try:
            return key_groups_of(table, keys, self.spec.key_groups)
        except TypeError as e:
            raise SpecError(f"step '{step.name}': resident lanes key BIGINT, TIMESTAMP and STRING columns: {e}") from None

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        return self.read_by.get(step.name)

    def prepared(self, step: StepSpec) -> Any:
        return self.stateless[step.name]

    def table(self, step: StepSpec) -> pa.Table:
        files = step.info.pinned_table(step.params)
        try:
            if step.name in self.tables:
                return read_arrow(self.tables[step.name])
            return read_arrow(files.path, pinned=False)  # (the live files: before the first plan)
        except ValueError as e:
            raise SpecError(f"step '{step.name}': lookup.table: {e}") from None

    def pinning(self, tables: Mapping[str, str]) -> LaneNetwork:
        """This network with the table versions ``tables`` pinned (itself when they are)."""
        return self if dict(tables) == dict(self.tables) else replace(self, tables=dict(tables))

    def run(self, lane: int, lanes: int, header: Mapping[str, Any], exchange: Exchange, run_step: RunStep,
            part: str) -> LaneEpoch:
        """Lane ``lane``'s part of the epoch ``header`` names, with the plan's ``slices``,
        ``watermarks`` and ``advance`` (by step), its ``shed`` points and the lookup ``tables``'
        versions. The sinks ``header["parts"]`` names get their rows written here, as part
        ``part``; the others' rows are returned (with their ``digests`` if asked). The rows too
        late for a step with a late target are written here too, as part ``part`` of its staging
        ``header["late"]`` names."""
        feed = self.pinning(header.get("tables") or {})  # (the kinds' side, with the epoch's table versions)
        epoch = int(header["epoch"])
        tables: dict[str, pa.Table] = {}
        observed: dict[str, Any] = {}
        dead: list[pa.Table] = []
        shed_rows: list[pa.Table] = []
        utility: dict[str, pa.Table] = {}
        for src in self.spec.sources:
            got = self.sources[src.name].read_arrow(header["slices"][src.name], self.read_by.get(src.name),
                                                    task=lane, tasks=lanes)
            tables[src.name], unweighed = arrow_weighted(got.data, src.name)  # (revisions: their _diff)
            observed[f"source:{src.name}"] = {"rows": tables[src.name].num_rows}
            dead += [t for t in (got.dead_letters, unweighed) if t is not None and t.num_rows]
        manifests: dict[str, dict[str, Any]] = {}
        late: dict[str, tuple[str | None, int]] = {}
        for step in self.spec.topological():
            inputs = [tables[i] for i in step.inputs]
            if not step.stateful:
                tables[step.name] = step.info.lane_run(feed, step, inputs)
                continue
            if self.spec.control.overload is not None:  # (before the step's own observations, as in Spark)
                shed = shed_tables(step, inputs, header.get("shed", {}).get(step.name), self.spec.control.overload,
                                   epoch)
                inputs = shed.inputs
                observed.update(shed.observed)
                shed_rows += shed.shed
                utility.update({f"{UTILITY}{k}": v for k, v in shed.utility.items()})
            for i, (rows, column) in enumerate(zip(inputs, step.time_columns(), strict=True)):
                if column is not None:
                    observed[f"step:{step.name}:{i}"] = {"max_t": newest_ms(rows.column(column))}
            inputs, late_rows = step.info.lane_late(step, inputs, int(header["watermarks"][step.name]))
            if late_rows is not None:  # written here, as a files sink's part
                observed.setdefault(f"step:{step.name}:0", {})["late"] = late_rows.num_rows
                late[step.name] = (write_part(late_rows, header["late"][step.name], part), late_rows.num_rows)
            keyed, _ = step.info.lane_input(feed, step, inputs)
            mine = exchange(epoch, step.name, keyed)
            manifests[step.name], out = run_step(
                epoch, step.name, mine, int(header["watermarks"][step.name]), header["advance"].get(step.name))
            tables[step.name], seen = step.info.lane_output(feed, step, out)
            observed.update(seen)
        done = LaneEpoch(observed, manifests, late=late)
        for sink in self.spec.sinks:
            rows, parts = tables[sink.input], header.get("parts", {}).get(sink.name)
            if header.get("digests"):  # (a hot pair's: the driver adds the lanes' up)
                done.digests[sink.name] = (rows.num_rows, str(row_hash_sum(rows)))
            if parts is None:
                done.tables[sink.name] = rows
            else:
                done.written[sink.name] = (write_part(rows, parts, part), rows.num_rows)
        if dead:
            done.tables["_dead"] = pa.concat_tables(dead)
        if shed_rows:
            done.tables[SHED] = pa.concat_tables(shed_rows, promote_options="default")
        done.tables.update(utility)
        return done


@dataclass
class LaneEpoch:
    """What a lane did of an epoch: its ``observed`` rows and event times (as the per-epoch
    job's observations, :attr:`~eddyline.runtime.epoch.records.Staged.observed`), its manifest
    by step, the rows it sends back (by sink; the dead letters as ``"_dead"``) and, by sink,
    the part it wrote (None: no rows) and its rows; by step with a late target, the same of its
    late rows; and, if asked, each sink's digest."""

    observed: dict[str, Any]
    manifests: dict[str, dict[str, Any]]
    tables: dict[str, pa.Table] = field(default_factory=dict)
    written: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    late: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    #: by sink, when the driver asked (a hot pair): its rows and :func:`~eddyline.hashing.row_hash_sum`
    digests: dict[str, tuple[int, str]] = field(default_factory=dict)


def merged_observed(parts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The lanes' observations as one: rows (and rows offered to and kept by a shed point, and
    late rows) added up (each lane's rows under ``lanes``, in lane order), the newest event time
    the newest of any, a ``max:<x>`` the largest, a ``sum:<x>`` and a ``count:<x>`` the
    ``mean:<x>`` of all lanes' values."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for key, seen in part.items():
            into = out.setdefault(key, {})
            if "rows" in seen:
                into["rows"] = into.get("rows", 0) + int(seen["rows"])
                into.setdefault("lanes", []).append(int(seen["rows"]))
            if "late" in seen:
                into["late"] = into.get("late", 0) + int(seen["late"])
            for name, value in seen.items():
                if name in ("offered", "kept") or name.startswith(("sum:", "count:")):
                    into[name] = into.get(name, 0) + value
                elif name.startswith("max:") and value is not None:
                    into[name] = value if into.get(name) is None else max(into[name], value)
                elif name.startswith("max:"):
                    into.setdefault(name, None)
            if "max_t" in seen:
                known = [t for t in (into.get("max_t"), seen["max_t"]) if t is not None]
                into["max_t"] = max(known) if known else None
    for into in out.values():  # a mean of the lanes' values: their sum over their count
        for name in [n for n in into if n.startswith("sum:")]:
            what = name.removeprefix("sum:")
            count = into.pop(f"count:{what}", 0)
            total = into.pop(name)
            into[f"mean:{what}"] = total / count if count else None
    return out
