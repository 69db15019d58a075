"""Turn the network and one epoch plan into Spark DataFrames.

Sources give their slice's frame; every step then asks its kind (:mod:`eddyline.kinds`) to
compile it, through the :class:`~eddyline.kinds.base.CompileContext` an :class:`EpochCompiler`
provides: the plan's watermark and routing, key-group SQL, observations, the lane shuffle
(:mod:`eddyline.runtime.shuffle`). Before a stateful step the plan's shedding is applied
(:mod:`eddyline.runtime.shedding`).

The watermark, the routing table and the state index come from the logged plan, never from the
clock, so the DataFrames of a replayed epoch equal the original ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eddyline.api.network import NetworkSpec
from eddyline.api.steps import StepSpec
from eddyline.columns import DIFF
from eddyline.errors import SpecError
from eddyline.eventtime import NO_WATERMARK
from eddyline.io.revisions import BAD, weighted
from eddyline.io.sources import Source, make_source
from eddyline.io.tables import LookupTables
from eddyline.kinds import step_kind
from eddyline.kinds.base import first_line
from eddyline.plan.keygroups import RoutingTable, key_group_sql
from eddyline.runtime.faults import Faults, NoFaults
from eddyline.runtime.lanes import LaneTask
from eddyline.runtime.shedding import shed_inputs
from eddyline.runtime.shuffle import Heartbeats, to_lanes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

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


@dataclass(frozen=True)
class Known:
    """What an observation would find, known before the epoch runs (see ``Frames.facts``)."""

    values: dict[str, Any]

    @property
    def get(self) -> dict[str, Any]:
        return self.values


@dataclass(frozen=True)
class SharedObservation:
    """One field of another observation, read under the name its reader expects: a step that
    reads a source as it is shares the source's observation instead of adding its own."""

    of: Observation | Known
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
    observations: dict[str, Observation | Known | SharedObservation] = field(default_factory=dict)
    dead_letters: dict[str, DataFrame] = field(default_factory=dict)
    late: dict[str, DataFrame] = field(default_factory=dict)


class EpochCompiler:
    """Builds one epoch's DataFrames; implements the kinds' :class:`CompileContext`.

    Between epochs it keeps only the SparkSession, the lookup tables and the lanes' heartbeat
    frames (built once per lane count)."""

    def __init__(
        self,
        spark: SparkSession,
        spec: NetworkSpec,
        sources: dict[str, Source],
        checkpoint: str,
        faults: Faults | None = None,
    ):
        self.spark = spark
        self.spec = spec
        self.sources = sources
        self.checkpoint = checkpoint
        self.faults = faults or NoFaults()
        self.tables = LookupTables(spec, checkpoint)
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
        # per epoch
        self.epoch = 0
        self.observing = True
        self._runs: dict[str, StepRun] = {}
        self._tables: dict[str, dict[str, Any]] = {}
        self._out = EpochFrames()
        #: per source, this epoch: its frame, its observation and, per time column observed
        #: there, the observation's field holding its newest value
        self._shared: dict[str, tuple[DataFrame, Observation | Known, dict[str, str]]] = {}

    def build(
        self,
        epoch: int,
        source_slices: dict[str, dict[str, Any]],
        steps: dict[str, StepRun],
        lanes: int,
        *,
        observe: bool = True,
        tables: dict[str, dict[str, Any]] | None = None,
        shed: dict[str, dict[str, Any]] | None = None,
    ) -> EpochFrames:
        self.epoch, self.observing, self._runs, self._tables = epoch, observe, steps, tables or {}
        self._out, self._shared = EpochFrames(), {}
        if self._read_by[0] is not self.spec:  # what the steps in force read of each source
            self._read_by = (self.spec, self.spec.columns_read())
        for src in self.spec.sources:
            self._source(src.name, source_slices[src.name], lanes)
        overload = self.spec.control.overload
        out = self._out
        for step in self.spec.topological():
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
        return out

    def _source(self, name: str, planned: dict[str, Any], lanes: int) -> None:
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
        known = frames.facts(times) if self.observing else None
        if known is not None:
            # a Parquet slice's footers have its rows and newest times: nothing to observe
            facts = Known(known)
            out.observations[f"source:{name}"] = facts
            self._shared[name] = (df, facts, {c: f"max_t:{c}" for c in times})
        elif self.observing:
            obs = self._observation(f"source:{name}")
            have = df.columns if times else []
            newest = {c: f"max_t:{c}" for c in times if c in have}
            rows = F.count(F.lit(1)).alias("rows")
            try:
                df = df.observe(obs, rows, *[F.expr(max_event_ms(c)).alias(a) for c, a in newest.items()])
            except Exception:  # a column that is no time: the step's own observation says so
                newest = {}
                obs = self._observation(f"source:{name}", "rows-only")  # an observation is used once
                df = df.observe(obs, rows)
            out.observations[f"source:{name}"] = obs
            self._shared[name] = (df, obs, newest)
        out.nodes[name] = df
        if frames.dead_letters is not None:
            out.dead_letters[name] = frames.dead_letters

    def _observation(self, key: str, variant: str = "") -> Observation:
        from pyspark.sql import Observation

        return Observation(f"e{self.epoch}-{key}{'-' + variant if variant else ''}")

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

        obs = self._observation(key)
        self._out.observations[key] = obs
        return df.observe(obs, *[F.expr(a) for a in aggregates])

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

    def to_lanes(self, step: StepSpec, keyed: DataFrame, kernel: Kernel, key_columns: tuple[str, ...]) -> DataFrame:
        run = self.run(step)
        task = LaneTask(
            step=step.name,
            epoch=self.epoch,
            checkpoint=self.checkpoint,
            kernel=kernel,
            routing=tuple(int(x) for x in run.routing.owners()),
            index=run.index,
            watermark_ms=run.watermark_ms,
            state_budget=run.state_budget,
            bytes_per_row=run.bytes_per_row,
            key_columns=key_columns,
            faults=self.faults,
        )
        return to_lanes(keyed, task, run.routing, self.heartbeats)

    def late_rows(self, step: StepSpec, df: DataFrame) -> None:
        self._out.late[step.name] = df

    def table(self, step: StepSpec) -> DataFrame:
        return self.tables.frame(self.spark, step.name, self._tables.get(step.name))


def check_revisions(step: StepSpec, inputs: list[DataFrame], shedding: bool) -> None:
    """Refuse, before anything runs, a step that cannot take the revisions one of its inputs
    carries (docs/revisions.md): it would treat a retraction as one more row."""
    revised = [name for name, df in zip(step.inputs, inputs, strict=True) if DIFF in df.columns]
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
