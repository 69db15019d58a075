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

A :class:`~eddyline.runtime.faults.Faults` hook is told each boundary the epoch passes. Stages
3–8 run in :mod:`.epoch.stages`.

Between epochs the engine takes the commands (:mod:`.intake`), admits or refuses those that need
a boundary of their own (:mod:`.admission`), and keeps the checkpoint and Spark's workers in
shape (:mod:`.upkeep`); the driver's mode (:mod:`.modes`) says what it is doing. What follows
from the network in force, and switching to another, is :mod:`.networks`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eddyline.api.network import NetworkSpec
from eddyline.errors import Fenced
from eddyline.ha.lease import Lease
from eddyline.io.sinks import Sink
from eddyline.observe.progress import ProgressReporter
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime import admission
from eddyline.runtime.admission import Running, alone, went_on_from
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.compile import analyze
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, ProgressRecord
from eddyline.runtime.epoch.stages import EpochClock, run_stages
from eddyline.runtime.faults import FaultPoint, Faults, NoFaults, UnderLease
from eddyline.runtime.inbox import Inbox
from eddyline.runtime.intake import (
    Intake,
    Step,
    applied_entry,
    next_step,
    route_refusal,
    settings_after,
)
from eddyline.runtime.livechange import LiveChange, view
from eddyline.runtime.modes import Driver, Mode, settled
from eddyline.runtime.networks import Networks
from eddyline.runtime.replica import Following, HotPair
from eddyline.runtime.rewriting import decision, propose_rewrites
from eddyline.runtime.summary import RunState, RunSummary
from eddyline.runtime.upkeep import WORKER_KEEPALIVE_S, Cleanups, WarmWorkers, clean, freeze_heap

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Engine(Networks):
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
        self.warm = WarmWorkers(worker_keepalive_s)
        self._retain = retain_epochs  # default: the network's history
        self.ckpt = Checkpoint(checkpoint)
        self.lanes = lanes or spec.lanes or spark.sparkContext.defaultParallelism
        self.inbox = Inbox(checkpoint, self.ckpt.gate)
        self.intake = Intake(self.inbox)
        self._given_sinks = sinks or {}
        self._attached = False  # the sources receive (upstream backup) while run() runs
        self._change = LiveChange()  # the last change of network, as the checkpoint records it
        #: an operator paused the network (control API): no epoch runs until a resume. The
        #: pause itself is kept in the checkpoint's inbox, so a restarted driver stays paused.
        self.paused = self.inbox.paused() is not None
        self.driver = Driver()
        self._build(spec)
        self.cleanups = Cleanups()
        self.clock = EpochClock()

    @property
    def sinks(self) -> dict[str, Sink]:
        return self.outputs.sinks

    @property
    def kept_warm_pids(self) -> list[int]:
        """The Python workers the last keep-alive job ran in."""
        return self.warm.pids

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        *,
        epochs: int | None = None,
        duration_s: float | None = None,
        until_idle: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> RunSummary:
        if self.driver.mode is Mode.STOPPED:
            self.driver.to(Mode.STARTING, "run() called again")
        if self.lease is not None:
            # renewed from the start: opening the checkpoint (fencing it, reading its head) is a
            # few round trips to the store, and on a loaded host or a slow store they could take
            # long enough for the lease to lapse before its first renewal
            self.lease.start_heartbeat(self._cancel_jobs)
        try:
            last, pending, started_at = self._open()
        except BaseException:
            if self.lease is not None:
                self.lease.release()
            raise
        run, t_start = RunState(until_idle, started_at), time.monotonic()
        try:
            for name, source in self.sources.items():  # upstream backup: start receiving (Source.attach)
                source.attach(self.ckpt.location, last.source_ends.get(name, 0) if last else 0)
            self._attached = True
            self._settle(f"took the checkpoint up after epoch {last.epoch if last else 0}")
            while not (
                (epochs is not None and run.summary.epochs >= epochs)
                or (duration_s is not None and time.monotonic() - t_start >= duration_s)
                or (should_stop is not None and should_stop())
            ):
                last, go_on = self._turn(run, last, pending)
                pending = None
                if not go_on:
                    break
        except BaseException as e:
            if isinstance(e, Fenced):
                self.driver.to(Mode.FENCED, str(e))
            self.cleanups.finish(raise_error=False, wait_s=0.5 if isinstance(e, Fenced) else None)
            raise
        finally:
            self._close(run.thawed)
        self.cleanups.finish()  # the last cleanup is done when run() returns
        return run.summary

    def _open(self) -> tuple[EpochCommit | None, EpochPlan | None, float]:
        """Open the checkpoint where it ends: the network in force, and the controller state,
        settings and control-stream cursor of the last commit or of the plan logged after it
        (returned, with the last commit and when the checkpoint's run started)."""
        changed = self.ckpt.restart_change(self.base_spec)  # refused before anything is written
        # before anything is read: from here on no older generation can write what we read
        self._open_gates()
        self._adopt_applied_network(changed)
        meta = self.ckpt.open(self.spec.fingerprint(), created=self.network_id)
        applied = meta.get("applied") or {}
        self._change = LiveChange.from_json(applied)
        self.ckpt.store_network(self.base_spec.as_dict())  # every plan names the network it ran
        self.executor.checkpoint_id = str(meta["id"])  # names this run's writes in sinks that remember them
        if self.pair is not None:  # the pair's writes are the same whichever driver makes them
            self.executor.checkpoint_id = self.pair.join(self.spec.fingerprint())
        last = self.ckpt.latest_commit()
        pending = self.ckpt.pending_plan(last.epoch if last else 0)
        self._restore(last.control if last else {})
        self._use_settings(pending.settings if pending is not None else last.settings if last else {})
        self.intake.cursor = pending.commands_cursor if pending is not None else last.commands_cursor if last else None
        if pending is not None:
            if pending.base is not None:  # a correction: it continues from an earlier commit
                base = self._base(pending, last)
                self._restore(base.control if base else {})
            self._restore(pending.control)
        return last, pending, float(meta["started_at"])

    def _turn(self, run: RunState, last: EpochCommit | None, pending: EpochPlan | None) -> tuple[EpochCommit | None, bool]:
        """One turn of the loop: take the commands, then plan, log and run an epoch, or wait.
        ``pending``: a plan logged before this run, run first. Returns the last commit and
        whether to go on."""
        epoch_start = time.monotonic()
        replayed = pending is not None
        if not replayed and not self.paused:
            self._merge_caught_up(last)
        before, taken = self.settings, [] if replayed else self._take_commands((last.epoch if last else 0) + 1)
        self._settle("at an epoch boundary")
        if self.paused and pending is None:  # an operator's pause: wait for the resume, workers kept warm
            self._idle(run, 0.2)
            return last, True
        special = taken[0] if taken and alone(taken[0]) else None
        rewind_to, restores = self._prepare(special, last) if special is not None else (None, [])
        base, elapsed = self._view(last, (last.epoch if last else 0) + 1), time.time() - run.started_at
        plan = pending or (self.planner.next(base, elapsed, run.until_idle) if rewind_to is None  # 1. plan
                           else self._plans.next(base, elapsed, run.until_idle, rewind_to))  # (no pair: refused)
        if plan is None:
            if special is None:  # (a change of network is recorded: it stays)
                self._use_settings(before)  # the commands wait for an epoch to take effect in
            if run.until_idle and not self.planner.waiting_for:
                return last, False
            self._idle(run, self.planner.poll_s or min(max(self.spec.trigger, self.executor.idle_poll_ms), 1000) / 1000)
            return last, True
        if not replayed:
            applied = [applied_entry(c, self.network_id) for c in [*self.intake.held, *taken]]
            self.intake.held = []
            plan = self._log(dataclasses.replace(plan, settings=self.settings, applied=applied,
                                                 commands_cursor=self.intake.read_to, network=self.network_id,
                                                 restores=restores))  # 2. log
            replayed = plan.generation != self.generation
            for command in taken:  # logged: from now on the plan applies them, also in a replay
                self.inbox.close(command, "applied", plan.epoch)
        if plan.settings != self.settings:  # a replay, a follower, or another driver's plan
            self._use_settings(plan.settings)
        self.intake.cursor = plan.commands_cursor
        if replayed or special is not None:
            self._settle(f"epoch {plan.epoch} runs {_runs(plan, special, pending)}", replaying=True)
        self.boundaries.reached(FaultPoint.AFTER_PLAN, plan.epoch)
        last, record = run_stages(self, plan, self._view(self._base(plan, last), plan.epoch), replayed)  # 3.–8.
        self._reported(run, plan, record.with_input_rate(epoch_start - run.prev_start if run.prev_start is not None else 0.0),
                       replayed)
        run.prev_start = epoch_start
        wait = self.spec.trigger / 1000 - (time.monotonic() - epoch_start)
        if wait > 0 and self.planner.poll_s is None:  # (a follower is paced by its leader)
            time.sleep(wait)
        return last, True

    def _reported(self, run: RunState, plan: EpochPlan, record: ProgressRecord, replayed: bool) -> None:
        """After an epoch committed: its progress record out, the heap frozen after the first,
        rewrites proposed for the next."""
        self.warm.used()
        refused = self.intake.take_refused()
        if refused:
            record = record.with_refused(refused)
        run.summary.add(plan.epoch, record, replayed)
        if run.summary.epochs == 1:
            run.thawed = freeze_heap()
        self.ckpt.write_progress(plan.epoch, record.to_json())  # (status and the dashboard read it)
        if self.reporter is not None:
            self.reporter.report(record.to_json())
        if self.spec.control.rewrite is not None and self.pair is None and self.spec.max_delay is None:
            propose_rewrites(self.base_spec, self.controller, self.inbox, plan.epoch + 1, self.controller.lanes_cap,
                             skip=self.intake.not_rewritten)

    def _idle(self, run: RunState, seconds: float) -> None:
        """Nothing to run: wait, keeping Spark's Python workers warm."""
        if not self.executor.holds_workers:  # (a resident stage's lanes are kept busy by it)
            run.summary.worker_keepalives += self.warm.touch(self.spark)
        time.sleep(seconds)

    def _close(self, thawed: bool) -> None:
        """What run() opened, closed (also when it fails)."""
        for source in self.sources.values():  # upstream backup: stop receiving (Source.detach)
            source.detach()
        self._attached = False
        self.intake.close()
        self.lookahead.close()
        self.executor.close()
        if self.pair is not None:
            self.pair.close()
        if self.lease is not None:
            self.lease.release()
        if thawed:
            gc.unfreeze()
        self.driver.to(Mode.STOPPED, "run() returned")

    def _settle(self, reason: str, replaying: bool = False) -> None:
        """The driver's mode as the facts have it now (:func:`eddyline.runtime.modes.settled`)."""
        self.driver.to(settled(paused=self.paused, replaying=replaying, following=self.pair is not None and self.lease is None,
                               catching_up=bool(self._change.catch_up)), reason)

    # ------------------------------------------------------------------ commands
    def _take_commands(self, epoch: int) -> list[dict[str, Any]]:
        """Control lines: the commands of the inbox, then of the control stream, whose settings
        fit the running network, in order, put in force for the epoch about to be planned (the
        caller logs them with it); the others are refused with the reason (while planning
        ``epoch``) and reported in the next progress record. A change of network comes alone."""
        self.intake.read_to = self.intake.cursor
        if isinstance(self.planner, Following):
            return []  # a follower runs its leader's plans, settings included
        taken: list[dict[str, Any]] = []
        for command in self.inbox.waiting():
            step = next_step(command, taken=bool(taken), paused=self.paused)
            if step is Step.STOP:
                return taken
            if step is Step.WAIT:
                return []
            if step is Step.PAUSE:
                self._pause_or_resume(command, epoch)
            elif step is Step.ROUTE:
                taken += self._route(command, epoch)
            elif step is Step.SET:
                taken += self._take(command, epoch)
            else:
                reason = admission.refusal(command, epoch - 1, self._running(), self.ckpt)
                if reason is None:
                    return [command]
                self.intake.refuse_alone(command, epoch, reason)
        stream = self.spec.control.commands
        if stream is not None and not self.paused:  # a control stream: its tuples are commands too
            for command in self.intake.stream(stream, self.spec.name):
                taken += self._take(command, epoch)
        return taken

    def _take(self, command: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        """``[command]`` if its settings fit the network as it runs with those taken before it
        (they are then in force), else ``[]`` (refused with the reason, once)."""
        settings, reason = settings_after(command, self.spec, self.base_spec, self.settings)
        if reason is not None:
            self.intake.refuse_setting(command, epoch, reason)
            return []
        self._use_settings(settings)
        return [command]

    def _route(self, command: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        """``[command]`` if its routing request fits (the manager then takes it in the plan of
        ``epoch``, where it becomes a decision), else ``[]`` (refused with the reason)."""
        request = command.get("route")
        lanes_now = self.lanes
        if isinstance(request, dict):
            last = self.ckpt.latest_commit()
            prev = last.steps.get(str(request.get("step"))) if last else None
            lanes_now = RoutingTable.from_json(prev.routing).lanes if prev else self.lanes
        reason = route_refusal(command, self.controller.manager, self.controller.lanes_cap, lanes_now)
        if reason is not None:
            self.intake.refuse(command, epoch, reason, "route", request)
            return []
        self.controller.manager.request({**request, "id": command.get("id")})  # type: ignore[dict-item]
        return [command]

    def _pause_or_resume(self, command: dict[str, Any], epoch: int) -> None:
        """An operator's pause (no epoch runs until a resume; kept in the checkpoint, so a
        restarted driver stays paused) or resume. Both are closed at once and logged in the plan
        of the next epoch that runs."""
        pause = "pause" in command
        if pause != self.paused:
            self.inbox.set_paused({"id": command.get("id"), "since": time.time()} if pause else None)
            self.paused = pause
            self._settle(f"{'paused' if pause else 'resumed'} by command {command.get('id')}")
            self.intake.held.append(command)
        self.inbox.close(command, "applied", epoch)

    def _running(self) -> Running:
        """The engine as the admission checks see it."""
        return Running(self.base_spec, self.spec, self.pair is not None or self.spec.max_delay is not None,
                       self._change.catch_up, self.outputs.sinks, self.executor.checkpoint_id, self.retain_epochs,
                       lambda new: analyze(new, self.spark))

    def _check_alone(self, command: dict[str, Any], last_epoch: int) -> None:
        """Refuse (raise) a change of network, a replay or an undo that cannot be done now."""
        admission.check(command, last_epoch, self._running(), self.ckpt)

    def _prepare(self, command: dict[str, Any], last: EpochCommit | None) -> tuple[int | None, list[int]]:
        """Carry out a command that needs a boundary of its own, up to planning: returns the
        commit the next epoch goes on from (None: the last) and the epochs whose retracted
        output it puts back."""
        if "undo" in command:  # back to the network, state and outputs from before the replay
            replay = int(command["undo"])
            before = self.ckpt.read_plan(replay - 1).network if replay > 1 else None
            raw = self.ckpt.read_network(before) if before else None
            if raw is not None:
                self._switch({"network": self.run_as_given(raw)}, last)
            return replay - 1, [replay]
        if "network" in command:
            self._switch(command, last)
        if "rewrite" in command:  # the decision, logged with the plan like every other
            self.controller.manager.decisions.append(decision(command, (last.epoch if last else 0) + 1))
        if "replay" in command:
            return went_on_from(self.ckpt, int(command["replay"])), []
        return None, []

    # ------------------------------------------------------------------ the lease

    def _view(self, commit: EpochCommit | None, epoch: int) -> EpochCommit | None:
        """``commit`` as the base of ``epoch`` (:func:`eddyline.runtime.livechange.view`)."""
        return view(commit, epoch, self._change, self.spec, self.ckpt)

    def _lead(self) -> None:
        """A follower of a hot pair took the lease over: from now on it leads under it."""
        assert self.pair is not None
        self.lease = self.pair.lease
        self.boundaries = UnderLease(self.faults, self.lease)
        self.lease.start_heartbeat(self._cancel_jobs)
        self._open_gates()
        self._settle("took the hot pair's lease over")

    def _cancel_jobs(self) -> None:
        """This driver was fenced while an epoch may be waiting in a Spark job: end the job, so
        that the epoch reaches its next check and stops there."""
        with contextlib.suppress(Exception):  # the session may be stopping too
            self.spark.sparkContext.cancelAllJobs()

    @property
    def generation(self) -> int:
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
        plan = dataclasses.replace(plan, generation=self.generation)
        self.boundaries.reached(FaultPoint.PLANNED, plan.epoch)
        if self.ckpt.write_plan(plan, exclusive=self.lease is not None):
            return plan
        theirs = self.ckpt.read_plan(plan.epoch)
        self._restore(theirs.control)
        return theirs

    def cleanup(self, epoch: int) -> None:
        """Delete what epochs before the retained ones left behind (in the cleanup's thread)."""
        keep_from = clean(self.ckpt, epoch, self.retain_epochs, self.spec.history_duration, self.spec.history_bytes,
                          [s.name for s in self.spec.stateful_steps()])
        if keep_from is not None and self.pair is not None:
            self.pair.selector.forget_before(keep_from)


def _runs(plan: EpochPlan, special: dict[str, Any] | None, pending: EpochPlan | None) -> str:
    """What a replaying epoch runs, for the driver's transition."""
    if special is not None and "replay" in special:
        return f"a replay from epoch {special['replay']}"
    if special is not None and "undo" in special:
        return f"the undo of the replay at epoch {special['undo']}"
    if special is not None:
        return "a change of network"
    return "the plan logged before this run" if pending is not None else "a plan another driver logged"
