"""Resident execution: the epochs of a network run without a Spark job each.

With ``execution: resident`` the lanes of the network's stateful steps are the tasks of one
long-lived Spark barrier stage (:mod:`eddyline.runtime.resident`; lane ``i`` of the stage is lane
``i`` of every step), and each epoch is, in this process: read the plan's slice of every source
(the readers the per-epoch job's tasks run, :meth:`~eddyline.io.sources.Source.read_arrow`), run
the stateless steps in DuckDB (:mod:`eddyline.operators.sqlsteps`), and for each stateful step in
turn prepare its rows as its kind does in Spark (:meth:`~eddyline.kinds.base.StepKind.lane_input`,
key groups worked out as Spark would), send every lane its rows (an idle lane an empty epoch: its
tick) and take back each lane's manifest and output; the manifests go where the per-epoch lanes
write theirs, and every sink is staged. Planning, publishing, folding, the commit and recovery
are the per-epoch engine's, unchanged: the same plan gives the same output in either mode, and a
checkpoint may change mode between runs.

Exactly once, as the per-epoch lanes give it:

* a stage holds the state of the commit it started from and of the epochs it ran since; it goes
  on to the next epoch only if the last commit is the last epoch it ran, else (an epoch failed
  after its lanes ran, a replay) a new stage starts from the last commit;
* every state file a lane writes names its stage attempt (claimed in the checkpoint), and the
  driver takes only manifests of the current attempt and epoch, so nothing an ended attempt
  wrote is ever named by a commit;
* a new routing table (a move, a rescale) ends the stage; the next starts with the new one;
* a lane that fails ends the stage: the epoch is run once more on a new stage, from the commit.

What runs resident (:func:`resident_problem` says why not, and the engine refuses before it
starts): stateful steps whose kinds prepare their lanes' rows on Arrow, keyed by BIGINT,
TIMESTAMP or STRING columns; ``filter`` and ``select`` steps around them; sources whose slices
can be read outside Spark (``files``, ``generator``); sinks that take Arrow (``files``,
``memory``, ``console``, ``discard``); no overload control, state budget, hot-key splits, hot
pair or ``max_delay``. The driver reads every row and collects the lanes' output: on a cluster
each source slice would be read by the lane tasks themselves (docs/perf-notes.md, "Resident
lanes").
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.api.network import NetworkSpec
from eddyline.columns import DIFF
from eddyline.errors import EngineError, SourceError, SpecError
from eddyline.io.files.target import write_table
from eddyline.kinds.base import spark_schema
from eddyline.operators.rows import event_time_ms
from eddyline.operators.sqlsteps import SqlStep, SqlStepError
from eddyline.plan.keygroups import RoutingTable, key_groups_of
from eddyline.runtime.checkpoint import Checkpoint, manifest_path
from eddyline.runtime.compile import EpochCompiler, revisions_refused
from eddyline.runtime.epoch.execute import Executor
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, Staged
from eddyline.runtime.resident import ResidentStage, ResidentStep, StageEnded, next_attempt
from eddyline.storage import makedirs

if TYPE_CHECKING:
    from eddyline.api.steps import StepSpec
    from eddyline.io.sinks import Sink
    from eddyline.io.sources import Source
    from eddyline.operators.base import Kernel
    from eddyline.runtime.epoch.publish import Outputs

#: the stateless step kinds a resident epoch runs (in DuckDB)
SQL_KINDS = ("filter", "select")


def resident_problem(spec: NetworkSpec, sources: dict[str, Source], sinks: dict[str, Sink]) -> str | None:
    """Why ``spec`` cannot run resident, naming the part that keeps it in Spark (None: it can)."""
    if spec.max_delay is not None:
        return "max_delay: Delay-Process-Correct runs in per-epoch jobs"
    if spec.control.overload is not None:
        return "control.overload: shedding runs in Spark"
    if spec.control.state_budget is not None:
        return "control.state_budget: a resident lane holds all of its state in memory"
    if not spec.stateful_steps():
        return "no stateful step: nothing to keep resident"
    for step in spec.steps:
        if step.stateful:
            problem = step.info.resident_problem(step)
            if problem is not None:
                return problem if problem.startswith("step '") else f"step '{step.name}': {problem}"
        elif step.kind not in SQL_KINDS:
            return f"step '{step.name}': a {step.kind} step runs in Spark (resident: {', '.join(SQL_KINDS)})"
    for name, source in sources.items():
        problem = source.arrow_problem()
        if problem is not None:
            return f"source '{name}': {problem}"
        if getattr(source.spec.params, "revisions", None):
            return f"source '{name}': revisions are carried by per-epoch jobs only"
    for name, sink in sinks.items():
        if not sink.takes_arrow:
            return f"sink '{name}': a {sink.spec.kind} sink writes from Spark"
    return None


def newest_ms(column: pa.ChunkedArray) -> int | None:
    """The newest value of a timestamp column in epoch milliseconds, rounded down as
    :func:`eddyline.runtime.compile.max_event_ms` gives it (None: no value)."""
    newest = pc.max(column)
    return int(event_time_ms(pa.array([newest], column.type))[0]) if newest.is_valid else None


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
        self.sql: dict[str, SqlStep] = {}
        self._sql_for: NetworkSpec | None = None
        self._compile_sql()
        self._kernels_for: tuple[Any, dict[str, Kernel]] | None = None
        self._check()
        self.stage: ResidentStage | None = None
        self._stage_key: tuple[Any, ...] | None = None
        #: stages started by this executor (the first, and one per move, rescale or failure)
        self.stages_started = 0

    def _compile_sql(self) -> None:
        """The stateless steps as DuckDB SQL, for the network in force (a control setting may
        change a filter or a select between epochs)."""
        if self._sql_for is self.spec:
            return
        try:
            self.sql = {s.name: SqlStep(s.name, condition=s.params) if s.kind == "filter"
                        else SqlStep(s.name, expressions=tuple(s.params))
                        for s in self.spec.steps if s.kind in SQL_KINDS}
        except SqlStepError as e:
            raise SpecError(f"execution: resident: {e}") from None
        self.read_by, self._sql_for = self.spec.columns_read(), self.spec

    def _check(self) -> None:
        """The network run over empty slices: a column or a function the resident path cannot
        take is refused now, before the checkpoint or any output is touched."""
        empty = {"start": 0, "end": 0, "files": []}
        tables = {}
        for src in self.spec.sources:
            try:
                tables[src.name] = self.compiler.sources[src.name].read_arrow(empty, self.read_by.get(src.name)).data
            except SourceError:
                return  # (a directory with nothing to tell the schema yet: its first epoch will)
        try:
            self._kernels(tables)
        except (SqlStepError, SpecError) as e:
            raise SpecError(f"execution: resident: {e}") from None

    # the kinds' side of a resident epoch (eddyline.kinds.base.LaneFeed)
    def key_groups(self, step: StepSpec, table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
        try:
            return key_groups_of(table, keys, self.spec.key_groups)
        except TypeError as e:
            raise SpecError(f"step '{step.name}': resident lanes key BIGINT, TIMESTAMP and STRING columns: {e}") from None

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        return self.read_by.get(step.name)

    # ----------------------------------------------------------------- an epoch
    def _settings(self, small: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # no Spark job to set anything for

    def _execute(self, plan: EpochPlan, last: EpochCommit | None, before_jobs: Any, small: bool) -> Staged:
        t0 = time.monotonic()
        self._compile_sql()
        read: dict[str, pa.Table] = {}
        observed: dict[str, dict[str, Any]] = {}
        dead: list[pa.Table] = []
        for src in self.spec.sources:
            got = self.compiler.sources[src.name].read_arrow(plan.sources[src.name], self.read_by.get(src.name))
            if DIFF in got.data.column_names:
                raise SpecError(f"execution: resident: source '{src.name}' carries revisions ({DIFF})")
            read[src.name] = got.data
            observed[f"source:{src.name}"] = {"rows": got.data.num_rows}
            if got.dead_letters is not None and got.dead_letters.num_rows:
                dead.append(got.dead_letters)
        if before_jobs is not None:
            before_jobs()
        kernels = self._kernels(read)
        manifests: dict[str, list[dict[str, Any]]] = {}
        for attempt in (1, 2):  # a stage that ended runs the epoch once more on a new one, from the commit
            stage = self._stage_for(plan, kernels, last)
            try:
                tables = self._run_steps(stage, plan, dict(read), observed, manifests)
                break
            except StageEnded as e:
                self.close()
                if attempt == 2:
                    raise EngineError(f"epoch {plan.epoch}: the resident lanes failed twice: {e}") from e
        sink_rows = self._stage_sinks_arrow(tables, plan.epoch)
        if dead:
            write_table(pa.concat_tables(dead), self.outputs.dead_letters, plan.epoch)
        return Staged(observed=observed, sink_rows=sink_rows, dead_letters=sum(t.num_rows for t in dead),
                      late_steps=(), shed_rows=False, compile_s=0.0, run_s=time.monotonic() - t0,
                      manifests=manifests)

    def _kernels(self, read: dict[str, pa.Table]) -> dict[str, Kernel]:
        """Every stateful step's kernel for sources of these schemas (the network's empty rows run
        through its steps; kept while the network and the schemas stay)."""
        schemas = tuple(t.schema for t in read.values())
        kept = self._kernels_for
        if kept is None or kept[0][0] is not self.spec or kept[0][1] != schemas:
            tables = {name: t.schema.empty_table() for name, t in read.items()}
            kernels: dict[str, Kernel] = {}
            for step in self.spec.topological():
                inputs = [tables[i] for i in step.inputs]
                revisions_refused(step, [n for n, t in zip(step.inputs, inputs, strict=True) if DIFF in t.column_names])
                if step.stateful:
                    _, kernels[step.name] = step.info.lane_input(self, step, inputs)
                    tables[step.name] = kernels[step.name].output_schema.empty_table()
                else:
                    tables[step.name] = self._sql(step, inputs[0])
            self._kernels_for = ((self.spec, schemas), kernels)
        return self._kernels_for[1]

    def _run_steps(self, stage: ResidentStage, plan: EpochPlan, tables: dict[str, pa.Table],
                   observed: dict[str, dict[str, Any]], manifests: dict[str, list[dict[str, Any]]]) -> dict[str, pa.Table]:
        """Every step of the epoch, in order: the stateless ones here, the stateful ones on the
        stage's lanes (their manifests into ``manifests``); every node's rows."""
        for step in self.spec.topological():
            inputs = [tables[i] for i in step.inputs]
            if step.stateful:
                tables[step.name], manifests[step.name] = self._lanes(stage, step, inputs, plan, observed)
            else:
                tables[step.name] = self._sql(step, inputs[0])
        return tables

    def _sql(self, step: StepSpec, rows: pa.Table) -> pa.Table:
        """A filter or a select over ``rows``; a select keeps a revision's weight, as in Spark
        (:class:`eddyline.kinds.select.Select`)."""
        out = self.sql[step.name].run(rows)
        if DIFF in rows.column_names and DIFF not in out.column_names:
            out = out.append_column(DIFF, rows.column(DIFF))
        return out

    def _lanes(self, stage: ResidentStage, step: StepSpec, inputs: list[pa.Table], plan: EpochPlan,
               observed: dict[str, dict[str, Any]]) -> tuple[pa.Table, list[dict[str, Any]]]:
        """One stateful step's epoch on the resident lanes: its output rows and the lanes'
        manifests (also left where per-epoch lanes leave theirs, for whoever inspects the
        checkpoint)."""
        for i, (rows, column) in enumerate(zip(inputs, step.time_columns(), strict=True)):
            if column is None:
                continue
            if column not in rows.column_names:
                raise SpecError(f"step '{step.name}': time: unknown column '{column}'; "
                                f"input has {', '.join(rows.column_names)}")
            if not pa.types.is_timestamp(rows.schema.field(column).type):
                raise SpecError(f"step '{step.name}': time: expected a timestamp column, '{column}' is "
                                f"{rows.schema.field(column).type}")
            observed[f"step:{step.name}:{i}"] = {"max_t": newest_ms(rows.column(column))}
        keyed, kernel = step.info.lane_input(self, step, inputs)
        done = stage.run(plan.epoch, keyed, plan.watermarks[step.name], plan.advance.get(step.name), step=step.name)
        gate = self.ckpt.gate.ready()
        outputs = []
        for d in done:
            table = d.pop("table", None)
            if table is not None and table.num_rows:
                outputs.append(table)
            path = manifest_path(self.ckpt.location, plan.epoch, step.name, int(d["lane"]), gate.generation)
            makedirs(self.ckpt.fs, path.rsplit("/", 1)[0])
            gate.put(path, json.dumps(d).encode())
        return (pa.concat_tables(outputs) if outputs else kernel.output_schema.empty_table()), done

    def _stage_for(self, plan: EpochPlan, kernels: dict[str, Kernel], last: EpochCommit | None) -> ResidentStage:
        """The stage to run the epoch on: the running one if it holds the last commit's state for
        these routing tables and kernels, else a new one started from the last commit."""
        steps = []
        for name, kernel in kernels.items():
            routing = RoutingTable.from_json(plan.routing[name])
            if routing.spread:
                raise EngineError(f"step '{name}': hot-key splits (SPREADFIRE) run in per-epoch jobs; "
                                  "resident lanes take whole key groups")
            steps.append((ResidentStep(name, kernel, tuple(int(x) for x in routing.owners())), routing.lanes))
        lanes = max(n for _, n in steps)
        # a new kernel (a control setting changed a step's parameters) is a new stage too
        key = (tuple(s for s, _ in steps), lanes, tuple(self.spec.step(n) for n in kernels))
        after = last.epoch if last is not None else 0
        if self.stage is not None and self._stage_key == key and self.stage.epoch == after:
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
            attempt=next_attempt(self.ckpt.location, gate), after=after, index=index, generation=gate.generation,
            faults=self.compiler.faults,
        )
        self._stage_key = key
        self.stages_started += 1
        return self.stage

    def _stage_sinks_arrow(self, tables: dict[str, pa.Table], epoch: int) -> dict[str, int]:
        rows: dict[str, int] = {}
        for spec in self.spec.sinks:
            sink, table = self.outputs.sinks[spec.name], tables[spec.input]
            if self._opened.get(spec.name) is not sink:
                sink.open(self.spec.name, self.checkpoint_id, spark_schema(table.schema), tentative=False)
                self._opened[spec.name] = sink
            sink.stage_table(table, epoch)
            rows[spec.name] = table.num_rows
        return rows

    @property
    def holds_workers(self) -> bool:  # type: ignore[override]
        return self.stage is not None

    def close(self) -> None:
        """End the stage (its lanes stop; the next epoch starts a new one from the last commit)."""
        if self.stage is not None:
            stage, self.stage, self._stage_key = self.stage, None, None
            stage.close()
