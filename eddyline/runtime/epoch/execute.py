"""Stage 3, execute: build the epoch's DataFrames from its plan and run them as Spark jobs.
Sinks stage their output, stateful lanes write their state versions and manifests, dead letters,
late rows and shed rows are staged beside; nothing becomes visible (see :mod:`.publish`)."""

from __future__ import annotations

import contextlib
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from eddyline.api.network import NetworkSpec
from eddyline.ha.selector import Digest
from eddyline.io.files import write_frame
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.compile import EpochCompiler, EpochFrames, RunObservation, StepRun, fresh
from eddyline.runtime.epoch.publish import Outputs
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, Staged

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyspark.sql import DataFrame, SparkSession

    from eddyline.io.sinks import Sink

#: an epoch after one that read at most this many rows is small: it runs without code generation
#: (see :func:`small_epoch`), its steps may hand rows to their lanes without combining them first
#: (``CompileContext.small``), and a sink whose last output was as small may write from the driver
SMALL_EPOCH_ROWS = 50_000


class Executor:
    def __init__(self, spec: NetworkSpec, compiler: EpochCompiler, outputs: Outputs):
        self.spec, self.compiler, self.outputs = spec, compiler, outputs
        self.stateful = spec.stateful_steps()
        #: per stateful step, the in-memory bytes of a state row as its lanes measured last
        #: (for working in slices under a state budget)
        self.bytes_per_row: dict[str, float] = {}
        # A stateful step read by more than one sink is cached for the epoch, so its lanes run
        # once (a second run would be correct, only wasted).
        readers: dict[str, int] = {}
        for sink in spec.sinks:
            for name in spec.upstream(sink.input):
                readers[name] = readers.get(name, 0) + 1
        self.shared = [s.name for s in self.stateful if readers.get(s.name, 0) > 1]
        #: per sink, the sink object told the schema it receives (once a run; again when a
        #: control setting moved the sink and the engine put a new one in its place)
        self._opened: dict[str, Sink] = {}
        self.checkpoint_id = ""
        #: compute every sink's digest on the way (a hot pair's stream selector compares them)
        self.digests = False
        #: input rows of the last epoch this executor ran (None: none yet), and each sink's rows
        self.last_rows: int | None = None
        self.last_sink_rows: dict[str, int] = {}
        #: per sink: the frame it was last given, whether digests were asked, its observation
        self._sink_observations: dict[str, tuple[DataFrame, bool, RunObservation]] = {}

    #: how Spark runs its epochs (the network's ``execution`` as it was resolved), and why not
    #: resident lanes when ``auto`` chose jobs
    mode = "job"
    why: str | None = None

    #: with nothing to read, look again after this long (or the trigger, if longer): a fraction
    #: of what an epoch costs, so that waiting adds little to a result's latency
    idle_poll_ms = 100

    #: its epochs keep Spark's task slots busy between them (a resident stage): nothing else
    #: may ask for them meanwhile (a job would wait for slots that are never freed)
    holds_workers = False

    def close(self) -> None:
        """The run ends, or another network is put in force: release what epochs keep running."""

    def execute(self, plan: EpochPlan, last: EpochCommit | None, before_jobs: Any = None) -> Staged:
        """``before_jobs``: called once the frames are built, before the first job runs."""
        small = self.last_rows is not None and self.last_rows <= SMALL_EPOCH_ROWS
        with self._settings(small):  # a frame persisted while building is planned then
            staged = self._execute(plan, last, before_jobs, small)
        self.last_rows = sum(int(v.get("rows") or 0) for k, v in staged.observed.items() if k.startswith("source:"))
        self.last_sink_rows = dict(staged.sink_rows)
        return staged

    def _settings(self, small: bool) -> contextlib.AbstractContextManager[None]:
        """Spark's settings for the epoch's jobs (see :func:`small_epoch`)."""
        return small_epoch(self.compiler.spark, small)

    def _execute(self, plan: EpochPlan, last: EpochCommit | None, before_jobs: Any, small: bool) -> Staged:
        t0 = time.monotonic()
        runs = {
            s.name: StepRun(
                plan.watermarks[s.name],
                RoutingTable.from_json(plan.routing[s.name]),
                dict(last.steps[s.name].index) if last and s.name in last.steps else {},
                state_budget=self.spec.control.state_budget,
                bytes_per_row=self.bytes_per_row.get(s.name, 0.0),
                advance_ms=plan.advance.get(s.name),
            )
            for s in self.stateful
        }
        try:
            frames = self.compiler.build(plan.epoch, plan.sources, runs, plan.lanes, small=small, tables=plan.tables,
                                         shed=plan.shed)
            with local_properties(self.compiler.spark, {**frames.properties(), **job_labels(self.spec.name, plan.epoch)}):
                return self._run(plan, frames, before_jobs, small, t0)
        except BaseException:
            self.compiler.forget()  # observations of the failed run may still be waiting
            self._sink_observations.clear()
            raise

    def _run(self, plan: EpochPlan, frames: EpochFrames, before_jobs: Any, small: bool, t0: float) -> Staged:
        from pyspark import StorageLevel

        run_on = fresh if frames.reused else _same  # a kept frame's every job plans it anew
        persisted = []
        for name in self.shared:
            frames.nodes[name] = run_on(frames.nodes[name]).persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(frames.nodes[name])
        t_built = time.monotonic()
        for spec in self.spec.sinks:
            sink = self.outputs.sinks[spec.name]
            if self._opened.get(spec.name) is not sink:
                sink.open(
                    self.spec.name, self.checkpoint_id, frames.nodes[spec.input].schema,
                    tentative=self.spec.max_delay is not None,  # eddyline.ha.dpc may mark epochs
                )
                self._opened[spec.name] = sink
        if before_jobs is not None:
            before_jobs()
        sink_rows, digests = self._stage_sinks(frames, plan.epoch, small, run_on)
        dead = self._stage_dead_letters(frames, plan.epoch, run_on)
        for step, late in frames.late.items():
            write_frame(run_on(late), self.outputs.late[step], plan.epoch)
        shed_rows = self.outputs.shed is not None and bool(frames.shed)
        if shed_rows:
            assert self.outputs.shed is not None
            rows = None
            for df in frames.shed.values():
                rows = df if rows is None else rows.unionByName(df, allowMissingColumns=True)
            assert rows is not None
            write_frame(run_on(rows), self.outputs.shed, plan.epoch)
        for df in persisted:
            df.unpersist()
        if frames.reused:
            # Spark completes an observation when its job's end reaches the listener bus, by
            # the observation's name and frame, which a reused frame keeps: a second job over an
            # observed frame (a dead-letter job, another sink) must be done with before the next
            # epoch arms the same names
            self.compiler.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        return Staged(
            observed={k: o.get for k, o in frames.observations.items()},
            sink_rows=sink_rows,
            dead_letters=dead,
            late_steps=tuple(frames.late),
            shed_rows=shed_rows,
            compile_s=t_built - t0,
            run_s=time.monotonic() - t_built,
            digests=digests,
        )

    def _stage_sinks(
        self, frames: EpochFrames, epoch: int, small: bool, run_on: Callable[[DataFrame], DataFrame]
    ) -> tuple[dict[str, int], dict[str, Digest]]:
        """Stage every sink's output; its row count comes from the sink itself or from an
        observation on the way (no extra job), and so does its digest if asked for."""
        rows: dict[str, int] = {}
        observed: dict[str, RunObservation] = {}
        for spec in self.spec.sinks:
            sink = self.outputs.sinks[spec.name]
            df = frames.nodes[spec.input]
            if self.digests or not sink.counts_itself:
                observed[sink.name] = obs = self._sink_observation(sink.name, df)
                obs.arm()
                df = obs.observed
            df = run_on(df)
            # a small input can still make a large output (a join): its size last epoch decides
            sink.small_epoch = small and self.last_sink_rows.get(sink.name, SMALL_EPOCH_ROWS + 1) <= SMALL_EPOCH_ROWS
            sink.stage(df, epoch)
            if sink.counts_itself:
                rows[sink.name] = sink.staged_rows(epoch)
        digests: dict[str, Digest] = {}
        for name, obs in observed.items():
            got = obs.get
            rows.setdefault(name, int(got.get("rows", 0)))
            if self.digests:
                digests[name] = Digest(int(got.get("rows", 0)), str(got.get("hash") or 0))
        return rows, digests

    def _sink_observation(self, sink: str, df: DataFrame) -> RunObservation:
        """The row count (and digest) of what reaches ``sink``; kept with a frame that serves
        every epoch (see ``EpochCompiler.build``), so that its plan stays the same too."""
        from pyspark.sql import functions as F

        kept = self._sink_observations.get(sink)
        if kept is not None and kept[0] is df and kept[1] == self.digests:
            return kept[2]
        obs = RunObservation(df, f"sink:{sink}", F.count(F.lit(1)).alias("rows"), *([_row_hash_sum(df)] if self.digests else []))
        self._sink_observations[sink] = (df, self.digests, obs)
        return obs

    def _stage_dead_letters(self, frames: EpochFrames, epoch: int, run_on: Callable[[DataFrame], DataFrame]) -> int:
        """Bad records were counted on the data path; the dead-letter job runs only if needed."""
        bad = {n: _bad_records(frames, n) for n in frames.dead_letters}
        dead = sum(bad.values())
        if dead:
            letters: DataFrame | None = None
            for n, df in frames.dead_letters.items():
                if bad[n]:
                    letters = df if letters is None else letters.unionByName(df)
            assert letters is not None
            write_frame(run_on(letters), self.outputs.dead_letters, epoch)
        return dead


def _same(df: DataFrame) -> DataFrame:
    return df


def job_labels(network: str, epoch: int) -> dict[str, str]:
    """Spark's job group and description for an epoch's jobs: Spark's UI, its event log and its
    history server then tell which network and epoch a job ran for (``cancelJobGroup`` stops a
    network's jobs), as they do for a Structured Streaming micro-batch."""
    return {"spark.jobGroup.id": f"eddyline:{network}", "spark.job.description": f"eddyline {network} epoch {epoch}"}


@contextmanager
def local_properties(spark: SparkSession, properties: dict[str, str]) -> Iterator[None]:
    """Spark local properties of this thread, and so of the jobs it starts, for the duration."""
    sc = spark.sparkContext
    before = {k: sc.getLocalProperty(k) for k in properties}
    for k, v in properties.items():
        sc.setLocalProperty(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            sc.setLocalProperty(k, v)  # None removes it


@contextmanager
def small_epoch(spark: SparkSession, small: bool) -> Iterator[None]:
    """Run the epoch's jobs without whole-stage code generation when it is small.

    Spark compiles a Java class for every stage of every job, and caches the classes by their
    code; but an epoch's offsets, watermarks and routing values are literals in that code, so
    every epoch compiles anew, several classes at tens of milliseconds each. For a small epoch
    that is a large part of its time and buys nothing: interpreted evaluation of a few thousand
    rows costs less than compiling the code that would evaluate them faster
    (docs/perf-notes.md, "The epoch floor")."""
    if not small:
        yield
        return
    # whole stages, and expressions outside them (Spark's fallback factory evaluates them
    # interpreted instead of compiling a projection or predicate)
    settings = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
    before = {k: spark.conf.get(k) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


def _bad_records(frames: EpochFrames, source: str) -> int:
    """The source's records that failed to parse or carry no valid revision weight, as counted
    on the data path (1 when nothing counted them: run the dead-letter job to find out)."""
    counted = [frames.observations[k] for k in (f"bad:{source}", f"bad-weights:{source}") if k in frames.observations]
    return sum(int(o.get.get("bad") or 0) for o in counted) if counted else 1


def _row_hash_sum(df: DataFrame) -> Any:
    """The sum of a 64-bit hash of every row (exact, as a decimal): equal for two outputs with the
    same rows in any order. Spark does not hash maps: those are hashed as their JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    cols = [F.to_json(F.col(f"`{f.name}`")) if isinstance(f.dataType, MapType) else F.col(f"`{f.name}`")
            for f in df.schema.fields]
    hashed = F.xxhash64(*cols) if cols else F.lit(0)
    return F.sum(hashed.cast("decimal(38,0)")).alias("hash")
