"""The epoch loop. One epoch is a sequence of stages, each a module of :mod:`eddyline.runtime.epoch`:

1. **plan** the next epoch from the last commit and the controller (slices, watermarks,
   routing, shedding);
2. **log** the plan atomically (a crash anywhere before step 7 replays the epoch from it);
3. **execute** it as Spark jobs: sinks stage their output, lanes write state and manifests;
4. **publish** the staged output (atomic per epoch, replacing an earlier attempt's);
5. **fold** the lane manifests into the new state index and load statistics;
6. **observe**: the controller learns the epoch's loads and costs;
7. **commit** atomically: source offsets + state index + watermarks + sink counts + the
   controller's state;
8. **report** the progress record.

A :class:`~eddyline.runtime.faults.Faults` hook is told each boundary the epoch passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eddyline.api.change import (
    NetworkDiff,
    catch_ups,
    check_change,
    history_starts,
    required_history_starts,
    still_catching_up,
    with_catch_ups,
)
from eddyline.api.live import carried, sink_settings, with_settings
from eddyline.api.network import NetworkSpec
from eddyline.api.units import Files, format_duration_ms
from eddyline.api.validate import spec_from_raw
from eddyline.control.controller import Controller
from eddyline.control.state import ControllerState
from eddyline.errors import CheckpointError, EddylineError, EngineError, SpecError, task_error_line
from eddyline.eventtime import NO_WATERMARK
from eddyline.ha.lease import Lease
from eddyline.io.files import FilesTarget
from eddyline.io.sinks import Sink, make_sink
from eddyline.io.sources import Source, make_source
from eddyline.observe.progress import ProgressReporter
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.checkpoint import Checkpoint, network_hash
from eddyline.runtime.commands import CommandFiles, CommandNats, command_reader
from eddyline.runtime.compile import EpochCompiler, analyze
from eddyline.runtime.epoch.commit import commit
from eddyline.runtime.epoch.execute import Executor
from eddyline.runtime.epoch.fold import fold
from eddyline.runtime.epoch.observe import observe
from eddyline.runtime.epoch.plan import Planner
from eddyline.runtime.epoch.publish import Outputs, publish
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, ProgressRecord
from eddyline.runtime.epoch.report import Timings, report
from eddyline.runtime.faults import FaultPoint, Faults, NoFaults, UnderLease
from eddyline.runtime.inbox import Inbox
from eddyline.runtime.lookahead import LookAhead
from eddyline.runtime.replica import Following, HotPair, Leading
from eddyline.runtime.rewriting import checked_rewrite, decision, propose_rewrites
from eddyline.state.store import KeyGroupStore, copy_state, drop_state, history_floor, state_steps

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.api.sinks import SinkSpec


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

    def add(self, epoch: int, record: ProgressRecord, replayed: bool) -> None:
        r = record.to_json()
        self.epochs += 1
        self.last_epoch = epoch
        self.input_rows += r["numInputRows"]
        self.dead_letters += r["deadLetters"]
        self.late_rows += r["lateRows"]
        self.replayed += int(replayed)
        for s in r["sinks"]:
            self.output_rows[s["description"]] = self.output_rows.get(s["description"], 0) + s["numOutputRows"]


#: PySpark stops a Python worker that has been idle for a minute (a constant in Spark's
#: PythonWorkerFactory, not a setting). The next epoch then starts new workers, which have lost
#: the lanes' state cache and must reload it (docs/perf-notes.md has the figures). An engine with
#: nothing to do for this long runs a tiny job on every core's worker instead.
WORKER_KEEPALIVE_S = 40.0


def touch_python_workers(spark: SparkSession) -> list[int]:
    """Run one keep-alive task per core, each in an idle Python worker of Spark's pool (which
    restarts its idle clock); returns the worker processes' ids."""
    from eddyline.runtime.lanes import keep_warm

    cores = spark.sparkContext.defaultParallelism
    rows = spark.range(0, cores, 1, cores).mapInArrow(keep_warm, "pid long").collect()
    return sorted(r.pid for r in rows)


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
        faults: Faults | None = None,
        retain_epochs: int | None = None,
        worker_keepalive_s: float | None = WORKER_KEEPALIVE_S,
        lease: Lease | None = None,
        pair: HotPair | None = None,
    ):
        """``lease``: acquired by the caller; the engine renews it and checks it before every
        step others can see, so that it stops (:class:`eddyline.ha.lease.Fenced`) once another
        driver took over; its plans and commits carry the lease's generation and are created
        only if no other driver created them first.

        ``pair``: this driver is one of a hot pair (:mod:`eddyline.runtime.replica`); it leads
        if ``lease`` is the pair's (acquired), else it follows until it takes the lease over."""
        if pair is not None:
            HotPair.check(spec)
        #: the network as written (``base_spec``) and with the control-line settings in force
        self.spec = self.base_spec = spec
        self.settings: dict[str, Any] = {}
        self.spark, self.reporter = spark, reporter
        self.pair = pair
        self.faults = faults or NoFaults()
        self.lease = lease
        # the boundaries the driver passes; tasks get self.faults alone (the lease stays here)
        self.boundaries: Faults = UnderLease(self.faults, lease) if lease is not None else self.faults
        self.worker_keepalive_s = worker_keepalive_s
        self._retain = retain_epochs  # default: the network's history
        self.ckpt = Checkpoint(checkpoint)
        self.lanes = lanes or spec.lanes or spark.sparkContext.defaultParallelism
        self.inbox = Inbox(checkpoint, self.ckpt.gate)
        self._refused: list[dict[str, Any]] = []  # commands refused since the last progress record
        self._given_sinks = sinks or {}
        self._attached = False  # the sources receive (upstream backup) while run() runs
        self._change = LiveChange()  # the last change of network, as the checkpoint records it
        #: the control stream: the last file the committed plans read, and what planning read to
        self._cursor: str | None = None
        self._read_to: str | None = None
        self._refused_ids: set[str] = set()  # refused once, not again while they wait to be read
        self._commands: CommandFiles | CommandNats | None = None  # the control stream's reader
        self._not_rewritten: set[str] = set()  # steps whose rewrite was refused
        #: an operator paused the network (control API): no epoch runs until a resume
        self.paused = self.inbox.paused() is not None
        self._held: list[dict[str, Any]] = []  # pauses and resumes, for the next plan's log
        self._build(spec)
        self._cleaner: _Cleaner | None = None
        self._python_used_at = time.monotonic()  # when Python workers last ran a task of ours
        self._last_epoch_start: float | None = None
        self._cold = True  # the first epoch of this process
        self.kept_warm_pids: list[int] = []  # the Python workers the last keep-alive job ran in

    def _build(self, spec: NetworkSpec, keep: dict[str, Sink] | None = None) -> None:
        """The parts of the engine that follow from the network: made at the start and again
        when a live change (:mod:`eddyline.api.change`) puts another network in force.
        ``keep``: sinks still open from the network before (unchanged), used as they are."""
        spark, checkpoint, pair, lease = self.spark, self.ckpt.location, self.pair, self.lease
        self.base_spec = spec
        self.network_id = network_hash(spec.as_dict())  # names the network in plans and the checkpoint
        # added steps still catching up read copies of running sources (api.change.catch_ups)
        self.spec = spec = with_catch_ups(spec, self._change.catch_up)
        self.settings = {}
        self.retain_epochs = self._retain or spec.history
        sinks = {**self._given_sinks, **(keep or {})}
        sinks = {s.name: sinks.get(s.name) or self._make_sink(s) for s in spec.sinks}
        self.sources: dict[str, Source] = {s.name: make_source(s) for s in spec.sources}
        overload = spec.control.overload
        self.outputs = Outputs(
            sinks=sinks,
            dead_letters=FilesTarget(
                spec.dead_letters or Files(path=f"{self.ckpt.location.rstrip('/')}/dead-letters", format="json")
            ),
            late={
                s.name: FilesTarget(target)
                for s in spec.stateful_steps()
                if (target := s.info.late_target(s.params)) is not None
            },
            shed=FilesTarget(overload.shed_sink) if overload is not None and overload.shed_sink is not None else None,
            selector=pair.selector if pair is not None else None,
        )
        self.controller = Controller(spec, max_lanes=spark.sparkContext.defaultParallelism)
        self.lookahead = LookAhead(spec.key_groups)
        self.compiler = EpochCompiler(spark, spec, self.sources, checkpoint, self.faults, gate=self.ckpt.gate)
        self._plans = Planner(
            spec, self.sources, self.lanes, self.controller, self.lookahead, self.compiler.tables, self.ckpt.read_commit
        )
        self.planner: Planner | Leading | Following = self._plans
        self.executor = Executor(spec, self.compiler, self.outputs)
        if pair is not None:  # both drivers stage the outputs: apart, with digests to compare
            self.executor.digests = True
            for out in [*self.outputs.sinks.values(), *self.outputs.targets()]:
                out.writer = pair.writer
            self.planner = (Leading(self._plans, pair) if lease is not None
                            else Following(self._plans, pair, self.controller, self._lead, self.ckpt))

    @property
    def sinks(self) -> dict[str, Sink]:
        return self.outputs.sinks

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        *,
        epochs: int | None = None,
        duration_s: float | None = None,
        until_idle: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RunSummary:
        changed = self.ckpt.restart_change(self.base_spec)  # refused before anything is written
        # before anything is read: from here on no older generation can write what we read
        self._open_gates()
        self._adopt_applied_network(changed)
        meta = self.ckpt.open(self.spec.fingerprint(), created=self.network_id)
        applied = meta.get("applied") or {}
        self._change = LiveChange.from_json(applied)
        self.ckpt.store_network(self.base_spec.as_dict())  # every plan names the network it ran
        started_at = float(meta["started_at"])
        self.executor.checkpoint_id = str(meta["id"])  # names this run's writes in sinks that remember them
        if self.pair is not None:  # the pair's writes are the same whichever driver makes them
            self.executor.checkpoint_id = self.pair.join(self.spec.fingerprint())
        last = self.ckpt.latest_commit()
        pending = self.ckpt.pending_plan(last.epoch if last else 0)
        self._restore(last.control if last else {})
        self._use_settings(pending.settings if pending is not None else last.settings if last else {})
        self._cursor = pending.commands_cursor if pending is not None else last.commands_cursor if last else None
        if pending is not None:
            if pending.base is not None:  # a correction: it continues from an earlier commit
                base = self._base(pending, last)
                self._restore(base.control if base else {})
            self._restore(pending.control)
        summary, thawed, t_start, prev_start = RunSummary(), False, time.monotonic(), None
        if self.lease is not None:
            self.lease.start_heartbeat()
        try:
            for name, source in self.sources.items():  # upstream backup: start receiving (Source.attach)
                source.attach(self.ckpt.location, last.source_ends.get(name, 0) if last else 0)
            self._attached = True
            while not (
                (epochs is not None and summary.epochs >= epochs)
                or (duration_s is not None and time.monotonic() - t_start >= duration_s)
                or (should_stop is not None and should_stop())
            ):
                epoch_start = time.monotonic()
                replayed = pending is not None
                if not replayed and not self.paused:
                    self._merge_caught_up(last)
                before, taken = self.settings, [] if replayed else self._take_commands((last.epoch if last else 0) + 1)
                if self.paused and pending is None:  # an operator's pause: wait for the resume, workers kept warm
                    summary.worker_keepalives += self._keep_workers_warm()
                    time.sleep(0.2)
                    continue
                special = taken[0] if taken and _alone(taken[0]) else None
                rewind_to, restores = self._prepare(special, last) if special is not None else (None, [])
                view, elapsed = self._view(last, (last.epoch if last else 0) + 1), time.time() - started_at
                plan = pending or (self.planner.next(view, elapsed, until_idle) if rewind_to is None  # 1. plan
                                   else self._plans.next(view, elapsed, until_idle, rewind_to))  # (no pair: refused)
                pending = None
                if plan is None:
                    if special is None:  # (a change of network is recorded: it stays)
                        self._use_settings(before)  # the commands wait for an epoch to take effect in
                    if until_idle and not self.planner.waiting_for:
                        break
                    summary.worker_keepalives += self._keep_workers_warm()
                    time.sleep(self.planner.poll_s or min(max(self.spec.trigger, 100), 1000) / 1000)
                    continue
                if not replayed:
                    applied = [{k: c[k] for k in ("id", "set", "from", "reset", "replay", "undo", "route", "pause", "resume")
                                if k in c}
                               | ({"network": self.network_id} if "network" in c else {})
                               | ({"rewrite": c["rewrite"]["rule"]} if "rewrite" in c else {}) for c in [*self._held, *taken]]
                    self._held = []
                    plan = self._log(dataclasses.replace(
                        plan, settings=self.settings, applied=applied, commands_cursor=self._read_to,
                        network=self.network_id, restores=restores))  # 2. log
                    replayed = plan.generation != self._generation
                    for command in taken:  # logged: from now on the plan applies them, also in a replay
                        self.inbox.close(command, "applied", plan.epoch)
                if plan.settings != self.settings:  # a replay, a follower, or another driver's plan
                    self._use_settings(plan.settings)
                self._cursor = plan.commands_cursor
                self.boundaries.reached(FaultPoint.AFTER_PLAN, plan.epoch)
                last, record = self._epoch(plan, self._view(self._base(plan, last), plan.epoch), replayed)  # 3.–8.
                record = record.with_input_rate(epoch_start - prev_start if prev_start is not None else 0.0)
                prev_start, self._python_used_at = epoch_start, time.monotonic()
                if self._refused:
                    record, self._refused = record.with_refused(self._refused), []
                summary.add(plan.epoch, record, replayed)
                if summary.epochs == 1:
                    thawed = _freeze_heap()
                self.ckpt.write_progress(plan.epoch, record.to_json())  # (status and the dashboard read it)
                if self.reporter is not None:
                    self.reporter.report(record.to_json())
                if self.spec.control.rewrite is not None and self.pair is None and self.spec.max_delay is None:
                    propose_rewrites(self.base_spec, self.controller, self.inbox, plan.epoch + 1, self.controller.lanes_cap,
                                     skip=self._not_rewritten)
                wait = self.spec.trigger / 1000 - (time.monotonic() - epoch_start)
                if wait > 0 and self.planner.poll_s is None:  # (a follower is paced by its leader)
                    time.sleep(wait)
        except BaseException:
            self._finish_cleanup(raise_error=False)
            raise
        finally:
            for source in self.sources.values():  # upstream backup: stop receiving (Source.detach)
                source.detach()
            self._attached = False
            if self._commands is not None:
                self._commands.close()
                self._commands = None
            self.lookahead.close()
            if self.pair is not None:
                self.pair.close()
            if self.lease is not None:
                self.lease.release()
            if thawed:
                gc.unfreeze()
        self._finish_cleanup()  # the last cleanup is done when run() returns
        return summary

    def _take_commands(self, epoch: int) -> list[dict[str, Any]]:
        """Control lines: the commands of the inbox, then of the control stream, whose settings
        fit the running network, in order, put in force for the epoch about to be planned (the
        caller logs them with it); the others are refused with the reason (while planning
        ``epoch``) and reported in the next progress record. A change of network comes alone."""
        self._read_to = self._cursor
        if isinstance(self.planner, Following):
            return []  # a follower runs its leader's plans, settings included
        taken: list[dict[str, Any]] = []
        for command in self.inbox.pending():
            if "pause" in command or "resume" in command:
                if taken:
                    return taken  # the commands before it take effect first
                self._pause_or_resume(command, epoch)
                continue
            if self.paused:
                return []  # everything else waits for the resume
            if "route" in command:
                taken += self._route(command, epoch)
                continue
            if not _alone(command):
                taken += self._take(command, epoch)
                continue
            if taken:
                return taken  # a change of network, a replay, an undo: each has a boundary of its own
            try:
                self._check_alone(command, epoch - 1)
            except EddylineError as e:
                if isinstance(command.get("rewrite"), dict):  # not proposed again by this driver
                    self._not_rewritten.add(str(command["rewrite"].get("step")))
                self.inbox.close(command, "refused", epoch, str(e))
                self._refused.append({"id": command.get("id"), "command": _alone(command), "reason": str(e)})
                continue
            return [command]
        stream = self.spec.control.commands
        if stream is not None and not self.paused:  # a control stream: its tuples are commands too
            if self._commands is None:  # (kept open while run() runs: a broker's connection)
                self._commands = command_reader(stream, self.spec.name)
            commands, self._read_to = self._commands.after(self._cursor)
            for command in commands:
                taken += self._take(command, epoch)
        return taken

    def _take(self, command: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        """``[command]`` if its settings fit the network as it runs with those taken before it
        (they are then in force), else ``[]`` (refused with the reason, once)."""
        wanted = command.get("set")
        try:
            if command.get("error") or not isinstance(wanted, dict) or not wanted:
                raise SpecError(f"control: {command.get('error') or 'expected a non-empty mapping STEP.PARAM -> value in set'}")
            with_settings(self.spec, wanted)  # names the command's own problem
            self._use_settings({**self.settings, **wanted})
        except SpecError as e:
            if command["id"] not in self._refused_ids:
                self._refused_ids.add(command["id"])
                self.inbox.close(command, "refused", epoch, str(e))
                self._refused.append({"id": command.get("id"), "set": wanted, "reason": str(e)})
            return []
        return [command]

    def _route(self, command: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        """``[command]`` if its routing request fits (the manager then takes it in the plan of
        ``epoch``, where it becomes a decision), else ``[]`` (refused with the reason)."""
        request = command.get("route")
        try:
            if not isinstance(request, dict):
                raise ValueError("route: expected a mapping with step and one of rebalance, lanes, move")
            last = self.ckpt.latest_commit()
            prev = last.steps.get(str(request.get("step"))) if last else None
            lanes_now = RoutingTable.from_json(prev.routing).lanes if prev else self.lanes
            self.controller.manager.check_request(request, self.controller.lanes_cap, lanes_now)
        except ValueError as e:
            self.inbox.close(command, "refused", epoch, str(e))
            self._refused.append({"id": command.get("id"), "route": request, "reason": str(e)})
            return []
        self.controller.manager.request({**request, "id": command.get("id")})
        return [command]

    def _pause_or_resume(self, command: dict[str, Any], epoch: int) -> None:
        """An operator's pause (no epoch runs until a resume; kept in the checkpoint, so a
        restarted driver stays paused) or resume. Both are closed at once and logged in the plan
        of the next epoch that runs."""
        pause = "pause" in command
        if pause != self.paused:
            self.inbox.set_paused({"id": command.get("id"), "since": time.time()} if pause else None)
            self.paused = pause
            self._held.append(command)
        self.inbox.close(command, "applied", epoch)

    def _check_alone(self, command: dict[str, Any], last_epoch: int) -> None:
        """Refuse (raise) a change of network, a replay or an undo that cannot be done now."""
        what = _alone(command)
        if self.pair is not None or self.spec.max_delay is not None:
            raise EngineError(f"{what}: a hot pair or a network with max_delay cannot do this live yet")
        if "network" in command:
            raw = command["network"]
            if not isinstance(raw, dict):
                raise SpecError(f"{what}: expected the new network as a mapping")
            fits = checked_rewrite(self.base_spec, command).fits if "rewrite" in command else ()
            new = spec_from_raw(raw)
            check_change(self.base_spec, new, tuple(command.get("reset") or ()), fits)
            if "start_epoch" in command:
                self._check_start(command["start_epoch"], new, last_epoch)
            # what would fail its first epoch is refused before it is in force
            analyze(with_catch_ups(new, self._catch_ups(command, new)), self.spark)
        if what == "apply":
            return
        target = command.get(what)
        if not isinstance(target, int) or not 1 <= target <= last_epoch:
            raise EngineError(f"{what}: expected an epoch from 1 to {last_epoch}, the last committed, got {target!r}")
        cannot = [n for n, s in self.outputs.sinks.items() if not s.rewinds]
        if cannot:
            raise EngineError(f"{what}: sink(s) {', '.join(cannot)} cannot take published epochs back and put them back "
                              "(files, memory, discard and nats sinks can, and postgres sinks with rewind: true; what a "
                              "console sink printed cannot be taken back)")
        targets = {json.dumps(sink_settings(self.spec, self.ckpt.read_plan(e).settings), sort_keys=True)
                   for e in range(target, last_epoch + 1) if self.ckpt.has_plan(e)}
        if len(targets) > 1:  # the epochs to take back were written to more than one target
            raise EngineError(f"{what}: a sink's target changed (a control setting) between epoch {target} and "
                              f"{last_epoch}; {what} can go back to the epoch the last change took effect at the earliest")
        if self._change.catch_up:  # (the copies' offsets would have to be taken back too)
            steps = sorted(st for _, readers in self._change.catch_up.values() for st in readers)
            raise EngineError(f"{what}: step(s) {', '.join(steps)} still catch up on copies of running sources; "
                              f"{what} once they read the sources themselves")
        meta = self.ckpt.metadata() or {}
        merged = [r["epoch"] for r in meta.get("caught_up", []) if r["epoch"] >= target]
        if merged:
            raise EngineError(f"{what}: added steps went over from a copy to its source at epoch {max(merged)}; "
                              f"{what} can go back to epoch {max(merged) + 1} at the earliest")
        rewritten = [r for r in meta.get("rewrites", []) if r["epoch"] >= target]
        if rewritten and what == "replay":  # its new steps took their state over at that boundary only
            r = min(rewritten, key=lambda r: r["epoch"])
            raise EngineError(f"replay: rule {r['rule']} rewrote step '{r['step']}' at epoch {r['epoch']}; "
                              f"a replay can go back to epoch {r['epoch'] + 1} at the earliest")
        if what == "replay":
            taken = self._taken_back(target, last_epoch)
            if taken is not None:
                raise EngineError(f"replay: epoch {target} was taken back by epoch {taken[0]}, which went on from epoch "
                                  f"{taken[1]}; replay from epoch {taken[0]} or from an epoch up to {taken[1]}")
        # the commit (and the plan naming its network) the epoch goes on from
        back = self._went_on_from(target) if what == "replay" else target - 1
        if back and not (self.ckpt.has_commit(back) and self.ckpt.has_plan(back)):
            raise EngineError(f"{what}: epoch {back} is no longer kept (the checkpoint keeps the last "
                              f"{self.retain_epochs} epochs{self._kept_for}; raise the network's history to go further back)")
        if what == "undo":
            plan = self.ckpt.read_plan(target) if self.ckpt.has_plan(target) else None
            if plan is None or not any("replay" in a for a in plan.applied):
                raise EngineError(f"undo: epoch {target} did not replay earlier epochs; there is nothing to undo")
            later = [(e, self.ckpt.read_plan(e).applied) for e in range(target + 1, last_epoch + 1) if self.ckpt.has_plan(e)]
            blocked = undo_blocked(target, later)
            if blocked:
                raise EngineError(f"undo: {blocked}")
        for sink in self.outputs.sinks.values():  # (one that keeps records may have dropped them)
            problem = sink.rewind_problem(self.spec.name, self.executor.checkpoint_id, range(target, last_epoch + 1),
                                          target if what == "undo" else None)
            if problem:
                raise EngineError(f"{what}: {problem}")

    def _went_on_from(self, epoch: int) -> int:
        """The commit ``epoch`` continued from: the one before, or for an epoch that replayed
        or undid a replay the earlier commit it went back to (0: the start)."""
        base = self.ckpt.read_plan(epoch).base if self.ckpt.has_plan(epoch) else None
        return epoch - 1 if base is None else base

    def _taken_back(self, epoch: int, last_epoch: int) -> tuple[int, int] | None:
        """Whether ``epoch`` was taken back: the epochs the last commit descends from, back to
        ``epoch``, skip it. Returns the epoch that skipped it and the commit that one went on
        from (a replay from there would read input that the sinks show from later epochs)."""
        at = last_epoch
        while at > epoch:
            went_on_from = self._went_on_from(at)
            if went_on_from < epoch:
                return at, went_on_from
            at = went_on_from
        return None

    @property
    def _kept_for(self) -> str:
        within, cap = self.spec.history_duration, self.spec.history_bytes
        also = f" and those committed in the last {format_duration_ms(within)}" if within is not None else ""
        return also + (f", as far as their state fits history_bytes ({cap:,} bytes)" if cap is not None else "")

    def _catch_ups(self, command: dict[str, Any], new: NetworkSpec) -> dict[str, tuple[str, tuple[str, ...]]]:
        """The copies added steps read while they catch up once ``command`` is in force: those
        still catching up, and with ``start_epoch`` those for the steps it adds."""
        start = command.get("start_epoch")
        added = catch_ups(self.base_spec, new, int(start)) if isinstance(start, int) else {}
        return still_catching_up(new, {**self._change.catch_up, **added})

    def _merge_caught_up(self, last: EpochCommit | None) -> None:
        """Copies that have read as far as their sources: from the next epoch on their steps
        read the sources themselves, with the state they have (the rows are the same from here
        on). Recorded in the checkpoint's metadata (``caught_up``) before the next epoch is planned."""
        if last is None or not self._change.catch_up or isinstance(self.planner, Following):
            return
        ends, cursors = last.source_ends, last.cursors
        done = [c for c, (s, _) in self._change.catch_up.items()
                if c in ends and ends[c] >= ends.get(s, 0) and cursors.get(c) == cursors.get(s)]
        if not done:
            return
        self._change = dataclasses.replace(
            self._change, catch_up={c: v for c, v in self._change.catch_up.items() if c not in done})
        self.ckpt.record_caught_up(self._change.to_json()["catch_up"], done, last.epoch + 1)
        settings = self.settings
        self._rebuild(self.base_spec, last)
        self._use_settings(settings)

    def _check_start(self, start: Any, new: NetworkSpec, last_epoch: int) -> None:
        """An added query that starts from a kept epoch: its sources must read what running
        ones read, and the commit before that epoch must still be kept."""
        if not isinstance(start, int) or not 1 <= start <= last_epoch + 1:
            raise EngineError(f"apply --from-epoch: expected an epoch from 1 to {last_epoch + 1}, got {start!r}")
        required_history_starts(self.base_spec, new, start)
        if start > 1 and not self.ckpt.has_commit(start - 1):
            raise EngineError(f"apply --from-epoch: epoch {start - 1} is no longer kept (the checkpoint keeps the last "
                              f"{self.retain_epochs} epochs{self._kept_for}; raise the network's history to go further back)")

    def _prepare(self, command: dict[str, Any], last: EpochCommit | None) -> tuple[int | None, list[int]]:
        """Carry out a command that needs a boundary of its own, up to planning: returns the
        commit the next epoch goes on from (None: the last) and the epochs whose retracted
        output it puts back."""

        if "undo" in command:  # back to the network, state and outputs from before the replay
            replay = int(command["undo"])
            before = self.ckpt.read_plan(replay - 1).network if replay > 1 else None
            raw = self.ckpt.read_network(before) if before else None
            if raw is not None:
                self._switch({"network": raw}, last)
            return replay - 1, [replay]
        if "network" in command:
            self._switch(command, last)
        if "rewrite" in command:  # the decision, logged with the plan like every other
            self.controller.manager.decisions.append(decision(command, (last.epoch if last else 0) + 1))
        if "replay" in command:
            return self._went_on_from(int(command["replay"])), []
        return None, []

    def _switch(self, command: dict[str, Any], last: EpochCommit | None) -> None:
        """Put the command's network in force from the next epoch (its plan logs the command):
        recorded in the checkpoint first, so that a driver that dies from here on comes back
        with it."""
        self._finish_cleanup()  # (a cleanup judges which steps' state to keep by the network in force)
        new = spec_from_raw(command["network"])
        raw = new.as_dict()  # canonical: the same network always has the same hash
        if network_hash(raw) == self.network_id:
            return  # in force already (switched while idle, the plan to log it still to come)
        start = command.get("start_epoch")
        copies = self._catch_ups(command, new)
        change = LiveChange(
            (last.epoch if last else 0) + 1, tuple(sorted(command.get("reset") or ())), dict(command.get("inherit") or {}),
            {n: (o, int(start)) for n, o in history_starts(self.base_spec, new).items()}
            | {c: (o, int(start)) for c, (o, _) in copies.items() if c not in self._change.catch_up} if start else {},
            copies)
        made_by = command.get("rewrite")
        self.ckpt.record_change(new.fingerprint(), self.ckpt.store_network(raw), change.to_json(),
                                {k: made_by[k] for k in ("rule", "step", "summary")} if made_by else None)
        self._change = change
        before, settings = self.base_spec, self.settings
        self._rebuild(new, last)
        self._use_settings(carried(before, new, settings))  # (logged with the plan about to be made)

    def _adopt_applied_network(self, changed: NetworkDiff | None) -> None:
        """Run the network the checkpoint holds in force: the one a live change applied, even
        when started with the network it was created with (a supervisor's unchanged command
        line). Started with a spec that differs from it (``changed``, see
        :meth:`Checkpoint.restart_change`), it runs the network in force and queues the spec's
        change for the next epoch boundary, as ``eddyline apply`` would."""
        meta = self.ckpt.metadata() or {}
        applied = meta.get("applied")
        if applied:
            self._change = LiveChange.from_json(applied)
        in_force = self.ckpt.in_force(meta)
        if in_force is not None and in_force != self.network_id:
            given = self.base_spec
            self._rebuild(spec_from_raw(self.ckpt.read_network(in_force)), None)
            if changed is not None and not changed.empty:
                self._queue_restart_change(given, changed)
        elif self._change.catch_up:  # its added steps go on catching up on their copies
            self._rebuild(self.base_spec, None)

    def _queue_restart_change(self, given: NetworkSpec, changed: NetworkDiff) -> None:
        """The change a restart's spec makes, queued (once) for the next epoch boundary."""
        raw = given.as_dict()
        digest = network_hash(raw)
        if not any(isinstance(c.get("network"), dict) and network_hash(c["network"]) == digest
                   for c in self.inbox.pending()):
            self.inbox.submit_network(raw, [], origin="restart")
        self._note(f"the spec differs from the network in checkpoint {self.ckpt.location}: applying the changed "
                   f"network at the next epoch boundary ({'; '.join(changed.lines())})")

    def _note(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.note(text)

    def _rebuild(self, spec: NetworkSpec, last: EpochCommit | None) -> None:
        """Another network in force: unchanged sinks stay open, everything else is made anew;
        the controller continues from the last commit where its steps are still there."""
        old = self.spec
        keep = {n: s for n, s in self.outputs.sinks.items()
                if any(x.name == n and x == old.node(n) for x in spec.sinks)}
        for name, sink in self.outputs.sinks.items():
            if name not in keep and hasattr(sink, "close"):
                sink.close()
        attached = self._attached
        if attached:
            for source in self.sources.values():
                source.detach()
        self.lookahead.close()
        checkpoint_id = self.executor.checkpoint_id
        self._build(spec, keep)
        self.executor.checkpoint_id = checkpoint_id
        if last is not None:
            with contextlib.suppress(Exception):  # a state for steps that are gone: decide afresh
                self._restore(last.control)
        if attached:
            for name, source in self.sources.items():
                source.attach(self.ckpt.location, last.source_ends.get(name, 0) if last else 0)
        self._open_gates()

    def _view(self, commit: EpochCommit | None, epoch: int) -> EpochCommit | None:
        """``commit`` as the base of ``epoch``: when a live change starts at ``epoch``, without
        the steps it reset, with the state of the steps it lets inherit one (copied), and with
        as many event-time inputs per step as the new network gives it."""
        change = self._change
        if commit is None or epoch != change.epoch:
            return commit
        steps = {n: s for n, s in commit.steps.items() if n not in change.reset}
        ends, cursors = dict(commit.source_ends), dict(commit.cursors)
        for new, (old, start) in change.sources.items():  # an added source from a kept epoch on
            if new not in commit.source_ends:
                then = self.ckpt.read_commit(start - 1) if start > 1 else None
                ends[new] = then.source_ends.get(old, 0) if then else 0
                if then is not None and old in then.cursors:
                    cursors[new] = then.cursors[old]
        for new, old in change.inherit.items():
            if old in steps and new not in commit.steps:
                copy_state(self.ckpt.location, old, new, steps[old].index)
                steps[new] = steps[old]
        for s in self.spec.stateful_steps():
            known, n = steps.get(s.name), len(s.time_columns())
            if known is not None and len(known.input_max) != n:
                steps[s.name] = dataclasses.replace(known, input_max=[*known.input_max, *[NO_WATERMARK] * n][:n])
        return dataclasses.replace(commit, steps=steps, source_ends=ends, cursors=cursors)

    def _use_settings(self, settings: dict[str, Any]) -> None:
        """Run with the network as written plus ``settings`` (validated: a plan logged them)."""
        if settings == self.settings:
            return
        spec = with_catch_ups(with_settings(self.base_spec, settings), self._change.catch_up)
        old, self.settings, self.spec = self.spec, settings, spec
        self.compiler.spec = self._plans.spec = self.executor.spec = spec
        self.controller.reconfigure(spec)
        moved = [s for s in spec.sinks if s != old.node(s.name)]  # a sink's target changed
        for sink in moved:  # (the executor opens the new one before its first epoch)
            before = self.outputs.sinks[sink.name]
            if hasattr(before, "close"):
                before.close()
            self.outputs.sinks[sink.name] = self._make_sink(sink)
        if moved:
            self._open_gates()

    def _make_sink(self, spec: SinkSpec) -> Sink:
        sink = make_sink(spec, self.reporter.console if self.reporter else None)
        sink.history = self.retain_epochs  # how far back a replay can go: what a rewinding sink keeps
        return sink

    def _open_gates(self) -> None:
        """Write under our lease generation (a follower's: the leader's) from now on, in the
        checkpoint and every sink: each store then refuses the writes of an older generation
        (:class:`~eddyline.storage.Gate`, :meth:`eddyline.io.sinks.Sink.fence`)."""
        generation = self._generation
        if self.lease is None and self.pair is not None:
            cur = self.pair.leader()
            generation = cur.generation if cur is not None else 0
        self.ckpt.fence(generation)
        for out in [*self.outputs.sinks.values(), *self.outputs.targets()]:
            out.fence(generation)

    def _lead(self) -> None:
        """A follower of a hot pair took the lease over: from now on it leads under it."""
        assert self.pair is not None
        self.lease = self.pair.lease
        self.boundaries = UnderLease(self.faults, self.lease)
        self.lease.start_heartbeat()
        self._open_gates()

    @property
    def _generation(self) -> int:
        """The lease generation this driver runs under (0 without a lease)."""
        if self.lease is None or self.lease.generation is None:
            return 0
        return self.lease.generation

    def _base(self, plan: EpochPlan, last: EpochCommit | None) -> EpochCommit | None:
        """The commit ``plan`` continues from: the last one, or for a correction the stable
        commit it names (None: the start)."""
        if plan.base is None:
            return last
        return self.ckpt.read_commit(plan.base) if plan.base else None

    def _log(self, plan: EpochPlan) -> EpochPlan:
        """Log a new plan (with our lease generation); if a driver we fenced logged this epoch's
        plan between our reading the checkpoint and now, that plan is the one to run."""
        plan = dataclasses.replace(plan, generation=self._generation)
        self.boundaries.reached(FaultPoint.PLANNED, plan.epoch)
        if self.ckpt.write_plan(plan, exclusive=self.lease is not None):
            return plan
        theirs = self.ckpt.read_plan(plan.epoch)
        self._restore(theirs.control)
        return theirs

    def _epoch(self, plan: EpochPlan, last: EpochCommit | None, replayed: bool) -> tuple[EpochCommit, ProgressRecord]:
        """Stages 3–8 of one logged epoch."""
        t0 = time.monotonic()
        wall_s = t0 - self._last_epoch_start if self._last_epoch_start is not None else 0.0
        self._last_epoch_start = t0
        try:
            # the next epoch's look-ahead counts while this one's jobs run
            staged = self.executor.execute(plan, last, before_jobs=self.lookahead.start)
        except EddylineError:
            raise
        except Exception as e:  # a Spark job failed: surface our own message if a task left one
            if self.lease is not None:  # or it failed because a driver that took over cleared our staging
                self.lease.check()
            line = task_error_line(e)
            if line is None:
                raise
            raise EngineError(f"epoch {plan.epoch}: {line}") from e
        self.boundaries.reached(FaultPoint.AFTER_STAGE, plan.epoch)
        t_run = time.monotonic()
        publish(self.outputs, staged, plan, self.boundaries)
        self.boundaries.reached(FaultPoint.AFTER_PUBLISH, plan.epoch)
        t_pub = time.monotonic()
        folded = fold(self.spec, self.ckpt, plan, last, staged, wall_s)
        for name, load in folded.loads.items():
            if load.state_rows:
                self.executor.bytes_per_row[name] = load.state_bytes / load.state_rows
        observed_ms = (time.monotonic() - t0) * 1000
        shed = observe(self.controller, self.spec, plan, staged, folded, observed_ms, wall_s, cold=self._cold)
        self._cold = False
        done = commit(
            self.ckpt, plan, last, staged, folded, self.controller.snapshot().model_dump(mode="json"), self.boundaries,
            generation=self._generation, exclusive=self.lease is not None,
        )
        self.boundaries.reached(FaultPoint.AFTER_COMMIT, plan.epoch)
        # upstream backup (Source.committed): what no later plan reads again; a correction
        # re-reads from the last stable commit (eddyline.ha.dpc)
        stable = done if not done.tentative else self.ckpt.read_commit(done.stable) if done.stable else None
        for name, source in self.sources.items():
            source.committed(stable.source_ends.get(name, 0) if stable else 0)
        t_commit = time.monotonic()
        if plan.epoch % self.retain_epochs == 0 or self.spec.history_bytes is not None:  # a cap: every epoch
            self._start_cleanup(plan.epoch)
        t_cleanup = time.monotonic()
        ms = Timings(
            planning=staged.compile_s * 1000,
            execution=(t_run - t0) * 1000 - staged.compile_s * 1000,
            publish=(t_pub - t_run) * 1000,
            commit=(t_commit - t_pub) * 1000,
            cleanup=(t_cleanup - t_commit) * 1000,
        )
        status = {
            name: health
            for name, health in [(n, s.status()) for n, s in self.sources.items()]
            + [(n, s.status()) for n, s in self.sinks.items()]
            if health is not None
        }
        if self.pair is not None:
            driver = self.pair.describe(leading=self.lease is not None)
        else:
            driver = self.lease.describe() if self.lease is not None else None
        return done, report(
            self.spec, self.controller, plan, staged, folded, shed, ms, replayed, observed_ms, wall_s, status,
            driver=driver, committed_at=done.committed_at,
        )

    def _restore(self, control: dict) -> None:
        """Continue with the controller state of the last commit and, on top of it, of the plan
        being replayed (as it was once that plan was made)."""
        if control:
            self.controller.restore(ControllerState.model_validate(control))

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

    # ------------------------------------------------------------------ cleanup
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
        import pyarrow as pa

        keep_from = epoch - self.retain_epochs + 1
        every = self.ckpt.commits()
        within = self.spec.history_duration
        if within is not None and every:  # also what was committed within that long
            newest = max(c.committed_at for c in every)
            keep_from = min([keep_from, *(c.epoch for c in every if c.committed_at >= newest - within / 1000)])
        cap = self.spec.history_bytes
        if cap is not None:  # the oldest epochs go until their state fits the cap
            keep_from = history_floor(self.ckpt.location, [(c.epoch, {n: s.index for n, s in c.steps.items()})
                                                           for c in every], keep_from, cap)
        # a tentative stretch may outlast the retained epochs: its correction continues from
        # the stable commit before it, which must stay (eddyline.ha.dpc)
        anchors = [c.stable for c in every if c.epoch >= keep_from and c.tentative and c.stable is not None]
        keep_from = min([keep_from, *anchors])
        commits = [c for c in every if c.epoch >= keep_from]
        if not commits:
            return
        running = [s.name for s in self.spec.stateful_steps()]
        for name in running:
            # The schema does not matter for cleanup; only the file names and chains do.
            store = KeyGroupStore(self.ckpt.location, name, pa.schema([("_kg", pa.int32())]), ["_kg"])
            store.cleanup([c.steps[name].index for c in commits if name in c.steps], below_epoch=keep_from)
        # a step a live change removed: its state goes once no kept commit has it (until then
        # a replay or an undo may go back to it)
        for name in state_steps(self.ckpt.location):
            if name not in running and not any(name in c.steps for c in commits):
                drop_state(self.ckpt.location, name)
        self.ckpt.forget_before(keep_from)
        self.ckpt.forget_progress()
        if self.pair is not None:
            self.pair.selector.forget_before(keep_from)


@dataclass(frozen=True)
class LiveChange:
    """A change of network as it takes effect: its first epoch, the stateful steps that start
    it with no state, the new steps that start with another's state, and the added sources
    that start where a running one was at a kept epoch (new -> (running, epoch))."""

    epoch: int = 0
    reset: tuple[str, ...] = ()
    inherit: dict[str, str] = field(default_factory=dict)
    sources: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: added steps catching up on copies of running sources: copy -> (source, steps)
    catch_up: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "reset": list(self.reset), "inherit": self.inherit,
                "sources": {n: list(v) for n, v in self.sources.items()},
                "catch_up": {c: [s, list(steps)] for c, (s, steps) in self.catch_up.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveChange:
        return cls(int(data.get("epoch", 0)), tuple(data.get("reset", ())), dict(data.get("inherit") or {}),
                   {n: (str(o), int(e)) for n, (o, e) in (data.get("sources") or {}).items()},
                   {c: (str(s), tuple(steps)) for c, (s, steps) in (data.get("catch_up") or {}).items()})


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
    numpy, ...): over 100,000 objects that a full collection walks every time, inside whichever
    epoch's planning or commit it hits. Frozen (after a collection, so no garbage is kept) they
    are no longer walked. The lanes' Python workers do the same (``lanes.gc_clock``).

    Returns whether nothing was frozen before: the run then thaws the heap when it ends, so the
    interpreter can still free everything at exit (some extension modules report the objects
    left at exit as leaks).
    """
    thawed = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    return thawed


def undo_blocked(replay: int, later: list[tuple[int, list[dict[str, Any]]]]) -> str | None:
    """Why the replay at epoch ``replay`` cannot be undone exactly, given the commands applied
    by each epoch after it (None: it can).

    Replays are undone in the reverse order they were made, like an editor's undo: an undo goes
    back to the commit before its replay and puts back what that replay took back, which is the
    content the sinks had then only if every replay since has been undone already (a later one
    may have taken back epochs from before it, which nothing would put back)."""
    open_ = [replay]  # replays in force, the latest last
    for epoch, applied in later:
        for command in applied:
            if "replay" in command:
                open_.append(epoch)
            elif "undo" in command and int(command["undo"]) in open_:
                open_.remove(int(command["undo"]))
                if int(command["undo"]) == replay:
                    return f"the replay at epoch {replay} was undone at epoch {epoch} already"
    if open_[-1] != replay:
        return (f"the replay at epoch {open_[-1]} came later and is still in force; undo it first "
                "(replays are undone in the reverse order they were made)")
    return None


def _alone(command: dict[str, Any]) -> str | None:
    """What a command that takes an epoch boundary of its own does (None: settings)."""
    for key, what in (("undo", "undo"), ("replay", "replay"), ("network", "apply")):
        if key in command:
            return what
    return None
