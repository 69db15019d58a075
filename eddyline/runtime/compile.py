"""Turn the network and one epoch plan into Spark DataFrames.

Sources give their slice's frame; every step then asks its kind (:mod:`eddyline.kinds`) to
compile it, through the :class:`~eddyline.kinds.base.CompileContext` an :class:`EpochCompiler`
provides: the plan's watermark and routing, key-group SQL, observations, the lane shuffle
(:mod:`eddyline.runtime.shuffle`). Before a stateful step the plan's shedding is applied
(:mod:`eddyline.runtime.shedding`).

The watermark, the routing table and the state index come from the logged plan, never from the
clock, so a replayed epoch computes what the original computed. Most of a network's frames do
not depend on the plan at all once the sources' slices and the lanes' epoch (state index,
watermark) reach the tasks as Spark local properties when the jobs run (``EpochFrames.properties``):
those are built once and run every epoch (:meth:`EpochCompiler.build`).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eddyline.api.network import NetworkSpec
from eddyline.api.steps import StepSpec
from eddyline.columns import DIFF
from eddyline.errors import SpecError
from eddyline.eventtime import NO_WATERMARK
from eddyline.io.revisions import BAD, weighted
from eddyline.io.sources import Source, make_source, slice_properties
from eddyline.io.tables import LookupTables
from eddyline.kinds import step_kind
from eddyline.kinds.base import first_line
from eddyline.plan.branches import fold, quoted, shared_node, substitute
from eddyline.plan.keygroups import RoutingTable, key_group_sql
from eddyline.runtime.checkpoint import lane_run_path
from eddyline.runtime.faults import Faults, NoFaults
from eddyline.runtime.lanes import LANE_PROPERTY, LaneTask
from eddyline.runtime.shedding import shed_inputs
from eddyline.runtime.shuffle import Heartbeats, to_lanes
from eddyline.storage import Gate, filesystem, makedirs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.operators.base import Kernel


@dataclass
class StepRun:
    """What one epoch needs to know about a stateful step."""

    watermark_ms: int
    routing: RoutingTable
    index: dict[int, list]
    #: per-lane state memory budget (None: unbounded)
    state_budget: int | None = None
    #: in-memory bytes of a state row as measured last epoch
    bytes_per_row: float = 0.0
    #: the watermark the lanes move to after the epoch's rows (``EpochPlan.advance``), if any
    advance_ms: int | None = None


@dataclass
class Known:
    """What an observation would find, known before the epoch runs (see ``Source.known``); a
    node kept across epochs is given each epoch's values."""

    values: dict[str, Any]

    @property
    def get(self) -> dict[str, Any]:
        return self.values


class RunObservation:
    """Aggregates over the rows of a frame, collected while a job runs it (Spark's
    ``CollectMetrics``), readable once per run: :meth:`arm` before the job, :attr:`get` after it.

    PySpark's ``Observation`` is bound to the first run of its frame only; a frame built once
    and run every epoch needs its observations armed again before every run. Spark completes an
    observation by its name and the id of the frame it observes, so arming registers a new one
    under the same two (``ObservationManager`` of the classic SparkSession, an internal API of
    the pinned Spark 4.3)."""

    def __init__(self, df: DataFrame, name: str, *aggregates: Any):
        from pyspark.sql import DataFrame as Frame
        from pyspark.sql.classic.column import _to_seq

        self.name, self._session = name, df.sparkSession
        first, *rest = aggregates
        jdf = df._jdf.observe(name, first._jc, _to_seq(df._sc, [c._jc for c in rest]))
        self._frame_id = df._jdf.id()
        self.observed = Frame(jdf, df.sparkSession)
        self._jo: Any = None

    def arm(self) -> None:
        jvm = self._session._jvm
        self._jo = getattr(jvm, "org.apache.spark.sql.Observation")(self.name)
        self._session._jsparkSession.observationManager().register(self._jo, self._frame_id)

    @property
    def get(self) -> dict[str, Any]:
        """The values of the last armed run (waits for it to end)."""
        from pyspark.serializers import CPickleSerializer

        assert self._jo is not None, f"observation {self.name} read before it was armed"
        utils = getattr(self._session._jvm, "org.apache.spark.sql.api.python.PythonSQLUtils")
        return CPickleSerializer().loads(utils.toPyRow(self._jo.getRow())).asDict(recursive=False)


@dataclass(frozen=True)
class SharedObservation:
    """One field of another observation, read under the name its reader expects: a step that
    reads a source as it is shares the source's observation instead of adding its own."""

    of: RunObservation | Known
    field: str
    name: str = "max_t"

    @property
    def get(self) -> dict[str, Any]:
        return {self.name: self.of.get.get(self.field)}


def max_event_ms(col: str) -> str:
    """SQL aggregate: the newest value of ``col`` in epoch milliseconds.

    An observation is evaluated row by row outside Spark's generated code: the rows pay only
    for max(); the conversion to milliseconds (monotonic, so it commutes with max) runs once."""
    return f"CAST(floor(unix_micros(max(CAST(`{col}` AS TIMESTAMP))) / 1000) AS BIGINT)"


@dataclass
class EpochFrames:
    nodes: dict[str, DataFrame] = field(default_factory=dict)
    #: per (step, input): the rows shed there (only when a shed sink is configured)
    shed: dict[str, DataFrame] = field(default_factory=dict)
    #: ``source:<name>`` rows (and newest times), ``step:<name>:<input>`` newest event time
    #: (a window also rows and late rows), ``shed:<step>:<input>``, ``bad:<source>``
    observations: dict[str, RunObservation | Known | SharedObservation] = field(default_factory=dict)
    dead_letters: dict[str, DataFrame] = field(default_factory=dict)
    late: dict[str, DataFrame] = field(default_factory=dict)
    #: some nodes are kept to serve more than one epoch (:meth:`EpochCompiler.build`): their
    #: observations' names recur, and every job must plan them anew (:func:`fresh`)
    reused: bool = False
    #: the epoch's planned slice per source, for tasks that take it when they run
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per stateful step, the epoch's part of its lanes' task (see ``EpochCompiler._lane_run``)
    lanes: dict[str, str] = field(default_factory=dict)

    def properties(self) -> dict[str, str]:
        """The Spark local properties the epoch's jobs run with: what their tasks take when they run."""
        return {**slice_properties(self.slices), **{LANE_PROPERTY + step: run for step, run in self.lanes.items()}}

    def arm(self) -> None:
        """Ready every observation for the epoch's run (see :class:`RunObservation`)."""
        for o in self.observations.values():
            if isinstance(o, RunObservation):
                o.arm()


_NOT_KEPT = object()
#: how many keys' frames a node keeps (see ``EpochCompiler._node``)
KEPT_VARIANTS = 2


@dataclass
class _Added:
    """What building one node added to the epoch's frames, to add again when it is kept."""

    key: Any
    serial: int  # unique to the frame built: the nodes built on it name it in their keys
    node: dict[str, DataFrame]
    observations: dict[str, Any]
    dead_letters: dict[str, DataFrame]
    late: dict[str, DataFrame]
    shared: dict[str, Any]

    @staticmethod
    def snapshot(out: EpochFrames, shared: dict[str, Any]) -> _Added:
        return _Added(None, -1, dict(out.nodes), dict(out.observations), dict(out.dead_letters), dict(out.late),
                      dict(shared))

    def added(self, name: str, key: Any, serial: int, out: EpochFrames, shared: dict[str, Any]) -> _Added:
        def new(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in now.items() if k not in before}

        return _Added(key, serial, {name: out.nodes[name]}, new(out.observations, self.observations),
                      new(out.dead_letters, self.dead_letters), new(out.late, self.late), new(shared, self.shared))

    def restore(self, out: EpochFrames, shared: dict[str, Any]) -> None:
        out.nodes.update(self.node)
        out.observations.update(self.observations)
        out.dead_letters.update(self.dead_letters)
        out.late.update(self.late)
        shared.update(self.shared)


def fresh(df: DataFrame) -> DataFrame:
    """``df`` as a new Dataset over the same logical plan, to be planned anew for a run.

    A Dataset plans itself once and keeps its physical plan; run again, that plan's shuffles are
    not run again (their map output from the first run is reused, and an adaptive plan keeps
    its finished stages), so a frame kept across epochs would give the first epoch's rows.
    Every job over a kept frame therefore runs a fresh Dataset of it."""
    from pyspark.sql import DataFrame as Frame

    session = df.sparkSession
    jds = session._jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, df._jdf.logicalPlan())
    return Frame(jds, session)


#: a lane run larger than this (a state index over many key groups) goes to a file in the
#: checkpoint, and only its path rides with the tasks
LANE_RUN_INLINE = 256 * 1024


class EpochCompiler:
    """Builds one epoch's DataFrames; implements the kinds' :class:`CompileContext`.

    Between epochs it keeps only the SparkSession, the lookup tables and the lanes' heartbeat
    frames (built once per lane count)."""

    def __init__(self, spark: SparkSession, spec: NetworkSpec, sources: dict[str, Source], checkpoint: str,
                 faults: Faults | None = None, gate: Gate | None = None):
        """``gate``: the checkpoint's (:attr:`eddyline.runtime.checkpoint.Checkpoint.gate`): what
        the driver writes there goes through it, and the lanes write through its generation's."""
        self.spark = spark
        self.sources = sources
        self.spec = spec
        self.checkpoint = checkpoint
        self.faults = faults or NoFaults()
        self.gate = gate if gate is not None else Gate(checkpoint)
        self.tables = LookupTables(spec, checkpoint, self.gate)
        self.heartbeats = Heartbeats(spark)
        # Event-time columns that stateful steps read straight from a source: the source's
        # observation also takes their newest value. Each observation is a node that every row
        # passes through outside Spark's generated code, so one is cheaper than two.
        self._direct_times: dict[str, list[str]] = {}
        for step in spec.steps:
            if step.stateful and not step.info.observes_own_time:
                for name, col in zip(step.inputs, step.time_columns(), strict=True):
                    if col is not None and name in sources:
                        times = self._direct_times.setdefault(name, [])
                        if col not in times:
                            times.append(col)
        self._read_by: tuple[NetworkSpec | None, dict[str, frozenset[str] | None]] = (None, {})
        #: the nodes kept across epochs (see :meth:`build`), and the network, lanes and
        #: observing they were built for
        self._nodes: dict[str, list[_Added]] = {}
        self._serials = itertools.count()
        self._kept_for: tuple[NetworkSpec | None, int, bool] = (None, 0, False)
        # per epoch
        self.epoch = 0
        self.observing = True
        self.small = False
        self._runs: dict[str, StepRun] = {}
        self._tables: dict[str, dict[str, Any]] = {}
        self._out = EpochFrames()
        self._built: dict[str, int] = {}  # node -> the serial of the frame it has this epoch
        #: per source, this epoch: its frame, its observation and, per time column observed
        #: there, the observation's field holding its newest value
        self._shared: dict[str, tuple[DataFrame, RunObservation | Known, dict[str, str]]] = {}


    @property
    def spec(self) -> NetworkSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: NetworkSpec) -> None:
        # each source is told whether a stateful step reads it, for the network in use (the
        # engine swaps the network when its settings or catch-ups change)
        self._spec = spec
        fed = set().union(*(spec.upstream(s.name) for s in spec.stateful_steps()))
        for name, source in self.sources.items():
            source.feeds_state = name in fed
    def build(
        self,
        epoch: int,
        source_slices: dict[str, dict[str, Any]],
        steps: dict[str, StepRun],
        lanes: int,
        *,
        observe: bool = True,
        small: bool = False,
        tables: dict[str, dict[str, Any]] | None = None,
        shed: dict[str, dict[str, Any]] | None = None,
    ) -> EpochFrames:
        """The epoch's frames, their observations armed for this epoch's run.

        A node whose frame depends on nothing in the epoch's plan but what its tasks take when
        they run (a source's slice, a lane's state and watermark) is built once and serves
        every epoch while the network, the lanes and the step's routing stay as they are:
        Spark analyses every operation of a frame as it is built, which costs a small epoch
        more than running it, and an unchanged plan finds its generated code in Spark's cache
        (docs/perf-notes.md, "The epoch floor"). The nodes after one that must be built anew
        (a Parquet source's files, a window's watermark in its SQL when it writes late rows out,
        a lookup's table version, shedding) are built anew too. A step that plans small epochs
        differently (``CompileContext.small``), or a source that reads small slices with fewer
        tasks, has a frame for each; a node keeps those of its last two keys."""
        if self._kept_for != (self.spec, lanes, observe):
            self._kept_for, self._nodes = (self.spec, lanes, observe), {}
        self.epoch, self.observing, self.small, self._runs = epoch, observe, small, steps
        self._tables = tables or {}
        self._out, self._shared = EpochFrames(slices=source_slices), {}
        if self._read_by[0] is not self.spec:  # what the steps in force read of each node
            self._read_by = (self.spec, self.spec.columns_read())
        out = self._out
        fixed: set[str] = set()  # nodes that may be kept
        self._built = {}
        for src in self.spec.sources:
            source, planned = self.sources[src.name], source_slices[src.name]
            known = source.known(planned, self._direct_times.get(src.name, [])) if observe else None
            at_run_time = source.run_time_key(planned)
            if at_run_time is None:  # a frame for this slice
                self._node(src.name, _NOT_KEPT, functools.partial(self._source, src.name, planned, lanes, known))
                continue
            fixed.add(src.name)
            make = functools.partial(self._source, src.name, None, lanes, known)
            if self._node(src.name, (at_run_time, known is not None), make) and known is not None:
                self._shared[src.name][1].values = known  # the kept node's facts, which kept steps share
        overload = self.spec.control.overload
        for step in self.spec.topological():
            kind = step_kind(step)
            keeps = (all(i in fixed for i in step.inputs) and not kind.reads_plan(step.params)
                     and not (overload is not None and step.stateful))
            key = _NOT_KEPT
            if keeps:
                fixed.add(step.name)
                key = (self.run(step).routing.to_json() if step.stateful else None,
                       small and kind.plans_small_epochs(step.params))
            self._node(step.name, key, lambda s=step: self._step(s, shed), step.inputs)
        out.lanes = {name: self._lane_run(epoch, name, run) for name, run in steps.items()}
        out.reused = bool(fixed)
        out.arm()
        return out

    def _step(self, step: StepSpec, shed: dict[str, dict[str, Any]] | None) -> None:
        overload = self.spec.control.overload
        out = self._out
        ins = [out.nodes[i] for i in step.inputs]
        check_revisions(step, ins, overload is not None)
        if overload is not None and step.stateful:
            ins, shed_rows = shed_inputs(self, step, ins, (shed or {}).get(step.name), overload)
            out.shed.update(shed_rows)
        try:
            out.nodes[step.name] = step_kind(step).compile(self, step, ins)
        except SpecError:
            raise
        except Exception as e:  # analysis errors name the step
            raise SpecError(f"step '{step.name}': {step.kind}: {first_line(e)}") from e

    def _node(self, name: str, key: Any, make: Callable[[], None], inputs: tuple[str, ...] = ()) -> bool:
        """Node ``name`` of this epoch: kept from an earlier epoch (returns True) if it was built
        for the same ``key`` on the same frames of its ``inputs``, else made by ``make()``, which
        adds its frame and whatever else it builds (observations, dead letters, late rows) to the
        epoch's frames, and kept for later epochs unless ``key`` is ``_NOT_KEPT``. A node keeps
        the frames of its last few keys (:data:`KEPT_VARIANTS`), so that epochs alternating
        between two keys (a source's slice small or not) each find theirs."""
        out, variants = self._out, self._nodes.setdefault(name, [])
        full = (key, tuple(self._built[i] for i in inputs))  # an input built anew: a new serial
        kept = next((v for v in variants if v.key == full), None) if key is not _NOT_KEPT else None
        if kept is not None:
            kept.restore(out, self._shared)
            variants.remove(kept)
            variants.append(kept)  # the most recently used last
            self._built[name] = kept.serial
            return True
        before = _Added.snapshot(out, self._shared)
        make()
        self._built[name] = serial = next(self._serials)
        if key is not _NOT_KEPT:
            variants.append(before.added(name, full, serial, out, self._shared))
            del variants[:-KEPT_VARIANTS]
        return False

    def _lane_run(self, epoch: int, step: str, run: StepRun) -> str:
        """The epoch's part of a stateful step's lane task, as its lanes read it when they run
        (:meth:`eddyline.runtime.lanes.LaneTask.for_epoch`): inline, or the path of a file."""
        self.gate.ready()  # the lanes write through it
        part = {"epoch": epoch, "index": {str(kg): chain for kg, chain in run.index.items()},
                "watermark_ms": run.watermark_ms, "bytes_per_row": run.bytes_per_row,
                "generation": self.gate.generation}
        if run.advance_ms is not None:
            part["advance_ms"] = run.advance_ms
        text = json.dumps(part)
        if len(text) <= LANE_RUN_INLINE:
            return text
        fs, _ = filesystem(self.checkpoint)
        path = lane_run_path(self.checkpoint, epoch, step, self.gate.generation)
        makedirs(fs, path.rsplit("/", 1)[0])
        self.gate.ready().put(path, text.encode())  # the same bytes again if the epoch is replayed
        return json.dumps({"path": path})

    def forget(self) -> None:
        """Build every node anew next epoch (an epoch failed: its observations may still wait)."""
        self._nodes = {}

    def _source(self, name: str, planned: dict[str, Any] | None, lanes: int, known: dict[str, Any] | None) -> None:
        """Source ``name``'s node: its frame (``planned`` None: the one whose tasks take the slice
        when they run), dead letters and observation, which is ``known`` (the facts the plan
        already tells) where there are such facts."""
        from pyspark.sql import functions as F

        out = self._out
        count_bad = None
        if self.observing:

            def count_bad(df: DataFrame) -> DataFrame:
                return self.observe(df, f"bad:{name}", "count_if(_bad) AS bad")  # only sources that parse records

        frames = self.sources[name].frames(self.spark, planned, lanes, count_bad, columns=self._read_by[1].get(name))
        frames = weighted(frames, name, (lambda df: self.observe(df, f"bad-weights:{name}", f"count_if({BAD}) AS bad")))
        df = frames.data
        times = self._direct_times.get(name, [])
        if known is not None:  # e.g. a Parquet slice's footers have its rows and newest times
            facts = Known(known)
            out.observations[f"source:{name}"] = facts
            self._shared[name] = (df, facts, {c: f"max_t:{c}" for c in times})
        elif self.observing:
            have = df.columns if times else []
            newest = {c: f"max_t:{c}" for c in times if c in have}
            rows = F.count(F.lit(1)).alias("rows")
            try:
                obs = RunObservation(df, f"source:{name}", rows, *[F.expr(max_event_ms(c)).alias(a) for c, a in newest.items()])
            except Exception:  # a column that is no time: the step's own observation says so
                newest = {}
                obs = RunObservation(df, f"source:{name}", rows)
            df = obs.observed
            out.observations[f"source:{name}"] = obs
            self._shared[name] = (df, obs, newest)
        out.nodes[name] = df
        if frames.dead_letters is not None:
            out.dead_letters[name] = frames.dead_letters

    # ------------------------------------------------------------------ CompileContext
    def run(self, step: StepSpec) -> StepRun:
        run = self._runs.get(step.name)
        assert run is not None, f"no plan for stateful step {step.name}"
        return run

    def key_group(self, keys: tuple[str, ...]) -> str:
        return key_group_sql(keys, self.spec.key_groups)

    def observe(self, df: DataFrame, key: str, *aggregates: str) -> DataFrame:
        if not self.observing:
            return df
        from pyspark.sql import functions as F

        obs = RunObservation(df, key, *[F.expr(a) for a in aggregates])
        self._out.observations[key] = obs
        return obs.observed

    def observe_event_times(self, step: StepSpec, inputs: list[DataFrame]) -> list[DataFrame]:
        if not self.observing:
            return inputs
        observed = []
        for i, (df, col) in enumerate(zip(inputs, step.time_columns(), strict=True)):
            key = f"step:{step.name}:{i}"
            if col is None:
                observed.append(df)
                continue
            shared = self._shared.get(step.inputs[i])
            if shared is not None and shared[0] is df and col in shared[2]:
                # the source's rows, as they are (not shed): its observation has the newest time
                self._out.observations[key] = SharedObservation(shared[1], shared[2][col])
                observed.append(df)
                continue
            if col not in df.columns:
                raise SpecError(f"step '{step.name}': time: unknown column '{col}'; input has {', '.join(df.columns)}")
            observed.append(self.observe(df, key, f"{max_event_ms(col)} AS max_t"))
        return observed

    def union_of(self, step: StepSpec, parts: list[tuple[DataFrame, list[tuple[str, str]]]]) -> DataFrame:
        def project(df: DataFrame, columns: list[tuple[str, str]]) -> DataFrame:
            if columns == [(c, quoted(c)) for c in df.columns]:
                return df  # as it is: a projection more is an analysis round more
            return df.selectExpr(*[f"{sql} AS {quoted(name)}" for name, sql in columns])

        one = self._one_read(step, parts, project)
        if one is not None:
            return one
        observed = self.observe_event_times(step, [df for df, _ in parts])
        return functools.reduce(
            lambda a, b: a.unionByName(b), [project(df, columns) for df, (_, columns) in zip(observed, parts, strict=True)]
        )

    def _one_read(
        self, step: StepSpec, parts: list[tuple[DataFrame, list[tuple[str, str]]]], project: Callable[..., DataFrame]
    ) -> DataFrame | None:
        """:meth:`union_of` from one read of the node all of ``step``'s inputs branch off, or None
        (see :mod:`eddyline.plan.branches`). Each row of that node becomes a struct per input
        whose condition it meets, exploded into rows, with the input's event time in a hidden
        column to observe; the result must have the columns and types of the plain union."""
        if self.spec.control.overload is not None or any(DIFF in df.columns for df, _ in parts):
            return None  # shedding thins each input on its own; a revision's weight is not folded
        shared = shared_node(self.spec, step)
        node = self._out.nodes.get(shared[0]) if shared is not None else None
        if shared is None or node is None:
            return None
        times = step.time_columns()
        hidden = [(f"__time{i}", df.schema[t].dataType.simpleString()) for i, ((df, _), t) in enumerate(zip(parts, times, strict=True))
                  if t is not None and t in df.columns]
        if len(hidden) != sum(t is not None for t in times) or any(n.startswith("__time") for _, cs in parts for n, _ in cs):
            return None  # an unknown time column (the plain union says so), or a name the hidden ones take
        items, conditions = [], []
        for i, ((_, columns), chain) in enumerate(zip(parts, shared[1], strict=True)):
            branch = fold(node.columns, chain)
            if branch is None:
                return None
            scope = branch.lookup()
            fields = [(name, substitute(sql, scope)) for name, sql in columns]
            fields += [(h, substitute(quoted(times[i]), scope) if h == f"__time{i}" else f"CAST(NULL AS {t})") for h, t in hidden]
            if any(sql is None or "'" in name or "\\" in name for name, sql in fields):
                return None
            struct = "named_struct(" + ", ".join(f"'{name}', {sql}" for name, sql in fields) + ")"
            items.append(struct if branch.condition is None else f"IF({branch.condition}, {struct}, NULL)")
            conditions.append(branch.condition)
        rows = node if None in conditions else node.where(" OR ".join(f"({c})" for c in conditions))
        try:
            keyed = (rows.selectExpr(f"explode(array({', '.join(items)})) AS _branch")
                     .where("_branch IS NOT NULL").select("_branch.*"))
            plain = functools.reduce(lambda a, b: a.unionByName(b), [project(df, columns) for df, columns in parts])
        except Exception:  # Spark refuses the folded SQL: the inputs are read as they are
            return None
        if [(f.name, f.dataType) for f in keyed.schema][: len(plain.columns)] != [(f.name, f.dataType) for f in plain.schema]:
            return None
        for h, _ in hidden:
            keyed = self.observe(keyed, f"step:{step.name}:{h.removeprefix('__time')}", f"{max_event_ms(h)} AS max_t")
        return keyed.drop(*[h for h, _ in hidden])

    def to_lanes(self, step: StepSpec, keyed: DataFrame, kernel: Kernel, key_columns: tuple[str, ...]) -> DataFrame:
        run = self.run(step)
        task = LaneTask(  # the epoch's part comes when the lanes run (``_lane_run``)
            step=step.name,
            checkpoint=self.checkpoint,
            kernel=kernel,
            routing=tuple(int(x) for x in run.routing.owners()),
            state_budget=run.state_budget,
            key_columns=key_columns,
            faults=self.faults,
        )
        return to_lanes(keyed, task, run.routing, self.heartbeats)

    def late_rows(self, step: StepSpec, df: DataFrame) -> None:
        self._out.late[step.name] = df

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        return self._read_by[1].get(step.name)  # (for the network in force: see build)

    def table(self, step: StepSpec) -> DataFrame:
        return self.tables.frame(self.spark, step.name, self._tables.get(step.name))


def check_revisions(step: StepSpec, inputs: list[DataFrame], shedding: bool) -> None:
    """Refuse, before anything runs, a step that cannot take the revisions one of its inputs
    carries (docs/revisions.md): it would treat a retraction as one more row."""
    revisions_refused(step, [name for name, df in zip(step.inputs, inputs, strict=True) if DIFF in df.columns], shedding)


def revisions_refused(step: StepSpec, revised: list[str], shedding: bool = False) -> None:
    """:func:`check_revisions` given the names of the inputs whose rows carry revisions."""
    if not revised:
        return
    reason = step_kind(step).revisions(step.params)
    if reason is None and shedding and step.stateful:
        reason = "overload shedding could drop a row but keep its retraction (or the reverse)"
    if reason is not None:
        raise SpecError(
            f"step '{step.name}': {step.kind} cannot take the revisions of input '{revised[0]}' "
            f"(its rows carry {DIFF}): {reason}"
        )


def analyze(spec: NetworkSpec, spark: SparkSession, lanes: int | None = None) -> EpochFrames:
    """The network over empty slices of every source: Spark analyses every step (column and
    type errors surface here, as :class:`SpecError` naming the step) without reading data or
    touching a checkpoint."""
    lanes = lanes or spark.sparkContext.defaultParallelism
    sources = {s.name: make_source(s) for s in spec.sources}
    runs = {
        s.name: StepRun(NO_WATERMARK, RoutingTable.uniform(spec.key_groups, lanes), {})
        for s in spec.steps
        if s.stateful
    }
    empty = {n: {"start": 0, "end": 0, "files": []} for n in sources}
    return EpochCompiler(spark, spec, sources, "/nonexistent-checkpoint").build(0, empty, runs, lanes, observe=False)



def physical_plans(spec: NetworkSpec, spark: SparkSession, lanes: int) -> dict[str, str]:
    """Spark's physical plan of one epoch, per sink (``eddyline explain``)."""
    frames = analyze(spec, spark, lanes)
    return {
        sink.name: frames.nodes[sink.input]._jdf.queryExecution().executedPlan().toString() for sink in spec.sinks
    }
