"""The epoch loop: plan → log → run on Spark → publish → commit.

One epoch, numbered steps (a crash anywhere before step 6 replays the epoch from its plan):

1. **plan**: per source the next offset slice (admission control caps it), per stateful step
   the watermark (from committed event times) and the routing table;
2. **log** the plan atomically;
3. **run** the network as Spark jobs: sinks stage their output, stateful lanes write their state
   versions and manifests;
4. **publish** sink output (atomic per epoch, replacing an earlier attempt's);
5. **fold** the lane manifests into the new state index;
6. **commit** atomically: source offsets + state index + watermarks + sink counts.

Watermarks: a step fed by sources follows the newest event time its inputs committed, minus its
delay (Spark's rule: from earlier epochs, so it is part of the plan). A step fed by stateful steps
inherits the smallest of their watermarks *of the previous epoch*: everything such an ancestor
emits in this epoch is at or after its current watermark, so it is never late downstream, and a
downstream window or top-k closes exactly when its ancestors can no longer add to it.

An epoch with no new input still runs when a watermark moved and state exists (windows may fire),
like Spark's no-data batches. With ``until_idle`` the run ends, once the input is exhausted, with
an end-of-stream epoch whose watermark passes every window (as Flink does for bounded input).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from eddyline.api.spec import NetworkSpec, StepSpec
from eddyline.control import policies
from eddyline.control.manager import DistributionManager
from eddyline.control.overload import EpochCost, OverloadController
from eddyline.control.stats import step_load
from eddyline.errors import CheckpointError, EddylineError, EngineError
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK, iso_ms
from eddyline.io.sinks import FilesTarget, Sink, make_sink, write_frame
from eddyline.io.sources import Source, make_source
from eddyline.observe.progress import ProgressReporter
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.compile import EpochCompiler, StepRun, topological
from eddyline.runtime.log import Checkpoint, EpochCommit, EpochPlan
from eddyline.runtime.lookahead import LookAhead
from eddyline.runtime.udf import task_error_line
from eddyline.state.store import KeyGroupStore, with_chains

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Named moments at which tests make the driver die with SIGKILL (``--crash-at EPOCH:POINT``).
CRASH_POINTS = ("after_plan", "in_task", "after_stage", "after_publish", "mid_commit", "after_commit")


@dataclass
class RunSummary:
    epochs: int = 0
    last_epoch: int = 0
    input_rows: int = 0
    output_rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    late_rows: int = 0
    replayed: int = 0
    #: keep-alive jobs run while idle, so Spark kept the lanes' Python workers (see WORKER_KEEPALIVE_S)
    worker_keepalives: int = 0


#: PySpark stops a Python worker that has been idle for a minute (a constant in Spark's
#: PythonWorkerFactory, not a setting). The next epoch then starts new workers, which have lost
#: the lanes' state cache: after a 75 s lull in bench/idle_lull.py the first epoch took 1,474 ms
#: against 393 ms before it, 64 key groups reloaded. An engine with nothing to do for this long
#: runs a tiny job on every core's worker instead.
WORKER_KEEPALIVE_S = 40.0


def touch_python_workers(spark: SparkSession) -> list[int]:
    """Run one keep-alive task per core, each in an idle Python worker of Spark's pool (which
    restarts its idle clock); returns the worker processes' ids."""
    from eddyline.runtime.lanes import keep_warm

    cores = spark.sparkContext.defaultParallelism
    rows = spark.range(0, cores, 1, cores).mapInArrow(keep_warm, "pid long").collect()
    return sorted(r.pid for r in rows)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Engine:
    """Runs one network against one checkpoint location in this process's SparkSession."""

    def __init__(
        self,
        spec: NetworkSpec,
        spark: SparkSession,
        checkpoint: str,
        *,
        lanes: int | None = None,
        reporter: ProgressReporter | None = None,
        sinks: dict[str, Sink] | None = None,
        crash_at: str | None = None,
        retain_epochs: int = 10,
        worker_keepalive_s: float | None = WORKER_KEEPALIVE_S,
    ):
        self.spec = spec
        self.worker_keepalive_s = worker_keepalive_s
        self._python_used_at = time.monotonic()  # when Python workers last ran a task of ours
        self.spark = spark
        self.ckpt = Checkpoint(checkpoint)
        self.lanes = lanes or spec.lanes or spark.sparkContext.defaultParallelism
        self.reporter = reporter
        self.sources: dict[str, Source] = {s.name: make_source(s) for s in spec.sources}
        self.sinks: dict[str, Sink] = sinks if sinks is not None else {
            s.name: make_sink(s, reporter.console if reporter else None) for s in spec.sinks
        }
        self.compiler = EpochCompiler(spark, spec, self.sources, checkpoint)
        self.stateful = [s for s in topological(spec) if s.stateful]  # inputs before their readers
        self.upstream = {s.name: _stateful_upstream(spec, s) for s in self.stateful}
        self.retain_epochs = retain_epochs
        self._cleaner: _Cleaner | None = None
        self.crash_epoch, self.crash_point = _parse_crash(crash_at)
        dl = spec.dead_letters
        from eddyline.api.spec import Files

        self.dead_letters = FilesTarget(dl or Files(path=f"{self.ckpt.location.rstrip('/')}/dead-letters", format="json"))
        self.late_targets = {
            s.name: FilesTarget(s.window_aggregate.late)
            for s in self.stateful
            if s.window_aggregate is not None and s.window_aggregate.late is not None
        }
        self.manager = DistributionManager(spec, max_lanes=spark.sparkContext.defaultParallelism)
        self.lookahead = LookAhead(spec.key_groups)
        self.overload = OverloadController(spec) if spec.control.overload is not None else None
        self.shed_target = (
            FilesTarget(spec.control.overload.shed_sink)
            if spec.control.overload is not None and spec.control.overload.shed_sink is not None
            else None
        )
        self._bytes_per_row: dict[str, float] = {}
        self._last_epoch_start: float | None = None
        self._cold = True  # the first epoch of this process
        self.kept_warm_pids: list[int] = []  # the Python workers the last keep-alive job ran in
        self.has_dead_letter_sources = any(
            s.files is not None and s.files.format != "parquet" for s in spec.sources
        )

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        *,
        epochs: int | None = None,
        duration_s: float | None = None,
        until_idle: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RunSummary:
        meta = self.ckpt.open(self.spec.fingerprint())
        started_at = float(meta["started_at"])
        last = self.ckpt.latest_commit()
        if last is not None and self.overload is not None and "overload" in last.control:
            self.overload.restore(last.control["overload"])
        pending = self.ckpt.pending_plan(last.epoch if last else 0)
        summary = RunSummary()
        thawed = False  # whether this run froze the heap and nothing else had
        try:
            t_start = time.monotonic()
            prev_epoch_start: float | None = None
            while True:
                if epochs is not None and summary.epochs >= epochs:
                    break
                if duration_s is not None and time.monotonic() - t_start >= duration_s:
                    break
                if should_stop is not None and should_stop():
                    break
                epoch_start = time.monotonic()
                replayed = pending is not None
                if pending is not None:
                    plan, pending = pending, None
                    self.manager.adopt(plan.decisions)
                else:
                    plan = self._plan_next(last, time.time() - started_at, until_idle)
                    if plan is None:
                        if until_idle:
                            break
                        summary.worker_keepalives += self._keep_workers_warm()
                        time.sleep(min(max(self.spec.trigger, 100), 1000) / 1000)
                        continue
                    self.ckpt.write_plan(plan)
                self._maybe_crash(plan.epoch, "after_plan")
                try:
                    commit, record = self._run_epoch(plan, last, replayed)
                except EddylineError:
                    raise
                except Exception as e:  # a Spark job failed: surface our own message if a task left one
                    line = task_error_line(e)
                    if line is None:
                        raise
                    raise EngineError(f"epoch {plan.epoch}: {line}") from e
                record["inputRowsPerSecond"] = (
                    record["numInputRows"] / (epoch_start - prev_epoch_start)
                    if prev_epoch_start is not None and epoch_start > prev_epoch_start
                    else 0.0
                )
                prev_epoch_start = epoch_start
                self._python_used_at = time.monotonic()
                last = commit
                summary.epochs += 1
                if summary.epochs == 1:
                    thawed = _freeze_heap()
                summary.last_epoch = plan.epoch
                summary.input_rows += record["numInputRows"]
                summary.dead_letters += record["deadLetters"]
                summary.late_rows += record["lateRows"]
                summary.replayed += int(replayed)
                for s in record["sinks"]:
                    summary.output_rows[s["description"]] = summary.output_rows.get(s["description"], 0) + s["numOutputRows"]
                if self.reporter is not None:
                    self.reporter.report(record)
                wait = self.spec.trigger / 1000 - (time.monotonic() - epoch_start)
                if wait > 0:
                    time.sleep(wait)
        except BaseException:
            self._finish_cleanup(raise_error=False)
            raise
        finally:
            self.lookahead.close()
            if thawed:
                gc.unfreeze()
        self._finish_cleanup()  # the last cleanup is done when run() returns
        return summary

    def _keep_workers_warm(self) -> int:
        """While the engine waits for input, keep Spark's Python workers (and the state they
        cache) alive: once ``worker_keepalive_s`` passed since they last ran a task, run one
        keep-alive task per core. Returns the number of jobs run (0 or 1)."""
        if self.worker_keepalive_s is None or time.monotonic() - self._python_used_at < self.worker_keepalive_s:
            return 0
        self._python_used_at = time.monotonic()
        try:
            self.kept_warm_pids = touch_python_workers(self.spark)
        except Exception:  # only a speed-up: if Spark cannot run it, the next epoch reports why
            return 0
        return 1

    # ------------------------------------------------------------------ planning
    def _plan_next(self, last: EpochCommit | None, elapsed_s: float, until_idle: bool) -> EpochPlan | None:
        """The next epoch's plan, or None when there is nothing to do.

        Once the input ended (``until_idle`` found it exhausted), sources read nothing more and
        the steps they feed get the end-of-stream watermark; it then reaches the steps further
        down one epoch at a time, so every step first receives what its ancestors flush."""
        epoch = last.epoch + 1 if last else 1
        ended = last is not None and last.end_of_stream
        if ended:
            assert last is not None
            slices = {
                name: {"start": last.source_ends.get(name, 0), "end": last.source_ends.get(name, 0), "files": [],
                       **({"cursor": last.cursors[name]} if name in last.cursors else {})}
                for name in self.sources
            }
        else:
            slices = {
                name: src.plan(
                    last.source_ends.get(name, 0) if last else 0,
                    elapsed_s,
                    last.cursors.get(name) if last else None,
                )
                for name, src in self.sources.items()
            }
        shed: dict[str, dict[str, Any]] = {}
        overload_decision: dict[str, Any] | None = None
        if self.overload is not None and not ended:
            available = {n: s["end"] - s["start"] for n, s in slices.items()}
            verdict = self.overload.plan(epoch, available)
            shed = verdict["shed"]
            if verdict["caps"]:
                for name, cap in verdict["caps"].items():
                    if self.sources[name].spec.files is None:
                        slices[name] = self.sources[name].plan(
                            last.source_ends.get(name, 0) if last else 0, elapsed_s,
                            last.cursors.get(name) if last else None, cap=cap,
                        )
            overload_decision = {
                "epoch": epoch, "step": "*", "kind": "overload",
                "action": {"caps": verdict["caps"], "shed": {k: v["keep"] for k, v in shed.items()}},
                "why": {**verdict["explain"], "hotSpots": self.overload.hot_spots()},
                "expected": {"epochMs": verdict["explain"].get("predictedMs")}, "measured": None,
            }
        new_rows = any(s["end"] > s["start"] for s in slices.values())

        def watermarks_for(flush: bool) -> dict[str, int]:
            out: dict[str, int] = {}
            for step in self.stateful:
                prev = last.steps.get(step.name) if last else None
                prev_wm = prev["watermark"] if prev else NO_WATERMARK
                max_t = prev["max_event_time"] if prev else NO_WATERMARK
                if flush:
                    observed = END_OF_STREAM
                else:
                    observed = prev_wm if max_t <= NO_WATERMARK else max(prev_wm, max_t - step.watermark_delay)
                ancestors, from_sources = self.upstream[step.name]
                # Downstream of stateful steps the watermark propagates, one epoch behind: what an
                # ancestor emits in this epoch is then never late here (see the module docstring).
                inherited = [last.steps[a]["watermark"] if last and a in last.steps else NO_WATERMARK for a in ancestors]
                wm = min([*inherited, *([observed] if from_sources or not ancestors else [])])
                if step.pattern is not None and step.pattern.seeds is not None:
                    # A split pattern's stage 2 continues stage 1's seeds right after their last
                    # row, so it must advance in lockstep with stage 1, in the same epoch.
                    wm = out[step.pattern.seeds]
                out[step.name] = max(wm, prev_wm)
            return out

        def previous(step: str) -> int:
            return last.steps[step]["watermark"] if last and step in last.steps else NO_WATERMARK

        has_state = bool(last) and any(last.steps.get(s.name, {}).get("index") for s in self.stateful)  # type: ignore[union-attr]
        watermarks = watermarks_for(ended)
        moved = any(watermarks[s] != previous(s) for s in watermarks)
        end_of_stream = ended
        if not new_rows and not (moved and has_state):
            if ended or not (until_idle and has_state):
                return None
            end_of_stream = True
            watermarks = watermarks_for(True)
        routing: dict[str, dict[str, Any]] = {}
        decisions: list[dict[str, Any]] = []
        elastic = self.spec.control.scale is not None
        for step in self.stateful:
            prev = last.steps.get(step.name) if last else None
            old = RoutingTable.from_json(prev["routing"]) if prev else None
            if old is None:
                table = RoutingTable.uniform(self.spec.key_groups, self.lanes)
            elif old.lanes == self.lanes or elastic:
                table = old
            else:  # restarted with another lane count: move as few key groups as possible
                counts = np.zeros(old.key_groups)
                for kg in prev["index"] if prev else ():
                    counts[int(kg) % old.key_groups] += 1
                table = old.rescaled(self.lanes, policies.rescale_assignment(counts, np.asarray(old.assignment), self.lanes))
            upcoming = None
            peek = None if end_of_stream else self._lookahead_input(step)
            if peek is not None:
                node, keys = peek
                upcoming = self.lookahead.counts(self.sources[node], slices[node], keys)
                # the next slice's files are counted while this epoch's job runs, for the next plan
                self.lookahead.prefetch(self.sources[node], slices[node], keys)
            table, made = self.manager.plan(epoch, step.name, table, upcoming)
            decisions.extend(d.to_json() for d in made)
            routing[step.name] = table.to_json()
        tables = self.compiler.tables.plan(last.tables if last else {})
        quiet = ("fits the bound", "no input", "warming up (slow start)")
        if overload_decision is not None and (
            shed or overload_decision["action"]["caps"] or overload_decision["why"].get("reason") not in quiet
        ):  # also say when the bound cannot be met at all
            decisions.append(overload_decision)
        return EpochPlan(epoch, slices, watermarks, routing, self.lanes, end_of_stream, tables, decisions, shed)

    def _lookahead_input(self, step: StepSpec) -> tuple[str, tuple[str, ...]] | None:
        """The source and key columns whose counts tell ``step``'s input rows per key group
        before the epoch runs (see :mod:`eddyline.runtime.lookahead`), if ``balance.lookahead`` is
        on and the step reads a source directly or through filters and selects that keep the key
        columns as they are; whether the counts are cheap there is up to the source."""
        balance = self.spec.control.balance
        if balance is None or not balance.lookahead or step.name not in self.manager.steps:
            return None
        if step.window_aggregate is not None or step.join is not None or step.input is None:
            return None
        keys = step.key_columns
        if not keys:
            return None
        # Up to the source through filters and selects that pass the keys on unchanged (a filter
        # only thins the rows, so the source's counts still tell where the load goes).
        node = step.input
        while node not in self.sources:
            up = self.spec.step(node)
            passes = up.filter is not None or (
                up.select is not None and all(any(e.strip() in ("*", k, f"`{k}`") for e in up.select) for k in keys)
            )
            if not passes:
                return None
            node = up.input
        return node, tuple(keys)

    # ------------------------------------------------------------------ one epoch
    def _run_epoch(self, plan: EpochPlan, last: EpochCommit | None, replayed: bool) -> tuple[EpochCommit, dict[str, Any]]:
        from pyspark import StorageLevel
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        epoch = plan.epoch
        runs = {
            s.name: StepRun(
                plan.watermarks[s.name],
                RoutingTable.from_json(plan.routing[s.name]),
                dict(last.steps[s.name]["index"]) if last and s.name in last.steps else {},
                state_budget=self.spec.control.state_budget,
                bytes_per_row=self._bytes_per_row.get(s.name, 0.0),
            )
            for s in self.stateful
        }
        wall_s = t0 - self._last_epoch_start if self._last_epoch_start is not None else 0.0
        self._last_epoch_start = t0
        kill_pid = os.getpid() if (self.crash_epoch == epoch and self.crash_point == "in_task") else None
        frames = self.compiler.build(
            epoch, plan.sources, runs, plan.lanes, kill_driver_pid=kill_pid, tables=plan.tables, shed=plan.shed
        )
        persisted = self._persist_shared(frames.nodes, StorageLevel.MEMORY_AND_DISK)
        t_plan = time.monotonic()
        self.lookahead.start()  # the next epoch's look-ahead counts while this one's job runs

        sink_rows: dict[str, int] = {}
        sink_obs: dict[str, Observation] = {}
        for sink_spec in self.spec.sinks:
            sink = self.sinks[sink_spec.name]
            df = frames.nodes[sink_spec.input]
            if sink_spec.kind == "files":
                obs = Observation(f"e{epoch}-sink-{sink.name}")
                df = df.observe(obs, F.count(F.lit(1)).alias("rows"))
                sink_obs[sink.name] = obs
            sink.stage(df, epoch)
            if sink_spec.kind != "files":
                staged = sink.collected.get(epoch)
                sink_rows[sink.name] = staged.num_rows if staged is not None else 0
        for name, obs in sink_obs.items():
            sink_rows[name] = int(obs.get.get("rows", 0))
        # Bad records were counted on the data path; the dead-letter job runs only if needed.
        bad = {
            n: int(frames.observations[f"bad:{n}"].get.get("bad") or 0) if f"bad:{n}" in frames.observations else 1
            for n in frames.dead_letters
        }
        dead = sum(bad.values())
        if dead:
            dl = None
            for n, df in frames.dead_letters.items():
                if bad[n]:
                    dl = df if dl is None else dl.unionByName(df)
            assert dl is not None
            write_frame(dl, self.dead_letters, epoch)
        for step_name, late_df in frames.late.items():
            write_frame(late_df, self.late_targets[step_name], epoch)
        if self.shed_target is not None and frames.shed:
            shed_rows = None
            for df in frames.shed.values():
                shed_rows = df if shed_rows is None else shed_rows.unionByName(df, allowMissingColumns=True)
            assert shed_rows is not None
            write_frame(shed_rows, self.shed_target, epoch)
        for df in persisted:
            df.unpersist()
        t_run = time.monotonic()
        self._maybe_crash(epoch, "after_stage")

        for sink in self.sinks.values():
            sink.publish(epoch)
        if dead:
            self.dead_letters.publish(epoch)
        for target in self.late_targets.values():
            target.publish(epoch)
        if self.shed_target is not None and frames.shed:
            self.shed_target.publish(epoch)
        t_pub = time.monotonic()
        self._maybe_crash(epoch, "after_publish")

        obs_values = {k: o.get for k, o in frames.observations.items()}
        steps_commit: dict[str, dict[str, Any]] = {}
        state_ops = []
        loads = {}
        out_rows: dict[str, int] = {}
        late_total = 0
        for s in self.stateful:
            run = runs[s.name]
            manifests = self.ckpt.lane_manifests(epoch, s.name, run.routing.lanes)
            index = dict(run.index)
            for m in manifests:
                index = with_chains(index, m["chains"])
            # Each input's newest event time so far; the step's watermark follows the slowest.
            prev = last.steps.get(s.name) if last else None
            n_inputs = 1 if s.window_aggregate is not None else len(s.time_columns())
            input_max = list(prev["input_max"]) if prev and "input_max" in prev else [NO_WATERMARK] * n_inputs
            for i in range(n_inputs):
                key = f"step:{s.name}" if s.window_aggregate is not None else f"step:{s.name}:{i}"
                seen_t = obs_values.get(key, {}).get("max_t")
                if seen_t is not None:
                    input_max[i] = max(input_max[i], int(seen_t))
            late = int(obs_values.get(f"step:{s.name}", {}).get("late") or 0)
            late += sum(int(m.get("metrics", {}).get("late_rows", 0)) for m in manifests)
            late_total += late
            load = step_load(epoch, run.routing.lanes, manifests, wall_s)
            loads[s.name] = load
            out_rows[s.name] = sum(m["output_rows"] for m in manifests)
            if load.state_rows:
                self._bytes_per_row[s.name] = load.state_bytes / load.state_rows
            steps_commit[s.name] = {
                "index": index,
                "input_max": input_max,
                "max_event_time": min(input_max),
                "watermark": run.watermark_ms,
                "routing": plan.routing[s.name],
            }
            state_ops.append(
                {
                    "operatorName": s.name,
                    "numRowsTotal": sum(m["state_rows"] for m in manifests),
                    "numRowsUpdated": sum(m["input_rows"] for m in manifests),
                    "memoryUsedBytes": sum(m["state_bytes"] for m in manifests),
                    "numRowsDroppedByWatermark": late,
                    "customMetrics": {
                        "stateBytesWritten": sum(m["bytes_written"] for m in manifests),
                        "snapshots": sum(m["snapshots"] for m in manifests),
                        "deltas": sum(m["deltas"] for m in manifests),
                        "cacheHits": sum(m["cache_hits"] for m in manifests),
                        "cacheMisses": sum(m["cache_misses"] for m in manifests),
                        "spilledBytes": load.spilled_bytes,
                        "stateSlices": sum(m.get("slices", 1) for m in manifests),
                        "workerPeakRssBytes": max((m["memory"]["peak"]["rss"] for m in manifests if "memory" in m), default=0),
                        **_summed_metrics(manifests),
                        "laneMs": [m["ms"] for m in manifests],
                        "laneCpuMs": [m.get("cpu_ms", {}) for m in manifests],
                        "laneWarming": [bool(m.get("warming_at_start")) for m in manifests],
                        "laneGc": [m.get("gc", {}) for m in manifests],
                        "laneInputRows": [m["input_rows"] for m in manifests],
                    },
                }
            )
        overload_record = self._observe_overload(
            plan, obs_values, loads, out_rows, sink_rows, (time.monotonic() - t0) * 1000, wall_s
        )
        commit = EpochCommit(
            epoch=epoch,
            source_ends={n: s["end"] for n, s in plan.sources.items()},
            steps=steps_commit,
            sinks=sink_rows,
            end_of_stream=plan.end_of_stream,
            cursors={n: s["cursor"] for n, s in plan.sources.items() if s.get("cursor") is not None},
            tables=plan.tables,
            control={"overload": self.overload.state()} if self.overload is not None else {},
        )
        crash = _die if (self.crash_epoch == epoch and self.crash_point == "mid_commit") else None
        self.ckpt.write_commit(commit, crash=crash)
        t_commit = time.monotonic()
        for name, load in loads.items():
            self.manager.observe(name, load)
        self._maybe_crash(epoch, "after_commit")
        if epoch % self.retain_epochs == 0:
            self._start_cleanup(epoch)
        t_cleanup = time.monotonic()

        input_rows = sum(int(obs_values.get(f"source:{n}", {}).get("rows") or 0) for n in self.sources)
        total_ms = (t_cleanup - t0) * 1000
        watermark = min(plan.watermarks.values()) if plan.watermarks else None
        record = {
            "id": self.spec.name,
            "batchId": epoch,
            "timestamp": iso_ms(int(time.time() * 1000)),
            "replayed": replayed,
            "numInputRows": input_rows,
            "processedRowsPerSecond": input_rows / (total_ms / 1000) if total_ms else 0.0,
            "durationMs": {
                "triggerExecution": round(total_ms, 1),
                "planning": round((t_plan - t0) * 1000, 1),
                "execution": round((t_run - t_plan) * 1000, 1),
                "publish": round((t_pub - t_run) * 1000, 1),
                "commit": round((t_commit - t_pub) * 1000, 1),
                "cleanup": round((t_cleanup - t_commit) * 1000, 1),
            },
            "triggerMs": self.spec.trigger,
            "eventTime": {"watermark": iso_ms(watermark)},
            "stateOperators": state_ops,
            "sources": [
                {
                    "description": n,
                    "startOffset": s["start"],
                    "endOffset": s["end"],
                    "numInputRows": int(obs_values.get(f"source:{n}", {}).get("rows") or 0),
                }
                for n, s in plan.sources.items()
            ],
            "sinks": [{"description": n, "numOutputRows": r} for n, r in sink_rows.items()],
            "deadLetters": dead,
            "lateRows": late_total,
            "routing": {n: _routing_summary(r) for n, r in plan.routing.items()},
            "load": {n: load.to_json() for n, load in loads.items()},
            "decisions": plan.decisions,
            "recentDecisions": self.manager.recent(5),
            **({"overload": overload_record} if overload_record is not None else {}),
            "backlog": {n: s.get("backlog", 0) for n, s in plan.sources.items()},
            "endOfStream": plan.end_of_stream,
        }
        return commit, record

    def _observe_overload(
        self,
        plan: EpochPlan,
        obs: dict[str, dict[str, Any]],
        loads: dict[str, Any],
        out_rows: dict[str, int],
        sink_rows: dict[str, int],
        duration_ms: float,
        wall_s: float,
    ) -> dict[str, Any] | None:
        """Feed the overload controller; report shed fractions and quality per query output."""
        if self.overload is None:
            return None
        offered: dict[str, list[int]] = {}
        kept: dict[str, list[int]] = {}
        quantiles: dict[str, list[float]] = {}
        for s in self.stateful:
            o, k = [], []
            for i in range(len(s.inputs)):
                v = obs.get(f"shed:{s.name}:{i}", {})
                o.append(int(v.get("offered") or 0))
                k.append(int(v.get("kept") or 0))
                if v.get("q"):
                    quantiles[s.name] = [float(x) for x in v["q"] if x is not None]
            offered[s.name], kept[s.name] = o, k
        read = {n: int(obs.get(f"source:{n}", {}).get("rows") or 0) for n in self.sources}
        self.overload.observe(
            EpochCost(
                plan.epoch, duration_ms, read, offered, kept,
                {n: load.makespan_ms for n, load in loads.items()},
                {n: load.busy_ms for n, load in loads.items()},
                {n: load.lanes for n, load in loads.items()},
                out_rows, dict(sink_rows), wall_s,
            ),
            quantiles,
            cold=self._cold,
        )
        self._cold = False
        quality = {}
        for sink in self.spec.sinks:
            ratio = 1.0
            for a in sorted(n for n in self.spec.upstream(sink.input) if getattr(self.spec.node(n), "stateful", False)):
                o, k = sum(offered.get(a, [])), sum(kept.get(a, []))
                if o:
                    ratio *= k / o
            quality[sink.name] = {"shedFraction": round(1 - ratio, 4), "keptFraction": round(ratio, 4)}
        expected = next((d["why"].get("predictedMs") for d in plan.decisions if d["kind"] == "overload"), None)
        arrival = sum(read.values()) / wall_s if wall_s > 0 else 0.0
        backlog = sum(int(s.get("backlog", 0)) for s in plan.sources.values())
        return {
            "boundMs": self.overload.bound_ms,
            "withinBound": duration_ms <= self.overload.bound_ms,
            "expectedMs": expected,
            "measuredMs": round(duration_ms, 1),
            "lagSeconds": round(backlog / arrival, 2) if arrival else None,
            "criticalPath": self.overload.critical_path(),
            "shed": {s: {"keep": v["keep"], "offered": offered.get(s), "kept": kept.get(s)} for s, v in plan.shed.items()},
            "quality": quality,
            "hotSpots": self.overload.hot_spots(),
        }

    def _persist_shared(self, nodes: dict[str, DataFrame], level: Any) -> list[DataFrame]:
        """Cache a stateful step's output when more than one Spark action reads it, so its
        lanes run once per epoch (a second run would be correct, only wasted)."""
        readers: dict[str, int] = {}
        for sink in self.spec.sinks:
            for name in self.spec.upstream(sink.input):
                readers[name] = readers.get(name, 0) + 1
        persisted = []
        for s in self.stateful:
            if readers.get(s.name, 0) > 1:
                nodes[s.name] = nodes[s.name].persist(level)
                persisted.append(nodes[s.name])
        return persisted

    def _start_cleanup(self, epoch: int) -> None:
        """Delete what epochs before the retained ones left behind, beside the next epochs.

        The files it deletes belong to epochs no retained commit or plan refers to, and a new
        epoch only writes new files, so the two never touch the same file. One cleanup at a
        time: the previous one is waited for (and its error raised) first.
        """
        self._finish_cleanup()
        self._cleaner = _Cleaner(self._cleanup, epoch)
        self._cleaner.start()

    def _finish_cleanup(self, raise_error: bool = True) -> None:
        cleaner, self._cleaner = self._cleaner, None
        if cleaner is None:
            return
        cleaner.join()
        if cleaner.error is not None and raise_error:
            raise CheckpointError(f"cleaning up the checkpoint after epoch {cleaner.epoch} failed: {cleaner.error}") from cleaner.error

    def _cleanup(self, epoch: int) -> None:
        keep_from = epoch - self.retain_epochs + 1
        commits = [c for c in self.ckpt.commits() if c.epoch >= keep_from]
        if not commits:
            return
        for s in self.stateful:
            # The schema does not matter for cleanup; only the file names and chains do.
            import pyarrow as pa

            store = KeyGroupStore(self.ckpt.location, s.name, pa.schema([("_kg", pa.int32())]), ["_kg"])
            store.cleanup([c.steps[s.name]["index"] for c in commits if s.name in c.steps], below_epoch=keep_from)
        self.ckpt.forget_before(keep_from)

    def _maybe_crash(self, epoch: int, point: str) -> None:
        if self.crash_epoch == epoch and self.crash_point == point:
            _die()


class _Cleaner(threading.Thread):
    """One checkpoint cleanup in a background thread; keeps its error for the engine."""

    def __init__(self, clean: Callable[[int], None], epoch: int) -> None:
        super().__init__(name=f"eddyline-cleanup-{epoch}", daemon=True)
        self.clean, self.epoch = clean, epoch
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.clean(self.epoch)
        except BaseException as e:  # handed to the engine's thread by _finish_cleanup
            self.error = e


def _freeze_heap() -> bool:
    """Keep the driver's long-lived objects out of Python's cyclic collector's full collections.

    After the first epoch the modules an epoch needs are imported (pyspark, pyarrow, pandas,
    numpy, ...): over 100,000 objects (113,000 right after the imports) that a full collection
    walks every time. In the adaptive benchmark one happened every 27-31 s and took 58-91 ms,
    inside whichever epoch's planning or commit it hit (bench/RESULTS.md). Frozen (after a
    collection, so no garbage is kept) they are no longer walked. The lanes' Python workers do
    the same (``lanes.gc_clock``).

    Returns whether nothing was frozen before: the run then thaws the heap when it ends, so the
    interpreter can still free everything at exit (some extension modules report the objects
    left at exit as leaks).
    """
    thawed = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    return thawed


def _stateful_upstream(spec: NetworkSpec, step: Any) -> tuple[list[str], bool]:
    """The nearest stateful steps feeding ``step`` (through stateless ones), and whether some
    input path reaches a source without passing a stateful step."""
    ancestors: list[str] = []
    from_sources = False
    frontier = list(step.inputs)
    seen: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        node = spec.node(name)
        if not node.inputs:
            from_sources = True
        elif getattr(node, "stateful", False):
            ancestors.append(name)
        else:
            frontier.extend(node.inputs)
    return sorted(ancestors), from_sources


def _routing_summary(routing: dict[str, Any]) -> dict[str, Any]:
    table = RoutingTable.from_json(routing)
    return {
        "version": table.version,
        "lanes": table.lanes,
        "keyGroupsPerLane": [len(table.key_groups_of(i)) for i in range(table.lanes)],
        "spread": {str(k): [table.assignment[k], *v] for k, v in table.spread.items()},
    }


def _summed_metrics(manifests: list[dict[str, Any]]) -> dict[str, int]:
    """Kernel counters (windows fired, matches, ...) summed over lanes, camelCased for progress."""
    out: dict[str, int] = {}
    for m in manifests:
        for k, v in m.get("metrics", {}).items():
            name = k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:])
            out[name] = out.get(name, 0) + int(v)
    return out


def _parse_crash(crash_at: str | None) -> tuple[int | None, str | None]:
    if not crash_at:
        return None, None
    epoch_s, _, point = crash_at.partition(":")
    if not epoch_s.isdigit() or point not in CRASH_POINTS:
        raise CheckpointError(f"--crash-at: expected EPOCH:POINT with POINT in {', '.join(CRASH_POINTS)}, got {crash_at!r}")
    return int(epoch_s), point
