"""Resident execution: the epochs of a network run without a Spark job each.

With ``execution: resident`` the lanes of the network's stateful steps are the tasks of one
long-lived Spark barrier stage (:mod:`eddyline.runtime.resident`; lane ``i`` of the stage is lane
``i`` of every step), and each epoch is one message from this process to every lane: the plan's
slices, watermarks and advances. Each lane reads its own share of every source's slice, runs the
stateless steps on its rows as their kinds do on Arrow (:meth:`~eddyline.kinds.base.StepKind.lane_run`;
a filter or a select in DuckDB, :mod:`eddyline.operators.sqlsteps`), and for each stateful step in
turn prepares its rows as the kind does in Spark (:meth:`~eddyline.kinds.base.StepKind.lane_input`,
key groups worked out as Spark would), exchanges them with the other lanes by key group and runs
the kernel (:mod:`eddyline.runtime.lanenetwork`); it answers with its manifests, its observations
and the rows of the sinks, which are staged here. Planning, publishing, folding, the commit and
recovery are the per-epoch engine's, unchanged: the same plan gives the same output in either
mode, and a checkpoint may change mode between runs.

Exactly once, as the per-epoch lanes give it:

* a stage holds the state of the commit it started from and of the epochs it ran since; it goes
  on to the next epoch only if the last commit is the last epoch it ran, else (an epoch failed
  after its lanes ran, a replay) a new stage starts from the last commit;
* every state file a lane writes names its stage attempt (claimed in the checkpoint), and the
  driver takes only manifests of the current attempt and epoch, so nothing an ended attempt
  wrote is ever named by a commit;
* a new routing table (a move, a rescale) ends the stage; the next starts with the new one;
* a lane that fails ends the stage: the epoch is run once more on a new stage, from the commit;
  a lane whose input or network is at fault (a source's error, a step's) stops the run with it.

What runs resident (:func:`resident_problem` says why not, and the engine refuses before it
starts): stateful steps whose kinds prepare their lanes' rows on Arrow (``pattern`` included,
split into stages or not), keyed by BIGINT, TIMESTAMP or STRING columns; the stateless steps
around them whose kinds run on a lane's Arrow rows: ``filter`` and ``select`` (in DuckDB),
``union`` (of inputs of the same column types), ``udf`` (the function on the lane's batches; its
error stops the run as a failed task's does), ``combine`` and ``lookup`` of a Parquet table (each
lane reads the version the epoch's plan pins, sent with the epoch's message, once, with the types
Spark's reader gives, :func:`~eddyline.io.tables.read_arrow`, and joins on Arrow as Spark's
broadcast join does; a CSV or JSON table, parsed by Spark's readers, runs in Spark); sources whose slices
can be read outside Spark (``files``, ``generator``, ``nexmark``, ``kafka``, ``nats``, ``nats_core``); sinks that take Arrow (``files``,
``kafka``, ``nats``, ``postgres``, ``memory``, ``console``, ``discard``); overload shedding (the
same rows dropped as in Spark: :func:`~eddyline.runtime.shedding.shed_tables`; a shed point's
utility quantiles are exact where Spark's are approximate) and a state budget (a lane keeps half
of it cached and works in slices, as a per-epoch lane does).
With ``max_delay`` (Delay-Process-Correct, :mod:`eddyline.ha.dpc`) the sinks are opened for
tentative epochs as a job opens them, and an epoch that continues from an earlier commit (the
correction) starts a new stage from it. A hot pair compares digests the lanes compute (Spark's
hash of each sink's rows). The lanes write their parts of a ``files`` sink and of a window's
``late`` target (its rows too late for the plan's watermark, split off as Spark splits them,
:meth:`~eddyline.kinds.base.StepKind.lane_late`); the other sinks' rows come back to the
driver, whose sinks write them.

A hot key group split by ``control.spread`` (SPREADFIRE) is split by the lanes as the per-epoch
job's shuffle splits it (:func:`~eddyline.runtime.resident.spread_rows`: each new row stored in
the fragment the Spark hash of its content names, probed in the others), for rows of the column
types that hash covers. A source's revisions (``_op`` or ``_diff``) are weighed by the lanes as
Spark weighs them (:func:`~eddyline.io.revisions.arrow_weighted`, dead letters and all) and go
to every step whose kind takes them, but a window aggregate (its weighted partials are Spark's).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eddyline.api.network import NetworkSpec
from eddyline.columns import DIFF, KG
from eddyline.errors import EngineError, SourceError, SpecError, task_error_line
from eddyline.ha.selector import Digest
from eddyline.hashing import hashable
from eddyline.io.files.target import prepare_parts, write_table
from eddyline.io.revisions import arrow_weight_problem, arrow_weighted
from eddyline.kinds.base import spark_schema
from eddyline.operators.sqlsteps import SqlStepError
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.compile import EpochCompiler, revisions_refused
from eddyline.runtime.epoch.execute import Executor
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, Staged
from eddyline.runtime.lanenetwork import (
    SHED,
    UTILITY,
    LaneNetwork,
    merged_observed,
    time_columns_checked,
)
from eddyline.runtime.resident import (
    LaneFailed,
    ResidentStage,
    ResidentStep,
    StageEnded,
    next_attempt,
)
from eddyline.runtime.shedding import shed_problem, shed_tables, utility_quantiles

if TYPE_CHECKING:
    from eddyline.io.sinks import Sink
    from eddyline.io.sources import Source
    from eddyline.operators.base import Kernel
    from eddyline.runtime.epoch.publish import Outputs

#: errors of a lane that are the network's or its input's, not the stage's: raised as they are
_USER_ERRORS: dict[str, type[Exception]] = {"SpecError": SpecError, "SourceError": SourceError,
                                            "SqlStepError": SpecError}


def resident_problem(spec: NetworkSpec, sources: dict[str, Source], sinks: dict[str, Sink]) -> str | None:
    """Why ``spec`` cannot run resident, naming the part that keeps it in Spark (None: it can)."""
    if not spec.stateful_steps():
        return "no stateful step: nothing to keep resident"
    for step in spec.steps:
        problem = step.info.resident_problem(step)
        if problem is not None:
            return problem if problem.startswith("step '") else f"step '{step.name}': {problem}"
    for name, source in sources.items():
        problem = source.arrow_problem()
        if problem is not None:
            return f"source '{name}': {problem}"
    for name, sink in sinks.items():
        if not sink.takes_arrow:
            return f"sink '{name}': a {sink.spec.kind} sink writes from Spark"
    return None


class ResidentExecutor(Executor):
    """:class:`~eddyline.runtime.epoch.execute.Executor` for resident epochs (module docstring)."""

    mode = "resident"
    idle_poll_ms = 20  # (a resident epoch costs about as much)

    def __init__(self, spec: NetworkSpec, compiler: EpochCompiler, outputs: Outputs, ckpt: Checkpoint):
        super().__init__(spec, compiler, outputs)
        problem = resident_problem(spec, compiler.sources, outputs.sinks)
        if problem is not None:
            raise SpecError(f"execution: resident: {problem}")
        self.ckpt = ckpt
        self.network: LaneNetwork | None = None
        self._prepare_network()
        self._schemas: dict[str, pa.Schema] = {}
        self._kernels_for: tuple[Any, dict[str, Kernel]] | None = None
        self._schemas_of: dict[str, pa.Schema] = {}  # every node's rows, by name
        self._check()
        self.stage: ResidentStage | None = None
        self._stage_key: tuple[Any, ...] | None = None
        #: stages started by this executor (the first, and one per move, rescale or failure)
        self.stages_started = 0

    def _prepare_network(self) -> None:
        """What the lanes run of the network in force (a control setting may change a filter or a
        select between epochs): its stateless steps as their kinds prepare them for the lanes."""
        if self.network is not None and self.network.spec is self.spec:
            return
        try:
            prepared = {s.name: s.info.lane_step(s) for s in self.spec.steps if not s.stateful}
        except SpecError as e:
            raise SpecError(f"execution: resident: {e}") from None
        self.network = LaneNetwork(self.spec, dict(self.compiler.sources), self.spec.columns_read(), prepared)

    def _source_schemas(self) -> dict[str, pa.Schema] | None:
        """Every source's columns, from an empty read (a Parquet directory's first file), kept once
        known; None while a source cannot tell yet (an empty directory)."""
        assert self.network is not None
        empty = {"start": 0, "end": 0, "files": []}
        for src in self.spec.sources:
            if src.name not in self._schemas:
                try:
                    read = self.compiler.sources[src.name].read_arrow(empty, self.network.read_by.get(src.name))
                except SourceError:
                    return None
                self._schemas[src.name] = read.data.schema
        return {src.name: self._schemas[src.name] for src in self.spec.sources}

    def _check(self) -> None:
        """The network run over empty slices: a column or a function the resident path cannot
        take is refused now, before the checkpoint or any output is touched."""
        schemas = self._source_schemas()
        if schemas is None:
            return  # (a directory with nothing to tell the schema yet: its first epoch will)
        try:
            self._kernels(schemas)
        except (SqlStepError, SpecError) as e:
            raise SpecError(f"execution: resident: {e}") from None
        except SourceError:
            return  # (a lookup's table that cannot be read yet: its first epoch's plan says so)
        for spec in self.spec.sinks:
            problem = self.outputs.sinks[spec.name].arrow_problem(self._schemas_of[spec.input])
            if problem is not None:
                raise SpecError(f"execution: resident: sink '{spec.name}': {problem}")

    def check_digests(self) -> None:
        """A hot pair compares each sink's digest (its rows, the sum of Spark's ``xxhash64`` of
        every row), which the lanes compute as Spark does for the scalar types only: a sink of
        other columns (lists, structs, maps) is refused, so the pair runs per-epoch jobs."""
        for spec in self.spec.sinks:
            schema = self._schemas_of.get(spec.input)
            for f in schema or ():
                if not hashable(f.type):
                    raise SpecError(f"execution: resident: a hot pair compares its sinks' digests; sink "
                                    f"'{spec.name}': column '{f.name}' is {f.type}, which resident lanes do not "
                                    "hash as Spark does")

    # ----------------------------------------------------------------- an epoch
    def _settings(self, small: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # no Spark job to set anything for

    def _execute(self, plan: EpochPlan, last: EpochCommit | None, before_jobs: Any, small: bool) -> Staged:
        t0 = time.monotonic()
        self._prepare_network()
        schemas = self._source_schemas()
        if schemas is None:
            raise SourceError("execution: resident: a source's directory has no file to tell its columns yet")
        tables = {step: self.compiler.tables.location(version) for step, version in plan.tables.items()}
        kernels = self._kernels(schemas, tables)
        if self.digests:
            self.check_digests()
        if before_jobs is not None:
            before_jobs()
        stateful = [step.name for step in self.spec.steps if step.stateful]
        for attempt in (1, 2):  # a stage that ended runs the epoch once more on a new one, from the commit
            stage = self._stage_for(plan, kernels, last)
            parts = self._lane_parts(plan.epoch)
            late = {step: prepare_parts(target, plan.epoch) for step, target in self.outputs.late.items()}
            try:
                answers = stage.run_network(plan.epoch, {
                    "slices": dict(plan.sources), "watermarks": {n: plan.watermarks[n] for n in stateful},
                    "advance": {n: plan.advance[n] for n in stateful if n in plan.advance}, "parts": parts,
                    "late": late, "shed": dict(plan.shed or {}), "digests": self.digests, "tables": tables})
                break
            except LaneFailed as e:
                self.close()
                if e.kind in _USER_ERRORS:  # the same again on a new stage: say it now
                    raise _USER_ERRORS[e.kind](str(e)) from None
                if e.kind == "LaneStepError":  # (a step's own code: as a per-epoch job's failed task says it)
                    raise EngineError(f"epoch {plan.epoch}: {task_error_line(e)}") from None
                if attempt == 2:
                    raise EngineError(f"epoch {plan.epoch}: the resident lanes failed twice: {e}") from e
            except StageEnded as e:
                self.close()
                if attempt == 2:
                    raise EngineError(f"epoch {plan.epoch}: the resident lanes failed twice: {e}") from e
        # (not written to the checkpoint as per-epoch lanes leave theirs: the fold takes them
        # from here, the commit keeps what it needs of them, and nothing else reads them)
        manifests = {name: [a["manifests"][name] for a in answers] for name in stateful}
        sink_rows = {}
        for sink in self.spec.sinks:
            if sink.name in parts:
                self.outputs.sinks[sink.name].parts_staged(
                    plan.epoch, [a["written"][sink.name][0] for a in answers if a["written"][sink.name][0]])
                sink_rows[sink.name] = sum(int(a["written"][sink.name][1]) for a in answers)
            else:
                rows = pa.concat_tables([a["tables"][sink.name] for a in answers])
                self.outputs.sinks[sink.name].stage_table(rows, plan.epoch)
                sink_rows[sink.name] = rows.num_rows
        for step, target in self.outputs.late.items():  # staged every epoch, as a job stages them
            target.staged(plan.epoch, [a["late"][step][0] for a in answers if a["late"][step][0]])
        digests = {sink.name: Digest(sum(int(a["digests"][sink.name][0]) for a in answers),
                                     str(sum(int(a["digests"][sink.name][1]) for a in answers)))
                   for sink in self.spec.sinks} if self.digests else {}
        dead = [a["tables"]["_dead"] for a in answers if "_dead" in a["tables"]]
        if dead:
            write_table(pa.concat_tables(dead), self.outputs.dead_letters, plan.epoch)
        observed = merged_observed([a["observed"] for a in answers])
        shed_rows = self._shed(plan.epoch, answers, observed)
        return Staged(observed=observed, sink_rows=sink_rows, dead_letters=sum(t.num_rows for t in dead),
                      late_steps=tuple(self.outputs.late), shed_rows=shed_rows, compile_s=0.0, run_s=time.monotonic() - t0,
                      manifests=manifests, digests=digests)

    def _shed(self, epoch: int, answers: list[dict[str, Any]], observed: dict[str, dict[str, Any]]) -> bool:
        """The rows the lanes shed staged in the shed sink (True: some were), and each shed
        point's utility quantiles among all lanes' values observed as Spark's are."""
        points = {k.removeprefix(UTILITY) for a in answers for k in a["tables"] if k.startswith(UTILITY)}
        for point in points:
            q = utility_quantiles([a["tables"][UTILITY + point] for a in answers if UTILITY + point in a["tables"]])
            observed.setdefault(f"shed:{point}", {})["q"] = q
        shed = [a["tables"][SHED] for a in answers if SHED in a["tables"]]
        if not shed or self.outputs.shed is None:
            return False
        write_table(pa.concat_tables(shed, promote_options="default"), self.outputs.shed, epoch)
        return True

    def _kernels(self, schemas: dict[str, pa.Schema], pinned: dict[str, str] | None = None) -> dict[str, Kernel]:
        """Every stateful step's kernel for sources of these schemas (the network's empty rows run
        through its steps, a lookup's against the table version ``pinned`` names, by step, or
        before the first plan the live files; kept while the network, the schemas and the
        tables' schemas stay)."""
        assert self.network is not None
        feed = self.network.pinning(pinned or {})
        kept = self._kernels_for
        looked_up = tuple(feed.table(s).schema for s in self.spec.steps if s.info.pinned_table(s.params) is not None)
        key = (self.spec, (tuple(schemas.values()), looked_up))
        if kept is None or kept[0][0] is not self.spec or kept[0][1] != key[1]:
            tables = {}
            for name, schema in schemas.items():  # (a source's revisions: weighed as the lanes weigh them)
                problem = arrow_weight_problem(schema, name)
                if problem is not None:
                    raise SpecError(problem)
                tables[name] = arrow_weighted(schema.empty_table(), name)[0]
            kernels: dict[str, Kernel] = {}
            for step in self.spec.topological():
                inputs = [tables[i] for i in step.inputs]
                revisions_refused(step, [n for n, t in zip(step.inputs, inputs, strict=True) if DIFF in t.column_names])
                if step.stateful:
                    overload = self.spec.control.overload
                    if overload is not None:  # (the kernel takes its rows as shed, a window's weights too)
                        for t in inputs:
                            problem = shed_problem(overload, step, t.schema)
                            if problem is not None:
                                raise SpecError(problem)
                        inputs = shed_tables(step, inputs, None, overload, 0).inputs
                    time_columns_checked(step, [t.schema for t in inputs])
                    _, kernels[step.name] = step.info.lane_input(feed, step, inputs)
                    self._splits_checked(step, kernels[step.name])
                    tables[step.name], _ = step.info.lane_output(feed, step,
                                                                 kernels[step.name].output_schema.empty_table())
                else:
                    tables[step.name] = step.info.lane_run(feed, step, inputs)
            self._kernels_for = (key, kernels)
            self._schemas_of = {name: table.schema for name, table in tables.items()}
        return self._kernels_for[1]

    def _splits_checked(self, step: Any, kernel: Kernel, split: bool = False) -> None:
        """A step SPREADFIRE may split (``split``: has split) has rows whose every column the lanes
        hash as Spark does (a split row's fragment is chosen by the hash of its content):
        SpecError naming the column."""
        if not split and (self.spec.control.spread is None or not step.info.spreadable(step.params)):
            return
        for f in kernel.input_schema:
            if f.name != KG and not hashable(f.type):
                raise SpecError(f"step '{step.name}': control.spread: resident lanes split rows of scalar columns "
                                f"(they hash a row as Spark does); '{f.name}' is {f.type}")

    def _stage_for(self, plan: EpochPlan, kernels: dict[str, Kernel], last: EpochCommit | None) -> ResidentStage:
        """The stage to run the epoch on: the running one if it holds the last commit's state for
        these routing tables and kernels, else a new one started from the last commit. An epoch
        that continues from an earlier commit than the one before it (a correction of tentative
        epochs, :mod:`eddyline.ha.dpc`, or a replay: ``last`` is its base) starts a new stage,
        loaded with that commit's state, whose first epoch is this one."""
        steps = []
        for name, kernel in kernels.items():
            routing = RoutingTable.from_json(plan.routing[name])
            split = tuple((g, 1 + len(extra)) for g, extra in sorted(routing.spread.items()))
            if split:  # (split by an earlier run's settings, maybe)
                self._splits_checked(self.spec.step(name), kernel, split=True)
            steps.append((ResidentStep(name, kernel, tuple(routing.owners().tolist()), split, routing.key_groups),
                          routing.lanes))
        lanes = max(n for _, n in steps)
        # a changed network (a control setting changed a step's parameters) is a new stage too
        key = (tuple(s for s, _ in steps), lanes, self.spec)
        after = last.epoch if last is not None else 0
        if (self.stage is not None and self._stage_key == key and self.stage.epoch == after
                and plan.epoch == after + 1):
            return self.stage
        self.close()
        spark = self.compiler.spark
        slots = spark.sparkContext.defaultParallelism
        if lanes > slots:
            raise EngineError(f"{lanes} resident lanes need as many task slots; Spark has {slots}")
        gate = self.ckpt.gate.ready()
        index = {name: dict(last.steps[name].index) for name in kernels if last is not None and name in last.steps}
        self.stage = ResidentStage(
            spark, steps=[s for s, _ in steps], checkpoint=self.ckpt.location, lanes=lanes, output=None,
            attempt=next_attempt(self.ckpt.location, gate), after=plan.epoch - 1, index=index, generation=gate.generation,
            faults=self.compiler.faults, network=self.network, state_budget=self.spec.control.state_budget,
        )
        self._stage_key = key
        self.stages_started += 1
        return self.stage

    def _lane_parts(self, epoch: int) -> dict[str, Any]:
        """Every sink opened; of those the lanes write themselves, where (by sink)."""
        parts = {}
        for spec in self.spec.sinks:
            sink = self.outputs.sinks[spec.name]
            if self._opened.get(spec.name) is not sink:
                sink.open(self.spec.name, self.checkpoint_id, spark_schema(self._schemas_of[spec.input]),
                          tentative=self.spec.max_delay is not None)  # eddyline.ha.dpc may mark epochs
                self._opened[spec.name] = sink
            where = sink.lane_parts(epoch)
            if where is not None:
                parts[spec.name] = where
        return parts

    @property
    def holds_workers(self) -> bool:  # type: ignore[override]
        return self.stage is not None

    def close(self) -> None:
        """End the stage (its lanes stop; the next epoch starts a new one from the last commit)."""
        if self.stage is not None:
            stage, self.stage, self._stage_key = self.stage, None, None
            stage.close()
